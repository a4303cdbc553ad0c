"""Decode throughput of the sampler against two baselines, written as JSON.

    python scripts/bench_sampler.py --out bench_sampler.json

Same random weights (a ~10M-param Qwen2-style config), same prompts, pure
sampling (temperature 1, no truncation), no EOS so every row emits exactly
--new-tokens tokens:

  ours            jaxrl_llm.sampling.generate (KV cache, lax.while_loop)
  hf_transformers transformers' generate on the same weights (PyTorch CPU),
                  exported through jaxrl_llm.model.hf_io.save_hf
  no_cache        our model without a KV cache: every step recomputes the
                  forward over the whole static [B, P + R] buffer

tokens/s = batch * new_tokens / wall seconds of one full generate call
(prefill included, compile excluded: one warm-up call first; best of --repeats);
tokens_per_cpu_s divides by the process's CPU seconds instead (robust to load).
--cpu-devices N shards ours' rows over N CPU devices (data parallel over the
cores, as the trainer's mesh would); transformers uses torch's thread pool.
A greedy parity check (ours vs transformers on the same weights) is recorded
too, so the comparison is known to run the same model.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.model import ModelConfig, forward, init_params, logits
from jaxrl_llm.model.hf_io import save_hf
from jaxrl_llm.model.sharding import MeshConfig, make_mesh, shard_params
from jaxrl_llm.sampling.config import SamplingConfig
from jaxrl_llm.sampling.generate import generate


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


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", required=True, help="JSON file to write")
  parser.add_argument("--batch", type=int, default=64)
  parser.add_argument("--prompt-len", type=int, default=16)
  parser.add_argument("--new-tokens", type=int, default=128)
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--dtype", default=None, help="SamplingConfig.dtype for ours (default: float32 as given)")
  parser.add_argument("--threads", type=int, nargs="+", default=[1, 2],
                      help="torch thread counts tried for the transformers baseline (the fastest is reported)")
  parser.add_argument("--no-cache-steps", type=int, default=4,
                      help="decode steps timed for no_cache (every step costs the same: tokens/s extrapolates)")
  parser.add_argument("--xla-threads", type=int, default=None,
                      help="1: run ours single-threaded (XLA's CPU thread pool off), as torch's best "
                           "setting on a loaded 2-core machine; default: XLA's default (all cores)")
  parser.add_argument("--cpu-devices", type=int, default=1,
                      help="N > 1: expose the CPU as N JAX devices and shard ours' rows over a (N, 1, 1) "
                           "mesh (data parallel, the way the trainer uses a mesh); default 1")
  parser.add_argument("--skip", nargs="*", default=(), choices=("ours", "hf_transformers", "no_cache"))
  args = parser.parse_args()
  if args.cpu_devices < 1:
    parser.error(f"--cpu-devices={args.cpu_devices}: must be >= 1")
  if args.cpu_devices > 1:  # read when XLA's CPU client starts (first use below), like --xla-threads
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + f" --xla_force_host_platform_device_count={args.cpu_devices}")
  if args.xla_threads is not None:
    if args.xla_threads != 1:
      parser.error("--xla-threads: only 1 is supported (XLA's CPU pool size is not settable per run)")
    # XLA reads XLA_FLAGS when its CPU client starts (first use below), so
    # setting it here, after `import jax`, still applies.
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

  cfg = ModelConfig.qwen2_10m()
  params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.key(0))
  # Non-zero q/k/v biases so the export and both models exercise them.
  layers = dict(params["layers"])
  for i, name in enumerate(("bq_LNH", "bk_LKH", "bv_LKH")):
    layers[name] = 0.02 * jax.random.normal(jax.random.key(100 + i), layers[name].shape)
  params = {**params, "layers": layers}
  B, P, R = args.batch, args.prompt_len, args.new_tokens
  prompt_BP = np.asarray(jax.random.randint(jax.random.key(1), (B, P), 0, cfg.vocab_size), np.int32)
  mask_BP = np.ones((B, P), bool)
  scfg = SamplingConfig(temperature=1.0, max_new_tokens=R, dtype=args.dtype)
  results: dict = {
      "config": {"model": "ModelConfig.qwen2_10m", "num_params": cfg.num_params(),
                 "vocab_size": cfg.vocab_size, "d_model": cfg.d_model, "n_layers": cfg.n_layers,
                 "batch": B, "prompt_len": P, "new_tokens": R, "sampling": "temperature 1, no top-k/top-p",
                 "ours_dtype": args.dtype or cfg.param_dtype,
                 "ours_xla_threads": args.xla_threads or "default", "ours_cpu_devices": args.cpu_devices,
                 "torch_threads_tried": args.threads,
                 "no_cache_timed_steps": args.no_cache_steps,
                 "repeats": args.repeats, "timing": "best wall time of one full generate call, prefill included"},
      "machine": {"cpu_count": os.cpu_count(), "loadavg_before": os.getloadavg(),
                  "jax_devices": [str(d) for d in jax.devices()]},
  }
  n_tokens = B * R

  if "ours" not in args.skip:
    prompt_j, mask_j = jnp.asarray(prompt_BP), jnp.asarray(mask_BP)
    mesh, ours_params = None, params
    if args.cpu_devices > 1:
      mesh = make_mesh(MeshConfig(args.cpu_devices, 1, 1))
      ours_params = shard_params(params, cfg, mesh)
    run = lambda: generate(ours_params, cfg, prompt_j, mask_j, scfg, jax.random.key(2),
                           mesh=mesh).tokens_BR.block_until_ready()
    secs, cpu = _best_time(run, args.repeats)
    results["ours"] = {"tokens_per_s": n_tokens / secs, "seconds": secs,
                       "tokens_per_cpu_s": n_tokens / cpu, "cpu_seconds": cpu}
    print("ours", results["ours"], flush=True)

  if "no_cache" not in args.skip:
    prompt_j = jnp.asarray(prompt_BP)
    steps = min(args.no_cache_steps, R)
    run = lambda n: _no_cache_generate(params, cfg, prompt_j, jax.random.key(2), jnp.int32(n),
                                       new_tokens=R).block_until_ready()
    # `steps` is traced: the one-step warm-up compiles the same executable.
    secs, cpu = _best_time(lambda: run(steps), args.repeats, warmup=lambda: run(1))
    results["no_cache"] = {"tokens_per_s": B * steps / secs, "seconds_for_timed_steps": secs,
                           "tokens_per_cpu_s": B * steps / cpu, "timed_steps": steps}
    print("no_cache", results["no_cache"], flush=True)

  if "hf_transformers" not in args.skip:
    import torch
    import transformers
    by_threads = {}
    for threads in args.threads:
      model = _hf_model(params, cfg, threads)
      secs, cpu = _best_time(lambda: _hf_generate(model, prompt_BP, R, True), args.repeats,
                             warmup=lambda: _hf_generate(model, prompt_BP, 2, True))
      by_threads[str(threads)] = {"tokens_per_s": n_tokens / secs, "seconds": secs,
                                  "tokens_per_cpu_s": n_tokens / cpu, "cpu_seconds": cpu}
      print("hf_transformers threads", threads, by_threads[str(threads)], flush=True)
    best = max(by_threads, key=lambda k: by_threads[k]["tokens_per_s"])
    results["hf_transformers"] = {**by_threads[best], "torch_threads": int(best), "by_threads": by_threads,
                                  "transformers_version": transformers.__version__,
                                  "torch_version": torch.__version__}
    # Parity: greedy continuations of a few prompts agree token for token.
    check_B, check_R = 4, 16
    ours = generate(params, cfg, jnp.asarray(prompt_BP[:check_B]), jnp.asarray(mask_BP[:check_B]),
                    SamplingConfig(temperature=0.0, max_new_tokens=check_R), jax.random.key(0))
    theirs = _hf_generate(model, prompt_BP[:check_B], check_R, False)
    results["greedy_parity"] = {"rows": check_B, "tokens": check_R,
                                "agree_fraction": float((np.asarray(ours.tokens_BR) == theirs).mean())}
    print("greedy_parity", results["greedy_parity"], flush=True)

  if "ours" in results and "hf_transformers" in results:
    results["ours_over_hf"] = results["ours"]["tokens_per_s"] / results["hf_transformers"]["tokens_per_s"]
    results["ours_over_hf_per_cpu_s"] = (results["ours"]["tokens_per_cpu_s"]
                                         / results["hf_transformers"]["tokens_per_cpu_s"])
  results["machine"]["loadavg_after"] = os.getloadavg()
  with open(args.out, "w") as f:
    json.dump(results, f, indent=2)
  print(json.dumps(results, indent=2))


if __name__ == "__main__":
  main()
