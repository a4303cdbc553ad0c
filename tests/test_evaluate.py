"""Evaluation maths against hand-computed values and brute-force enumeration."""

import itertools

import numpy as np
import pytest

from jaxrl_llm import evaluate as ev


def test_pass_at_k_hand_computed():
  # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7
  # n=5, c=0, k=2: 1 - C(5,2)/C(5,2) = 0
  # n=5, c=4, k=2: n-c = 1 < k, every pair holds a correct one -> 1
  # n=5, c=1, k=1: 1 - C(4,1)/C(5,1) = 1 - 4/5 = 0.2
  np.testing.assert_allclose(ev.pass_at_k_per_prompt(5, np.array([2, 0, 4]), 2),
                             [0.7, 0.0, 1.0], rtol=0, atol=1e-12)
  np.testing.assert_allclose(ev.pass_at_k_per_prompt(5, np.array([1]), 1), [0.2],
                             rtol=0, atol=1e-12)


def test_pass_at_k_equals_enumeration_of_all_subsets():
  rng = np.random.default_rng(0)
  correct_PN = rng.random((6, 7)) < 0.35
  for k in (1, 2, 3, 7):
    brute = np.mean([
        np.mean([row[list(idx)].any() for idx in itertools.combinations(range(7), k)])
        for row in correct_PN])
    assert ev.pass_at_k(correct_PN, k) == pytest.approx(brute, abs=1e-12)


def test_mean_at_k_and_summary_hand_computed():
  correct_PN = np.array([[1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 1, 0]], bool)
  # per-prompt fractions 2/4, 0/4, 3/4 -> mean (0.5 + 0 + 0.75) / 3 = 0.41666...
  assert ev.mean_at_k(correct_PN) == pytest.approx(1.25 / 3, abs=1e-12)
  # pass@1 sampled equals mean@n by the estimator's definition.
  assert ev.pass_at_k(correct_PN, 1) == pytest.approx(1.25 / 3, abs=1e-12)
  # pass@2: prompt 0: 1 - C(2,2)/C(4,2) = 1 - 1/6; prompt 1: 0; prompt 2: n-c=1<2 -> 1
  # mean = (5/6 + 0 + 1) / 3 = 11/18
  o = ev.EvalOutcomes(
      greedy_correct_P=np.array([True, False, True]),
      greedy_reward_P=np.array([1.0, 0.1, 1.0]),
      greedy_length_P=np.array([4, 10, 7]),
      greedy_truncated_P=np.array([False, True, False]),
      sampled_correct_PN=correct_PN)
  s = ev.summarize(o, ks=(1, 2))
  assert s == pytest.approx({
      "num_prompts": 3,
      "pass@1_greedy": 2 / 3,
      "mean_reward": 2.1 / 3,           # (1.0 + 0.1 + 1.0) / 3
      "mean_response_length": 7.0,      # (4 + 10 + 7) / 3
      "truncation_rate": 1 / 3,
      "mean@4": 1.25 / 3,
      "pass@1": 1.25 / 3,
      "pass@2": 11 / 18,
  }, abs=1e-12)


def test_bad_k_and_counts_are_named():
  with pytest.raises(ValueError, match=r"k = 5: expected 1 <= k <= n = 4"):
    ev.pass_at_k(np.zeros((2, 4), bool), 5)
  with pytest.raises(ValueError, match=r"correct counts must lie in \[0, n = 3\]"):
    ev.pass_at_k_per_prompt(3, np.array([4]), 1)
  with pytest.raises(ValueError, match=r"must be \[prompts, samples\]"):
    ev.pass_at_k(np.zeros(4, bool), 1)


def test_entry_point_bad_input_is_named(tmp_path):
  # Checked before any model is built.
  with pytest.raises(ValueError, match=r"--k=4: expected 1 <= k <= --n_samples=2"):
    ev.evaluate_steps(str(tmp_path), n_samples=2, ks=(1, 4))
  with pytest.raises(FileNotFoundError, match=r"no config.json in .*expected the workdir of a "
                     r"training run, or pass --config"):
    ev.evaluate_steps(str(tmp_path))


def test_format_table_aligns_columns():
  table = ev.format_table({4: {"num_prompts": 16, "pass@1_greedy": 0.0625},
                           2: {"num_prompts": 16, "pass@1_greedy": 0.5}})
  assert table.splitlines() == ["step  num_prompts  pass@1_greedy",
                                "   2           16         0.5000",
                                "   4           16         0.0625"]
