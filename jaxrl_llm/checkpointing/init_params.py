"""`init_checkpoint`: start a new run from saved params instead of a fresh init.

The source is either
  * a Hugging Face directory (config.json + *.safetensors), read with the
    model package's loader, or
  * a workdir of an earlier run (or its checkpoints/ folder): its params at
    `step` (default: the newest intact step) are read; optimizer state, PRNG key
    and data position are not, since this is a new run, not a resume.
Either way the model config the source was saved with must match the run's
(the differing fields are named otherwise), and the params land in the
shardings of `target_params`.
"""

import glob
import os
from typing import Any

import jax

from jaxrl_llm.checkpointing.config import CheckpointConfig
from jaxrl_llm.checkpointing.errors import IncompatibleCheckpointError, NoCheckpointError
from jaxrl_llm.checkpointing.manager import (
    RUNTIME_MODEL_FIELDS, CheckpointManager, to_jsonable)

CHECKPOINT_SUBDIR = "checkpoints"


def is_hf_dir(path: str) -> bool:
  return (os.path.exists(os.path.join(path, "config.json"))
          and bool(glob.glob(os.path.join(path, "*.safetensors"))))


def checkpoint_dir(path: str) -> str:
  """The checkpoints folder of a workdir (or `path` itself if it is one)."""
  sub = os.path.join(path, CHECKPOINT_SUBDIR)
  return sub if os.path.isdir(sub) else path


def _compare(expected: dict, found: dict, where: str) -> None:
  diffs = [f"{k}: expected {expected.get(k)!r}, found {found.get(k)!r}"
           for k in sorted(set(expected) | set(found))
           if k not in RUNTIME_MODEL_FIELDS and expected.get(k) != found.get(k)]
  if diffs:
    raise IncompatibleCheckpointError(f"{where} holds another model: " + "; ".join(diffs))


def params_from_checkpoint(path: str, target_params: Any, model_config: Any, *,
                step: int | None = None, params_key: str = "params") -> tuple[Any, str]:
  """(params, description of the source) for `--config.init_checkpoint=path`.

  target_params: params (or ShapeDtypeStructs with shardings) of the run's model.
  model_config: the run's ModelConfig.
  """
  if not os.path.isdir(path):
    raise NoCheckpointError(
        f"init_checkpoint = {path!r} is not a directory: expected a Hugging Face "
        "directory (config.json + *.safetensors) or the workdir of a run")
  if is_hf_dir(path):
    if step is not None:
      raise ValueError(f"init_checkpoint step = {step}: a Hugging Face directory "
                       "has no steps; leave the step unset")
    from jaxrl_llm.model.io import hf_io  # pylint: disable=import-outside-toplevel
    from jaxrl_llm.model.io.hf_config import config_from_hf  # pylint: disable=import-outside-toplevel
    # Compare configs before reading any tensor.
    cfg = config_from_hf(hf_io.read_hf_config(path), param_dtype=model_config.param_dtype)
    _compare(to_jsonable(model_config), to_jsonable(cfg), f"Hugging Face directory {path}")
    shardings = jax.tree.map(lambda x: x.sharding, target_params)
    params, _ = hf_io.load_hf(path, shardings=lambda _: shardings,
                              param_dtype=model_config.param_dtype)
    return params, f"Hugging Face directory {path}"
  mngr = CheckpointManager(checkpoint_dir(path), CheckpointConfig(),
                           model_config=model_config, read_only=True)
  found_step, params = mngr.restore_subtree(params_key, target_params, step)
  return params, f"step {found_step} of {mngr.directory}"
