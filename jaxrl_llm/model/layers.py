"""Decoder building blocks: RMSNorm (w or Gemma's 1 + w), RoPE (with linear /
Llama 3 scaling), grouped-query attention over a slot axis (optionally
soft-capped), the gated MLP (SwiGLU or GeGLU).

Numerics follow the Hugging Face reference implementations: RMSNorm
normalises in float32 and casts back before the scale (Gemma: scales in
float32, then casts); RoPE tables are float32 (rotate-half layout);
attention scores and softmax are float32.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.model.config import ModelConfig, RopeScaling


def rms_norm(x_BTD: jax.Array, scale_D: jax.Array, eps: float, plus_one: bool = False) -> jax.Array:
  """y = scale * x / sqrt(mean(x^2) + eps), the mean over the last axis.

  plus_one (Gemma): y = (1 + scale) * x / sqrt(mean(x^2) + eps), the product
  taken in float32 and cast back after it, where the plain form casts the
  normalised x back first and multiplies in x's dtype (as Hugging Face's
  Gemma3RMSNorm and LlamaRMSNorm do: they differ in bf16).
  Works for any leading shape (also the per-head q/k norm over H).
  """
  x32 = x_BTD.astype(jnp.float32)
  var = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
  shape = (1,) * (x_BTD.ndim - 1) + scale_D.shape
  if plus_one:
    scale32 = 1.0 + scale_D.astype(jnp.float32).reshape(shape)
    return (x32 * jax.lax.rsqrt(var + eps) * scale32).astype(x_BTD.dtype)
  normed = (x32 * jax.lax.rsqrt(var + eps)).astype(x_BTD.dtype)
  scale = scale_D.astype(x_BTD.dtype).reshape(shape)
  return scale * normed


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None) -> np.ndarray:
  """Inverse frequencies theta^(-2i/H), i < H/2, float32, with optional scaling.

  Computed with numpy at trace time (static), op by op in float32 like the
  reference implementation.
  """
  exponent = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
  inv_freq = (np.float32(1.0) / (np.float32(theta) ** exponent)).astype(np.float32)
  if scaling is None:
    return inv_freq
  factor = np.float32(scaling.factor)
  if scaling.kind == "linear":
    return (inv_freq / factor).astype(np.float32)
  # Llama 3.1: keep high frequencies, divide low ones by `factor`, and blend
  # linearly in wavelength-space between the two cut-offs.
  old_len = np.float32(scaling.original_max_position)
  low, high = np.float32(scaling.low_freq_factor), np.float32(scaling.high_freq_factor)
  low_freq_wavelen = old_len / low
  high_freq_wavelen = old_len / high
  wavelen = np.float32(2 * math.pi) / inv_freq
  scaled = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
  smooth = (old_len / wavelen - low) / (high - low)
  smoothed = (1 - smooth) * scaled / factor + smooth * scaled
  is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
  return np.where(is_medium, smoothed, scaled).astype(np.float32)


def rope_tables(positions_BT: jax.Array, cfg: ModelConfig, local: bool = False
                ) -> tuple[jax.Array, jax.Array]:
  """cos_BTH, sin_BTH (float32) for the rotate-half layout; local=True: the
  local layers' table (base rope_local_theta, no scaling) when the config
  gives them one."""
  if local and cfg.rope_local_theta is not None:
    theta, scaling = cfg.rope_local_theta, None
  else:
    theta, scaling = cfg.rope_theta, cfg.rope_scaling
  inv_freq = jnp.asarray(rope_inv_freq(cfg.head_dim, theta, scaling))
  angles_BTh = positions_BT.astype(jnp.float32)[:, :, None] * inv_freq[None, None, :]
  angles_BTH = jnp.concatenate([angles_BTh, angles_BTh], axis=-1)
  return jnp.cos(angles_BTH), jnp.sin(angles_BTH)


def apply_rope(x_BTNH: jax.Array, cos_BTH: jax.Array, sin_BTH: jax.Array) -> jax.Array:
  """x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1]."""
  half = x_BTNH.shape[-1] // 2
  x1, x2 = x_BTNH[..., :half], x_BTNH[..., half:]
  rotated = jnp.concatenate([-x2, x1], axis=-1)
  cos = cos_BTH.astype(x_BTNH.dtype)[:, :, None, :]
  sin = sin_BTH.astype(x_BTNH.dtype)[:, :, None, :]
  return x_BTNH * cos + rotated * sin


def attention(q_BTNH: jax.Array, k_BKHS: jax.Array, v_BKSH: jax.Array,
              allowed_BTS: jax.Array, *, scale: float | None = None,
              softcap: float | None = None) -> jax.Array:
  """Softmax(q k^T * scale) v over the allowed (query, slot) pairs; GQA.

  scale defaults to 1 / sqrt(H). softcap c (Gemma 2): the scaled scores
  become c * tanh(scores / c) before the mask.

  Keys come transposed, [B, K, H, S], and values head-major, [B, K, S, H]
  (the KV cache's layouts), so q k^T and p v are both plain batched matmuls
  over (B, K) with the contraction on the rows of the second operand: no
  transpose of the keys or values, which at decode are the whole cache, and
  the faster matmul form on a CPU (docs/benchmarks.md, "Sampler", has the
  measurement).
  A query row with no allowed slot (a padding query) returns zeros, not NaN,
  and passes no gradient anywhere.
  """
  B, T, N, H = q_BTNH.shape
  K = k_BKHS.shape[1]
  q_BKGTH = jnp.transpose(q_BTNH.reshape(B, T, K, N // K, H), (0, 2, 3, 1, 4))
  scores_BKGTS = jnp.einsum("BKGTH,BKHS->BKGTS", q_BKGTH, k_BKHS,
                            preferred_element_type=jnp.float32) * (H ** -0.5 if scale is None else scale)
  if softcap is not None:
    scores_BKGTS = softcap * jnp.tanh(scores_BKGTS / softcap)
  allowed_B11TS = allowed_BTS[:, None, None, :, :]
  scores_BKGTS = jnp.where(allowed_B11TS, scores_BKGTS, jnp.finfo(jnp.float32).min)
  probs_BKGTS = jax.nn.softmax(scores_BKGTS, axis=-1)
  # Fully masked rows softmax to uniform; zero them so padding reads nothing.
  probs_BKGTS = jnp.where(allowed_B11TS, probs_BKGTS, 0.0).astype(v_BKSH.dtype)
  out_BKGTH = jnp.einsum("BKGTS,BKSH->BKGTH", probs_BKGTS, v_BKSH)
  return jnp.transpose(out_BKGTH, (0, 3, 1, 2, 4)).reshape(B, T, N, H)


def gated_mlp(x_BTD: jax.Array, w_gate_DF: jax.Array, w_up_DF: jax.Array,
              w_down_FD: jax.Array, act: str = "silu") -> jax.Array:
  """down(act(x W_gate) * (x W_up)): SwiGLU with act="silu", GeGLU with
  act="gelu_tanh" (the tanh approximation of GELU, PyTorch's
  gelu(approximate="tanh"))."""
  gate_BTF = jnp.einsum("BTD,DF->BTF", x_BTD, w_gate_DF)
  up_BTF = jnp.einsum("BTD,DF->BTF", x_BTD, w_up_DF)
  return jnp.einsum("BTF,FD->BTD", glu(gate_BTF, up_BTF, act), w_down_FD)


def glu(gate_BTF: jax.Array, up_BTF: jax.Array, act: str = "silu") -> jax.Array:
  """act(gate) * up, the gated MLP's hidden activations."""
  if act == "silu":
    return jax.nn.silu(gate_BTF) * up_BTF
  if act == "gelu_tanh":
    return jax.nn.gelu(gate_BTF, approximate=True) * up_BTF
  raise ValueError(f"gated_mlp: act={act!r} is not one of ('silu', 'gelu_tanh')")
