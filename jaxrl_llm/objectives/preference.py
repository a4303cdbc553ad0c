"""Direct Preference Optimization (Rafailov et al. 2023) and its variants, as pure functions.

A pair b has a prompt x, a chosen response y_w and a rejected one y_l. With
sequence log-probs (summed over the response tokens) under the trained
policy pi and the frozen reference pi_ref, the implicit rewards are

    r_w = beta (log pi(y_w|x) - log pi_ref(y_w|x)),   r_l likewise,

and the margin m_b = r_w - r_l (docs/objectives.md, section 13). Per pair:

    sigmoid  (DPO, eq. 7; with eps > 0 conservative DPO, Mitchell 2023):
             -(1 - eps) log sigmoid(m) - eps log sigmoid(-m)
    robust   (rDPO, Chowdhury et al. 2024):
             ((1 - eps)(-log sigmoid(m)) - eps (-log sigmoid(-m))) / (1 - 2 eps)
    ipo      (IPO, Azar et al. 2023, on summed log-probs):
             (m / beta - 1 / (2 beta))^2

and L = sum_b w_b loss_b / sum_b w_b, w_b 1 for a real pair and 0 for a
padding row, kept as a `WeightedSum` so batches add up exactly. eps is the
assumed share of flipped labels (`label_smoothing`); IPO takes none.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxrl_llm.checks import bad, check_choice, check_float
from jaxrl_llm.objectives.aggregation import WeightedSum

DPO_LOSS_TYPES = ("sigmoid", "robust", "ipo")


@struct.dataclass
class DPOResult:
  loss: WeightedSum  # L as (numerator, denominator)
  reward_chosen_B: jax.Array  # f32 [B] r_w = beta (log pi - log pi_ref)(y_w | x)
  reward_rejected_B: jax.Array  # f32 [B] r_l


def check_dpo_knobs(beta: float, loss_type: str, label_smoothing: float, *, prefix: str = "dpo") -> None:
  """beta > 0; loss_type one of DPO_LOSS_TYPES; eps in [0, 0.5) (0.5 makes the preference a coin toss,
  and robust divides by 1 - 2 eps), 0 for ipo."""
  check_float(f"{prefix}.beta", beta, 0.0, low_open=True)
  check_choice(f"{prefix}.loss_type", loss_type, DPO_LOSS_TYPES)
  check_float(f"{prefix}.label_smoothing", label_smoothing, 0.0, 0.5, high_open=True)
  if loss_type == "ipo" and label_smoothing:
    raise bad(f"{prefix}.label_smoothing", label_smoothing, "0 with loss_type='ipo' (IPO has no label-noise term)")


def dpo_loss(logp_chosen_B: jax.Array, logp_rejected_B: jax.Array, ref_chosen_B: jax.Array,
             ref_rejected_B: jax.Array, weight_B: jax.Array, *, beta: float, loss_type: str,
             label_smoothing: float = 0.0) -> DPOResult:
  """The module docstring's L and implicit rewards from sequence log-probs [B] (the reference's carry
  no gradient: the caller computes them under stop_gradient or as constants)."""
  check_dpo_knobs(beta, loss_type, label_smoothing)
  shapes = {a.shape for a in (logp_chosen_B, logp_rejected_B, ref_chosen_B, ref_rejected_B, weight_B)}
  if len(shapes) != 1 or len(next(iter(shapes))) != 1:
    raise ValueError(f"dpo_loss: the five pair arrays must share one [B] shape, got {sorted(shapes)}")
  f32 = lambda a: a.astype(jnp.float32)  # noqa: E731
  r_w = beta * (f32(logp_chosen_B) - f32(ref_chosen_B))
  r_l = beta * (f32(logp_rejected_B) - f32(ref_rejected_B))
  m_B, eps = r_w - r_l, label_smoothing
  if loss_type == "ipo":
    per_pair_B = jnp.square(m_B / beta - 1.0 / (2.0 * beta))
  elif loss_type == "robust":
    per_pair_B = ((1.0 - eps) * -jax.nn.log_sigmoid(m_B) + eps * jax.nn.log_sigmoid(-m_B)) / (1.0 - 2.0 * eps)
  else:
    per_pair_B = -(1.0 - eps) * jax.nn.log_sigmoid(m_B) - eps * jax.nn.log_sigmoid(-m_B)
  w_B = f32(weight_B)
  return DPOResult(loss=WeightedSum(jnp.sum(w_B * per_pair_B), jnp.sum(w_B)), reward_chosen_B=r_w,
                   reward_rejected_B=r_l)
