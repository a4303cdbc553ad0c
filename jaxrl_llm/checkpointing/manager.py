"""Checkpoint manager over Orbax: everything needed to resume a run exactly.

One step directory holds three items:
  state: the array pytree the trainer hands over (params, optimizer state,
    PRNG key, the sampler-lag buffer of past params, ...), via StandardSave;
  data:  the data iterator's state (grain's `get_state()` dict), via JsonSave;
  meta:  step, resolved run config, model config, extra JSON, via JsonSave.

Saves are atomic (Orbax writes to a temporary directory and renames it once
complete; stale temporaries are removed when the manager opens) and async when
configured. Each committed step gets a manifest of file sizes and CRC32s
(manifest.py); restore checks it and falls back to the previous step when a
step is damaged, reporting what it skipped.
"""

import dataclasses
import json
import os
from typing import Any, Mapping

from absl import logging
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as ocp_managers

from jaxrl_llm.checkpointing import manifest as manifest_lib
from jaxrl_llm.model import distributed
from jaxrl_llm.checkpointing import pytree_io
from jaxrl_llm.checkpointing.config import CheckpointConfig
from jaxrl_llm.checkpointing.errors import (
    CorruptCheckpointError,
    IncompatibleCheckpointError,
    NoCheckpointError,
    StepNotFoundError,
)

PyTree = Any

# Model-config fields that change neither the parameters nor the function
# they compute, so a checkpoint may be restored across them (attention_impl:
# the same attention by another kernel; a workdir from before it has none).
RUNTIME_MODEL_FIELDS = frozenset({"remat", "compute_dtype", "init_std", "max_position", "attention_impl"})


def to_jsonable(obj: Any) -> Any:
  """Dataclasses, ConfigDicts and mappings -> plain JSON values (dtypes as str)."""
  if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
    obj = dataclasses.asdict(obj)
  elif hasattr(obj, "to_dict"):
    obj = obj.to_dict()
  return json.loads(json.dumps(obj, default=str))


@dataclasses.dataclass(frozen=True)
class Restored:
  """What `restore` returns.

  skipped: (step, reason) for each newer step that was damaged and passed over.
  """

  step: int
  state: PyTree
  data_state: Any
  meta: dict
  skipped: tuple[tuple[int, str], ...] = ()


