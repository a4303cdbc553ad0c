"""Seconds per RL step with synchronous and asynchronous rollouts (`rollout.overlap`), written as JSON.

    python scripts/bench_async.py --out async_tiny.json                       # built-in sampler, tiny default config
    python scripts/bench_async.py --out async_llama.json --engine openai      # llama.cpp's server, GGUF sync
    python scripts/bench_async.py --out async_smollm2.json --model smollm2    # configs/examples/smollm2_word_problems.py
    python scripts/bench_async.py --out smoke.json --steps 1 --rounds 1 --set rollout.prompts_per_step=8

Both modes run the same config at the same `rollout.staleness` (default 1), so
they compute the same steps (tests/training/test_async_rollout.py checks they
are bit-identical); only when each batch is generated differs. Every (mode,
round) is a fresh process running `Trainer.run` on a temporary workdir:
--warmup-steps steps first (compiles, first calls; reported apart), then
--steps timed steps. Rounds are interleaved and the mode that goes first
alternates, so a stretch of outside load hurts one round of each.

Reported per mode: wall seconds per step (the time between the ends of two
consecutive steps in the run's loop: everything the loop does), best and
median, and the split from each step's metrics, medians over the timed steps:

  sampling_s  time/rollout_s: the engine generating the step's batch
  sync_s      time/sync_s: the engine taking the weights (llama.cpp: GGUF export + restart)
  score_s     time/score_s: the reward
  prep_s      time/recompute_s + time/advantage_s: pi_prox / pi_ref, advantages
  update_s    time/update_s: the optimizer updates
  idle_s      time/idle_s: the step blocked on the background thread (async; 0 synchronously)
  wait_s      time/rollout_wait_s: from asking for the batch to holding it

With async rollouts sampling and sync run in the background, overlapping the
update: the parts then add up to more than the step. The machine's load
averages (what `uptime` prints) are recorded before and after every child.
No check of the numbers is made here: the script measures, a reader judges.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time

from harness import emit, load, spawn

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE_CONFIG = os.path.join(REPO, "configs", "examples", "smollm2_word_problems.py")
LLAMA_SERVER = os.path.expanduser("~/.cache/jaxrl_llm/llama-server-0.3.36/build/bin/llama-server")
SPLIT = {"sampling_s": ("time/rollout_s",), "sync_s": ("time/sync_s",), "score_s": ("time/score_s",),
         "prep_s": ("time/recompute_s", "time/advantage_s"), "update_s": ("time/update_s",),
         "idle_s": ("time/idle_s",), "wait_s": ("time/rollout_wait_s",)}


def _config(args, overlap: bool):
  """The run config of one child: the base config, the mode, the bench's settings, --set overrides."""
  if args.model == "smollm2":
    spec = importlib.util.spec_from_file_location("smollm2_example", EXAMPLE_CONFIG)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    c = mod.get_config()
  else:
    from jaxrl_llm.training.defaults import get_config

    c = get_config(args.method)
  c.rollout.staleness = args.staleness
  c.rollout.overlap = overlap
  c.train.steps = args.warmup_steps + args.steps
  if args.sft_steps is not None:
    c.sft.steps = args.sft_steps
  c.eval.n_examples = args.eval_examples
  c.checkpoint.every_steps = 0  # the final save only, after the timed steps
  c.log.progress = False
  if args.engine == "openai":
    c.rollout.engine = "openai"
    c.rollout.server.command = args.server_command
    c.rollout.server.sync_every = args.sync_every
  from jaxrl_llm.training.config import from_config_dict
  from jaxrl_llm.training.tiny import apply_settings

  return from_config_dict(apply_settings(c, dict(_setting(item) for item in args.set)))


def _setting(item: str) -> tuple[str, object]:
  """--set KEY=VALUE: VALUE as a Python literal, else as the string."""
  key, _, text = item.partition("=")
  try:
    return key, ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return key, text


def _worker(args) -> dict:
  """One run in this (fresh) process: per step its wall seconds and metrics."""
  from jaxrl_llm.training.loop import Trainer

  cfg = _config(args, args.worker == "async")
  ends = []
  with tempfile.TemporaryDirectory() as tmp:
    t0 = time.perf_counter()
    tr = Trainer(cfg, os.path.join(tmp, "run"), log=lambda line: None)
    tr.hooks.append(lambda trainer, state, metrics: ends.append(time.perf_counter()))
    tr.run()
    total = time.perf_counter() - t0
  steps = []
  for i, m in enumerate(tr.history):
    row = {"wall_s": ends[i] - ends[i - 1] if i else m["time/step_s"], "step_s": float(m["time/step_s"]),
           "sampled_tokens": float(m["perf/sampled_tokens"]),
           "version_lag_mean": float(m.get("rollout/version_lag_mean", -1.0))}
    row.update({name: float(sum(m.get(k, 0.0) for k in keys)) for name, keys in SPLIT.items()})
    if "engine/sync_s" in m:
      row["engine_sync_s"] = float(m["engine/sync_s"])
    steps.append(row)
  return {"mode": args.worker, "steps": steps, "run_s": total,
          "config": {"engine": cfg.rollout.engine, "staleness": cfg.rollout.staleness, "overlap": cfg.rollout.overlap,
                     "prompts_per_step": cfg.rollout.prompts_per_step, "group_size": cfg.rollout.group_size,
                     "max_response_len": cfg.rollout.max_response_len, "model": cfg.model.hf_path or "tiny",
                     "sft_steps": cfg.sft.steps, "train_steps": cfg.train.steps}}


