"""Fingerprints of the decoder's compiled programs, to tell whether a change of the model code
changes what XLA runs, written as JSON.

    PYTHONPATH=<checkout> python scripts/compiled_programs.py --out F.json     # per version, compare

For ModelConfig.preset("qwen2_10m") (abstract params, nothing runs) it compiles, on this machine's
backend, the stacked forward (a scan), the gradient of a loss of the logits through it, and one decode
step over unstacked layers with a KV cache, and hashes each optimised HLO's instructions with the
instruction names and source metadata removed and the lines sorted: two versions with equal
fingerprints run the same operations (the order of independent instructions aside).
"""

import argparse
import hashlib
import json
import re

import jax
import jax.numpy as jnp

from jaxrl_llm import model as M


def fingerprint(compiled) -> dict:
  txt = re.sub(r", metadata=\{[^}]*\}", "", compiled.as_text())
  ops = sorted(re.sub(r"%[A-Za-z0-9_.-]+", "%v", line) for line in txt.splitlines() if " = " in line)
  return {"sha256": hashlib.sha256("\n".join(ops).encode()).hexdigest(), "instructions": len(ops)}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", required=True, help="JSON file to write")
  args = parser.parse_args()
  cfg = M.ModelConfig.preset("qwen2_10m")
  params = jax.eval_shape(lambda: M.init_params(cfg, jax.random.key(0)))
  B, T, S = 4, 16, 32
  t = jax.ShapeDtypeStruct((B, T), jnp.int32)
  m = jax.ShapeDtypeStruct((B, T), jnp.bool_)

  def hidden(p, t, m):
    return M.forward(p, cfg, t, jnp.cumsum(m, 1) - 1, m)[0]

  def step(p, tok, cache):
    pu = M.unstack_layers(p)
    h, cache = M.forward(pu, cfg, tok, jnp.zeros((B, 1), jnp.int32) + cache.index, jnp.ones((B, 1), bool), cache)
    return M.logits(pu, cfg, h), cache

  loss = jax.grad(lambda p, t, m: jnp.sum(M.logits(p, cfg, hidden(p, t, m)) ** 2))
  cache = jax.eval_shape(lambda: M.init_cache(cfg, B, S))
  out = {
      "forward_scan": fingerprint(jax.jit(hidden).lower(params, t, m).compile()),
      "grad_scan": fingerprint(jax.jit(loss).lower(params, t, m).compile()),
      "decode_unstacked": fingerprint(jax.jit(step).lower(params, jax.ShapeDtypeStruct((B, 1), jnp.int32),
                                                          cache).compile()),
  }
  with open(args.out, "w") as f:
    json.dump(out, f, indent=2)
  print(json.dumps(out, indent=2))


if __name__ == "__main__":
  main()
