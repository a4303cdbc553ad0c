"""Checkpoints of a training run: resume, periodic and final saves, init from saved params.

`RunCheckpoints` is what the trainer's loop talks to (training/loop.py):
  * `resume_step()`: the newest saved step in <workdir>/checkpoints, or None;
  * `add_trees(trees)`: pytrees outside the TrainState that a resume needs;
  * `restore(state, restore_data_state)`: the saved TrainState (params,
    optimizer state, value head, reference params, the sampler-lag buffer,
    PRNG key, step) in place of `state`, the data iterator's saved position
    handed to `restore_data_state`, and the run-level JSON saved beside it
    (start eval, SFT info, step history);
  * `on_step(state, metrics)`: after every RL step, saves every
    `checkpoint.every_steps` steps;
  * `finish(state)`: saves the final step and waits for the writes;
  * `init_params(state, path, step)`: `init_checkpoint` for a new run.

Pytrees a resume needs that live outside the TrainState (a moving
self-teacher's weights, say) come through `add_trees`, a dict name ->
`ExtraTree` (an extension's `checkpoint_trees()`): each is saved beside the
state's fields under its name and handed back to its `set` on restore.
"""

import dataclasses
import os
from typing import Any, Callable

import numpy as np

from jaxrl_llm import faults
from jaxrl_llm.checkpointing import init_params as init_lib
from jaxrl_llm.checkpointing.config import CheckpointConfig
from jaxrl_llm.checkpointing.manager import CheckpointManager, to_jsonable

CHECKPOINT_SUBDIR = init_lib.CHECKPOINT_SUBDIR
# TrainState fields that are host-side metadata, saved as JSON rather than arrays.
_HOST_FIELDS = ("data_state",)


@dataclasses.dataclass(frozen=True)
class ExtraTree:
  """A pytree outside the TrainState that a resumed run needs to continue exactly."""

  get: Callable[[], Any]  # the current tree (arrays), read at every save and as the restore target
  set: Callable[[Any], None]  # receives the restored tree (get()'s structure, dtypes and shardings)


def state_tree(state) -> dict:
  """The array fields of a TrainState as a plain dict (Orbax's native structure)."""
  return {f.name: getattr(state, f.name) for f in dataclasses.fields(state)
          if f.name not in _HOST_FIELDS}


def plain(obj: Any) -> Any:
  """numpy / jax scalars inside dicts and lists -> Python int / float (JSON-exact)."""
  if isinstance(obj, dict):
    return {k: plain(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [plain(v) for v in obj]
  if isinstance(obj, np.generic) or (hasattr(obj, "shape") and obj.shape == ()):
    return np.asarray(obj).item()
  return obj


def json_row(metrics: dict) -> dict:
  """A metrics dict with numpy / jax scalars as Python floats (JSON-exact)."""
  out = {}
  for k, v in metrics.items():
    try:
      out[k] = float(np.asarray(v))
    except (TypeError, ValueError):
      out[k] = str(v)
  return out


class RunCheckpoints:
  """Save / resume for one run in `workdir` (see the module docstring)."""

  def __init__(self, workdir: str, cfg: CheckpointConfig, *, run_config: Any,
               model_config: Any, log: Callable[[str], None] = print):
    self.cfg, self.log, self.model_config = cfg, log, model_config
    self.run_config = to_jsonable(run_config)
    self.mngr = CheckpointManager(os.path.join(workdir, CHECKPOINT_SUBDIR), cfg,
                                  model_config=model_config)
    # Run-level JSON saved with every step: what a resumed run cannot recompute.
    self.extra: dict = {}
    self.extra_trees: dict[str, ExtraTree] = {}

  def add_trees(self, trees: dict[str, ExtraTree]) -> None:
    """Saves `trees` with every checkpoint and restores them on resume."""
    clash = sorted(set(self.extra_trees) & set(trees))
    if clash:
      raise ValueError(f"checkpoint trees {clash} are registered twice")
    self.extra_trees.update(trees)

  def _tree(self, state) -> dict:
    tree = state_tree(state)
    clash = sorted(set(tree) & set(self.extra_trees))
    if clash:
      raise ValueError(f"checkpoint_trees {clash} clash with TrainState fields of the same name")
    return {**tree, **{name: t.get() for name, t in self.extra_trees.items()}}

  def resume_step(self) -> int | None:
    return self.mngr.latest_step()

  def init_params(self, state, path: str, step: int | None):
    """`state` with its params read from `path` (a run's workdir or a HF directory)."""
    from jaxrl_llm.checkpointing.init_params import params_from_checkpoint  # pylint: disable=import-outside-toplevel
    params, source = params_from_checkpoint(path, state.params, self.model_config, step=step)
    self.log(f"init_checkpoint: params from {source}")
    return state.replace(params=params)

  def restore(self, state, restore_data_state: Callable[[dict], None]):
    """(restored state, saved extra JSON); `restore_data_state` gets the data iterator's saved position."""
    r = self.mngr.restore(self._tree(state))
    for step, why in r.skipped:
      self.log(f"checkpoint step {step} is damaged ({why}); used step {r.step} instead")
    fields = dict(r.state)
    for name, t in self.extra_trees.items():
      t.set(fields.pop(name))
    state = state.replace(**fields, data_state=r.data_state)
    restore_data_state(r.data_state)
    self.extra = dict(r.meta.get("extra") or {})
    self.log(f"resumed from checkpoint step {r.step} in {self.mngr.directory}")
    return state, self.extra

  def save(self, state, metrics: dict | None = None) -> None:
    faults.point("checkpoint_write")
    self.mngr.save(int(state.step), self._tree(state), data_state=state.data_state,
                   config=self.run_config, extra=self.extra,
                   metrics=None if metrics is None else json_row(metrics))
    faults.point("checkpoint_save")  # the write may still be in flight (async)

  def on_step(self, state, metrics: dict) -> None:
    """After an RL step: records the step's metrics, saves when due."""
    self.extra.setdefault("history", []).append(json_row(metrics))
    if self.mngr.should_save(int(state.step)):
      self.save(state, metrics)

  def finish(self, state, metrics: dict | None = None) -> None:
    """Saves the final step (unless just saved) and waits for every write."""
    if self.mngr.should_save(int(state.step), final=True):
      self.save(state, metrics)
    self.mngr.close()
