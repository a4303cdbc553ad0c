"""Top-k over the vocabulary from hidden states and the output projection.

For tempered logits z = (hidden_ND @ w_DV) / temperature, returns per token the
K largest ids (descending logit; ties to the lower id) and their log-probs
normalised over the FULL vocabulary, log p(v) = z_v - logsumexp(z). Used by the
sampler's record of mu (``topk_ids_BRK`` / ``topk_logp_BRK``) and by top-k
distillation.

The forward streams over vocabulary tiles keeping a running top-k and the
online log-sum-exp (chunked XLA: ``lax.top_k`` of the running set and the
chunk; Pallas: K rounds of max-selection per tile, since neither Triton nor
Mosaic has a sort).
The log-probs are differentiable in hidden and w (the ids are not):
d logp_k / d z = 1[v = id_k] - p, recomputed tile by tile in the backward.
"""

from __future__ import annotations

import functools

import flax.struct
import jax
import jax.numpy as jnp
from jax import lax

from jaxrl_llm.kernels import _xla_loop
from jaxrl_llm.kernels.config import (MASK_VALUE, VocabTiles, check_hidden_w,
                                      check_mask, check_temperature,
                                      resolve_impl)
from jaxrl_llm.kernels.token_logprobs import (PALLAS_LOOPS, full_logits_reference,
                                              stats_dz)


@flax.struct.dataclass
class VocabTopK:
  """ids: (N, K) int32, by descending logit; logp: (N, K) f32 log-probs
  normalised over the full vocabulary. Both 0 on masked tokens."""

  ids: jax.Array
  logp: jax.Array


def vocab_topk_reference(hidden_ND, w_DV, *, k: int, temperature=1.0,
                         mask_N=None, impl="naive", tiles=None,
                         interpret=None) -> VocabTopK:
  """Plain-jnp ``vocab_topk`` (materialises N x V); same signature."""
  del impl, tiles, interpret
  logp_NV = jax.nn.log_softmax(
      full_logits_reference(hidden_ND, w_DV, temperature), axis=-1)
  logp_NK, ids_NK = lax.top_k(logp_NV, k)
  return _apply_mask(VocabTopK(ids_NK.astype(jnp.int32), logp_NK), mask_N)


def _apply_mask(out: VocabTopK, mask_N) -> VocabTopK:
  if mask_N is None:
    return out
  return VocabTopK(jnp.where(mask_N[:, None], out.ids, 0),
                   jnp.where(mask_N[:, None], out.logp, 0.0))


# ------------------------------------------------------- streaming maths


def _init(rows: int, k: int):
  return (jnp.full((rows, 1), MASK_VALUE, jnp.float32),
          jnp.zeros((rows, 1), jnp.float32),
          jnp.full((rows, k), MASK_VALUE, jnp.float32),
          jnp.full((rows, k), -1, jnp.int32))


def _lse_update(m_r1, s_r1, z_rC):
  m_new = jnp.maximum(m_r1, jnp.max(z_rC, axis=1, keepdims=True))
  s_r1 = s_r1 * jnp.exp(m_r1 - m_new) + jnp.sum(jnp.exp(z_rC - m_new), axis=1,
                                                 keepdims=True)
  return m_new, s_r1


def _xla_step(carry, tile, rows):
  """Running top-k by ``lax.top_k`` over (running set, chunk)."""
  del rows
  m_r, s_r, vals_rK, ids_rK = carry
  (z_rC,) = tile.zs
  k = vals_rK.shape[1]
  m_r, s_r = _lse_update(m_r, s_r, z_rC)
  cols_rC = jnp.broadcast_to(tile.cols_1C, z_rC.shape)
  cand_vals = jnp.concatenate([vals_rK, z_rC], axis=1)
  cand_ids = jnp.concatenate([ids_rK, cols_rC], axis=1)
  vals_rK, idx_rK = lax.top_k(cand_vals, k)
  return m_r, s_r, vals_rK, jnp.take_along_axis(cand_ids, idx_rK, axis=1)


