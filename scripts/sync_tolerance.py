"""The sync check's tolerances, measured: max |delta log p| on the probe between llama.cpp's server and the trainer.

For each model and each GGUF export type (f32, f16, q8_0, q4_0) the model is
exported as the engine exports it (`export_gguf`), llama.cpp's `llama-server`
is started on it as the engine starts it (`LlamaServerProcess`: the f32
export with an f32 KV cache and no flash attention), and each of `--seeds`
probes (`sync_check.probe_ids` with seeds 0, 1, ...) is scored by the server
(`sync_check.engine_logp`, what every verified sync sends) and by the trainer
(`sync_check.trainer_logp` on the params exported). Reported per model and
type: the max over the probes of max_t |log p_server - log p_trainer|, and
the same against the trainer run on the weights read back from the exported
file (the project's GGUF reader, `gguf_io.gguf_to_hf` + `hf_io.load_hf`):
what is left once the export's rounding is taken out (llama.cpp's arithmetic).
"hf" is the trainer's bfloat16-compute forward against its float32 one, no
server: the stand-in for SGLang's default precision.

Models: the tiny character model at init scales 0.02 (the default) and
0.1, and, when fetched, SmolLM2-135M-Instruct (`python -m jaxrl_llm.convert
fetch --model=smollm2-135m`) set the tolerances; the tiny model at 0.3 (the
llama.cpp tests' model, whose random logits swing by tens of nats) is
measured as a stress case and left out of them.

    python scripts/sync_tolerance.py --out sync_tolerance.json [--seeds 8] [--server PATH] [--margin 4]

JSON: {"runs": [{model, export, max_abs_dlogp, max_abs_dlogp_readback, mean_abs_dlogp, sets_tolerance,
seconds}], "tolerance": {export: value}, "margin", "seeds", "server"}; tolerance = margin x the largest
max_abs_dlogp of the type over the models that set it, rounded up to 1, 2 or 5 x 10^k.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import tempfile
import time

import jax
import numpy as np

from jaxrl_llm.model.config import ModelConfig
from jaxrl_llm.model.io.gguf_export import GGUF_EXPORT_TYPES, export_gguf
from jaxrl_llm.model.io.gguf_io import gguf_to_hf
from jaxrl_llm.model.io.hf_io import load_hf
from jaxrl_llm.model.params import init_params
from jaxrl_llm.model.io.pretrained import models_dir
from jaxrl_llm.model.tokenizer import CharTokenizer, make_tokenizer
from jaxrl_llm.sampling import sync_check
from jaxrl_llm.sampling.http_client import ServerClient
from jaxrl_llm.sampling.server_process import LlamaServerProcess


def default_server() -> str:
  built = os.environ.get("JAXRL_LLM_LLAMA_CPP") or os.path.expanduser("~/.cache/jaxrl_llm/llama-server-0.3.36")
  return os.environ.get("JAXRL_LLM_LLAMA_SERVER") or os.path.join(built, "build", "bin", "llama-server")


def models():
  """(name, params, cfg, tokenizer, hf_path, sets_tolerance) of every model measured."""
  tok = CharTokenizer()
  for std in (0.02, 0.1, 0.3):
    cfg = ModelConfig.tiny(tok.vocab_size, init_std=std)
    yield f"tiny(init_std={std})", init_params(cfg, jax.random.key(0)), cfg, tok, "", std < 0.3
  hf = os.path.join(models_dir(), "hf")
  found = os.listdir(hf) if os.path.isdir(hf) else []
  smol = sorted(os.path.join(hf, d) for d in found if d.startswith("SmolLM2-135M"))
  if smol:
    params, cfg = load_hf(smol[0])
    yield "SmolLM2-135M-Instruct", params, cfg, make_tokenizer(smol[0]), smol[0], True
  else:
    print("SmolLM2-135M-Instruct is not fetched: measured on the tiny model only", file=sys.stderr)


def excluded(tok) -> tuple[int, ...]:
  ids = [getattr(tok, "pad_id", None), getattr(tok, "eos_id", None), getattr(tok, "bos_id", None)]
  ids += list(getattr(tok, "eos_ids", ()) or ())
  return tuple(int(i) for i in ids if i is not None)


def measure(command: str, name, params, cfg, tok, hf_path, export: str, seeds: int, work: str) -> dict:
  t0 = time.perf_counter()
  path = os.path.join(work, f"policy-v0.{export}.gguf")
  export_gguf(params, cfg, path, tokenizer=tok, qtype=export, hf_path=hf_path)
  readback_dir = gguf_to_hf(path, os.path.join(work, f"readback-{export}"), chat_template=False)
  readback, rb_cfg = load_hf(readback_dir)
  probes = [sync_check.probe_ids(cfg.vocab_size, excluded(tok), seed=s) for s in range(seeds)]
  proc = LlamaServerProcess(command, alias="probe", slots=1, ctx_per_slot=64, wait_s=600.0, log_dir=work,
                            exact=export == "f32")
  proc.start(path)
  try:
    client = ServerClient(proc.url, timeout_s=120.0)
    served = [sync_check.engine_logp(client, "probe", p, sync_check.Deadline(3600.0, 0), timeout_s=120.0,
                                     retries=2, backoff_s=0.5) for p in probes]
  finally:
    proc.stop()
  ours = [sync_check.trainer_logp(params, cfg, p) for p in probes]
  back = [sync_check.trainer_logp(readback, rb_cfg, p) for p in probes]
  run = {"model": name, "export": export,
         "max_abs_dlogp": float(max(np.abs(s - o).max() for s, o in zip(served, ours))),
         "max_abs_dlogp_readback": float(max(np.abs(s - b).max() for s, b in zip(served, back))),
         "mean_abs_dlogp": float(np.mean([np.abs(s - o).mean() for s, o in zip(served, ours)])),
         "seconds": round(time.perf_counter() - t0, 1)}
  print(json.dumps(run), flush=True)
  return run


def bf16_gap(name, params, cfg, tok, seeds: int) -> dict:
  """The trainer in bfloat16 compute against float32, same params: the 'hf' (SGLang) stand-in."""
  gaps = []
  for s in range(seeds):
    p = sync_check.probe_ids(cfg.vocab_size, excluded(tok), seed=s)
    f32 = sync_check.trainer_logp(params, cfg, p)
    bf16 = np.asarray(sync_check._logp(params, jax.numpy.asarray(p)[None],  # noqa: SLF001 - the same function
                                       dataclasses.replace(cfg, compute_dtype="bfloat16")))
    gaps.append(float(np.abs(bf16 - f32).max()))
  run = {"model": name, "export": "hf", "max_abs_dlogp": max(gaps), "max_abs_dlogp_readback": None}
  print(json.dumps(run), flush=True)
  return run


def round_up(x: float) -> float:
  """The smallest of 1, 2, 5 x 10^k that is >= x (2.3e-3 -> 5e-3, 0.107 -> 0.2)."""
  e = math.floor(math.log10(x))
  return next(float(f"{m}e{k}") for k in (e, e + 1) for m in (1, 2, 5) if float(f"{m}e{k}") >= x)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", required=True, help="JSON file to write")
  ap.add_argument("--seeds", type=int, default=8, help="probes per model and export type")
  ap.add_argument("--server", default=default_server(), help="llama.cpp's llama-server (scripts/build_llama_server.sh)")
  ap.add_argument("--threads", type=int, default=1, help="llama-server -t")
  ap.add_argument("--margin", type=float, default=4.0, help="tolerance = margin x the largest measured gap")
  args = ap.parse_args()
  command = f"{args.server} -t {args.threads}"
  runs = []
  with tempfile.TemporaryDirectory() as tmp:
    for i, (name, params, cfg, tok, hf_path, sets) in enumerate(models()):
      for export in GGUF_EXPORT_TYPES:
        work = os.path.join(tmp, f"{i}-{export}")
        os.makedirs(work)
        runs.append({**measure(command, name, params, cfg, tok, hf_path, export, args.seeds, work),
                     "sets_tolerance": sets})
      runs.append({**bf16_gap(name, params, cfg, tok, args.seeds), "sets_tolerance": sets})
  tol = {e: round_up(args.margin * max(r["max_abs_dlogp"] for r in runs if r["export"] == e and r["sets_tolerance"]))
         for e in (*GGUF_EXPORT_TYPES, "hf")}
  out = {"runs": runs, "tolerance": tol, "margin": args.margin, "seeds": args.seeds, "server": args.server}
  with open(args.out, "w") as f:
    json.dump(out, f, indent=2)
  print(json.dumps({"tolerance": tol}))


if __name__ == "__main__":
  main()
