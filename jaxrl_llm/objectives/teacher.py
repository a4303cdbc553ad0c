"""Teacher trust knobs: magnitude (RLSD), confidence tau, sign gates.

docs/objectives.md sections 11.5-11.6; equation numbers below are its (eq.
11.15: L = sum z * tau * D_teacher). Routing (z: SRPO, multi-teacher) is in
``teacher_routing.py``; the divergences D are in ``distill.py``.

Every weight returned here is detached: it scales a gradient, it never carries
one. Advantages may be response-level ``adv_B`` (broadcast over tokens, eq. 6.7)
or token-level ``adv_BR``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _adv_BR(adv: jax.Array, like_BR: jax.Array, name: str = "adv") -> jax.Array:
  """Broadcast a response-level advantage over tokens, explicitly."""
  if adv.ndim == 1 and like_BR.ndim == 2 and adv.shape[0] == like_BR.shape[0]:
    return jnp.broadcast_to(adv[:, None], like_BR.shape)
  if adv.shape == like_BR.shape:
    return adv
  raise ValueError(f"{name} has shape {adv.shape}; expected [B]={like_BR.shape[:1]} or "
                   f"[B, R]={like_BR.shape}")


def teacher_entropy(teacher_logp_BRV: jax.Array) -> jax.Array:
  """H(q_t) = -sum_a q_t(a) log q_t(a) per position (eq. 11.16), detached."""
  logq_BRV = jax.lax.stop_gradient(teacher_logp_BRV)
  finite = logq_BRV > -jnp.inf
  safe_BRV = jnp.where(finite, logq_BRV, 0.0)
  return -jnp.sum(jnp.where(finite, jnp.exp(safe_BRV) * safe_BRV, 0.0), axis=-1)


def confidence_weight(teacher_entropy_BR: jax.Array, *, beta: float, tau_min: float,
                      tau_max: float) -> jax.Array:
  """tau_t = clip(exp(-beta * H(q_t)), tau_min, tau_max) (eq. 11.17).

  A confident (low-entropy) teacher counts more. beta >= 0 (beta = 0 gives
  tau = clip(1) everywhere); 0 <= tau_min <= tau_max.
  """
  if not beta >= 0.0:
    raise ValueError(f"confidence_weight: beta={beta} must be >= 0")
  if not 0.0 <= tau_min <= tau_max:
    raise ValueError(f"confidence_weight: need 0 <= tau_min <= tau_max, got tau_min={tau_min}, "
                     f"tau_max={tau_max}")
  tau_BR = jnp.clip(jnp.exp(-beta * jax.lax.stop_gradient(teacher_entropy_BR)), tau_min, tau_max)
  return tau_BR


def _check_rlsd(eps_w: float, lam: float) -> None:
  if not 0.0 <= eps_w < 1.0:
    raise ValueError(f"rlsd: eps_w={eps_w} is outside [0, 1); the multiplier is clipped to "
                     "[1 - eps_w, 1 + eps_w] and must stay positive so reward keeps the sign")
  if not 0.0 <= lam <= 1.0:
    raise ValueError(f"rlsd: lam={lam} is outside [0, 1] (the teacher mix weight lambda)")


def rlsd_multiplier(adv: jax.Array, gap_BR: jax.Array, *, eps_w: float) -> jax.Array:
  """u = clip(exp(sign(A) * Delta), 1 - eps_w, 1 + eps_w) (eq. 11.13), detached.

  ``gap_BR`` is the sampled-token teacher gap Delta = log q(y) - log p(y)
  (eq. 11.7). For A > 0, tokens the teacher likes more than the student get
  more weight; for A < 0, tokens the teacher likes less get more blame. A = 0
  gives u = 1.
  """
  _check_rlsd(eps_w, 0.0)
  adv_BR = _adv_BR(adv, gap_BR)
  delta_BR = jax.lax.stop_gradient(gap_BR)
  u_BR = jnp.exp(jnp.sign(jax.lax.stop_gradient(adv_BR)) * delta_BR)
  return jnp.clip(u_BR, 1.0 - eps_w, 1.0 + eps_w)


def rlsd_advantage(adv: jax.Array, gap_BR: jax.Array, *, eps_w: float, lam: float) -> jax.Array:
  """A_rlsd = A * [(1 - lambda) + lambda * u] (eq. 11.14): reward direction, teacher magnitude.

  Since u > 0, sign(A_rlsd) = sign(A) always; |A_rlsd| / |A| lies in
  [1 - lambda * eps_w, 1 + lambda * eps_w]. The result is a detached
  token-level advantage to feed the policy loss (section 11.5).
  """
  _check_rlsd(eps_w, lam)
  adv_BR = jax.lax.stop_gradient(_adv_BR(adv, gap_BR))
  u_BR = rlsd_multiplier(adv, gap_BR, eps_w=eps_w)
  return adv_BR * ((1.0 - lam) + lam * u_BR)


def sign_gate(gap_BR: jax.Array, adv: jax.Array, *, disagree_weight: float = 0.0) -> jax.Array:
  """Sign-consistency gate on the teacher branch (SG-OPD, Xu et al., 2026; eq. 11.18), detached.

  1 where the teacher gap and the reward advantage push the sampled token the
  same way (sign(Delta) * sign(A) > 0), ``disagree_weight`` elsewhere,
  including A = 0 or Delta = 0 (no agreement to trust). ``disagree_weight``
  in [0, 1]: 0 is a hard mask.
  """
  if not 0.0 <= disagree_weight <= 1.0:
    raise ValueError(f"sign_gate: disagree_weight={disagree_weight} is outside [0, 1]")
  adv_BR = _adv_BR(adv, gap_BR)
  agree_BR = jnp.sign(gap_BR) * jnp.sign(adv_BR) > 0
  return jax.lax.stop_gradient(
      jnp.where(agree_BR, 1.0, disagree_weight).astype(gap_BR.dtype))
