"""Per-token log-probabilities, entropy and log-normaliser without N x V logits.

With tempered logits z = (hidden_ND @ w_DV) / temperature and p = softmax(z):

    lse     = log sum_v exp(z_v)
    logp    = z_target - lse                  (log p of the target token)
    entropy = lse - sum_v p_v z_v             (= -sum_v p_v log p_v)

The forward streams over vocabulary tiles with an online max (m), normaliser
(s = sum exp(z - m)) and first moment (a = sum exp(z - m) z), as in flash
attention. The backward recomputes each tile of logits and forms

    d z_v = g_logp (1[v = target] - p_v) + g_lse p_v + g_entropy p_v (E_p[z] - z_v)

then accumulates d hidden = d z @ w^T / T and d w = hidden^T @ d z / T tile by
tile. Gradients therefore flow to hidden and w through logp, entropy and lse.
"""

from __future__ import annotations

import functools

import flax.struct
import jax
import jax.numpy as jnp
from jax import lax

from jaxrl_llm.kernels import _mosaic_loop, _pallas_loop, _xla_loop
from jaxrl_llm.kernels.config import (MASK_VALUE, VocabTiles, check_hidden_w,
                                      check_ids, check_mask, check_temperature,
                                      ids_out_of_range, resolve_impl)

_HI = lax.Precision.HIGHEST

# The Pallas loops by resolved impl (``config.resolve_impl``); both take the
# same step / dz functions as the chunked-XLA loop.
PALLAS_LOOPS = {"pallas_triton": _pallas_loop, "pallas_mosaic": _mosaic_loop}


@flax.struct.dataclass
class TokenLogprobs:
  """Per-token outputs, all f32 (zero on masked tokens).

  logp: (N,) for ``token_logprobs``, (N, K) for ``gather_logprobs``: log p of
    the target id(s); NaN where an unmasked id is outside [0, V) under jit.
  entropy: (N,) entropy of p in nats.
  lse: (N,) log-sum-exp of the tempered logits.
  """

  logp: jax.Array
  entropy: jax.Array
  lse: jax.Array


# ----------------------------------------------------------------- reference


def full_logits_reference(hidden_ND, w_DV, temperature: float):
  """Tempered f32 logits, N x V (the naive path and the tests' oracle)."""
  z_NV = jnp.dot(hidden_ND.astype(jnp.float32), w_DV.astype(jnp.float32),
                 precision=_HI)
  return z_NV / jnp.float32(temperature)


def gather_logprobs_reference(hidden_ND, w_DV, ids_NK, *, temperature=1.0,
                              mask_N=None, impl="naive", tiles=None,
                              interpret=None) -> TokenLogprobs:
  """Plain-jnp ``gather_logprobs`` (materialises N x V); same signature."""
  del impl, tiles, interpret
  logp_NV = jax.nn.log_softmax(full_logits_reference(hidden_ND, w_DV,
                                                     temperature), axis=-1)
  v = w_DV.shape[1]
  logp_NK = jnp.take_along_axis(logp_NV, jnp.clip(ids_NK, 0, v - 1), axis=1)
  logp_NK = jnp.where(ids_out_of_range(ids_NK, v), jnp.nan, logp_NK)
  entropy_N = -jnp.sum(jnp.exp(logp_NV) * logp_NV, axis=-1)
  z_NV = full_logits_reference(hidden_ND, w_DV, temperature)
  lse_N = jax.nn.logsumexp(z_NV, axis=-1)
  return _apply_mask(TokenLogprobs(logp_NK, entropy_N, lse_N), mask_N)


def token_logprobs_reference(hidden_ND, w_DV, targets_N, *, temperature=1.0,
                             mask_N=None, impl="naive", tiles=None,
                             interpret=None) -> TokenLogprobs:
  """Plain-jnp ``token_logprobs`` (materialises N x V); same signature."""
  out = gather_logprobs_reference(hidden_ND, w_DV, targets_N[:, None],
                                  temperature=temperature, mask_N=mask_N)
  return out.replace(logp=out.logp[:, 0])


def _apply_mask(out: TokenLogprobs, mask_N) -> TokenLogprobs:
  if mask_N is None:
    return out
  logp = jnp.where(mask_N.reshape(mask_N.shape + (1,) * (out.logp.ndim - 1)),
                   out.logp, 0.0)
  return TokenLogprobs(logp, jnp.where(mask_N, out.entropy, 0.0),
                       jnp.where(mask_N, out.lse, 0.0))


