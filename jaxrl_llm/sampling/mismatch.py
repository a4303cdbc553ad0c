"""A sampler mismatch you can dial: mu != pi_prox on purpose, and how far apart they are.

Real rollout engines do not run the trainer's weights exactly: they quantise
them, run other kernels and lag behind (docs/objectives.md sections 1 and
12, "rollout mismatch"). The built-in sampler reproduces the first
two on purpose, so that the off-policy corrections of docs/objectives.md
section 4 (c = pi_prox / mu) can be studied with a known, adjustable mismatch
(`SamplerMismatch`, the run config's `rollout.mismatch` section):

* `quant`: group-wise symmetric fake quantisation of the weight matrices,
  after llama.cpp's block formats (ggml-quants.c, quantize_row_q8_0_ref and
  quantize_row_q4_0_ref): blocks of `quant_group` consecutive weights along the
  matmul's input axis (the axis llama.cpp blocks along), one scale per
  block stored as float16, and

      int8 (Q8_0): d = amax / 127,  q = roundf(x / d)        in [-127, 127],  x' = q d
      int4 (Q4_0): d = max / -8,    q = min(15, floor(x / d + 8.5)) in [0, 15], x' = (q - 8) d

  where amax = max |x| over the block and max is the block's value of
  largest magnitude, with its sign (so it lands exactly on level -8). The
  dequantised weights x' replace the matrices (fake quantisation: the
  sampler still runs float matmuls). A last block shorter than `quant_group` is
  quantised on its own (llama.cpp refuses such rows; we keep them).
* `noise`: a relative Gaussian perturbation x' = x (1 + noise * eps) of the
  same matrices, eps ~ N(0, 1) drawn once from `noise_seed` (one stream per
  tensor): the same eps at every refresh, so, like an engine's kernels, the
  perturbation is a fixed function of the weights.

Tensors touched (`MATRICES`): every weight matrix of the decoder, i.e. the
token embedding (and with it a tied output head), the untied output head,
the attention projections wq, wk, wv, wo and the MLP's w_gate, w_up, w_down;
norm scales and biases stay as they are (llama.cpp keeps them in float too).
Order: noise, then quantisation, then the sampler's dtype cast
(`rollout.sampler_dtype`), so all sources combine; staleness k is separate
(which weights the engine is handed). The engine derives its weights with
`mismatched_params` whenever its weights are refreshed (`JaxSampler.sync`).

`mismatch_metrics` measures what a step's mismatch did: statistics of
log c = log pi_prox - log mu over the response tokens.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.checks import check_choice, check_float, check_int

QUANT_MODES = ("none", "int8", "int4")
# A weight matrix of the params (model/params.py) -> the axes its matmul contracts
# over (the input axes; the embedding's row is its D axis, as the tied head
# contracts it). Quantisation blocks run along these axes.
MATRICES = {
    "embed_VD": (1,), "lm_head_DV": (0,),
    "wq_LDNH": (1,), "wk_LDKH": (1,), "wv_LDKH": (1,), "wo_LNHD": (1, 2),
    "w_gate_LDF": (1,), "w_up_LDF": (1,), "w_down_LFD": (1,),
}


@dataclasses.dataclass(frozen=True)
class SamplerMismatch:
  """How the sampler's weights differ from the policy's: the run config's `rollout.mismatch`
  section (built-in engine; `--config.rollout.mismatch.<field>=...`, training/defaults.py builds
  the block from these defaults). Hashable: a jit static argument."""

  quant: str = "none"  # none | int8 | int4: the weight matrices fake-quantised like llama.cpp's Q8_0 / Q4_0
  quant_group: int = 32  # weights per quantisation block (one float16 scale each), along the input axis
  noise: float = 0.0  # relative std of a Gaussian perturbation w (1 + noise eps) of the matrices; 0 = off
  noise_seed: int = 0  # seed of eps (drawn once: the same perturbation at every weight refresh)

  def __post_init__(self):
    check_choice("config.rollout.mismatch.quant", self.quant, QUANT_MODES)
    check_int("config.rollout.mismatch.quant_group", self.quant_group, 1, 1 << 20)
    object.__setattr__(self, "noise", check_float("config.rollout.mismatch.noise", self.noise, 0.0, 1.0))
    check_int("config.rollout.mismatch.noise_seed", self.noise_seed, 0)

  @property
  def active(self) -> bool:
    """Whether the sampler's weights differ from the ones it is handed."""
    return self.quant != "none" or self.noise > 0


NO_MISMATCH = SamplerMismatch()


def _round_half_away(x):
  """C's roundf: round to nearest, ties away from zero (jnp.round breaks ties to even)."""
  r = jnp.round(x)
  t = jnp.trunc(x)
  tie = jnp.abs(x - t) == 0.5
  return jnp.where(tie, t + jnp.sign(x), r)


