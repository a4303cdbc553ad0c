"""Evaluation metrics for verifiable tasks, and the `evaluate` entry point.

The metrics are pure numpy functions of per-sample outcomes:
  pass@1_greedy:    mean over prompts of correct(greedy answer).
  pass@k (sampled): the unbiased estimator of Chen et al. (2021), eq. 1:
      pass@k = E_prompts[ 1 - C(n - c, k) / C(n, k) ]
    for n samples per prompt of which c are correct (k <= n).
  mean@k:           mean over prompts of c / n (the expected accuracy of one
    sampled answer, estimated from n samples).
  mean reward, mean response length (tokens), truncation rate (fraction of
  responses that hit the length limit before EOS).
"""

import dataclasses

import numpy as np


def pass_at_k_per_prompt(n: int, c_P: np.ndarray, k: int) -> np.ndarray:
  """Unbiased pass@k for each prompt with c_P correct out of n samples.

  1 - C(n-c, k) / C(n, k) = 1 - prod_{i=n-c+1}^{n} (1 - k / i), the product form
  avoids huge binomials. When n - c < k every draw of k holds a correct one.
  """
  c_P = np.asarray(c_P, dtype=np.int64)
  if not 1 <= k <= n:
    raise ValueError(f"k = {k}: expected 1 <= k <= n = {n} (samples per prompt)")
  if c_P.size and (c_P.min() < 0 or c_P.max() > n):
    raise ValueError(f"correct counts must lie in [0, n = {n}], got {c_P.min()}..{c_P.max()}")
  out = np.empty(c_P.shape, dtype=np.float64)
  for i, c in enumerate(c_P.reshape(-1)):
    if n - c < k:
      out.reshape(-1)[i] = 1.0
    else:
      out.reshape(-1)[i] = 1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1))
  return out


def pass_at_k(correct_PN: np.ndarray, k: int) -> float:
  """Mean unbiased pass@k from a [prompts, samples] boolean array."""
  correct_PN = np.asarray(correct_PN, dtype=bool)
  if correct_PN.ndim != 2:
    raise ValueError(f"correct_PN must be [prompts, samples], got shape {correct_PN.shape}")
  return float(pass_at_k_per_prompt(correct_PN.shape[1], correct_PN.sum(1), k).mean())


def mean_at_k(correct_PN: np.ndarray) -> float:
  """Mean over prompts of the fraction of correct samples."""
  return float(np.asarray(correct_PN, dtype=np.float64).mean(axis=1).mean())


def greedy_pass_at_1(correct_P: np.ndarray) -> float:
  return float(np.asarray(correct_P, dtype=np.float64).mean())


def truncation_rate(truncated_B: np.ndarray) -> float:
  return float(np.asarray(truncated_B, dtype=np.float64).mean())


@dataclasses.dataclass(frozen=True)
class EvalOutcomes:
  """Per-sample outcomes of one evaluation.

  greedy_correct_P: greedy answer correct, per prompt.
  greedy_reward_P, greedy_length_P, greedy_truncated_P: same responses.
  sampled_correct_PN: N sampled answers per prompt (None when not sampled).
  """

  greedy_correct_P: np.ndarray
  greedy_reward_P: np.ndarray
  greedy_length_P: np.ndarray
  greedy_truncated_P: np.ndarray
  sampled_correct_PN: np.ndarray | None = None


def summarize(o: EvalOutcomes, ks: tuple[int, ...] = ()) -> dict[str, float]:
  """The evaluation table: pass@1 (greedy), pass@k / mean@k, reward, length, truncation."""
  out = {
      "num_prompts": int(np.asarray(o.greedy_correct_P).shape[0]),
      "pass@1_greedy": greedy_pass_at_1(o.greedy_correct_P),
      "mean_reward": float(np.mean(o.greedy_reward_P)),
      "mean_response_length": float(np.mean(o.greedy_length_P)),
      "truncation_rate": truncation_rate(o.greedy_truncated_P),
  }
  if o.sampled_correct_PN is not None:
    n = np.asarray(o.sampled_correct_PN).shape[1]
    out[f"mean@{n}"] = mean_at_k(o.sampled_correct_PN)
    for k in ks:
      out[f"pass@{k}"] = pass_at_k(o.sampled_correct_PN, k)
  return out
