"""`python -m jaxrl_llm.lab`: the method x mismatch x seed grid (docs/lab.md).

    python -m jaxrl_llm.lab --methods=grpo,token_tis,icepop,icepop@band_high=2 \\
        --mismatch=none,int4,noise:0.2 --seeds=3 --steps=60 --out=runs/lab [--jobs=2] \\
        [--config=BASE.py] [--config.key=value ...]

A user's mistake (an unknown method, a bad mismatch token, a settings change
in a used --out) ends with one `error:` line and exit status 2; failed cells
end the sweep with status 1 once every other cell ran.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
import time

from jaxrl_llm.checks import ConfigError, check_float, check_int
from jaxrl_llm.cli import EXIT_USER_ERROR
from jaxrl_llm.lab import grid, plots, results, runner

DEFAULT_TARGET_REWARD = 0.8
DEFAULT_COLLAPSE_DROP = 0.2
DEFAULT_KL_BOUND = 1.0
DEFAULT_SMOOTH = 5
EVAL_POINTS = 4  # evaluations during a cell when --eval-every is 0 (besides the start and the end)


class _Parser(argparse.ArgumentParser):
  def error(self, message):  # one line and status 2, like every entry point's user errors
    raise ConfigError(message)


def _parser() -> argparse.ArgumentParser:
  p = _Parser(prog="python -m jaxrl_llm.lab", allow_abbrev=False,
              description="Runs methods x sampler mismatches x seeds from one warm start per seed; writes "
                          "results.json, results.md and plots in --out. Extra --config.key=value flags apply "
                          "to every run.")
  p.add_argument("--methods", required=True, help="comma-separated presets (configs/*.py), each optionally "
                 "with @knob=value changes: grpo,icepop,icepop@band_high=2")
  p.add_argument("--mismatch", required=True, help=f"comma-separated mismatch settings: {grid.MISMATCH_FORMS}")
  p.add_argument("--seeds", default="1", help="N (seeds 0..N-1) or a list 0,3,7 (default 1)")
  p.add_argument("--steps", required=True, type=int, help="RL steps per cell (config.train.steps)")
  p.add_argument("--out", required=True, help="the sweep's folder (reused: finished cells are skipped)")
  p.add_argument("--jobs", type=int, default=1, help="runs at a time (default 1)")
  p.add_argument("--config", default="", help="base config file; its changes from configs/<its method>.py "
                 "(outside the objective) apply to every run")
  p.add_argument("--configs-dir", "--configs_dir", dest="configs_dir", default=grid.default_configs_dir(),
                 help="folder of the method presets (default: the repository's configs/)")
  p.add_argument("--eval-every", "--eval_every", dest="eval_every", type=int, default=0,
                 help=f"held-out evaluation every this many steps; 0: steps / {EVAL_POINTS}")
  p.add_argument("--target-reward", "--target_reward", dest="target_reward", type=float,
                 default=DEFAULT_TARGET_REWARD, help="reward for steps-to-target (default %(default)s)")
  p.add_argument("--collapse-drop", "--collapse_drop", dest="collapse_drop", type=float,
                 default=DEFAULT_COLLAPSE_DROP, help="reward fall below its running best counted as a collapse "
                 "(default %(default)s)")
  p.add_argument("--kl-bound", "--kl_bound", dest="kl_bound", type=float, default=DEFAULT_KL_BOUND,
                 help="kl/ref (KL to the warm start, nats/token, smoothed like the reward) counted as a "
                 "collapse (default %(default)s)")
  p.add_argument("--smooth", type=int, default=DEFAULT_SMOOTH, help="trailing-mean window of the reward and KL "
                 "curves for target, collapse and plots (default %(default)s)")
  p.add_argument("--retry-failed", "--retry_failed", dest="retry_failed", action="store_true",
                 help="rerun cells recorded as failed (default: keep their record)")
  p.add_argument("--no-compile-cache", "--no_compile_cache", dest="compile_cache", action="store_false",
                 help="do not share a JAX compilation cache (<out>/compile_cache) between the runs")
  return p


def _split(text: str) -> list[str]:
  return [t for t in (s.strip() for s in text.split(",")) if t]


class Lab:
  """The sweep of one command: its grid, runs, and results."""

  def __init__(self, args, overrides: dict[str, str], argv: list[str]):
    self.args, self.argv = args, argv
    presets = grid.preset_names(args.configs_dir)
    self.methods = [grid.parse_method(m, presets) for m in _split(args.methods)]
    self.mismatches = [grid.parse_mismatch(x) for x in _split(args.mismatch)]
    if not self.methods or not self.mismatches:
      raise ConfigError("--methods and --mismatch each need at least one entry")
    self.seeds = grid.parse_seeds(args.seeds)
    check_int("--steps", args.steps, 1)
    check_int("--eval-every", args.eval_every, 0)
    check_int("--smooth", args.smooth, 1)
    runner.check_jobs(args.jobs)
    check_float("--collapse-drop", args.collapse_drop, 0.0, low_open=True)
    check_float("--kl-bound", args.kl_bound, 0.0, low_open=True)
    check_float("--target-reward", args.target_reward)
    self.cells = grid.make_cells(self.methods, self.mismatches, self.seeds)
    self.out = os.path.abspath(args.out)
    self.warm_preset = grid.WARM_START_PRESET
    base = {}
    if args.config:
      self.warm_preset, base = grid.base_overrides(args.config, args.configs_dir)
    self.common = {**base, **overrides}  # every run: the base file's changes, then the command line's
    self.eval_every = args.eval_every or max(1, round(args.steps / EVAL_POINTS))
    self.criteria = results.Criteria(target=args.target_reward, drop=args.collapse_drop, kl_bound=args.kl_bound,
                                     smooth=args.smooth)

  # ---- the runs ---------------------------------------------------------------------
  def _preset_path(self, name: str) -> str:
    return os.path.join(os.path.abspath(self.args.configs_dir), f"{name}.py")

  def _spec(self, preset: str, flags: dict[str, str]) -> dict:
    neutral = {k: v for k, v in flags.items() if k != "init_checkpoint"}  # the folder may move
    return {"preset": preset, "preset_sha": grid.file_sha(self._preset_path(preset)),
            **{f"config.{k}": v for k, v in neutral.items()}}

  def warm_start_dir(self, seed: int) -> str:
    return os.path.join(self.out, "warm_start", f"s{seed}")

  def warm_start_job(self, seed: int) -> runner.Job:
    """SFT only (train.steps = 0): the saved params every cell of this seed starts from."""
    flags = {**self.common, "seed": str(seed), "train.steps": "0", "log.progress": "false"}
    wd = self.warm_start_dir(seed)
    return runner.Job(name=f"warm_start/s{seed}", workdir=wd, spec=self._spec(self.warm_preset, flags),
                      argv=runner.trainer_argv(self._preset_path(self.warm_preset), wd, flags))

  def cell_dir(self, cell: grid.Cell) -> str:
    return os.path.join(self.out, "cells", cell.name)

  def cell_flags(self, cell: grid.Cell) -> dict[str, str]:
    """The cell's config keys: the common ones, its method's, its mismatch's, then the lab's."""
    return {**self.common, **dict(cell.method.overrides), **dict(cell.mismatch.settings),
            "seed": str(cell.seed), "init_checkpoint": self.warm_start_dir(cell.seed), "sft.steps": "0",
            "train.steps": str(self.args.steps), "eval.every": str(self.eval_every), "log.every": "1",
            "log.progress": "false"}

  def cell_job(self, cell: grid.Cell) -> runner.Job:
    flags = self.cell_flags(cell)
    wd = self.cell_dir(cell)
    return runner.Job(name=cell.name, workdir=wd, spec=self._spec(cell.method.preset, flags),
                      argv=runner.trainer_argv(self._preset_path(cell.method.preset), wd, flags),
                      after=f"warm_start/s{cell.seed}")

  def run(self) -> int:
    lab = runner.Runner(self.out, self.args.jobs, env=runner.child_env(self.out, self.args.compile_cache),
                        retry_failed=self.args.retry_failed)
    lab.lock()
    jobs = [self.warm_start_job(s) for s in self.seeds] + [self.cell_job(c) for c in self.cells]
    todo = lab.plan(jobs)
    skipped = len(jobs) - len(todo)
    lab.event("sweep", "", argv=self.argv, runs=len(jobs), to_run=len(todo))
    print(f"lab: {len(self.cells)} cells ({len(self.methods)} methods x {len(self.mismatches)} mismatch x "
          f"{len(self.seeds)} seeds) + {len(self.seeds)} warm starts in {self.out}: {len(todo)} to run, "
          f"{skipped} already recorded", flush=True)
    _term_as_interrupt()
    try:
      lab.run(todo)
    finally:
      out = self.write_results()
    counts = out["counts"]
    print(f"lab: {counts['done']} done, {counts['failed']} failed, {counts['missing']} not run -> "
          f"{os.path.join(self.out, 'results.md')}", flush=True)
    return 0 if counts["done"] == len(self.cells) else 1

  # ---- the results --------------------------------------------------------------------
  def write_results(self) -> dict:
    cells, warm = [], {}
    for s in self.seeds:
      st = runner.read_status(self.warm_start_dir(s)) or {}
      warm[f"s{s}"] = {"status": st.get("status", "missing"), "fingerprint": st.get("fingerprint"),
                       "error": st.get("error")}
    for cell in self.cells:
      st = runner.read_status(self.cell_dir(cell)) or {}
      entry = {"name": cell.name, "method": cell.method.label, "preset": cell.method.preset,
               "mismatch": cell.mismatch.label, "seed": cell.seed, "status": st.get("status", "missing"),
               "workdir": os.path.relpath(self.cell_dir(cell), self.out),
               "overrides": {f"config.{k}": v for k, v in self.cell_flags(cell).items()},
               "warm_start": st.get("warm_start"), "wall_s": st.get("wall_s")}
      if entry["status"] == "done":
        try:
          entry["numbers"] = results.cell_numbers(self.cell_dir(cell), self.criteria)
          with open(os.path.join(self.cell_dir(cell), "summary.json")) as f:
            entry["summary"] = json.load(f)
        except (OSError, ValueError, KeyError) as e:  # a done cell whose files were removed or damaged since
          entry.update(status="failed", error=f"results unreadable: {type(e).__name__}: {e}", returncode=None)
      elif entry["status"] == "failed":
        entry["error"], entry["returncode"] = st.get("error"), st.get("returncode")
      cells.append(entry)
    groups = [{"method": m.label, "mismatch": x.label,
               "aggregate": results.aggregate_seeds([c for c in cells if c["method"] == m.label and c["mismatch"] == x.label])}
              for m in self.methods for x in self.mismatches]
    counts = {k: sum(c["status"] == k for c in cells) for k in ("done", "failed", "missing")}
    out = {"out": self.out, "command": "python -m jaxrl_llm.lab " + shlex.join(self.argv),
           "methods": [m.label for m in self.methods], "mismatches": [x.label for x in self.mismatches],
           "seeds": list(self.seeds), "steps": self.args.steps, "eval_every": self.eval_every,
           "criteria": {"target": self.criteria.target, "drop": self.criteria.drop,
                        "kl_bound": self.criteria.kl_bound, "smooth": self.criteria.smooth},
           "common_overrides": self.common, "warm_starts": warm, "counts": counts, "groups": groups, "cells": cells,
           "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    out["plots"] = {"heatmap": "heatmap.png",
                    "curves": [os.path.basename(p) for p in plots.curves(out, self.out, self.criteria.smooth)]}
    plots.heatmap(out, os.path.join(self.out, "heatmap.png"))
    _atomic_write(os.path.join(self.out, "results.json"), json.dumps(out, indent=1))
    _atomic_write(os.path.join(self.out, "results.md"), results.markdown(out))
    return out


def _atomic_write(path: str, text: str) -> None:
  tmp = f"{path}.tmp"
  with open(tmp, "w") as f:
    f.write(text)
  os.replace(tmp, path)


def _term_as_interrupt() -> None:
  """SIGTERM ends the sweep like Ctrl-C: running cells get SIGTERM (the trainer saves its step)."""
  def handler(signum, frame):
    del signum, frame
    raise KeyboardInterrupt
  signal.signal(signal.SIGTERM, handler)


def main(argv: list[str]) -> int:
  try:
    # The lab runs its cells as processes of their own (one host's grid); launched as a multi-process
    # run (model/distributed.py's variables) it would start every cell once per process.
    n = os.environ.get("JAX_NUM_PROCESSES", "")
    if n.strip() not in ("", "0", "1"):
      raise ConfigError(f"python -m jaxrl_llm.lab runs as one process (its cells are processes of their own); "
                        f"JAX_NUM_PROCESSES={n} asks for a multi-process run: unset it (a cell's own run may be "
                        "multi-process: docs/scaling.md)")
    args, extra = _parser().parse_known_args(argv)
    lab = Lab(args, grid.parse_overrides(extra), argv)
    return lab.run()
  except (ConfigError, runner.LabError) as e:
    print(f"error: {e}", file=sys.stderr)
    return EXIT_USER_ERROR
  except KeyboardInterrupt:
    print("lab: interrupted; rerun the same command to finish the missing cells", file=sys.stderr)
    return 128 + signal.SIGTERM


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
