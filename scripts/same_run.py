"""Whether two training runs are the same run: their metrics.jsonl rows compared step by step.

    python scripts/same_run.py RUN_A RUN_B [--out F.json]

Each RUN is a workdir of `python -m jaxrl_llm.train`. The wall-clock fields (time/, perf/, engine's
seconds) are left out. Prints, and writes to --out as JSON: the steps of each run, the metrics equal
bit for bit at every step, those that differ with their largest absolute difference and the first
step where they do, and the held-out accuracy curve of each run (eval/accuracy, and the summary's
start and end). Used to check that a change of how samples are made (e.g. the continuous batcher for
episodes, `rollout.continuous_slots`) leaves the run as it was (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

CLOCK = ("time/", "perf/", "engine/export_s", "engine/reload_s", "engine/sync_s")


def read_rows(workdir: str) -> list[dict]:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(CLOCK)} for line in f if line.strip()]


def compare(a: list[dict], b: list[dict]) -> dict:
  """{steps, equal: [keys], differ: {key: {max_abs, first_step}}, only_a, only_b} over the common steps."""
  by_step_b = {r["step"]: r for r in b}
  keys_a = {k for r in a for k in r}
  keys_b = {k for r in b for k in r}
  differ: dict[str, dict] = {}
  for ra in a:
    rb = by_step_b.get(ra["step"])
    if rb is None:
      continue
    for k in sorted(set(ra) & set(rb)):
      x, y = ra[k], rb[k]
      if x == y:
        continue
      gap = abs(x - y) if isinstance(x, (int, float)) and isinstance(y, (int, float)) else float("inf")
      d = differ.setdefault(k, {"max_abs": 0.0, "first_step": ra["step"]})
      d["max_abs"] = max(d["max_abs"], gap)
  return {"steps": [[r["step"] for r in a], [r["step"] for r in b]],
          "equal": sorted((keys_a & keys_b) - set(differ) - {"step"}), "differ": differ,
          "only_a": sorted(keys_a - keys_b), "only_b": sorted(keys_b - keys_a)}


def accuracy_curve(workdir: str, rows: list[dict]) -> dict:
  curve = {r["step"]: r["eval/accuracy"] for r in rows if "eval/accuracy" in r}
  path = os.path.join(workdir, "summary.json")
  if os.path.exists(path):
    with open(path) as f:
      s = json.load(f)
    curve = {"start": s.get("eval_accuracy_start"), **curve, "end": s.get("eval_accuracy_end")}
  return curve


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("run_a")
  ap.add_argument("run_b")
  ap.add_argument("--out", default="", help="also write the comparison here as JSON")
  args = ap.parse_args(argv)
  for run in (args.run_a, args.run_b):
    if not os.path.isfile(os.path.join(run, "metrics.jsonl")):
      print(f"error: {run}: no metrics.jsonl (a workdir of python -m jaxrl_llm.train)", file=sys.stderr)
      return 2
  a, b = read_rows(args.run_a), read_rows(args.run_b)
  out = compare(a, b)
  out["accuracy"] = [accuracy_curve(args.run_a, a), accuracy_curve(args.run_b, b)]
  print(f"steps: {len(a)} and {len(b)}; equal at every step: {len(out['equal'])} metrics; "
        f"differ: {len(out['differ'])}")
  for k, d in sorted(out["differ"].items()):
    print(f"  {k}: max |a - b| {d['max_abs']:.3g}, first at step {d['first_step']}")
  print(f"accuracy: {out['accuracy'][0]}\n          {out['accuracy'][1]}")
  if args.out:
    with open(args.out, "w") as f:
      json.dump(out, f, indent=2)
  return 0


if __name__ == "__main__":
  sys.exit(main())