def fake_quantize(w, *, bits: int, group: int, axes: tuple[int, ...] = (-1,)):
  """w with each block of `group` weights along `axes` quantised and dequantised.

  bits = 8: llama.cpp's Q8_0 rule; bits = 4: Q4_0 (module docstring). The
  block scale is rounded to float16 as llama.cpp stores it. `axes` are
  flattened (in order) into the blocked axis. Returns w's shape and dtype.
  """
  if bits not in (4, 8):
    raise ValueError(f"fake_quantize: bits={bits!r} is invalid: allowed 4 (Q4_0) or 8 (Q8_0)")
  if not isinstance(group, int) or group < 1:
    raise ValueError(f"fake_quantize: group={group!r} is invalid: a block size >= 1")
  dtype = w.dtype
  axes = tuple(a % w.ndim for a in axes)
  rest = tuple(a for a in range(w.ndim) if a not in axes)
  x = jnp.transpose(w.astype(jnp.float32), rest + axes)
  moved = x.shape
  n = int(np.prod([w.shape[a] for a in axes]))
  x = x.reshape(moved[:len(rest)] + (n,))
  pad = -n % group
  x = jnp.pad(x, [(0, 0)] * len(rest) + [(0, pad)])  # zeros change no block's max
  x = x.reshape(x.shape[:-1] + ((n + pad) // group, group))
  if bits == 8:
    d = jnp.max(jnp.abs(x), axis=-1, keepdims=True) / 127.0
    inv = jnp.where(d != 0, 1.0 / jnp.where(d != 0, d, 1.0), 0.0)
    q = _round_half_away(x * inv)
    out = q * d.astype(jnp.float16).astype(jnp.float32)
  else:
    peak = jnp.take_along_axis(x, jnp.argmax(jnp.abs(x), axis=-1, keepdims=True), axis=-1)
    d = peak / -8.0
    inv = jnp.where(d != 0, 1.0 / jnp.where(d != 0, d, 1.0), 0.0)
    q = jnp.minimum(15.0, jnp.floor(x * inv + 8.5))
    out = (q - 8.0) * d.astype(jnp.float16).astype(jnp.float32)
  out = out.reshape(out.shape[:-2] + (n + pad,))[..., :n].reshape(moved)
  inverse = np.argsort(rest + axes)
  return jnp.transpose(out, tuple(int(i) for i in inverse)).astype(dtype)


def _matrix_leaves(params):
  """(path string, name, leaf) of every weight matrix, in a fixed (sorted) order."""
  out = []
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    name = getattr(path[-1], "key", None)
    if name in MATRICES:
      out.append((jax.tree_util.keystr(path), name, leaf))
  return sorted(out, key=lambda t: t[0])


@functools.partial(jax.jit, static_argnames=("mismatch",))
def mismatched_params(params: dict, mismatch: SamplerMismatch) -> dict:
  """The sampler's weights for the policy's `params`: noise, then quantisation (module docstring).

  Pure: equal params and settings give equal weights. Leaves outside
  `MATRICES` are returned unchanged.
  """
  if not mismatch.active:
    return params
  names = [p for p, _, _ in _matrix_leaves(params)]
  base = jax.random.key(mismatch.noise_seed)

  def derive(path, leaf):
    name = getattr(path[-1], "key", None)
    if name not in MATRICES:
      return leaf
    w = leaf
    if mismatch.noise > 0:
      k = jax.random.fold_in(base, names.index(jax.tree_util.keystr(path)))
      eps = jax.random.normal(k, w.shape, jnp.float32)
      w = (w.astype(jnp.float32) * (1.0 + mismatch.noise * eps)).astype(leaf.dtype)
    if mismatch.quant != "none":
      w = fake_quantize(w, bits=8 if mismatch.quant == "int8" else 4, group=mismatch.quant_group,
                        axes=MATRICES[name])
    return w

  return jax.tree_util.tree_map_with_path(derive, params)


# Quantiles of log c reported every step, and the bands whose outside is counted.
LOG_C_QUANTILES = (0.01, 0.1, 0.5, 0.9, 0.99)
C_BANDS = ((0.5, 2.0), (0.5, 5.0))


def mismatch_metrics(prox_logp_BR, behav_logp_BR, mask_BR) -> dict[str, float]:
  """What a step's mismatch produced, over its response tokens (host numbers).

  log c = log pi_prox - log mu per token (c = pi_prox / mu, docs/objectives.md
  eq. 1.1), unclamped:
    mismatch/log_c_mean, mismatch/log_c_abs_mean, mismatch/log_c_q{01,10,50,90,99};
    mismatch/seq_abs_log_c_mean and _max: |log c_i| = |sum_t log c_{i,t}| of each answer;
    mismatch/c_out_0.5_2_frac and mismatch/c_out_0.5_5_frac: tokens with c outside [0.5, 2] and [0.5, 5].
  """
  mask = np.asarray(mask_BR, bool)
  log_c = np.where(mask, np.asarray(prox_logp_BR, np.float64) - np.asarray(behav_logp_BR, np.float64), 0.0)
  tok = log_c[mask]
  if tok.size == 0:
    tok = np.zeros(1)
  out = {"mismatch/log_c_mean": float(tok.mean()), "mismatch/log_c_abs_mean": float(np.abs(tok).mean())}
  for q, v in zip(LOG_C_QUANTILES, np.quantile(tok, LOG_C_QUANTILES)):
    out[f"mismatch/log_c_q{round(q * 100):02d}"] = float(v)
  seq = np.abs(log_c.sum(axis=1))[mask.any(axis=1)]
  out["mismatch/seq_abs_log_c_mean"] = float(seq.mean()) if seq.size else 0.0
  out["mismatch/seq_abs_log_c_max"] = float(seq.max()) if seq.size else 0.0
  for lo, hi in C_BANDS:
    outside = (tok < np.log(lo)) | (tok > np.log(hi))
    out[f"mismatch/c_out_{lo:g}_{hi:g}_frac"] = float(outside.mean())
  return out
