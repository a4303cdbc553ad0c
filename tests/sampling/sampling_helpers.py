"""A tiny model and a full-forward (no KV cache) recompute for the sampler tests."""

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.model import ModelConfig, forward, init_params, logits

VOCAB = 48


def tiny_model(**overrides):
  """A 2-layer Qwen2-style model; init_std 0.3 so greedy paths are not flat."""
  base = dict(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64,
              qkv_bias=True, init_std=0.3)
  cfg = ModelConfig.tiny(VOCAB, **{**base, **overrides})
  params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.key(0))
  # Non-zero biases, so the q/k/v bias path is exercised too.
  layers = dict(params["layers"])
  for i, name in enumerate(("bq_LNH", "bk_LKH", "bv_LKH")):
    layers[name] = 0.3 * jax.random.normal(jax.random.key(10 + i), layers[name].shape)
  return cfg, {**params, "layers": layers}


def pad_prompts(prompts, side, width=None):
  """Lists of ids -> (tokens_BP, mask_BP), padded with id 0 on `side`
  ("left", "right"; "mixed" alternates starting with left)."""
  width = width or max(len(p) for p in prompts)
  tokens = np.zeros((len(prompts), width), np.int32)
  mask = np.zeros((len(prompts), width), bool)
  for b, p in enumerate(prompts):
    s = side if side != "mixed" else ("left" if b % 2 == 0 else "right")
    lo = width - len(p) if s == "left" else 0
    tokens[b, lo:lo + len(p)] = p
    mask[b, lo:lo + len(p)] = True
  return jnp.asarray(tokens), jnp.asarray(mask)


def recompute_logits(params, cfg, prompt_BP, prompt_mask_BP, tokens_BR, mask_BR):
  """logits_BRV[b, t]: the logits that predict response token t, from one
  forward pass without a cache over prompt + response."""
  tokens_BT = jnp.concatenate([prompt_BP, tokens_BR], axis=1)
  mask_BT = jnp.concatenate([prompt_mask_BP.astype(bool), mask_BR], axis=1)
  positions_BT = jnp.where(mask_BT, jnp.cumsum(mask_BT, axis=1) - 1, 0)
  hidden_BTD, _ = forward(params, cfg, tokens_BT, positions_BT, mask_BT)
  logits_BTV = logits(params, cfg, hidden_BTD)
  P, R = prompt_BP.shape[1], tokens_BR.shape[1]
  last_B = P - 1 - np.argmax(np.asarray(prompt_mask_BP)[:, ::-1], axis=1)
  idx_BR = np.concatenate([last_B[:, None], np.tile(np.arange(P, P + R - 1)[None, :], (len(last_B), 1))], axis=1)
  return jnp.take_along_axis(logits_BTV, jnp.asarray(idx_BR)[:, :, None], axis=1)
