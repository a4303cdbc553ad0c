"""What every run does around its steps: the RL trainer's (training/loop.py) and the reward-model
run's (reward_model/trainer.py).

`RunShell` owns the workdir (a file there is refused), its config record
(checkpointing/provenance.py: a resume with another config is refused or
recorded), the checkpoints and exact resume (checkpointing/run.py's
`RunCheckpoints`, made by `open`), and `steps`: the loop over a run's steps
with the evaluation cadence, the metrics file (rundir/metrics.py, written by
process 0), the checkpoints' save point after every step, and a graceful stop on SIGTERM
(the step in progress finishes and is saved; `Stopped` is raised) or after a
given number of steps (tests of resume). What a step is, and what a run
does before and after its steps, stays with the run.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable
from typing import Any

import jax

from jaxrl_llm.checkpointing import provenance
from jaxrl_llm.checkpointing.run import RunCheckpoints
from jaxrl_llm.checks import ConfigError
from jaxrl_llm.model import distributed
from jaxrl_llm.rundir.metrics import MetricsWriter


class Stopped(Exception):
  """SIGTERM reached the run: the step in progress finished and was saved; rerun to resume."""

  def __init__(self, step: int):
    super().__init__(f"stopped by SIGTERM after step {step}, which is saved: rerun the same command to resume")
    self.step = step


class StopRequest:
  """Turns SIGTERM into a request the loop reads between steps (main thread only), in a run of one process.

  `poll()` is called once per step: whether to stop after it."""

  def __init__(self):
    self.requested, self._old = False, None

  def install(self) -> None:
    try:
      self._old = signal.signal(signal.SIGTERM, self._on_term)
    except ValueError:  # not the main thread: no graceful stop
      self._old = None

  def _on_term(self, signum, frame):
    del signum, frame
    self.requested = True

  def poll(self) -> bool:
    return self.requested

  def restore(self) -> None:
    if self._old is not None:
      signal.signal(signal.SIGTERM, self._old)


class AgreedStop:
  """The stop of a run of several processes: SIGTERM to any of them stops them all after the same step.

  Each process deciding alone would stop one after step s while another runs step s + 1 into
  collectives nobody answers. `jax.distributed.initialize` installs JAX's preemption notifier: a
  SIGTERM to any process is posted to the coordination service, and the processes agree on the
  first check past the fastest one's (`multihost_utils.reached_preemption_sync_point`). The checks
  are numbered per process from 1 and every process checks once per step, so the number is the
  same everywhere; a SIGTERM before the first check (the warm start, the start evaluation) stops
  the run after its first step, which saves the warm-started state. A Python handler is not
  installed: it would replace JAX's notifier."""

  _checks = 0  # per process, over every loop it runs: the protocol wants increasing numbers

  def install(self) -> None:  # the preemption service is checked when the run joins (model/distributed.py)
    pass

  def poll(self) -> bool:
    from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel

    AgreedStop._checks += 1
    return bool(multihost_utils.reached_preemption_sync_point(AgreedStop._checks))

  def restore(self) -> None:
    pass


class RunShell:
  """One run's workdir, config record, checkpoints and step loop (the module docstring).

  cfg: the run's config (saved as config.json); checkpoint_cfg: its `checkpoint` section;
  defaults: the config kind's flattened defaults, for the config record (`record_config`).
  """

  def __init__(self, workdir: str, cfg, *, checkpoint_cfg, log: Callable[[str], None], allow_config_change: bool,
               defaults: Callable[[], dict]):
    self.workdir, self.cfg, self.checkpoint_cfg, self.log = workdir, cfg, checkpoint_cfg, log
    self.allow_config_change, self.defaults = allow_config_change, defaults
    self.ckpt: RunCheckpoints | None = None

  def check_workdir(self, what: str) -> None:
    """Refuse a workdir that is a file (`what`: the directory a resume expects there)."""
    if os.path.exists(self.workdir) and not os.path.isdir(self.workdir):
      raise ConfigError(f"workdir {self.workdir!r} is a file: expected a directory (new, or {what})")

  def open(self, model_cfg) -> tuple[RunCheckpoints, bool]:
    """Make the workdir, its checkpoints and its config record -> (checkpoints, whether the run resumes)."""
    os.makedirs(self.workdir, exist_ok=True)
    self.ckpt = ckpt = RunCheckpoints(self.workdir, self.checkpoint_cfg, run_config=self.cfg, model_config=model_cfg,
                                      log=self.log)
    resuming = ckpt.resume_step() is not None
    provenance.record_config(self.workdir, self.cfg, resuming=resuming, allow_change=self.allow_config_change,
                             log=self.log, defaults=self.defaults)
    return ckpt, resuming

  def steps(self, state, *, total: int, step_fn: Callable[[Any], tuple[Any, dict]],
            evaluate: Callable[[Any], dict], eval_every: int, eval_last: bool, log_every: int,
            after_step: Callable[[Any, dict, bool], None] = lambda state, metrics, written: None,
            stop_after: int | None = None) -> tuple[Any, int | None]:
    """The steps from `state.step` to `total` -> (state, the step a `stop_after` stop saved, else None).

    Each step: `step_fn(state) -> (state, metrics)`; the held-out `evaluate(state)` every `eval_every`
    steps (and after the last with `eval_last`) as `eval/*` metrics; a metrics row every `log_every`
    steps, after the last and after an evaluation; `after_step(state, metrics, written)`; the
    checkpoint's save point (`RunCheckpoints.on_step`: a save at the checkpoint's cadence). SIGTERM:
    the step in progress finishes, is saved, and `Stopped` is raised. When the loop ends, whether or
    not it raised, the SIGTERM handler is put back, the metrics file closes and a save in flight
    completes, each even when another of them fails.
    """
    ckpt = self.ckpt
    stopped = None
    with contextlib.ExitStack() as stack:  # its callbacks run last first, each whatever the others do
      stack.callback(ckpt.mngr.wait)  # a save in flight completes even when a step raised
      writer = MetricsWriter(self.workdir, start_step=int(state.step)) if distributed.is_primary() else None
      if writer is not None:
        stack.callback(writer.close)
      stop = AgreedStop() if jax.process_count() > 1 else StopRequest()
      stop.install()
      stack.callback(stop.restore)
      for i, _ in enumerate(range(int(state.step), total)):
        state, metrics = step_fn(state)
        step = int(state.step)
        evaluated = bool(eval_every and step % eval_every == 0 and step < total) or (eval_last and step == total)
        if evaluated:
          metrics.update({f"eval/{k}": v for k, v in evaluate(state).items()})
        written = step % log_every == 0 or step == total or evaluated
        if writer is not None and written:
          writer.write(step, metrics)
        after_step(state, metrics, written)
        # -- checkpoint save point: the complete state after each step.
        ckpt.on_step(state, metrics)
        requested = stop.poll()  # every step, in every process (AgreedStop's checks are numbered)
        if (requested or stop_after is not None and i + 1 >= stop_after) and step < total:
          if ckpt.mngr.should_save(step, final=True):
            ckpt.save(state, metrics)
          if requested:  # a graceful stop: this step is kept
            self.log(f"SIGTERM: stopping after step {step} (saved)")
            raise Stopped(step)
          stopped = step
          break
    return state, stopped
