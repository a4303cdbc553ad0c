"""One whole training run from the command line, timed and measured, as JSON.

    python scripts/bench_train_run.py --out run.json [--config configs/gspo.py] [--set train.steps=20 ...]

Runs `python -m jaxrl_llm.train --config=CONFIG --workdir=<temp> --config.log.progress=False
[--config.KEY=VALUE for each --set]` in a child process (the package on this process's
PYTHONPATH: scripts/bench_compare.py --script-from-here runs it against other commits' packages) and
reports its wall seconds, its peak RSS (the child's ru_maxrss), the median seconds per RL step after
the first (`time/step_s` of metrics.jsonl), the median `time/update_s` and `time/recompute_s`, the
run's summary (held-out accuracy before and after) and the load around it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import load  # noqa: E402


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--out", required=True)
  parser.add_argument("--config", default="configs/gspo.py")
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="a config override (without the --config. prefix)")
  parser.add_argument("--timeout", type=float, default=3600.0)
  args = parser.parse_args()
  for s in args.set:
    if "=" not in s:
      parser.error(f"--set {s!r}: expected KEY=VALUE")
  before = load()
  with tempfile.TemporaryDirectory(prefix="bench_train_run_") as tmp:
    workdir = os.path.join(tmp, "run")
    cmd = [sys.executable, "-m", "jaxrl_llm.train", f"--config={args.config}", f"--workdir={workdir}",
           "--config.log.progress=False", *[f"--config.{s}" for s in args.set]]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
      out, err = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
      proc.kill()
      raise SystemExit(f"bench_train_run: the run took more than --timeout={args.timeout:g} s") from None
    wall = time.perf_counter() - t0
    if proc.returncode:
      raise SystemExit(f"bench_train_run: the run failed (exit {proc.returncode}):\n{err[-4000:]}")
    import resource  # pylint: disable=import-outside-toplevel
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20  # KiB -> GiB (Linux)
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    rl = [r for r in rows if "time/step_s" in r]
    summary = json.load(open(os.path.join(workdir, "summary.json")))

  def median(key):
    vals = [r[key] for r in rl[1:] if key in r]
    return statistics.median(vals) if vals else None

  result = {"command": " ".join(cmd[1:]), "wall_s": wall, "peak_rss_gib": peak, "rl_steps": len(rl),
            "rl_step_s_median": median("time/step_s"), "update_s_median": median("time/update_s"),
            "recompute_s_median": median("time/recompute_s"), "pack_update_frac": median("pack/update_frac"),
            "summary": summary, "stdout_tail": out[-2000:], "load_before": before, "load_after": load()}
  with open(args.out, "w") as f:
    json.dump(result, f, indent=1)
  print(json.dumps({k: v for k, v in result.items() if k not in ("summary", "stdout_tail")}, indent=1))


if __name__ == "__main__":
  main()
