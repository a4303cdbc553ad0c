"""Adaptive KL coefficient to a target KL (Ziegler et al. 2019, "Fine-Tuning Language Models from
Human Preferences", section 2.2; the PPO-RLHF controller of their lm-human-preferences code and TRL's
`AdaptiveKLController`). Host-side maths on scalars.

The reward carries -beta_t * KL to the reference (objectives/kl.py `fold_kl_into_rewards`). After
step t, whose rewards used beta_t, the coefficient moves by the proportional error of the KL measured
on that step's samples:

    e_t       = clip((KL_t - KL_target) / KL_target, -0.2, 0.2)
    beta_{t+1} = beta_t * (1 + K_beta * e_t),      K_beta = n_t / horizon

n_t the step's samples (the code's `n_steps`, the batch size; the paper's K_beta = 0.1) and
`horizon` (objective.kl_horizon) in samples: an error held at the clip moves log beta by about
0.2 * n / horizon per step. KL_t is the mean over the step's answers of the per-answer sum over
its tokens of the objective's estimator (k1 = log pi_prox - log pi_ref for InstructGPT's reward):
the quantity the reward penalises, in nats per answer (Ziegler et al.'s KL(pi, rho) of a sample).
With K_beta <= 1 (training/config.py checks horizon >= the batch) the factor lies in [0.8, 1.2],
so beta stays > 0.
"""

from __future__ import annotations

import numpy as np

ERROR_CLIP = 0.2  # Ziegler et al.'s clip of the proportional error


def kl_error(kl: float, target: float) -> float:
  """e_t = clip((KL_t - KL_target) / KL_target, -0.2, 0.2)."""
  return float(np.clip((kl - target) / target, -ERROR_CLIP, ERROR_CLIP))


def next_kl_coef(beta: float, kl: float, *, target: float, horizon: float, n_samples: int) -> float:
  """beta_{t+1} = beta_t * (1 + (n_samples / horizon) * e_t) (module docstring)."""
  return float(beta * (1.0 + n_samples / horizon * kl_error(kl, target)))


def answer_kl(kl_BR: np.ndarray, mask_BR: np.ndarray) -> float:
  """KL_t: the mean over the rows with a sampled token of sum_t mask_BR * kl_BR (per-token estimates
  of KL(pi || pi_ref)); 0 without such a row."""
  mask = np.asarray(mask_BR, bool)
  rows = mask.any(axis=1)
  if not rows.any():
    return 0.0
  per_answer = np.where(mask, np.asarray(kl_BR, np.float64), 0.0).sum(axis=1)
  return float(per_answer[rows].mean())