def _pallas_step(carry, tile, rows):
  """Running top-k by K rounds of max-selection over (running set, tile).

  The running set holds lower ids than the tile, so it wins ties; inside each
  the lowest id wins: the same order as ``lax.top_k`` on the full logits.
  """
  del rows
  m_r, s_r, vals_rK, ids_rK = carry
  (z_rC,) = tile.zs
  k = vals_rK.shape[1]
  m_r, s_r = _lse_update(m_r, s_r, z_rC)
  iota_1K = lax.broadcasted_iota(jnp.int32, (1, k), 1)
  big = 2**30  # a Python int: kernels may not capture arrays

  def body(i, state):
    run_rK, tz_rC, new_vals, new_ids = state
    best_run = jnp.max(run_rK, axis=1, keepdims=True)
    best_z = jnp.max(tz_rC, axis=1, keepdims=True)
    take_run = best_run >= best_z
    slot_r1 = jnp.min(jnp.where(run_rK == best_run, iota_1K, k), axis=1,
                      keepdims=True)
    run_id = jnp.sum(jnp.where(iota_1K == slot_r1, ids_rK, 0), axis=1,
                     keepdims=True)
    col_r1 = jnp.min(jnp.where(tz_rC == best_z, tile.cols_1C, big), axis=1,
                     keepdims=True)
    val = jnp.where(take_run, best_run, best_z)
    idv = jnp.where(take_run, run_id, col_r1)
    new_vals = jnp.where(iota_1K == i, val, new_vals)
    new_ids = jnp.where(iota_1K == i, idv, new_ids)
    run_rK = jnp.where(jnp.logical_and(take_run, iota_1K == slot_r1),
                       -jnp.inf, run_rK)
    tz_rC = jnp.where(jnp.logical_and(jnp.logical_not(take_run),
                                      tile.cols_1C == col_r1), -jnp.inf, tz_rC)
    return run_rK, tz_rC, new_vals, new_ids

  state = (vals_rK, z_rC, jnp.zeros_like(vals_rK), jnp.zeros_like(ids_rK))
  _, _, vals_rK, ids_rK = lax.fori_loop(0, k, body, state)
  return m_r, s_r, vals_rK, ids_rK


def _stream(h, w, k, temperature, impl, tiles, interpret):
  sources = ((h, w, temperature),)
  if impl in PALLAS_LOOPS:
    carry = PALLAS_LOOPS[impl].forward(sources, _pallas_step,
                                      functools.partial(_init, k=k), (),
                                      tiles=tiles, interpret=interpret)
  else:
    carry = _xla_loop.forward(sources, _xla_step, _init(h.shape[0], k), (),
                              chunk_v=tiles.chunk_v)
  m_N1, s_N1, vals_NK, ids_NK = carry
  lse_N1 = m_N1 + jnp.log(s_N1)
  return ids_NK, vals_NK - lse_N1, lse_N1[:, 0]


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5, 6))
def _core(h, w, k, temperature, impl, tiles, interpret):
  ids_NK, logp_NK, _ = _stream(h, w, k, temperature, impl, tiles, interpret)
  return ids_NK, logp_NK


def _core_fwd(h, w, k, temperature, impl, tiles, interpret):
  ids_NK, logp_NK, lse_N = _stream(h, w, k, temperature, impl, tiles,
                                   interpret)
  return (ids_NK, logp_NK), (h, w, ids_NK, lse_N)


def _core_bwd(k, temperature, impl, tiles, interpret, res, cts):
  del k
  h, w, ids_NK, lse_N = res
  _, g_NK = cts
  zeros_N1 = jnp.zeros_like(lse_N)[:, None]
  rows = (lse_N[:, None], zeros_N1, -jnp.sum(g_NK, axis=1, keepdims=True),
          zeros_N1, ids_NK, g_NK)
  sources = ((h, w, temperature),)
  if impl in PALLAS_LOOPS:
    return PALLAS_LOOPS[impl].backward(sources, stats_dz, rows, tiles=tiles,
                                      interpret=interpret)
  return _xla_loop.backward(sources, stats_dz, rows, chunk_v=tiles.chunk_v)


_core.defvjp(_core_fwd, _core_bwd)


def vocab_topk(hidden_ND, w_DV, *, k: int, temperature=1.0, mask_N=None,
               impl="auto", tiles: VocabTiles | None = None,
               interpret=None) -> VocabTopK:
  """Top-k ids and full-vocabulary log-probs per token, streaming over V.

  Logits are hidden_ND @ w_DV divided by ``temperature`` before the softmax.

  Args:
    hidden_ND: (N, D) final hidden states; w_DV: (D, V) output projection.
    k: static int, 1 <= k <= V.
    temperature: static float > 0.
    mask_N: optional (N,) bool; masked tokens return ids 0, logp 0 and get
      zero gradient.
    impl, tiles, interpret: see ``config``. The Pallas kernels cost k
      selection rounds per tile (the Triton ones pad k to a power of two).
  """
  n, _, v = check_hidden_w(hidden_ND, w_DV)
  temperature = check_temperature(temperature)
  mask_N = check_mask(mask_N, n)
  if isinstance(k, bool) or not isinstance(k, int):
    raise TypeError(f"k={k!r}: must be a Python int")
  if not 1 <= k <= v:
    raise ValueError(f"k={k}: must satisfy 1 <= k <= V = {v}")
  tiles = VocabTiles() if tiles is None else tiles
  if not isinstance(tiles, VocabTiles):
    raise TypeError(f"tiles={tiles!r}: must be a VocabTiles")
  impl, interpret = resolve_impl(impl, interpret)
  if impl == "naive":
    return vocab_topk_reference(hidden_ND, w_DV, k=k, temperature=temperature,
                                mask_N=mask_N)
  kp = 1 << (k - 1).bit_length() if impl == "pallas_triton" else k
  ids_NK, logp_NK = _core(hidden_ND, w_DV, kp, temperature, impl, tiles,
                          interpret)
  return _apply_mask(VocabTopK(ids_NK[:, :k], logp_NK[:, :k]), mask_N)
