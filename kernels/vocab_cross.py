"""Vocabulary cross terms between p (trainable) and a second distribution q.

p = softmax(hidden_ND @ w_DV / temperature) carries the gradient; q is always
stop-gradient. Per token, summed over the whole vocabulary:

    cross = sum_v q(v) log p(v)
    kl_pq = KL(p || q) = sum_v p(v) (log p(v) - log q(v))     (reverse KL)
    kl_qp = KL(q || p) = sum_v q(v) (log q(v) - log p(v))     (forward KL)

Two ways to give q:

- ``vocab_cross``: q = softmax(hidden_q_NE @ w_q_EV / temperature_q), e.g. the
  sampler's mu recomputed by the old policy (exact Score Centering, whose term
  ``cross`` has gradient sum_v mu(v) s_v, docs/objectives.md eq. 8.2), a teacher for
  full forward/reverse KL distillation, or mu for TRM's full KL. Streams over
  vocabulary tiles with an online log-sum-exp for both distributions; the
  backward recomputes both logit tiles and uses, with q fixed,
      d cross / d z = q - p,   d kl_qp / d z = p - q,
      d kl_pq / d z = p (log p - log q - kl_pq).
- ``vocab_cross_topk`` (in ``vocab_cross_topk.py``): q given as top-k.
"""

from __future__ import annotations

import functools

import flax.struct
import jax
import jax.numpy as jnp

from jaxrl_llm.kernels import _xla_loop
from jaxrl_llm.kernels.config import (MASK_VALUE, VocabTiles, check_hidden_w,
                                      check_mask, check_temperature,
                                      resolve_impl)
from jaxrl_llm.kernels.token_logprobs import PALLAS_LOOPS, full_logits_reference


@flax.struct.dataclass
class VocabCross:
  """Per-token f32 (N,) terms; 0 on masked tokens. q is stop-gradient.

  cross: sum_v q(v) log p(v).  kl_pq: KL(p || q).  kl_qp: KL(q || p).
  """

  cross: jax.Array
  kl_pq: jax.Array
  kl_qp: jax.Array


def apply_mask(out: VocabCross, mask_N) -> VocabCross:
  if mask_N is None:
    return out
  return jax.tree.map(lambda x: jnp.where(mask_N, x, 0.0), out)


def vocab_cross_reference(hidden_ND, w_DV, hidden_q_NE, w_q_EV, *,
                          temperature=1.0, temperature_q=1.0, mask_N=None,
                          impl="naive", tiles=None,
                          interpret=None) -> VocabCross:
  """Plain-jnp ``vocab_cross`` (materialises N x V twice); same signature."""
  del impl, tiles, interpret
  logp_NV = jax.nn.log_softmax(
      full_logits_reference(hidden_ND, w_DV, temperature), axis=-1)
  logq_NV = jax.lax.stop_gradient(jax.nn.log_softmax(
      full_logits_reference(hidden_q_NE, w_q_EV, temperature_q), axis=-1))
  p_NV, q_NV = jnp.exp(logp_NV), jnp.exp(logq_NV)
  return apply_mask(VocabCross(
      cross=jnp.sum(q_NV * logp_NV, axis=-1),
      kl_pq=jnp.sum(p_NV * (logp_NV - logq_NV), axis=-1),
      kl_qp=jnp.sum(q_NV * (logq_NV - logp_NV), axis=-1)), mask_N)


# ------------------------------------------------------- streaming maths


def _init(rows: int):
  m = jnp.full((rows, 1), MASK_VALUE, jnp.float32)
  zero = jnp.zeros((rows, 1), jnp.float32)
  # Per distribution: max, normaliser, sum e z, sum e y (e = exp(logit - max)).
  return (m, zero, zero, zero), (m, zero, zero, zero)


def _moments_update(state, x_rC, z_rC, y_rC):
  m_r1, s_r1, az_r1, ay_r1 = state
  m_new = jnp.maximum(m_r1, jnp.max(x_rC, axis=1, keepdims=True))
  corr_r1 = jnp.exp(m_r1 - m_new)
  e_rC = jnp.exp(x_rC - m_new)
  return (m_new, s_r1 * corr_r1 + jnp.sum(e_rC, axis=1, keepdims=True),
          az_r1 * corr_r1 + jnp.sum(e_rC * z_rC, axis=1, keepdims=True),
          ay_r1 * corr_r1 + jnp.sum(e_rC * y_rC, axis=1, keepdims=True))


def _step(carry, tile, rows):
  del rows
  p_state, q_state = carry
  z_rC, y_rC = tile.zs
  return (_moments_update(p_state, z_rC, z_rC, y_rC),
          _moments_update(q_state, y_rC, z_rC, y_rC))