# ------------------------------------------------------- streaming maths


# Per-row statistics are (rows, 1) columns, not (rows,) vectors: the layout a
# TPU (Mosaic) kernel keeps in VMEM, and the same maths for every path.


def _stats_init(rows: int, k: int):
  m_r1 = jnp.full((rows, 1), MASK_VALUE, jnp.float32)
  zero_r1 = jnp.zeros((rows, 1), jnp.float32)
  return m_r1, zero_r1, zero_r1, jnp.zeros((rows, k), jnp.float32)


def _stats_step(carry, tile, rows):
  """Online (max, normaliser, first moment, target logits) update."""
  m_r1, s_r1, a_r1, zt_rK = carry
  (z_rC,) = tile.zs
  (ids_rK,) = rows
  m_new = jnp.maximum(m_r1, jnp.max(z_rC, axis=1, keepdims=True))
  corr_r1 = jnp.exp(m_r1 - m_new)
  e_rC = jnp.exp(z_rC - m_new)
  s_r1 = s_r1 * corr_r1 + jnp.sum(e_rC, axis=1, keepdims=True)
  a_r1 = a_r1 * corr_r1 + jnp.sum(e_rC * z_rC, axis=1, keepdims=True)
  zt_rK = zt_rK + tile.gather(z_rC, ids_rK)
  return m_new, s_r1, a_r1, zt_rK


def stats_dz(tile, rows):
  """d z = p (alpha + beta (z - E_p z)) + scatter(g at ids)."""
  lse_r1, ez_r1, alpha_r1, beta_r1, ids_rK, g_rK = rows
  (z_rC,) = tile.zs
  p_rC = jnp.exp(z_rC - lse_r1)
  dz_rC = p_rC * (alpha_r1 + beta_r1 * (z_rC - ez_r1))
  return dz_rC + tile.scatter(g_rK, ids_rK)


def _stream_forward(h, w, ids_NK, temperature, impl, tiles, interpret):
  sources = ((h, w, temperature),)
  k = ids_NK.shape[1]
  if impl in PALLAS_LOOPS:
    carry = PALLAS_LOOPS[impl].forward(sources, _stats_step,
                                      functools.partial(_stats_init, k=k),
                                      (ids_NK,), tiles=tiles,
                                      interpret=interpret)
  else:
    carry = _xla_loop.forward(sources, _stats_step,
                              _stats_init(h.shape[0], k), (ids_NK,),
                              chunk_v=tiles.chunk_v)
  m_N1, s_N1, a_N1, zt_NK = carry
  lse_N1 = m_N1 + jnp.log(s_N1)
  ez_N1 = a_N1 / s_N1
  return zt_NK - lse_N1, (lse_N1 - ez_N1)[:, 0], lse_N1[:, 0], ez_N1[:, 0]


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def _core(h, w, ids_NK, temperature, impl, tiles, interpret):
  logp_NK, entropy_N, lse_N, _ = _stream_forward(h, w, ids_NK, temperature,
                                                 impl, tiles, interpret)
  return logp_NK, entropy_N, lse_N


def _core_fwd(h, w, ids_NK, temperature, impl, tiles, interpret):
  logp_NK, entropy_N, lse_N, ez_N = _stream_forward(h, w, ids_NK, temperature,
                                                    impl, tiles, interpret)
  return (logp_NK, entropy_N, lse_N), (h, w, ids_NK, lse_N, ez_N)


def _core_bwd(temperature, impl, tiles, interpret, res, cts):
  h, w, ids_NK, lse_N, ez_N = res
  g_logp_NK, g_entropy_N, g_lse_N = cts
  # d logp_k/dz = e_t - p;  d lse/dz = p;  d entropy/dz = -p (z - E_p z).
  alpha_N = g_lse_N - jnp.sum(g_logp_NK, axis=1)
  beta_N = -g_entropy_N
  rows = (lse_N[:, None], ez_N[:, None], alpha_N[:, None], beta_N[:, None],
          ids_NK, g_logp_NK)
  sources = ((h, w, temperature),)
  if impl in PALLAS_LOOPS:
    dh, dw = PALLAS_LOOPS[impl].backward(sources, stats_dz, rows,
                                        tiles=tiles, interpret=interpret)
  else:
    dh, dw = _xla_loop.backward(sources, stats_dz, rows, chunk_v=tiles.chunk_v)
  return dh, dw, None


_core.defvjp(_core_fwd, _core_bwd)


# ------------------------------------------------------------ public ops


