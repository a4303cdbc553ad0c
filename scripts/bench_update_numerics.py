"""The update's forward + backward under each remat policy and compute dtype, as JSON.

    python scripts/bench_update_numerics.py --out numerics.json [--rounds 3] [--variants full:f32,none:bf16]

One micro-batch of the RL-step benchmark's shape (SmolLM2-135M at random init, float32 params,
16 rows in groups of 4 sharing a prompt of --prompt-len tokens, --response-len response tokens)
through `model.logprobs.response_logprobs` and `jax.grad` of the summed log-probs, as the update
differentiates it. Each variant is `REMAT:DTYPE`: REMAT one of model.remat's policies (none, full,
save_dots), DTYPE the compute dtype of the matmuls (f32, bf16; params and the log-softmax stay
f32). Each (variant, round) is a fresh process; rounds interleave the variants. Reported per
variant: the median seconds of --calls timed calls after the compiling one, the compiled
program's temporary bytes (XLA's memory_analysis), the child's peak RSS, the load around it, and
the gradient's relative difference from the full:f32 variant (the precision bf16 costs).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import emit, load, spawn  # noqa: E402

VARIANTS = ("full:f32", "save_dots:f32", "none:f32", "full:bf16", "save_dots:bf16", "none:bf16")
DTYPES = {"f32": "float32", "bf16": "bfloat16"}


def worker(args) -> None:
  import jax
  import jax.numpy as jnp
  import numpy as np

  from jaxrl_llm.model import ModelConfig, init_params
  from jaxrl_llm.model.logprobs import response_logprobs

  remat, dtype = args.worker.split(":")
  cfg = ModelConfig.preset("smollm2_135m", remat=remat, compute_dtype=DTYPES[dtype])
  params = init_params(cfg, jax.random.PRNGKey(0))
  rng = np.random.default_rng(0)
  B, G, P, R = args.rows, args.group, args.prompt_len, args.response_len
  prompt_BP = np.repeat(rng.integers(1, cfg.vocab_size, (B // G, P)), G, axis=0).astype(np.int32)
  pmask_BP = np.ones((B, P), bool)
  response_BR = rng.integers(1, cfg.vocab_size, (B, R)).astype(np.int32)
  rmask_BR = np.arange(R)[None, :] < rng.integers(R // 2, R + 1, (B, 1))

  def loss(p):
    lp = response_logprobs(p, cfg, prompt_BP, pmask_BP, response_BR, rmask_BR, temperature=1.0,
                           impl=args.impl, prompt_group=G)
    return jnp.sum(jnp.where(rmask_BR, lp.logp_BR, 0.0))

  grad = jax.jit(jax.grad(loss))
  compiled = grad.lower(params).compile()
  mem = compiled.memory_analysis()
  g = jax.block_until_ready(compiled(params))
  times = []
  for _ in range(args.calls):
    t0 = time.perf_counter()
    g = jax.block_until_ready(compiled(params))
    times.append(time.perf_counter() - t0)
  leaves = [np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(g)]
  flat = np.concatenate(leaves)
  path = os.path.join(args.tmp, f"grad_{remat}_{dtype}.npy")
  np.save(path, flat[::97].astype(np.float32))  # a fixed subsample, for the precision comparison
  emit({"variant": args.worker, "median_s": statistics.median(times), "times_s": times,
        "temp_bytes": int(mem.temp_size_in_bytes), "argument_bytes": int(mem.argument_size_in_bytes),
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, "grad_sample": path})


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--out", required=False, default="bench_update_numerics.json")
  parser.add_argument("--variants", default=",".join(VARIANTS))
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--calls", type=int, default=3)
  parser.add_argument("--rows", type=int, default=16)
  parser.add_argument("--group", type=int, default=4)
  parser.add_argument("--prompt-len", type=int, default=70)
  parser.add_argument("--response-len", type=int, default=64)
  parser.add_argument("--impl", default="auto")
  parser.add_argument("--tmp", default=None)
  parser.add_argument("--worker", default=None)
  args = parser.parse_args()
  if args.worker:
    worker(args)
    return
  import numpy as np
  import tempfile

  variants = args.variants.split(",")
  for v in variants:
    remat, _, dtype = v.partition(":")
    if remat not in ("none", "full", "save_dots") or dtype not in DTYPES:
      parser.error(f"--variants: {v!r} is not REMAT:DTYPE with REMAT in none|full|save_dots, DTYPE in f32|bf16")
  tmp = args.tmp or tempfile.mkdtemp(prefix="bench_update_numerics_")
  argv = ["--calls", str(args.calls), "--rows", str(args.rows), "--group", str(args.group),
          "--prompt-len", str(args.prompt_len), "--response-len", str(args.response_len), "--impl", args.impl,
          "--tmp", tmp]
  runs = []
  for r in range(args.rounds):
    order = variants if r % 2 == 0 else variants[::-1]
    for v in order:
      res = spawn(__file__, argv, v, timeout=3600)
      res["round"] = r
      runs.append(res)
      print(f"round {r} {v}: {res['median_s']:.3f} s, temp {res['temp_bytes'] / 2**30:.2f} GiB, "
            f"load {res['load_before']['loadavg'][0]:.2f}", flush=True)
  summary = {}
  ref_path = os.path.join(tmp, "grad_full_f32.npy")
  ref = np.load(ref_path).astype(np.float64) if os.path.exists(ref_path) else None
  for v in variants:
    mine = [x for x in runs if x["variant"] == v]
    s = {"median_s": statistics.median(x["median_s"] for x in mine),
         "min_s": min(x["median_s"] for x in mine), "max_s": max(x["median_s"] for x in mine),
         "temp_gib": mine[0]["temp_bytes"] / 2**30, "peak_rss_gib": max(x["peak_rss_gib"] for x in mine)}
    if ref is not None:
      g = np.load(mine[0]["grad_sample"]).astype(np.float64)
      s["grad_rel_diff_vs_full_f32"] = float(np.linalg.norm(g - ref) / np.linalg.norm(ref))
    summary[v] = s
  out = {"config": vars(args), "runs": runs, "summary": summary, "machine": load()}
  with open(args.out, "w") as f:
    json.dump(out, f, indent=1)
  for v, s in summary.items():
    print(f"{v:16s} {s['median_s']:7.3f} s [{s['min_s']:.3f}, {s['max_s']:.3f}]  temp {s['temp_gib']:.2f} GiB  "
          f"rss {s['peak_rss_gib']:.2f} GiB  grad diff {s.get('grad_rel_diff_vs_full_f32', float('nan')):.2e}")


if __name__ == "__main__":
  main()
