"""One benchmark of scripts/ run as several variants, interleaved, written as JSON: versions of the
package (commits), settings of the benchmark, or both.

    python scripts/bench_compare.py --out cmp.json --rounds 3 --key ours.tokens_per_s \\
        --variant before=b095d40 --variant after=. \\
        -- bench_sampler.py --skip hf_transformers no_cache --rounds 1

    python scripts/bench_compare.py --out share.json --rounds 2 --key ours.seconds_per_step_median \\
        --variant off=.:--share-prompt=off --variant auto=.:--share-prompt=auto -- bench_rl_step.py --skip trl --rounds 1

With --script-from-here every variant runs this tree's copy of the script (a benchmark newer than
the commits it compares, e.g. bench_train_run.py against a968da1).

A variant is NAME=REV[:ARGS]: REV a commit, checked out into a temporary git worktree, or "." for
this working tree (committed or not); ARGS (space-separated) go after the benchmark's own. Each
round runs every variant once, each its own copy of the script importing its own package
(PYTHONPATH), in a fresh process; the order rotates by round, so a stretch of outside load hurts
one round of each. Reported per variant and --key (a dotted path into the script's JSON): every
round's value, the median, the spread (max - min), each median over the first variant's, and the
load averages around every run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import load  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def git(*args) -> str:
  return subprocess.run(["git", "-C", REPO, *args], check=True, capture_output=True, text=True).stdout.strip()


def checkout(rev: str, where: str) -> str:
  """A worktree of `rev` at `where`, its top-level kernels/ importable as jaxrl_llm.kernels (as the
  installed package maps it)."""
  git("worktree", "add", "--detach", "-f", where, rev)
  link = os.path.join(where, "jaxrl_llm", "kernels")
  if not os.path.exists(link):
    os.symlink(os.path.join("..", "kernels"), link)
  return where


def dig(tree: dict, dotted: str):
  for part in dotted.split("."):
    tree = tree[part]
  return tree


def parse_variant(text: str) -> tuple[str, str, list[str]]:
  name, sep, rest = text.partition("=")
  if not sep or not name or not rest:
    raise SystemExit(f"--variant {text!r}: expected NAME=REV[:ARGS]")
  rev, _, args = rest.partition(":")
  return name, rev, args.split()


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", required=True, help="JSON file to write")
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--variant", action="append", required=True, help="NAME=REV[:ARGS] (REV '.': this tree)")
  parser.add_argument("--key", action="append", required=True, help="dotted path of a figure to compare")
  parser.add_argument("--timeout", type=float, default=3600.0, help="seconds one run may take")
  parser.add_argument("--script-from-here", action="store_true",
                      help="run this tree's copy of the benchmark script for every variant (each still imports "
                           "its own package): for a script the older commits lack")
  parser.add_argument("bench", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS...]")
  args = parser.parse_args()
  bench = args.bench[1:] if args.bench[:1] == ["--"] else args.bench
  if not bench or not os.path.exists(os.path.join(REPO, "scripts", bench[0])):
    parser.error(f"bench: expected a script of scripts/ after --, got {bench}")
  variants = [parse_variant(v) for v in args.variant]
  if len({name for name, _, _ in variants}) != len(variants):
    parser.error("--variant: names must differ")

  head = git("rev-parse", "HEAD")
  dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
  with tempfile.TemporaryDirectory() as tmp:
    roots, described, made = {}, {}, []
    for name, rev, extra in variants:
      if rev == ".":
        roots[name] = REPO
        described[name] = {"rev": head + (" + uncommitted changes" if dirty else ""), "args": extra}
      else:
        full = git("rev-parse", rev)
        roots[name] = checkout(full, os.path.join(tmp, name))
        made.append(roots[name])
        described[name] = {"rev": full, "args": extra}
    runs: dict[str, list[dict]] = {name: [] for name, _, _ in variants}
    try:
      for r in range(args.rounds):
        order = variants[r % len(variants):] + variants[:r % len(variants)]
        for name, _, extra in order:
          root = roots[name]
          out = os.path.join(tmp, f"{name}_{r}.json")
          before = load()
          script = os.path.join(REPO if args.script_from_here else root, "scripts", bench[0])
          proc = subprocess.run([sys.executable, script, *bench[1:], *extra,
                                 "--out", out], cwd=root, env=dict(os.environ, PYTHONPATH=root),
                                capture_output=True, text=True, timeout=args.timeout)
          if proc.returncode:
            raise SystemExit(f"{name} round {r} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
          result = json.load(open(out))
          runs[name].append({"values": {k: dig(result, k) for k in args.key}, "load_before": before,
                             "load_after": load(), "result": result})
          print(f"round {r} {name}", runs[name][-1]["values"], before["loadavg"], flush=True)
    finally:
      for root in made:
        subprocess.run(["git", "-C", REPO, "worktree", "remove", "--force", root], capture_output=True)

  first = variants[0][0]
  summary = {}
  for key in args.key:
    summary[key] = {}
    for name, rs in runs.items():
      values = [x["values"][key] for x in rs]
      summary[key][name] = {"by_round": values, "median": statistics.median(values),
                            "spread": max(values) - min(values)}
    for name in runs:
      summary[key][name][f"median_over_{first}"] = summary[key][name]["median"] / summary[key][first]["median"]
  results = {"bench": bench, "variants": described, "rounds": args.rounds, "summary": summary, "runs": runs,
             "machine": {"cpu_count": os.cpu_count(), "end": load()}}
  with open(args.out, "w") as f:
    json.dump(results, f, indent=2)
  print(json.dumps(summary, indent=2))


if __name__ == "__main__":
  main()
