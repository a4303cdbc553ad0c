"""A float64 numpy llama decoder: how the stand-in servers score the sync check's probe.

`llama_logits(model, tokens)` is the next-token logits of a llama-family
decoder (RMSNorm, rotate-half RoPE, grouped-query attention, SwiGLU, tied or
untied head) written out from Hugging Face's modeling_llama, independent of
the trainer's `jaxrl_llm.model`. The weights come from the files the engine's
weight syncs write: a GGUF export (`from_gguf`, q/k rows un-permuted back to
the rotate-half layout; quantised matrices dequantised with the `gguf`
package) or a Hugging Face directory (`from_hf`). No jax import: a stand-in
process starts in well under a second.
"""

from __future__ import annotations

import json
import os

import numpy as np


def _rms(x, g, eps):
  return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g


def _rope(x_TNH, theta: float):
  T, _, H = x_TNH.shape
  ang = np.arange(T)[:, None] * theta ** (-np.arange(0, H, 2) / H)[None]  # [T, H/2]
  cos, sin = np.cos(ang)[:, None], np.sin(ang)[:, None]
  a, b = x_TNH[..., :H // 2], x_TNH[..., H // 2:]
  return np.concatenate([a * cos - b * sin, b * cos + a * sin], -1)


def llama_logits(model: dict, tokens) -> np.ndarray:
  """float64 [V]: the logits of the token after `tokens` (positions 0 .. T - 1)."""
  N, K, H, theta, eps = model["n_heads"], model["n_kv_heads"], model["head_dim"], model["theta"], model["eps"]
  x = model["embed"][np.asarray(tokens)]
  T = x.shape[0]
  future = ~np.tril(np.ones((T, T), bool))
  for p in model["layers"]:
    h = _rms(x, p["attn_norm"], eps)
    q = _rope((h @ p["q"].T).reshape(T, N, H), theta)
    k = np.repeat(_rope((h @ p["k"].T).reshape(T, K, H), theta), N // K, axis=1)  # query head n: kv n // (N/K)
    v = np.repeat((h @ p["v"].T).reshape(T, K, H), N // K, axis=1)
    s = np.einsum("tnh,snh->nts", q, k) / np.sqrt(H)
    s[:, future] = -np.inf
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    x = x + np.einsum("nts,snh->tnh", w, v).reshape(T, N * H) @ p["o"].T
    h = _rms(x, p["ffn_norm"], eps)
    g = h @ p["gate"].T
    x = x + (g / (1.0 + np.exp(-g)) * (h @ p["up"].T)) @ p["down"].T
  return _rms(x[-1], model["norm"], eps) @ model["head"].T


def log_softmax(x: np.ndarray) -> np.ndarray:
  x = x - x.max()
  return x - np.log(np.exp(x).sum())


def _unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
  """llama.cpp's interleaved RoPE rows back to rotate-half: per head (i, a) -> (a, i)."""
  half = w.shape[0] // n_heads // 2
  return w.reshape(n_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def from_gguf(path: str) -> dict:
  """The model of a llama-architecture GGUF file (the engine's export)."""
  import gguf

  reader = gguf.GGUFReader(path)
  field = lambda key: reader.fields[f"llama.{key}"].contents()  # noqa: E731
  tensors = {}
  for t in reader.tensors:
    data = gguf.quants.dequantize(t.data, t.tensor_type)
    tensors[t.name] = np.asarray(data, np.float64).reshape([int(d) for d in reversed(t.shape)])
  N, K = int(field("attention.head_count")), int(field("attention.head_count_kv"))
  layers = []
  for i in range(int(field("block_count"))):
    b = lambda name: tensors[f"blk.{i}.{name}.weight"]  # noqa: E731,B023
    layers.append(dict(attn_norm=b("attn_norm"), q=_unpermute(b("attn_q"), N), k=_unpermute(b("attn_k"), K),
                       v=b("attn_v"), o=b("attn_output"), ffn_norm=b("ffn_norm"), gate=b("ffn_gate"),
                       up=b("ffn_up"), down=b("ffn_down")))
  embed = tensors["token_embd.weight"]
  return dict(embed=embed, layers=layers, norm=tensors["output_norm.weight"],
              head=tensors.get("output.weight", embed), n_heads=N, n_kv_heads=K,
              head_dim=int(field("attention.key_length")), theta=float(field("rope.freq_base")),
              eps=float(field("attention.layer_norm_rms_epsilon")))


def from_hf(path: str) -> dict:
  """The model of a Hugging Face llama directory (one model.safetensors, as the SGLang sync writes it)."""
  from safetensors.numpy import load_file

  with open(os.path.join(path, "config.json")) as f:
    hf = json.load(f)
  t = {k: v.astype(np.float64) for k, v in load_file(os.path.join(path, "model.safetensors")).items()}
  layers = []
  for i in range(hf["num_hidden_layers"]):
    b = lambda name: t[f"model.layers.{i}.{name}.weight"]  # noqa: E731,B023
    layers.append(dict(attn_norm=b("input_layernorm"), q=b("self_attn.q_proj"), k=b("self_attn.k_proj"),
                       v=b("self_attn.v_proj"), o=b("self_attn.o_proj"), ffn_norm=b("post_attention_layernorm"),
                       gate=b("mlp.gate_proj"), up=b("mlp.up_proj"), down=b("mlp.down_proj")))
  embed = t["model.embed_tokens.weight"]
  N = hf["num_attention_heads"]
  return dict(embed=embed, layers=layers, norm=t["model.norm.weight"], head=t.get("lm_head.weight", embed),
              n_heads=N, n_kv_heads=hf["num_key_value_heads"], head_dim=hf.get("head_dim") or hf["hidden_size"] // N,
              theta=float(hf["rope_theta"]), eps=float(hf["rms_norm_eps"]))