class CheckpointManager:
  """Saves and restores training state under `directory` (workdir/checkpoints).

  model_config: the run's model config (dataclass or dict); stored at save and
  compared at restore, so a checkpoint of another model is refused with the
  differing fields named.
  """

  def __init__(self, directory: str, cfg: CheckpointConfig = CheckpointConfig(), *,
               model_config: Any = None, read_only: bool = False):
    self.directory = os.path.abspath(directory)
    self.cfg = cfg
    self.model_config = None if model_config is None else to_jsonable(model_config)
    if read_only and not os.path.isdir(self.directory):
      raise NoCheckpointError(
          f"no checkpoint directory at {self.directory}: expected the "
          "'checkpoints' folder of a workdir written by a training run")
    policies = [ocp_managers.LatestN(n=cfg.keep_last)]
    if cfg.keep_best:
      metric = cfg.best_metric
      policies.append(ocp_managers.BestN(
          get_metric_fn=lambda m: m[metric], n=cfg.keep_best,
          reverse=cfg.best_mode == "min", keep_checkpoints_without_metrics=False))
    options = ocp.CheckpointManagerOptions(
        preservation_policy=ocp_managers.AnyPreservationPolicy(policies),
        enable_async_checkpointing=cfg.async_save,
        save_interval_steps=0 if read_only else 1,  # (saves are decided by should_save)
        cleanup_tmp_directories=not read_only,
        read_only=read_only,
        create=not read_only,
    )
    self._mngr = ocp.CheckpointManager(
        self.directory, options=options,
        item_handlers={"state": ocp.StandardCheckpointHandler(),
                       "data": ocp.JsonCheckpointHandler(),
                       "meta": ocp.JsonCheckpointHandler()})
    self._unmanifested: list[int] = []

  # ----------------------------------------------------------------- listing

  def all_steps(self) -> list[int]:
    return sorted(self._mngr.all_steps())

  def latest_step(self) -> int | None:
    steps = self.all_steps()
    return steps[-1] if steps else None

  def step_dir(self, step: int) -> str:
    return os.path.join(self.directory, str(step))

  def should_save(self, step: int, *, final: bool = False) -> bool:
    """True at every `every_steps` steps and at the final step, unless saved."""
    if step in self._mngr.all_steps():
      return False
    return final or (self.cfg.every_steps > 0 and step % self.cfg.every_steps == 0)

  # ------------------------------------------------------------------ saving

  def save(self, step: int, state: PyTree, *, data_state: Any = None,
           config: Any = None, extra: Mapping[str, Any] | None = None,
           metrics: Mapping[str, float] | None = None) -> None:
    """Starts saving `state` at `step` (returns before the write ends if async).

    data_state: JSON-serialisable iterator state (e.g. grain's get_state()).
    metrics: the step's metrics; only `best_metric` is kept, to rank steps.
    """
    # Orbax waits for the previous async save inside save(); do it first so
    # that the previous step, now committed, gets its manifest.
    self.wait()
    meta = {"step": int(step), "config": to_jsonable(config),
            "model_config": self.model_config, "extra": to_jsonable(dict(extra or {}))}
    best = None
    if metrics is not None and self.cfg.keep_best and self.cfg.best_metric in metrics:
      best = {self.cfg.best_metric: float(metrics[self.cfg.best_metric])}
    self._mngr.save(
        step,
        args=ocp.args.Composite(
            state=ocp.args.StandardSave(pytree_io.keys_to_data(state)),
            data=ocp.args.JsonSave(to_jsonable(data_state)),
            meta=ocp.args.JsonSave(meta)),
        metrics=best, force=True)
    self._unmanifested.append(int(step))

  def wait(self) -> None:
    """Blocks until pending saves are committed, then writes their manifests."""
    self._mngr.wait_until_finished()
    kept = set(self._mngr.all_steps())
    for step in self._unmanifested:
      if step in kept and os.path.isdir(self.step_dir(step)) and distributed.is_primary():
        manifest_lib.write_manifest(self.step_dir(step))
    if self._unmanifested:
      distributed.barrier("checkpoint_manifests")  # written (by process 0) before any process reads them
    self._unmanifested = []

  def close(self) -> None:
    self.wait()
    self._mngr.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

  # --------------------------------------------------------------- restoring

  def restore_meta(self, step: int) -> dict:
    """The meta item (step, config, model_config, extra) of a saved step."""
    self._require_step(step)
    return dict(self._mngr.restore(
        step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"])

  def saved_keys(self, step: int) -> list[str]:
    """The top-level fields of step `step`'s saved state, read from its metadata (no arrays)."""
    self._require_step(step)
    tree = self._mngr.item_metadata(step)["state"]
    tree = getattr(tree, "tree", tree)
    return sorted(tree) if isinstance(tree, dict) else []

  def restore(self, target: PyTree, step: int | None = None) -> Restored:
    """Restores `step`, or the newest intact step when step is None.

    target: a pytree like the saved state (arrays or ShapeDtypeStructs with
    shardings; typed PRNG keys where keys were saved).
    """
    return self._with_fallback(lambda s, skipped: self._restore_one(target, s, skipped), step)

  def restore_subtree(self, key: str, target: PyTree, step: int | None = None
                      ) -> tuple[int, PyTree]:
    """(step, state[key]) only, e.g. the params of a run to initialise another.

    Reads only that part of the saved state, into target's shardings.
    """
    return self._with_fallback(
        lambda s, _: (s, self._restore_subtree_one(key, target, s)), step)

  def _with_fallback(self, restore_fn, step):
    """Runs restore_fn(step, skipped) on `step`, or on the newest step that is
    intact (manifest matches and Orbax reads it), reporting the steps skipped."""
    if step is not None:
      self._require_step(step)
      problems = manifest_lib.verify_manifest(self.step_dir(step))
      if problems:
        raise CorruptCheckpointError(
            f"checkpoint step {step} in {self.directory} is damaged: "
            + "; ".join(problems[:5]))
      return restore_fn(step, ())
    steps = self.all_steps()
    if not steps:
      raise NoCheckpointError(
          f"no checkpoint in {self.directory}: expected step directories "
          "written by a training run (is this the right workdir?)")
    skipped = []
    for s in reversed(steps):
      problems = manifest_lib.verify_manifest(self.step_dir(s))
      if not problems:
        try:
          return restore_fn(s, tuple(skipped))
        except IncompatibleCheckpointError:
          raise
        except Exception as e:  # pylint: disable=broad-except
          problems = [f"{type(e).__name__}: {e}"]
      reason = "; ".join(problems[:5])
      logging.warning("checkpoint step %d in %s is damaged (%s); trying the "
                      "previous one", s, self.directory, reason)
      skipped.append((s, reason))
    raise CorruptCheckpointError(
        f"every checkpoint in {self.directory} is damaged: "
        + "; ".join(f"step {s}: {r}" for s, r in skipped))

  def _require_step(self, step: int) -> None:
    steps = self.all_steps()
    if step not in steps:
      raise StepNotFoundError(
          f"step {step} is not saved in {self.directory}; saved steps: "
          f"{steps if steps else 'none'}")

  def _check_model_config(self, meta: dict, step: int) -> None:
    found = meta.get("model_config")
    if self.model_config is None or found is None:
      return
    diffs = [
        f"{k}: expected {self.model_config.get(k)!r}, found {found.get(k)!r}"
        for k in sorted(set(self.model_config) | set(found))
        if k not in RUNTIME_MODEL_FIELDS and self.model_config.get(k) != found.get(k)
    ]
    if diffs:
      raise IncompatibleCheckpointError(
          f"checkpoint step {step} in {self.directory} was saved for another "
          "model config: " + "; ".join(diffs))

  def _restore_one(self, target: PyTree, step: int, skipped) -> Restored:
    meta = self.restore_meta(step)
    self._check_model_config(meta, step)
    abstract = pytree_io.abstract_target(target)
    saved_tree = self._mngr.item_metadata(step)["state"]
    saved_tree = getattr(saved_tree, "tree", saved_tree)
    try:
      pytree_io.check_compatible(saved_tree, abstract, f"checkpoint step {step}")
    except ValueError as e:
      raise IncompatibleCheckpointError(str(e)) from None
    out = self._mngr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract),
        data=ocp.args.JsonRestore(), meta=ocp.args.JsonRestore()))
    state = pytree_io.data_to_keys(out["state"], target)
    return Restored(step=step, state=state, data_state=out["data"], meta=meta,
                    skipped=skipped)

  def _restore_subtree_one(self, key: str, target: PyTree, step: int) -> PyTree:
    meta = self.restore_meta(step)
    self._check_model_config(meta, step)
    saved_tree = self._mngr.item_metadata(step)["state"]
    saved_tree = getattr(saved_tree, "tree", saved_tree)
    if not isinstance(saved_tree, dict) or key not in saved_tree:
      found = sorted(saved_tree) if isinstance(saved_tree, dict) else type(saved_tree).__name__
      raise IncompatibleCheckpointError(
          f"checkpoint step {step} in {self.directory} has no '{key}' in its "
          f"state; found {found}")
    abstract = {key: pytree_io.abstract_target(target)}
    try:
      pytree_io.check_compatible({key: saved_tree[key]}, abstract, f"checkpoint step {step}")
    except ValueError as e:
      raise IncompatibleCheckpointError(str(e)) from None
    restore_args = ocp.checkpoint_utils.construct_restore_args(abstract)
    out = ocp.PyTreeCheckpointer().restore(
        os.path.join(self.step_dir(step), "state"),
        args=ocp.args.PyTreeRestore(item=abstract, restore_args=restore_args,
                                    partial_restore=True))
    return pytree_io.data_to_keys(out[key], target)
