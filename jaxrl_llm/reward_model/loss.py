"""The Bradley-Terry loss of a reward model and its pairwise metrics, as pure functions.

A pair b has the scores r_c = r(x, y_chosen) and r_r = r(x, y_rejected) and
the score gap delta_b = r_c - r_r. Bradley-Terry models
P(chosen preferred) = sigmoid(delta_b); the loss is its negative
log-likelihood, optionally with a margin and TRL's centring penalty:

    L = sum_b w_b [ -log sigmoid(delta_b - m_b) + coef * (r_c + r_r)^2 ] / sum_b w_b

(TRL's RewardTrainer: `margin` per row, `center_rewards_coefficient`). w_b is
1 for a real pair and 0 for a padding row. Every reduction returns sums, so
batches and hosts add up exactly (`WeightedSum`, `PairStats.__add__`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl_llm.objectives.aggregation import WeightedSum

ECE_BINS = 10  # confidence bins of the expected calibration error, equal width over [0.5, 1]


def _check_pairs(**arrays) -> None:
  shapes = {name: a.shape for name, a in arrays.items()}
  if any(len(s) != 1 for s in shapes.values()) or len(set(shapes.values())) != 1:
    raise ValueError(f"pair arrays must share one [B] shape, got {shapes}")


def bradley_terry_loss(r_chosen_B: jax.Array, r_rejected_B: jax.Array, margin_B: jax.Array,
                       weight_B: jax.Array, *, center_coef: float) -> WeightedSum:
  """The module docstring's L as (numerator, denominator); `center_coef` = 0 turns centring off."""
  _check_pairs(r_chosen_B=r_chosen_B, r_rejected_B=r_rejected_B, margin_B=margin_B, weight_B=weight_B)
  r_c, r_r = r_chosen_B.astype(jnp.float32), r_rejected_B.astype(jnp.float32)
  w_B = weight_B.astype(jnp.float32)
  nll_B = -jax.nn.log_sigmoid(r_c - r_r - margin_B.astype(jnp.float32))
  per_pair_B = nll_B + center_coef * jnp.square(r_c + r_r)
  return WeightedSum(jnp.sum(w_B * per_pair_B), jnp.sum(w_B))


@struct.dataclass
class PairStats:
  """Weighted sums over pairs; `summary` divides once, so adding batches first is exact.

  Calibration reads sigmoid(delta) as P(chosen preferred): the predicted
  winner is the higher score, its confidence max(p, 1 - p) in [0.5, 1], and
  it is correct when delta > 0 (a tie is wrong, as in accuracy). ECE is
  sum_k |sum_{b in k} w_b (correct_b - conf_b)| / sum_b w_b over ECE_BINS
  equal-width confidence bins (Guo et al. 2017, eq. 3).
  """

  n: jax.Array  # [] sum of weights (pairs)
  correct: jax.Array  # [] sum w * 1[delta > 0]
  margin: jax.Array  # [] sum w * delta
  reward: jax.Array  # [] sum w * (r_c + r_r) / 2
  bin_n_K: jax.Array  # [K] sum of weights per confidence bin
  bin_conf_K: jax.Array  # [K] sum w * confidence per bin
  bin_correct_K: jax.Array  # [K] sum w * correct per bin

  def __add__(self, other: "PairStats") -> "PairStats":
    return jax.tree.map(lambda a, b: a + b, self, other)

  def summary(self) -> dict[str, float]:
    """accuracy, margin (mean r_c - r_r), reward_mean (mean score), ece; host floats (0 with no pairs)."""
    s = jax.tree.map(lambda a: np.asarray(a, np.float64), self)
    n = float(s.n)
    if n == 0:
      return {"accuracy": 0.0, "margin": 0.0, "reward_mean": 0.0, "ece": 0.0}
    return {"accuracy": float(s.correct) / n, "margin": float(s.margin) / n, "reward_mean": float(s.reward) / n,
            "ece": float(np.sum(np.abs(s.bin_correct_K - s.bin_conf_K))) / n}


def pair_stats(r_chosen_B: jax.Array, r_rejected_B: jax.Array, weight_B: jax.Array,
               n_bins: int = ECE_BINS) -> PairStats:
  """The sums of `PairStats` for one batch of pairs."""
  _check_pairs(r_chosen_B=r_chosen_B, r_rejected_B=r_rejected_B, weight_B=weight_B)
  r_c, r_r = r_chosen_B.astype(jnp.float32), r_rejected_B.astype(jnp.float32)
  w_B = weight_B.astype(jnp.float32)
  delta_B = r_c - r_r
  correct_B = (delta_B > 0).astype(jnp.float32)
  p_B = jax.nn.sigmoid(delta_B)
  conf_B = jnp.maximum(p_B, 1.0 - p_B)
  bin_B = jnp.clip(jnp.floor((conf_B - 0.5) * 2.0 * n_bins), 0, n_bins - 1).astype(jnp.int32)
  onehot_BK = jax.nn.one_hot(bin_B, n_bins, dtype=jnp.float32) * w_B[:, None]
  return PairStats(n=jnp.sum(w_B), correct=jnp.sum(w_B * correct_B), margin=jnp.sum(w_B * delta_B),
                   reward=jnp.sum(w_B * 0.5 * (r_c + r_r)), bin_n_K=jnp.sum(onehot_BK, axis=0),
                   bin_conf_K=jnp.einsum("BK,B->K", onehot_BK, conf_B),
                   bin_correct_K=jnp.einsum("BK,B->K", onehot_BK, correct_B))


def implicit_reward_summary(stats: PairStats) -> dict[str, float]:
  """`stats.summary()` of DPO's implicit rewards r = beta log(pi / pi_ref) (objectives/preference.py), plus
  the mean chosen and rejected reward: reward_mean +- margin / 2 (reward_mean is the mean of (r_c + r_r) / 2,
  margin that of r_c - r_r). accuracy is the share of pairs whose margin is > 0, ece that of sigmoid(margin)
  read as P(chosen preferred), the Bradley-Terry probability DPO fits."""
  s = stats.summary()
  return {**s, "chosen": s["reward_mean"] + 0.5 * s["margin"], "rejected": s["reward_mean"] - 0.5 * s["margin"]}
