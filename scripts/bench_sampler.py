"""Decode throughput of the sampler against two baselines, written as JSON.

    python scripts/bench_sampler.py --out bench_sampler.json

Same random weights (a ~10M-param Qwen2-style config), same prompts, pure
sampling (temperature 1, no truncation), no EOS so every row emits exactly
--new-tokens tokens:

  ours            jaxrl_llm.sampling.generate (KV cache, lax.while_loop)
  hf_transformers transformers' generate on the same weights (PyTorch CPU),
                  exported through jaxrl_llm.model.io.hf_io.save_hf
  no_cache        our model without a KV cache: every step recomputes the
                  forward over the whole static [B, P + R] buffer

tokens/s = batch * new_tokens / wall seconds of one full generate call
(prefill included, compile excluded: one warm-up call first; best of --repeats);
tokens_per_cpu_s divides by the process's CPU seconds instead (robust to load).
Each side is measured at several settings and reported at its fastest: ours
on 1 and 2 JAX CPU devices (--cpu-devices; N > 1 shards the rows over the N
devices, data parallel over the cores, as the trainer's mesh would),
transformers at 1 and 2 torch threads (--threads). Every backend and setting
runs in a fresh process, so no thread pool of one measurement is left
running beside the next.
A greedy parity check (ours vs transformers on the same weights) is recorded
too, so the comparison is known to run the same model.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.model import ModelConfig, forward, init_params, logits
from jaxrl_llm.model.io.hf_io import save_hf
from jaxrl_llm.model.sharding import MeshConfig, make_mesh, shard_params
from jaxrl_llm.sampling.config import SamplingConfig
from jaxrl_llm.sampling.generate import generate

from harness import emit, load, spawn


def _best_time(fn, repeats: int, warmup=None) -> tuple[float, float]:
  """(wall seconds, process CPU seconds) of the fastest of `repeats` calls.

  CPU seconds (all threads of this process) are the load-robust figure on a
  shared machine: wall time there mostly measures the other processes.
  """
  (warmup or fn)()  # compile / warm up
  best = (float("inf"), float("inf"))
  for _ in range(repeats):
    c0, t0 = time.process_time(), time.perf_counter()
    fn()
    best = min(best, (time.perf_counter() - t0, time.process_time() - c0))
  return best


@functools.partial(jax.jit, static_argnames=("cfg", "new_tokens"))
def _no_cache_generate(params, cfg: ModelConfig, prompt_BP, key, steps, *, new_tokens: int):
  """Sampling with a full forward over the static [B, P + R] buffer at every
  step; runs the first `steps` of the R steps (each costs the same)."""
  B, P = prompt_BP.shape
  T = P + new_tokens
  tokens_BT = jnp.concatenate([prompt_BP, jnp.zeros((B, new_tokens), jnp.int32)], axis=1)
  positions_BT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32)[None, :], (B, T))

  def body(t, tokens_BT):
    mask_BT = positions_BT < P + t
    hidden_BTD, _ = forward(params, cfg, tokens_BT, positions_BT, mask_BT)
    hidden_B1D = jax.lax.dynamic_slice_in_dim(hidden_BTD, P + t - 1, 1, axis=1)
    logits_BV = logits(params, cfg, hidden_B1D)[:, 0]
    tok_B = jax.random.categorical(jax.random.fold_in(key, t), logits_BV).astype(jnp.int32)
    return jax.lax.dynamic_update_slice(tokens_BT, tok_B[:, None], (0, P + t))

  return jax.lax.fori_loop(0, steps, body, tokens_BT)


def _hf_model(params, cfg: ModelConfig, threads: int):
  """The same weights in transformers (float32), through our HF export."""
  import torch
  from transformers import AutoModelForCausalLM
  torch.set_num_threads(threads)
  with tempfile.TemporaryDirectory() as tmp:
    save_hf(params, cfg, tmp)
    model = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32)
  return model.eval()


def _hf_generate(model, prompt_BP: np.ndarray, new_tokens: int, do_sample: bool):
  import torch
  with torch.inference_mode():
    out = model.generate(
        input_ids=torch.from_numpy(prompt_BP.astype(np.int64)),
        attention_mask=torch.ones(prompt_BP.shape, dtype=torch.long),
        max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=do_sample,
        temperature=1.0 if do_sample else None, top_k=0 if do_sample else None,
        top_p=1.0 if do_sample else None, eos_token_id=None, pad_token_id=0)
  return out[:, prompt_BP.shape[1]:].numpy()


def _setup(args):
  """The benchmark's model, params and prompts (deterministic: every worker
  process rebuilds the same ones)."""
  cfg = ModelConfig.preset("qwen2_10m")
  params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.key(0))
  # Non-zero q/k/v biases so the export and both models exercise them.
  layers = dict(params["layers"])
  for i, name in enumerate(("bq_LNH", "bk_LKH", "bv_LKH")):
    layers[name] = 0.02 * jax.random.normal(jax.random.key(100 + i), layers[name].shape)
  params = {**params, "layers": layers}
  B, P = args.batch, args.prompt_len
  prompt_BP = np.asarray(jax.random.randint(jax.random.key(1), (B, P), 0, cfg.vocab_size), np.int32)
  return cfg, params, prompt_BP, np.ones((B, P), bool)


def _run_ours(args, devices: int) -> dict:
  cfg, params, prompt_BP, mask_BP = _setup(args)
  B, R = args.batch, args.new_tokens
  scfg = SamplingConfig(temperature=1.0, max_new_tokens=R, dtype=args.dtype)
  prompt_j, mask_j = jnp.asarray(prompt_BP), jnp.asarray(mask_BP)
  mesh = None
  if devices > 1:
    mesh = make_mesh(MeshConfig(devices, 1, 1))
    params = shard_params(params, cfg, mesh)
  run = lambda: generate(params, cfg, prompt_j, mask_j, scfg, jax.random.key(2),
                         mesh=mesh).tokens_BR.block_until_ready()
  secs, cpu = _best_time(run, args.repeats)
  return {"tokens_per_s": B * R / secs, "seconds": secs, "tokens_per_cpu_s": B * R / cpu,
          "cpu_seconds": cpu, "jax_devices": len(jax.devices())}


def _run_no_cache(args) -> dict:
  cfg, params, prompt_BP, _ = _setup(args)
  prompt_j = jnp.asarray(prompt_BP)
  steps = min(args.no_cache_steps, args.new_tokens)
  run = lambda n: _no_cache_generate(params, cfg, prompt_j, jax.random.key(2), jnp.int32(n),
                                     new_tokens=args.new_tokens).block_until_ready()
  # `steps` is traced: the one-step warm-up compiles the same executable.
  secs, cpu = _best_time(lambda: run(steps), args.repeats, warmup=lambda: run(1))
  return {"tokens_per_s": args.batch * steps / secs, "seconds_for_timed_steps": secs,
          "tokens_per_cpu_s": args.batch * steps / cpu, "timed_steps": steps}


def _run_hf(args, threads: int) -> dict:
  import torch
  import transformers
  cfg, params, prompt_BP, mask_BP = _setup(args)
  B, R = args.batch, args.new_tokens
  model = _hf_model(params, cfg, threads)
  secs, cpu = _best_time(lambda: _hf_generate(model, prompt_BP, R, True), args.repeats,
                         warmup=lambda: _hf_generate(model, prompt_BP, 2, True))
  out = {"tokens_per_s": B * R / secs, "seconds": secs, "tokens_per_cpu_s": B * R / cpu,
         "cpu_seconds": cpu, "transformers_version": transformers.__version__,
         "torch_version": torch.__version__}
  # Parity (after the timing): greedy continuations of a few prompts agree
  # token for token, so both sides run the same model.
  check_B, check_R = 4, 16
  ours = generate(params, cfg, jnp.asarray(prompt_BP[:check_B]), jnp.asarray(mask_BP[:check_B]),
                  SamplingConfig(temperature=0.0, max_new_tokens=check_R), jax.random.key(0))
  theirs = _hf_generate(model, prompt_BP[:check_B], check_R, False)
  out["greedy_parity"] = {"rows": check_B, "tokens": check_R,
                          "agree_fraction": float((np.asarray(ours.tokens_BR) == theirs).mean())}
  return out


def _worker(args) -> None:
  """One measurement in this (fresh) process; prints its result as JSON."""
  kind, n = args.worker.split(":")
  n = int(n)
  if kind == "ours":
    # XLA reads XLA_FLAGS when its CPU client starts (first use below), so
    # setting it here, after `import jax`, still applies.
    flags = os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={n}"
    if args.xla_threads == 1:
      flags += " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    os.environ["XLA_FLAGS"] = flags
    result = _run_ours(args, n)
  elif kind == "hf":
    result = _run_hf(args, n)
  else:
    result = _run_no_cache(args)
  emit(result)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", required=True, help="JSON file to write")
  parser.add_argument("--batch", type=int, default=64)
  parser.add_argument("--prompt-len", type=int, default=16)
  parser.add_argument("--new-tokens", type=int, default=128)
  parser.add_argument("--repeats", type=int, default=2, help="timed calls per process (the best is kept)")
  parser.add_argument("--rounds", type=int, default=2,
                      help="rounds over all settings, interleaved (the best round of each is kept)")
  parser.add_argument("--dtype", default=None, help="SamplingConfig.dtype for ours (default: float32 as given)")
  parser.add_argument("--threads", type=int, nargs="+", default=[1, 2],
                      help="torch thread counts tried for the transformers baseline (the fastest is reported)")
  parser.add_argument("--cpu-devices", type=int, nargs="+", default=[1, 2],
                      help="JAX CPU device counts tried for ours (the fastest is reported): N > 1 exposes "
                           "the CPU as N devices and shards the rows over a (N, 1, 1) mesh, data parallel "
                           "the way the trainer uses a mesh")
  parser.add_argument("--no-cache-steps", type=int, default=4,
                      help="decode steps timed for no_cache (every step costs the same: tokens/s extrapolates)")
  parser.add_argument("--xla-threads", type=int, default=None,
                      help="1: run ours with XLA's intra-op thread pool off; default: XLA's default")
  parser.add_argument("--skip", nargs="*", default=(), choices=("ours", "hf_transformers", "no_cache"))
  parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if any(n < 1 for n in args.cpu_devices):
    parser.error(f"--cpu-devices={args.cpu_devices}: each must be >= 1")
  for name in ("repeats", "rounds"):
    if getattr(args, name) < 1:
      parser.error(f"--{name}={getattr(args, name)}: must be >= 1")
  if args.xla_threads not in (None, 1):
    parser.error("--xla-threads: only 1 is supported (XLA's CPU pool size is not settable per run)")
  if args.worker:
    _worker(args)
    return

  cfg = ModelConfig.preset("qwen2_10m")
  B, P, R = args.batch, args.prompt_len, args.new_tokens
  results: dict = {
      "config": {"model": 'ModelConfig.preset("qwen2_10m")', "num_params": cfg.num_params(),
                 "vocab_size": cfg.vocab_size, "d_model": cfg.d_model, "n_layers": cfg.n_layers,
                 "batch": B, "prompt_len": P, "new_tokens": R, "sampling": "temperature 1, no top-k/top-p",
                 "ours_dtype": args.dtype or cfg.param_dtype,
                 "ours_xla_threads": args.xla_threads or "default", "ours_cpu_devices_tried": args.cpu_devices,
                 "torch_threads_tried": args.threads,
                 "no_cache_timed_steps": args.no_cache_steps, "repeats": args.repeats,
                 "rounds": args.rounds,
                 "timing": "best wall time of one full generate call, prefill included, over "
                           "repeats x rounds; each backend and setting in a process of its own"},
      "machine": {"cpu_count": os.cpu_count(), "start": load()},
  }
  argv = sys.argv[1:]

  # Every setting of every backend is measured once per round, the rounds
  # interleaved, and its best round kept: a stretch of outside load on the
  # machine then hurts one round of each side, not all of one side. Each in a
  # process of its own: an idle XLA or torch thread pool left over from the
  # previous measurement would otherwise share the cores with the next one.
  specs = ([f"ours:{n}" for n in args.cpu_devices] * ("ours" not in args.skip)
           + ["no_cache:1"] * ("no_cache" not in args.skip)
           + [f"hf:{n}" for n in args.threads] * ("hf_transformers" not in args.skip))
  runs: dict[str, list[dict]] = {spec: [] for spec in specs}
  for r in range(args.rounds):
    for spec in specs:
      runs[spec].append(spawn(__file__, argv, spec))
      print(f"round {r}", spec, runs[spec][-1], flush=True)
  best = {spec: max(rs, key=lambda x: x["tokens_per_s"]) for spec, rs in runs.items()}
  spread = {spec: [round(x["tokens_per_s"], 1) for x in rs] for spec, rs in runs.items()}

  def best_of(kind: str, counts, key: str) -> dict:
    by = {str(n): {**best[f"{kind}:{n}"], "tokens_per_s_by_round": spread[f"{kind}:{n}"]} for n in counts}
    top = max(by, key=lambda k: by[k]["tokens_per_s"])
    return {**by[top], key: int(top), f"by_{key}": by}

  if "ours" not in args.skip:
    results["ours"] = best_of("ours", args.cpu_devices, "cpu_devices")
  if "no_cache" not in args.skip:
    results["no_cache"] = best["no_cache:1"]
  if "hf_transformers" not in args.skip:
    results["hf_transformers"] = best_of("hf", args.threads, "torch_threads")
    results["greedy_parity"] = results["hf_transformers"].pop("greedy_parity")
    for entry in results["hf_transformers"]["by_torch_threads"].values():
      entry.pop("greedy_parity", None)
  if "ours" in results and "hf_transformers" in results:
    results["ours_over_hf"] = results["ours"]["tokens_per_s"] / results["hf_transformers"]["tokens_per_s"]
    results["ours_over_hf_per_cpu_s"] = (results["ours"]["tokens_per_cpu_s"]
                                         / results["hf_transformers"]["tokens_per_cpu_s"])
  results["machine"]["end"] = load()
  with open(args.out, "w") as f:
    json.dump(results, f, indent=2)
  print(json.dumps(results, indent=2))


if __name__ == "__main__":
  main()