def _summary(runs: list[dict], warmup: int) -> dict:
  timed = [s for r in runs for s in r["steps"][warmup:]]
  wall = [s["wall_s"] for s in timed]
  keys = [k for k in timed[0] if k.endswith("_s") and k != "wall_s"]
  return {"seconds_per_step_best": min(wall), "seconds_per_step_median": statistics.median(wall),
          "seconds_per_step_by_round": [[round(s["wall_s"], 3) for s in r["steps"][warmup:]] for r in runs],
          "split_median_s": {k: statistics.median(s[k] for s in timed) for k in keys},
          "warmup_steps_s": [[round(s["wall_s"], 3) for s in r["steps"][:warmup]] for r in runs],
          "version_lag_mean_timed": sorted({s["version_lag_mean"] for s in timed}),
          "run_s_median": statistics.median(r["run_s"] for r in runs)}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", required=True, help="JSON file to write")
  parser.add_argument("--engine", default="builtin", choices=("builtin", "openai"),
                      help="builtin: our sampler; openai: llama.cpp's server the engine starts (--server-command)")
  parser.add_argument("--model", default="tiny", choices=("tiny", "smollm2"),
                      help="tiny: the default config's model (training/defaults.py); smollm2: "
                           "configs/examples/smollm2_word_problems.py")
  parser.add_argument("--method", default="grpo", help="objective preset of the tiny config")
  parser.add_argument("--staleness", type=int, default=1, help="rollout.staleness of both modes (>= 1)")
  parser.add_argument("--steps", type=int, default=5, help="timed steps per child")
  parser.add_argument("--warmup-steps", type=int, default=1, help="steps per child before the timed ones (>= 1)")
  parser.add_argument("--rounds", type=int, default=2, help="fresh processes per mode, interleaved")
  parser.add_argument("--sft-steps", type=int, default=None, help="warm-start steps (default: the config's)")
  parser.add_argument("--eval-examples", type=int, default=16, help="eval.n_examples (start and end, untimed)")
  parser.add_argument("--server-command", default=LLAMA_SERVER + " -t 1" if os.path.isfile(LLAMA_SERVER)
                      else "llama-server -t 1", help="rollout.server.command with --engine openai")
  parser.add_argument("--sync-every", type=int, default=1, help="rollout.server.sync_every with --engine openai")
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="any other config key, e.g. --set rollout.prompts_per_step=16 (repeatable)")
  parser.add_argument("--child-timeout", type=float, default=3600.0, help="seconds one child may take")
  parser.add_argument("--worker", default=None, choices=("sync", "async"), help=argparse.SUPPRESS)
  args = parser.parse_args()
  for name in ("staleness", "steps", "warmup_steps", "rounds", "sync_every", "eval_examples"):
    if getattr(args, name) < 1:
      parser.error(f"--{name.replace('_', '-')}={getattr(args, name)}: must be >= 1")
  if args.sft_steps is not None and args.sft_steps < 0:
    parser.error(f"--sft-steps={args.sft_steps}: must be >= 0")
  if args.worker:
    emit(_worker(args))
    return

  argv = sys.argv[1:]
  results: dict = {"bench": {k: v for k, v in vars(args).items() if k not in ("out", "worker")},
                   "machine": {"cpu_count": os.cpu_count(), "start": load()}}
  runs: dict[str, list[dict]] = {"sync": [], "async": []}
  for r in range(args.rounds):
    for mode in (("sync", "async") if r % 2 == 0 else ("async", "sync")):
      runs[mode].append(spawn(__file__, argv, mode, timeout=args.child_timeout, cwd=REPO))
      print(f"round {r} {mode}: " + json.dumps([round(s["wall_s"], 2) for s in runs[mode][-1]["steps"]]),
            flush=True)
  results["config"] = runs["sync"][0]["config"]
  for mode, rs in runs.items():
    results[mode] = {**_summary(rs, args.warmup_steps), "runs": rs}
  results["async_over_sync_seconds_median"] = (results["async"]["seconds_per_step_median"]
                                               / results["sync"]["seconds_per_step_median"])
  results["machine"]["end"] = load()
  with open(args.out, "w") as f:
    json.dump(results, f, indent=2)
  print(json.dumps({k: v for k, v in results.items() if k not in ("sync", "async")}, indent=2))
  for mode in runs:
    print(mode, json.dumps({k: v for k, v in results[mode].items() if k != "runs"}))


if __name__ == "__main__":
  main()
