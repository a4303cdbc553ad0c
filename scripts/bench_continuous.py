"""The static batch against continuous batching on long-tailed response lengths, written as JSON.

    python scripts/bench_continuous.py --out continuous.json [--prompts 32 --samples 4 --new-tokens 512
        --slots 32 64 --chunk 16 --eos-ids 48 --repeats 2]

One workload: --prompts prompts x --samples samples of at most --new-tokens tokens from the ~10M-param
Qwen2-style model at random init (ModelConfig.preset("qwen2_10m")), temperature 1, where the first
--eos-ids ids of the vocabulary end a sample. That gives long-tailed lengths (roughly geometric, cut at
--new-tokens; the JSON records their mean, quantiles and maximum), the case where a static batch keeps
decoding every row until the longest ends. Sides, each in a fresh process (harness.spawn):

  static            sampling.generate: every sample in one batch (the trainer's default)
  continuous_N      sampling.continuous.generate_continuous in N slots, --chunk decode steps per look

Each side runs once to compile, then --repeats timed calls (the best is kept); tokens/s counts the
sampled tokens (EOS included). Both sides give the same tokens for the same key (checked here on the
first samples, and in tests/sampling/test_continuous.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def worker(args) -> dict:
  import jax
  import numpy as np

  from jaxrl_llm.model import ModelConfig, init_params
  from jaxrl_llm.sampling.config import SamplingConfig
  from jaxrl_llm.sampling.continuous import generate_continuous
  from jaxrl_llm.sampling.generate import generate

  cfg = ModelConfig.preset("qwen2_10m")
  params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.key(0))
  scfg = SamplingConfig(temperature=1.0, max_new_tokens=args.new_tokens, n_samples=args.samples,
                        eos_ids=tuple(range(args.eos_ids)), pad_id=cfg.vocab_size - 1)
  rng = np.random.default_rng(0)
  prompt_BP = rng.integers(args.eos_ids, cfg.vocab_size - 1, size=(args.prompts, args.prompt_len)).astype(np.int32)
  mask_BP = np.ones_like(prompt_BP, bool)
  if args.worker == "static":
    run = lambda key: generate(params, cfg, prompt_BP, mask_BP, scfg, key)  # noqa: E731
  else:
    slots = int(args.worker.split("_")[1])
    run = lambda key: generate_continuous(params, cfg, prompt_BP, mask_BP, scfg, key, slots=slots,  # noqa: E731
                                          chunk=args.chunk)
  t0 = time.perf_counter()
  ro = run(jax.random.key(1))
  lengths = np.asarray(jax.device_get(ro.length_B))
  first_s = time.perf_counter() - t0
  best = float("inf")
  for _ in range(args.repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(run(jax.random.key(1)).tokens_BR)
    best = min(best, time.perf_counter() - t0)
  tokens = int(lengths.sum())
  return {"side": args.worker, "first_call_s": first_s, "best_s": best, "tokens": tokens,
          "tokens_per_s": tokens / best, "lengths": {"mean": float(lengths.mean()),
                                                     "p50": float(np.quantile(lengths, 0.5)),
                                                     "p90": float(np.quantile(lengths, 0.9)),
                                                     "max": int(lengths.max())},
          "first_rows": np.asarray(jax.device_get(ro.tokens_BR))[:4, :32].tolist()}


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", required=True)
  p.add_argument("--prompts", type=int, default=32)
  p.add_argument("--samples", type=int, default=4)
  p.add_argument("--prompt-len", "--prompt_len", type=int, default=16)
  p.add_argument("--new-tokens", "--new_tokens", type=int, default=512)
  p.add_argument("--slots", type=int, nargs="+", default=[32, 64])
  p.add_argument("--chunk", type=int, default=16)
  p.add_argument("--eos-ids", "--eos_ids", type=int, default=48)
  p.add_argument("--repeats", type=int, default=2)
  p.add_argument("--worker", default=None)
  args = p.parse_args(argv)
  if args.worker:
    harness.emit(worker(args))
    return
  flags = [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in
           ("prompts", "samples", "prompt_len", "new_tokens", "chunk", "eos_ids", "repeats")] + ["--out", args.out]
  sides = {}
  for side in ["static"] + [f"continuous_{n}" for n in args.slots]:
    sides[side] = harness.spawn(__file__, flags, side)
    print(f"{side}: {sides[side]['best_s']:.2f} s, {sides[side]['tokens_per_s']:.0f} tokens/s, "
          f"lengths {sides[side]['lengths']}", flush=True)
  static = sides["static"]
  out = {"workload": {k: getattr(args, k) for k in ("prompts", "samples", "prompt_len", "new_tokens", "chunk",
                                                    "eos_ids", "repeats")},
         "model": 'ModelConfig.preset("qwen2_10m"), random init', "sides": sides,
         "speedup_over_static": {s: static["best_s"] / v["best_s"] for s, v in sides.items() if s != "static"},
         "same_tokens": all(v["first_rows"] == static["first_rows"] for v in sides.values())}
  with open(args.out, "w") as f:
    json.dump(out, f, indent=1)
  print(json.dumps({"speedup_over_static": out["speedup_over_static"], "same_tokens": out["same_tokens"]}))


if __name__ == "__main__":
  main()
