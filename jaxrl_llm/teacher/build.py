"""The teacher's weights: an external checkpoint (or one per task tag), a
better-trained copy of the warm start, or the student itself (package
docstring: where each comes from and what is checkpointed)."""


from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

from jaxrl_llm import model as model_lib
from jaxrl_llm.model import sharding as sharding_lib
from jaxrl_llm.teacher.config import TeacherConfig
from jaxrl_llm.teacher.stage import hint_examples



# ---- the teacher's weights ---------------------------------------------------

def _copy(tree):
  return jax.tree.map(jnp.copy, tree)


def _mesh_of(params):
  """The mesh the student's params are placed on; None where they sit on one device (no mesh)."""
  sharding = jax.tree.leaves(params)[0].sharding
  return sharding.mesh if isinstance(sharding, NamedSharding) else None


def load_teacher_checkpoint(path: str, student_params, student_cfg: model_lib.ModelConfig,
                            field: str = "checkpoint"):
  """(params, model_cfg) of an external teacher; same vocabulary as the student or an error.

  The teacher is placed like the policy: on the student's mesh, by
  model/sharding.py's rules for its own shapes (a run's workdir restores
  into the student's shardings), so no device holds its whole [D, V] head.
  """
  if not os.path.isdir(path):
    raise FileNotFoundError(f"config.teacher.{field}={path!r} does not exist: expected a Hugging "
                            "Face directory (config.json + *.safetensors) or a run's workdir")
  from jaxrl_llm.checkpointing import init_params as ckpt_init
  if ckpt_init.is_hf_dir(path):
    from jaxrl_llm.model.io import hf_io
    from jaxrl_llm.model.io.hf_config import config_from_hf
    cfg = config_from_hf(hf_io.read_hf_config(path), param_dtype=student_cfg.param_dtype)
    if cfg.vocab_size != student_cfg.vocab_size:
      raise ValueError(f"config.teacher.{field}={path!r} has vocab_size={cfg.vocab_size} but the student "
                       f"has {student_cfg.vocab_size}: the teacher must use the student's tokenizer")
    mesh = _mesh_of(student_params)
    if mesh is None:
      return hf_io.load_hf(path, param_dtype=student_cfg.param_dtype)
    try:
      sharding_lib.check_divisible(cfg, mesh)
    except ValueError as e:
      raise ValueError(f"config.teacher.{field}={path!r} cannot be split over the student's mesh: {e}") from e
    return hf_io.load_hf(path, shardings=lambda c: sharding_lib.param_shardings(c, mesh),
                         param_dtype=student_cfg.param_dtype)
  try:
    params, _ = ckpt_init.params_from_checkpoint(path, student_params, student_cfg)
  except ValueError as e:  # IncompatibleCheckpointError names the differing fields
    if "vocab_size" in str(e):
      raise ValueError(f"config.teacher.{field}={path!r}: vocabulary differs from the student's "
                       f"(the teacher must use the student's tokenizer): {e}") from e
    raise
  return params, student_cfg


def load_routed_teachers(cfg: TeacherConfig, student_params, student_cfg):
  """-> (params tuple, cfg tuple, {tag: teacher index}) for ``route_by_tag``; a path shared by tags loads once."""
  paths, tag_teacher = [], {}
  for tag, path in cfg.routes:
    if path not in paths:
      paths.append(path)
    tag_teacher[tag] = paths.index(path)
  loaded = []
  for path in paths:
    first_tag = next(t for t, q in cfg.routes if q == path)
    loaded.append(load_teacher_checkpoint(path, student_params, student_cfg, field=f"route_by_tag[{first_tag}]"))
  return tuple(p for p, _ in loaded), tuple(c for _, c in loaded), tag_teacher


def build_teacher(cfg: TeacherConfig, student_params, student_cfg, *, sft_fn, train_examples):
  """-> (student_params, teacher_params, teacher_cfg, info) before RL starts.

  ``sft_fn(params, examples, steps) -> params`` runs the warm start's SFT
  (it may donate its input; copies are passed). ``train_examples`` carry
  their (partly wrong) demos; correct demos are their answers. With
  ``route_by_tag`` the teacher params and configs are tuples (one per
  distinct path) and info["tag_teacher"] maps each tag to its index.
  """
  if cfg.source == "none":
    return student_params, None, None, {}
  if cfg.source == "checkpoint" and cfg.routes:
    params, cfgs, tag_teacher = load_routed_teachers(cfg, student_params, student_cfg)
    return student_params, params, cfgs, {"teacher_source": cfg.route_by_tag, "tag_teacher": tag_teacher}
  if cfg.source == "checkpoint":
    params, tcfg = load_teacher_checkpoint(cfg.checkpoint, student_params, student_cfg)
    return student_params, params, tcfg, {"teacher_source": cfg.checkpoint}
  if cfg.source == "sft":
    correct = [dataclasses.replace(e, demo=e.answer) for e in train_examples]
    params = sft_fn(_copy(student_params), correct, cfg.sft_steps)
    return student_params, params, student_cfg, {"teacher_source": f"sft+{cfg.sft_steps} correct"}
  # self: optionally teach the model to read a hint, then phi_{-1} = theta_0.
  if cfg.context == "hint" and cfg.hint_sft_steps:
    mixed = hint_examples(train_examples, cfg.hint_template) + list(train_examples)
    student_params = sft_fn(_copy(student_params), mixed, cfg.hint_sft_steps)
  return student_params, _copy(student_params), student_cfg, {"teacher_source": f"self/{cfg.schedule}"}
