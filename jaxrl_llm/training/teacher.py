"""Teacher stage: build the teacher, score the student's rollouts with it, and
route its signal into the update (spec 000 sections 5-6, spec 003 on-policy
distillation and self-distillation with hints).

Where the teacher comes from (``teacher.source``):

* ``sft``: an external teacher made by the warm start: the warm-started
  student trained ``sft_steps`` more steps on *correct* demonstrations only
  (a better-trained checkpoint of the same architecture and tokenizer).
* ``checkpoint``: an external teacher from a Hugging Face directory or a
  run's workdir; its vocabulary must be the student's.
* ``self``: the student's own network (SDPO). Its weights follow
  ``teacher.schedule`` (objectives/teacher_schedule.py). With
  ``context=hint`` the teacher sees the reference answer as a hint before the
  prompt; ``hint_sft_steps`` warm-start steps teach the model to read a hint.

How the signal enters (``teacher.signal``), all on the student's own samples:

* ``distill``: the loss form, coef * D(p, q) per token (reverse KL, forward
  KL or JSD(beta), eq. 26-30; over the full vocabulary, or over the teacher's
  top-k with ``teacher.topk``), plus rl_coef times the reward policy loss.
* ``gap_advantage``: the sampled-token advantage form: A_t = rl_coef A_i +
  coef tau_t Delta_t with Delta the detached teacher gap (eq. 31-33).
* ``srpo``: GRPO on samples routed z_grpo, coef * D on samples routed z_sdpo
  (eq. 34-35), one shared token normaliser.
* ``rlsd``: reward sets the direction, the clipped teacher gap the magnitude
  (eq. 37-39).

tau is the teacher-confidence weight of eq. 56 (confidence_beta = 0: tau = 1);
``sign_gate`` multiplies the teacher branch by the SG-OPD sign-consistency gate
(objectives/teacher.py). With ``route_by_tag`` each task tag has its own
external teacher (multi-teacher distillation, spec 003); a sample whose tag
has none gets m_i = 0 (no teacher term; SRPO routes it to GRPO).

This module builds the teacher and hooks it into the trainer; the config is
teacher_config.py, the scoring and rewriting teacher_stage.py, the loss term
teacher_loss.py.

Checkpoints: a self-teacher under ``refresh`` / ``ema`` depends on the run's
history, so its weights are saved with every checkpoint of the run and
restored on resume (``Trainer.checkpoint_trees``). Every other teacher is
rebuilt deterministically on resume (the warm start reruns, external
checkpoints are read again, ``frozen`` is theta_0, ``current`` is the
student) and stays out of the checkpoint.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp

from jaxrl_llm import model as model_lib
from jaxrl_llm.checkpointing.run import ExtraTree
from jaxrl_llm.training.data import prompt_text
from jaxrl_llm.training.teacher_config import (CONTEXTS, DIVERGENCES, SIGNALS, SOURCES, TeacherConfig,
                                               teacher_preflight)
from jaxrl_llm.training.teacher_loss import DistillTerm
from jaxrl_llm.training.teacher_stage import TeacherSignals, TeacherStage, hint_examples

__all__ = [
  "CONTEXTS",
  "DIVERGENCES",
  "SIGNALS",
  "SOURCES",
  "DistillTerm",
  "TeacherConfig",
  "TeacherSignals",
  "TeacherStage",
  "attach",
  "build_teacher",
  "hint_examples",
  "load_teacher_checkpoint",
  "rewrite_batch",
]

CHECKPOINT_KEY = "teacher_params"  # the moving self-teacher's weights in the run's checkpoints


# ---- the teacher's weights ---------------------------------------------------

def _copy(tree):
  return jax.tree.map(jnp.copy, tree)


def load_teacher_checkpoint(path: str, student_params, student_cfg: model_lib.ModelConfig,
                            field: str = "checkpoint"):
  """(params, model_cfg) of an external teacher; same vocabulary as the student or an error."""
  if not os.path.isdir(path):
    raise FileNotFoundError(f"config.teacher.{field}={path!r} does not exist: expected a Hugging "
                            "Face directory (config.json + *.safetensors) or a run's workdir")
  from jaxrl_llm.checkpointing import init as ckpt_init
  if ckpt_init.is_hf_dir(path):
    from jaxrl_llm.model import hf_io
    from jaxrl_llm.model.hf_config import config_from_hf
    cfg = config_from_hf(hf_io.read_hf_config(path), param_dtype=student_cfg.param_dtype)
    if cfg.vocab_size != student_cfg.vocab_size:
      raise ValueError(f"config.teacher.{field}={path!r} has vocab_size={cfg.vocab_size} but the student "
                       f"has {student_cfg.vocab_size}: the teacher must use the student's tokenizer")
    params, cfg = hf_io.load_hf(path, param_dtype=student_cfg.param_dtype)
    return params, cfg
  try:
    params, _ = ckpt_init.init_params(path, student_params, student_cfg)
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


# ---- the trainer's hooks ---------------------------------------------------------

def attach(tr, state):
  """After the warm start, before the update compiles: build the teacher on ``tr``.

  Sets ``tr.teacher_stage`` (None when no teacher), appends the loss term to
  ``tr.extra_terms`` and the teacher heads to ``tr.aux_providers`` (loss
  forms over the full vocabulary), and registers a moving self-teacher's weights in
  ``tr.checkpoint_trees`` (saved with the run, restored on resume); a
  self-teacher's hint warm start may replace the student's params.
  """
  cfg = getattr(tr.cfg, "teacher", None)
  tr.teacher_stage = None
  if cfg is None or not cfg.enabled:
    return state
  teacher_preflight(tr.cfg)  # paths, vocabulary, topk: before any teacher is built
  from jaxrl_llm.training.sft import run_sft

  c = tr.cfg

  def sft_fn(params, examples, steps):
    longest = 1 + max(len(tr.tokenizer.encode(prompt_text(tr.tokenizer, e.prompt, c.data.chat_template)))
                      for e in examples)  # + BOS; hinted prompts are longer than data.max_prompt_len
    width = max(c.data.max_prompt_len, -(-longest // 8) * 8)
    params, _ = run_sft(params, tr.model_cfg, examples, tr.tokenizer, steps=steps, batch_size=c.sft.batch_size,
                        lr=c.sft.lr, warmup_steps=min(c.sft.warmup_steps, steps),
                        max_prompt_len=width, max_response_len=c.rollout.max_response_len,
                        seed=c.seed + 1, impl=c.kernels.impl, mesh=tr.mesh, chat_template=c.data.chat_template,
                        log=tr.log)
    return params

  params, t_params, t_cfg, info = build_teacher(cfg, state.params, tr.model_cfg, sft_fn=sft_fn,
                                                train_examples=tr.train_examples)
  tr.log(f"teacher: {info.get('teacher_source')}, signal {cfg.signal}")
  stage = TeacherStage(cfg, t_params, t_cfg, tr.model_cfg, tr.tokenizer, temperature=c.rollout.temperature,
                       max_prompt_len=c.data.max_prompt_len, chat_template=c.data.chat_template,
                       chunk=c.micro_batch_size, impl=c.kernels.impl, tag_teacher=info.get("tag_teacher"))
  tr.teacher_stage = stage
  tr.extra_terms = tuple(tr.extra_terms) + stage.extra_terms(c.objective.aggregation)
  if cfg.loss_form and not cfg.topk:
    def teacher_heads(trainer, st):  # the update's aux: the teacher heads of this step
      del trainer
      return stage.heads(st)
    tr.aux_providers.append(teacher_heads)
  if cfg.moving_self_teacher:
    tr.checkpoint_trees = {**getattr(tr, "checkpoint_trees", {}),
                           CHECKPOINT_KEY: ExtraTree(get=lambda: stage.params, set=stage.restore_params)}
  return state.replace(params=params)


def rewrite_batch(tr, state, samples, scores, adv_BR, mask_BR):
  """In the step, after the advantages: -> (adv_BR, extra_BR, metrics) with the teacher's signal."""
  stage = getattr(tr, "teacher_stage", None)
  if stage is None:
    return adv_BR, {}, {}
  sig = stage.signals(samples, state.params, int(state.step))
  return stage.apply(sig, adv_BR, mask_BR, scores.correct_B)
