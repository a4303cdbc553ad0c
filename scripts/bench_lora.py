"""LoRA against full fine-tuning on the SmolLM2 word-problem example, each run a fresh process.

    python scripts/bench_lora.py --out lora.json [--variants full,r16,r64] [--seeds 0,1,2] [--steps 20]

Each (variant, seed) runs `configs/examples/smollm2_word_problems.py` to the end in a child of this
script and reports the held-out greedy accuracy at the start and the end, seconds per RL step (the
mean of `time/step_s` after the first, compiling, step), the child's peak RSS, the bytes of the
trained parameters and of the optimizer state, and the load around it. Variants:

    full    the example as it is: every weight trains (lr 1e-5)
    rN      LoRA of rank N on q, k, v, o, gate, up, down, alpha 32, lr 1e-4

LoRA's learning rate is 10x full fine-tuning's, the ratio Schulman et al. ("LoRA Without Regret",
Thinking Machines, 2025) find optimal across model sizes, with alpha = 32 fixed and s = alpha / r as
they use. JSON: {"runs": [{variant, seed, acc_start, acc_end, gain, step_s, peak_rss_gb,
trained_param_bytes, opt_state_bytes, wall_s, load_before, load_after}], "summary": {variant: mean
and std of the gain over seeds, ...}, "machine": ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import emit, load, spawn  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LORA_LR = 1e-4
LORA_ALPHA = 32.0


def settings(variant: str, seed: int, steps: int) -> dict:
  """The run-config overrides of one variant."""
  out = {"seed": seed, "train.steps": steps, "log.progress": False, "checkpoint.every_steps": 0}
  if variant != "full":
    out.update({"model.lora.rank": int(variant[1:]), "model.lora.alpha": LORA_ALPHA, "train.lr": LORA_LR})
  return out


def worker(args) -> None:
  import jax

  from jaxrl_llm.cli import load_config_file
  from jaxrl_llm.model import lora
  from jaxrl_llm.model.params import param_shapes
  from jaxrl_llm.training.config import from_config_dict
  from jaxrl_llm.training.loop import Trainer
  from jaxrl_llm.training.tiny import apply_settings

  c = load_config_file(os.path.join(REPO, "configs/examples/smollm2_word_problems.py"))
  apply_settings(c, settings(args.variant, args.seed, args.steps))
  cfg = from_config_dict(c)
  workdir = tempfile.mkdtemp(prefix=f"bench_lora_{args.variant}_{args.seed}_")
  t0 = time.time()
  tr = Trainer(cfg, workdir, log=lambda *a, **k: None)
  summary = tr.run()
  wall = time.time() - t0
  rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  steps = [r["time/step_s"] for r in rows[1:]] or [rows[0]["time/step_s"]]
  # Bytes of what trains and of its optimizer state, from the model's shapes (AdamW: 2 moments).
  trained = lora.trainable(param_shapes(tr.model_cfg))
  trained_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(trained))
  base_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(lora.base(param_shapes(tr.model_cfg))))
  emit({"variant": args.variant, "seed": args.seed, "acc_start": summary["eval_accuracy_start"],
        "acc_end": summary["eval_accuracy_end"], "gain": summary["eval_gain"],
        "step_s": statistics.mean(steps), "wall_s": wall,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "trained_param_bytes": trained_bytes, "opt_state_bytes": 2 * trained_bytes,
        "frozen_param_bytes": base_bytes if args.variant != "full" else 0})


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--out", required=True, help="the JSON file to write")
  ap.add_argument("--variants", default="full,r16,r64", help="comma-separated: full and/or rN (LoRA rank N)")
  ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
  ap.add_argument("--steps", type=int, default=20, help="RL steps per run (the example's: 20)")
  ap.add_argument("--worker", default="", help=argparse.SUPPRESS)
  ap.add_argument("--variant", default="full", help=argparse.SUPPRESS)
  ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.worker:
    worker(args)
    return
  variants = [v.strip() for v in args.variants.split(",") if v.strip()]
  for v in variants:
    if v != "full" and not (v.startswith("r") and v[1:].isdigit() and int(v[1:]) >= 1):
      ap.error(f"--variants: {v!r} is neither 'full' nor rN with N >= 1")
  seeds = [int(s) for s in args.seeds.split(",")]
  runs = []
  for seed in seeds:  # seed-major: each variant sees the machine's load of its seed's round
    for v in variants:
      r = spawn(__file__, ["--out", args.out, "--steps", str(args.steps)], "run",
                extra=["--variant", v, "--seed", str(seed)], cwd=REPO)
      runs.append(r)
      print(f"{v} seed {seed}: {r['acc_start']:.2f} -> {r['acc_end']:.2f}, {r['step_s']:.1f} s/step, "
            f"peak RSS {r['peak_rss_gb']:.2f} GB, load {r['load_before']['loadavg'][0]:.1f}", flush=True)
      with open(args.out, "w") as f:  # after every run: a long benchmark keeps what it measured
        json.dump({"runs": runs, "summary": summarise(runs), "machine": load()}, f, indent=1)


def summarise(runs: list[dict]) -> dict:
  out = {}
  for v in dict.fromkeys(r["variant"] for r in runs):
    rs = [r for r in runs if r["variant"] == v]
    gains = [r["gain"] for r in rs]
    out[v] = {"seeds": len(rs), "gain_mean": statistics.mean(gains),
              "gain_std": statistics.stdev(gains) if len(gains) > 1 else None,
              "step_s_mean": statistics.mean(r["step_s"] for r in rs),
              "peak_rss_gb_max": max(r["peak_rss_gb"] for r in rs),
              "trained_param_bytes": rs[0]["trained_param_bytes"], "opt_state_bytes": rs[0]["opt_state_bytes"]}
  return out


if __name__ == "__main__":
  main()