def _dz(tile, rows):
  lse_p_r1, lse_q_r1, kl_pq_r1, coef_qp_r1, g_pq_r1 = rows
  z_rC, y_rC = tile.zs
  p_rC = jnp.exp(z_rC - lse_p_r1)
  q_rC = jnp.exp(y_rC - lse_q_r1)
  log_ratio_rC = (z_rC - lse_p_r1) - (y_rC - lse_q_r1)
  return (coef_qp_r1 * (q_rC - p_rC)
          + g_pq_r1 * p_rC * (log_ratio_rC - kl_pq_r1))


def _stream(sources, impl, tiles, interpret):
  if impl in PALLAS_LOOPS:
    carry = PALLAS_LOOPS[impl].forward(sources, _step, _init, (), tiles=tiles,
                                      interpret=interpret)
  else:
    carry = _xla_loop.forward(sources, _step, _init(sources[0][0].shape[0]),
                              (), chunk_v=tiles.chunk_v)
  (mp, sp, apz, apy), (mq, sq, aqz, aqy) = jax.tree.map(lambda x: x[:, 0],
                                                        carry)
  lse_p, lse_q = mp + jnp.log(sp), mq + jnp.log(sq)
  ep_z, ep_y, eq_z, eq_y = apz / sp, apy / sp, aqz / sq, aqy / sq
  cross = eq_z - lse_p
  kl_qp = (eq_y - lse_q) - cross
  kl_pq = (ep_z - lse_p) - (ep_y - lse_q)
  return (cross, kl_pq, kl_qp), (lse_p, lse_q)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7, 8))
def _core(h, w, hq, wq, temperature, temperature_q, impl, tiles, interpret):
  sources = ((h, w, temperature), (hq, wq, temperature_q))
  return _stream(sources, impl, tiles, interpret)[0]


def _core_fwd(h, w, hq, wq, temperature, temperature_q, impl, tiles,
              interpret):
  sources = ((h, w, temperature), (hq, wq, temperature_q))
  terms, (lse_p, lse_q) = _stream(sources, impl, tiles, interpret)
  return terms, (h, w, hq, wq, lse_p, lse_q, terms[1])


def _core_bwd(temperature, temperature_q, impl, tiles, interpret, res, cts):
  h, w, hq, wq, lse_p, lse_q, kl_pq = res
  g_cross, g_pq, g_qp = cts
  rows = tuple(x[:, None] for x in (lse_p, lse_q, kl_pq, g_cross - g_qp, g_pq))
  sources = ((h, w, temperature), (hq, wq, temperature_q))
  if impl in PALLAS_LOOPS:
    dh, dw = PALLAS_LOOPS[impl].backward(sources, _dz, rows, tiles=tiles,
                                        interpret=interpret)
  else:
    dh, dw = _xla_loop.backward(sources, _dz, rows, chunk_v=tiles.chunk_v)
  # q is stop-gradient: zero cotangents for its inputs.
  return dh, dw, jnp.zeros_like(hq), jnp.zeros_like(wq)


_core.defvjp(_core_fwd, _core_bwd)


def vocab_cross(hidden_ND, w_DV, hidden_q_NE, w_q_EV, *, temperature=1.0,
                temperature_q=1.0, mask_N=None, impl="auto",
                tiles: VocabTiles | None = None,
                interpret=None) -> VocabCross:
  """cross, KL(p||q), KL(q||p) per token with q = softmax(h_q @ w_q / T_q).

  Logits of each side are divided by its temperature before the softmax.
  Gradients flow to hidden_ND and w_DV only; hidden_q_NE and w_q_EV get zero
  gradient (q is stop-gradient). E may differ from D (e.g. a teacher) but both
  sides must share N and V. Masked tokens (mask_N False) return 0 and get
  zero gradient. impl, tiles, interpret: see ``config``.
  """
  n, _, v = check_hidden_w(hidden_ND, w_DV)
  nq, _, vq = check_hidden_w(hidden_q_NE, w_q_EV, "hidden_q_NE", "w_q_EV")
  if (nq, vq) != (n, v):
    raise ValueError(
        f"q side has N={nq}, V={vq} but p side has N={n}, V={v}: "
        "hidden_q_NE.shape[0] must equal hidden_ND.shape[0] and "
        "w_q_EV.shape[1] must equal w_DV.shape[1]")
  temperature = check_temperature(temperature)
  temperature_q = check_temperature(temperature_q, "temperature_q")
  mask_N = check_mask(mask_N, n)
  tiles = VocabTiles() if tiles is None else tiles
  if not isinstance(tiles, VocabTiles):
    raise TypeError(f"tiles={tiles!r}: must be a VocabTiles")
  impl, interpret = resolve_impl(impl, interpret)
  if impl == "naive":
    return vocab_cross_reference(hidden_ND, w_DV, hidden_q_NE, w_q_EV,
                                 temperature=temperature,
                                 temperature_q=temperature_q, mask_N=mask_N)
  hq, wq = jax.lax.stop_gradient(hidden_q_NE), jax.lax.stop_gradient(w_q_EV)
  terms = _core(hidden_ND, w_DV, hq, wq, temperature, temperature_q, impl,
                tiles, interpret)
  return apply_mask(VocabCross(*terms), mask_N)
