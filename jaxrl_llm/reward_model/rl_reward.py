"""A reward model's score as the RL reward (RLHF's second stage), host-side maths on [B] scalars.

InstructGPT (Ouyang et al. 2022, eq. 2) trains the policy on

    R(x, y) = r_theta(x, y) - beta * log(pi_RL(y | x) / pi_SFT(y | x))

with the KL to the supervised model inside the reward. Here, per sample i,

    R_i = w_rm * clip_c(norm(r_i)) + w_v * v_i + s_i - p * [i cut without EOS]     (`mixed_reward`)

r_i the reward model's score (scorer.py, on the device: training/model_reward.py), v_i the task's verifier reward (format bonus included),
s_i the soft overlong penalty (training/score.py, kept whatever the weights); w_rm and w_v are
data.reward_model_weight and data.verifier_weight. The order is: score (an ensemble's combined
score), normalise, clip, weigh and add. clip_c (data.reward_clip = c > 0, `clip_reward`) bounds
the normalised score to [-c, c], so a score far outside what the reward model saw in training
moves the policy no more than c (in units of the score's std with a normalisation). p is
data.missing_eos_penalty (TRL's `missing_eos_penalty`): a sample cut at its length limit without
EOS (`RolloutBatch.truncated_B`) loses p whatever it scored (`missing_eos_shaping`, a term of the
reward outside the clip, also with the verifier's reward alone: training/eos_penalty.py).

An ensemble (data.reward_model "a,b,...", M >= 2 reward models) scores each sample with every member
and combines them before the normalisation (`ensemble_reward`):

    r_i = mean_m r_mi - k * std_m r_mi,      std over the M members with ddof 0 (population)

k = data.reward_model_uncertainty_k (0: the plain mean). The std is the members' disagreement, an
uncertainty estimate; subtracting it lowers the reward where the members disagree, where the policy
is likely exploiting one model's error (Coste et al. 2023, "Reward Model Ensembles Help Mitigate
Overoptimization": their uncertainty-weighted optimisation subtracts the variance; the std used
here is in the score's own units, so k does not depend on the score's scale). The members' scores
are combined raw: train them on the same pairs (different seeds or data orders) so their scales agree.

InstructGPT's KL term is the objective's `kl_placement="reward"` with `kl_estimator="k1"`
(objectives/kl.py `fold_kl_into_rewards`), applied to R_i before the advantages:

    R_i - beta * sum_t mask_it * (log pi_prox(y_it) - log pi_ref(y_it)),   beta = objective.kl_coef

or, with objective.kl_target > 0, Ziegler et al.'s adaptive beta_t (objectives/kl_control.py).

pi_prox the policy as the step's updates begin (the sampler, on-policy; InstructGPT's pi_RL) and
pi_ref the frozen warm-started model (pi_SFT).

`norm` (data.reward_norm) is one of
    none      r_i
    running   (r_i - m) / (s + eps), m and s the mean and std of every score seen so far, this
              round's included (Ziegler et al. 2019 normalise the reward model to mean 0, std 1 on
              the policy's samples; a running estimate keeps doing so as the policy moves)
    group     (r_i - mean_g r) / (std_g r + eps) over the G samples of i's prompt
"""

from __future__ import annotations

import dataclasses

import numpy as np

EPS = 1e-6  # added to a std before dividing by it


@dataclasses.dataclass(frozen=True)
class Moments:
  """Running count, mean and sum of squared deviations (M2) of every score seen (Welford)."""

  count: float = 0.0
  mean: float = 0.0
  m2: float = 0.0

  @property
  def std(self) -> float:
    """The population std, sqrt(M2 / count) (0 with no scores)."""
    return float(np.sqrt(self.m2 / self.count)) if self.count else 0.0


def update_moments(m: Moments, x_B: np.ndarray) -> Moments:
  """`m` merged with the scores x_B (Chan et al.'s parallel update):
      n = n_a + n_b,  mean = mean_a + d * n_b / n,  M2 = M2_a + M2_b + d^2 n_a n_b / n,  d = mean_b - mean_a."""
  x = np.asarray(x_B, np.float64)
  n_b = float(x.size)
  if n_b == 0:
    return m
  mean_b = float(x.mean())
  m2_b = float(((x - mean_b) ** 2).sum())
  n = m.count + n_b
  d = mean_b - m.mean
  return Moments(count=n, mean=m.mean + d * n_b / n, m2=m.m2 + m2_b + d * d * m.count * n_b / n)


def running_normalise(r_B: np.ndarray, m: Moments) -> np.ndarray:
  """(r - m.mean) / (m.std + EPS)."""
  return ((np.asarray(r_B, np.float64) - m.mean) / (m.std + EPS)).astype(np.float32)


def group_normalise(r_B: np.ndarray, group_size: int) -> np.ndarray:
  """(r_i - mean_g r) / (std_g r + EPS) over each prompt's G consecutive samples (population std)."""
  r_NG = np.asarray(r_B, np.float64).reshape(-1, group_size)
  out = (r_NG - r_NG.mean(axis=1, keepdims=True)) / (r_NG.std(axis=1, keepdims=True) + EPS)
  return out.reshape(-1).astype(np.float32)


def mixed_reward(model_B: np.ndarray, verifier_B: np.ndarray, shaping_B: np.ndarray, *, w_rm: float,
                 w_v: float) -> np.ndarray:
  """R_B = w_rm * model_B + w_v * verifier_B + shaping_B (model_B already normalised)."""
  out = (w_rm * np.asarray(model_B, np.float64) + w_v * np.asarray(verifier_B, np.float64)
         + np.asarray(shaping_B, np.float64))
  return out.astype(np.float32)


def ensemble_reward(r_MB: np.ndarray, k: float) -> np.ndarray:
  """r_B = mean_m r_MB - k * std_m r_MB over the M members (axis 0), population std (ddof 0)."""
  r = np.asarray(r_MB, np.float64)
  return (r.mean(axis=0) - k * r.std(axis=0, ddof=0)).astype(np.float32)


def clip_reward(x_B: np.ndarray, c: float) -> np.ndarray:
  """clip(x, -c, c) for c > 0; x itself for c = 0 (off)."""
  x = np.asarray(x_B, np.float32)
  return np.clip(x, -c, c).astype(np.float32) if c > 0 else x


def missing_eos_shaping(truncated_B: np.ndarray, penalty: float) -> np.ndarray:
  """-penalty on each sample cut at its length limit without EOS, 0 elsewhere (f32 [B])."""
  return np.where(np.asarray(truncated_B, bool), -float(penalty), 0.0).astype(np.float32)
