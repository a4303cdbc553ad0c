"""Benchmark of the vocabulary ops: naive (full N x V logits in XLA) vs fused.

For each op, forward ("fwd") and forward+backward ("fwd_bwd", gradients to
hidden and w), records the compiled executable's temporaries
(``memory_analysis().temp_size_in_bytes``, deterministic) and the median wall
time of several runs. Runs of the implementations alternate so that a change
in machine load hits all of them alike.

    python scripts/bench_kernels.py --out bench.json            # N=2048, D=512, V=151936
    python scripts/bench_kernels.py --out bench.json --quick    # small shapes

JSON: {op: {"fwd_bwd": {"naive": {"temp_bytes", "seconds"}, "fused": {...}},
"fwd": {...}}}. "fused" is the chunked-XLA path (what impl="auto" picks on
CPU); on a GPU backend a "pallas" entry (compiled Pallas kernels) is added.
Shapes, backend and load average are printed, not stored.

    python scripts/bench_kernels.py --out sharded.json --sharded [--quick]

The vocabulary-sharded path (kernels/sharded.py) on a (data 2, tensor 4) mesh
(8 fake CPU devices unless the machine has 8): per op, forward+backward, the
per-device temporaries and the number of all-gathers of the whole [D, V] head
in the compiled program, for the sharded ops ("sharded") against the plain
chunked op fed the same split head ("replicated": XLA gathers it). No
timings: 8 fake devices share this machine's cores. The interpret-mode
Pallas kernels are never timed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time

if "--sharded" in sys.argv and "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import jax
import jax.numpy as jnp

from jaxrl_llm.kernels import (VocabOps, VocabSharding, VocabTiles, token_logprobs,
                               vocab_cross, vocab_cross_topk, vocab_topk)

OPS = ("token_logprobs", "vocab_topk", "vocab_cross", "vocab_cross_topk")
TOP_K = 32


def _inputs(n: int, d: int, v: int):
  k = jax.random.split(jax.random.key(0), 5)
  hidden_ND = jax.random.normal(k[0], (n, d), jnp.float32)
  w_DV = 0.05 * jax.random.normal(k[1], (d, v), jnp.float32)
  targets_N = jax.random.randint(k[2], (n,), 0, v)
  hidden_q_ND = jax.random.normal(k[3], (n, d), jnp.float32)
  w_q_DV = 0.05 * jax.random.normal(k[4], (d, v), jnp.float32)
  # Distinct top-k ids per row (stride v // K) with a q mass of 0.9 on them.
  stride = v // TOP_K
  ids_NK = (jnp.arange(n)[:, None] + stride * jnp.arange(TOP_K)[None, :]) % v
  q_logp_NK = jnp.full((n, TOP_K), jnp.log(0.9 / TOP_K), jnp.float32)
  return dict(hidden_ND=hidden_ND, w_DV=w_DV, targets_N=targets_N,
              hidden_q_ND=hidden_q_ND, w_q_DV=w_q_DV, ids_NK=ids_NK,
              q_logp_NK=q_logp_NK)


def _op_fn(op: str, impl_kw):
  """Returns f(hidden_ND, w_DV, x) -> pytree of per-token outputs.

  Every array is an argument of the jitted function: closed-over arrays would
  be constants that XLA tries to fold (whole N x V logits at compile time).
  """
  if op == "token_logprobs":
    return lambda h, w, x: token_logprobs(h, w, x["targets_N"], **impl_kw)
  if op == "vocab_topk":
    return lambda h, w, x: vocab_topk(h, w, k=TOP_K, **impl_kw).logp
  if op == "vocab_cross":
    return lambda h, w, x: vocab_cross(h, w, x["hidden_q_ND"], x["w_q_DV"],
                                       **impl_kw)
  if op == "vocab_cross_topk":
    return lambda h, w, x: vocab_cross_topk(h, w, x["ids_NK"], x["q_logp_NK"],
                                            tail="rescale", **impl_kw)
  raise ValueError(f"op={op!r}: must be one of {OPS}")


def _scalar(f):
  return lambda h, w, x: sum(jnp.sum(leaf)
                             for leaf in jax.tree.leaves(f(h, w, x)))


def _compiled(op: str, mode: str, x, impl_kw):
  f = _op_fn(op, impl_kw)
  if mode == "fwd_bwd":
    f = jax.grad(_scalar(f), argnums=(0, 1))
  return jax.jit(f).lower(x["hidden_ND"], x["w_DV"], x).compile()


def _bench(op: str, mode: str, x, impls: dict, reps: int):
  compiled = {name: _compiled(op, mode, x, kw) for name, kw in impls.items()}
  times = {name: [] for name in impls}
  for _ in range(reps):
    for name, fn in compiled.items():
      t0 = time.perf_counter()
      jax.block_until_ready(fn(x["hidden_ND"], x["w_DV"], x))
      times[name].append(time.perf_counter() - t0)
  return {name: {"temp_bytes": int(fn.memory_analysis().temp_size_in_bytes),
                 "seconds": statistics.median(times[name])}
          for name, fn in compiled.items()}


def _sharded_op_fn(op: str, ops: VocabOps):
  if op == "token_logprobs":
    return lambda h, w, x: ops.token_logprobs(h, w, x["targets_N"])
  if op == "vocab_topk":
    return lambda h, w, x: ops.vocab_topk(h, w, k=TOP_K).logp
  if op == "vocab_cross":
    return lambda h, w, x: ops.vocab_cross(h, w, x["hidden_q_ND"], x["w_q_DV"])
  return lambda h, w, x: ops.vocab_cross_topk(h, w, x["ids_NK"], x["q_logp_NK"], tail="rescale")


def bench_sharded(ops_names, n, d, v, tiles, out_path):
  """Per-device temporaries and whole-head gathers: sharded ops vs the plain op on a split head."""
  from jax.sharding import NamedSharding, PartitionSpec as P

  from jaxrl_llm.model.sharding import MeshConfig, make_mesh

  mesh = make_mesh(MeshConfig(data=2, fsdp=1, tensor=4), jax.devices()[:8])
  sharding = VocabSharding(mesh)
  x = _inputs(n, d, v)
  place = {"w_DV": sharding.head, "w_q_DV": sharding.head}
  x = {k: jax.device_put(a, NamedSharding(mesh, place.get(k, sharding.rows))) for k, a in x.items()}
  variants = {"sharded": VocabOps(impl="xla_chunked", tiles=tiles, sharding=sharding),
              "replicated": VocabOps(impl="xla_chunked", tiles=tiles)}
  results = {}
  for op in ops_names:
    results[op] = {}
    for name, ops in variants.items():
      f = jax.grad(_scalar(_sharded_op_fn(op, ops)), argnums=(0, 1))
      with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        compiled = jax.jit(f).lower(x["hidden_ND"], x["w_DV"], x).compile()
      hlo = compiled.as_text()
      gathers = [g for g in re.findall(r"= \w+\[(\d+),(\d+)\]\S* all-gather(?:-start)?\(", hlo)
                 if sorted(map(int, g)) == sorted((d, v))]
      results[op][name] = {"temp_bytes_per_device": int(compiled.memory_analysis().temp_size_in_bytes),
                           "head_all_gathers": len(gathers)}
    print(op, "fwd_bwd", json.dumps(results[op]), flush=True)
    with open(out_path, "w") as fh:
      json.dump({"mesh": "data 2 x tensor 4", "N": n, "D": d, "V": v, "results": results}, fh, indent=2)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True, help="output JSON file")
  parser.add_argument("--quick", action="store_true",
                      help="small shapes (N=256, D=64, V=8192), 2 runs")
  parser.add_argument("--ops", default=",".join(OPS),
                      help=f"comma-separated subset of {OPS}")
  parser.add_argument("--reps", type=int, default=None,
                      help="timed runs per implementation (default 3, quick 2)")
  parser.add_argument("--chunk-v", type=int, default=VocabTiles().chunk_v,
                      help="vocabulary chunk of the chunked-XLA path")
  parser.add_argument("--sharded", action="store_true",
                      help="the vocabulary-sharded path on a (data 2, tensor 4) mesh: memory, no timings")
  args = parser.parse_args()
  ops = [o for o in args.ops.split(",") if o]
  for op in ops:
    if op not in OPS:
      parser.error(f"--ops: {op!r} is not one of {OPS}")
  n, d, v = (256, 64, 8192) if args.quick else (2048, 512, 151_936)
  reps = args.reps or (2 if args.quick else 3)
  if reps < 1:
    parser.error(f"--reps={reps}: must be >= 1")
  tiles = VocabTiles(chunk_v=args.chunk_v)
  if args.sharded:
    print(f"sharded: N={n} D={d} V={v} f32 chunk_v={tiles.chunk_v} loadavg={os.getloadavg()}", flush=True)
    bench_sharded(ops, n, d, v, tiles, args.out)
    return
  impls = {"naive": dict(impl="naive"),
           "fused": dict(impl="xla_chunked", tiles=tiles)}
  backend = jax.default_backend()
  if backend == "gpu":
    impls["pallas"] = dict(impl="pallas", tiles=VocabTiles())
  print(f"backend={backend} devices={jax.devices()} N={n} D={d} V={v} f32 "
        f"chunk_v={tiles.chunk_v} top_k={TOP_K} reps={reps} "
        f"loadavg={os.getloadavg()}", flush=True)
  x = _inputs(n, d, v)
  results = {}
  for op in ops:
    results[op] = {}
    for mode in ("fwd_bwd", "fwd"):
      results[op][mode] = _bench(op, mode, x, impls, reps)
      print(op, mode, json.dumps(results[op][mode]), flush=True)
      # Rewritten after every measurement: a long run that is stopped keeps
      # what it finished.
      with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
  print(f"loadavg at end={os.getloadavg()}", flush=True)


if __name__ == "__main__":
  main()