def gather_logprobs(hidden_ND, w_DV, ids_NK, *, temperature=1.0, mask_N=None,
                    impl="auto", tiles: VocabTiles | None = None,
                    interpret=None) -> TokenLogprobs:
  """log p of K ids per token, plus entropy and lse, streaming over V.

  Logits are hidden_ND @ w_DV divided by ``temperature`` before the softmax.
  Gradients flow to hidden_ND and w_DV (not to the integer ids). Masked tokens
  (mask_N False) return 0 and get zero gradient; their ids are not checked.
  Ids out of [0, V) raise ValueError when the ids are concrete; under jit they
  cannot be checked cheaply and give logp = NaN for that entry instead.
  Cost: one pass over each vocabulary tile per id column (K), so keep K small
  (top-k sizes, not thousands).

  Args:
    hidden_ND: (N, D) final hidden states (any float dtype; math in f32).
    w_DV: (D, V) output projection.
    ids_NK: (N, K) integer ids.
    temperature: static float > 0.
    mask_N: optional (N,) bool.
    impl: "auto" | "pallas" | "xla_chunked" | "naive" (see ``config``).
    tiles: ``VocabTiles`` (default ``VocabTiles()``).
    interpret: for impl "pallas": None (compiled: Triton on GPU, Mosaic on
      TPU), True (the Triton kernels interpreted) or a
      ``jax.experimental.pallas.tpu.InterpretParams`` (the Mosaic kernels in
      TPU interpret mode); see ``config.resolve_impl``.
  """
  n, _, v = check_hidden_w(hidden_ND, w_DV)
  temperature = check_temperature(temperature)
  mask_N = check_mask(mask_N, n)
  if getattr(ids_NK, "ndim", None) != 2:
    raise ValueError(
        f"ids_NK has shape {getattr(ids_NK, 'shape', None)}: must be (N, K)")
  check_ids(ids_NK, (n, ids_NK.shape[1]), v, "ids_NK", mask_N)
  tiles = VocabTiles() if tiles is None else tiles
  if not isinstance(tiles, VocabTiles):
    raise TypeError(f"tiles={tiles!r}: must be a VocabTiles")
  impl, interpret = resolve_impl(impl, interpret)
  if impl == "naive":
    return gather_logprobs_reference(hidden_ND, w_DV, ids_NK,
                                     temperature=temperature, mask_N=mask_N)
  bad_NK = ids_out_of_range(ids_NK, v)
  if mask_N is not None:
    bad_NK = jnp.logical_and(bad_NK, mask_N[:, None])
  safe_NK = jnp.where(ids_out_of_range(ids_NK, v), -1, ids_NK).astype(jnp.int32)
  k = ids_NK.shape[1]
  if impl == "pallas_triton" and k & (k - 1):
    # Triton tiles are powers of two; id -1 matches no column.
    kp = 1 << (k - 1).bit_length()
    safe_NK = jnp.pad(safe_NK, ((0, 0), (0, kp - k)), constant_values=-1)
  logp_NK, entropy_N, lse_N = _core(hidden_ND, w_DV, safe_NK, temperature,
                                    impl, tiles, interpret)
  logp_NK = jnp.where(bad_NK, jnp.nan, logp_NK[:, :k])
  return _apply_mask(TokenLogprobs(logp_NK, entropy_N, lse_N), mask_N)


def token_logprobs(hidden_ND, w_DV, targets_N, *, temperature=1.0, mask_N=None,
                   impl="auto", tiles: VocabTiles | None = None,
                   interpret=None) -> TokenLogprobs:
  """log p(target), entropy and lse per token, never materialising N x V.

  Logits are hidden_ND @ w_DV divided by ``temperature`` before the softmax.
  See ``gather_logprobs`` for the arguments; ``targets_N`` is (N,) integer.
  Returns ``TokenLogprobs`` with logp of shape (N,).
  """
  n, _, v = check_hidden_w(hidden_ND, w_DV)
  if getattr(targets_N, "shape", None) != (n,):
    raise ValueError(
        f"targets_N has shape {getattr(targets_N, 'shape', None)}: must be "
        f"({n},) (one target per row of hidden_ND)")
  check_ids(targets_N, (n,), v, "targets_N", check_mask(mask_N, n))
  out = gather_logprobs(hidden_ND, w_DV, targets_N[:, None],
                        temperature=temperature, mask_N=mask_N, impl=impl,
                        tiles=tiles, interpret=interpret)
  return out.replace(logp=out.logp[:, 0])
