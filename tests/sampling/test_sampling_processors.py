"""Logit processors against hand-computed values and a naive numpy reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.sampling.processors import gather_logp, process_logits, sample_from_logp
from sampling_reference import processed_probs


def test_temperature_golden():
  # logits [0, log 2] at tau = 0.5 -> z = [0, 2 log 2] -> mu ∝ [1, 4] = [0.2, 0.8].
  logp = process_logits(jnp.array([[0.0, np.log(2.0)]]), temperature=0.5)
  np.testing.assert_allclose(np.exp(logp), [[0.2, 0.8]], rtol=1e-6)


def test_top_p_golden():
  # p = [0.1, 0.5, 0.15, 0.25]; descending 0.5, 0.25, 0.15, 0.1 with mass before
  # 0, 0.5, 0.75, 0.9: top_p = 0.7 keeps {1, 3}, renormalised 0.5/0.75, 0.25/0.75.
  logits = jnp.log(jnp.array([[0.1, 0.5, 0.15, 0.25]]))
  probs = np.exp(process_logits(logits, temperature=1.0, top_p=0.7))
  np.testing.assert_allclose(probs, [[0.0, 2 / 3, 0.0, 1 / 3]], atol=1e-6)


def test_top_k_golden_breaks_ties_to_lower_id():
  # logits [1, 3, 3, 2], top_k = 2 keeps ids 1 and 2 (both 3), each 1/2.
  # top_k = 1 keeps exactly one of the tied ids: the lower, id 1.
  logits = jnp.array([[1.0, 3.0, 3.0, 2.0]])
  np.testing.assert_allclose(np.exp(process_logits(logits, temperature=1.0, top_k=2)), [[0, 0.5, 0.5, 0]], atol=1e-7)
  np.testing.assert_allclose(np.exp(process_logits(logits, temperature=1.0, top_k=1)), [[0, 1, 0, 0]], atol=1e-7)


def test_min_p_golden():
  # p = [0.5, 0.25, 0.15, 0.1], min_p = 0.25: floor 0.125 keeps the first three,
  # renormalised by 0.9 -> [5/9, 2.5/9, 1.5/9, 0].
  logits = jnp.log(jnp.array([[0.5, 0.25, 0.15, 0.1]]))
  probs = np.exp(process_logits(logits, temperature=1.0, min_p=0.25))
  np.testing.assert_allclose(probs, [[5 / 9, 2.5 / 9, 1.5 / 9, 0.0]], atol=1e-6)


def test_greedy_is_point_mass_on_argmax():
  logits = jnp.array([[0.3, 2.0, -1.0], [5.0, 5.0, 1.0]])
  logp = process_logits(logits, temperature=0.0)
  assert np.asarray(logp).tolist() == [[-np.inf, 0.0, -np.inf], [0.0, -np.inf, -np.inf]]


@pytest.mark.parametrize("temperature,top_k,top_p,min_p", [
    (1.0, 0, 1.0, 0.0), (0.7, 0, 1.0, 0.0), (1.3, 5, 1.0, 0.0), (1.0, 0, 0.6, 0.0),
    (0.8, 7, 0.9, 0.0), (1.0, 0, 1.0, 0.05), (0.9, 10, 0.8, 0.02), (0.0, 0, 1.0, 0.0),
    (1.0, 17, 1.0, 0.0),
])
@pytest.mark.slow
def test_matches_naive_reference(temperature, top_k, top_p, min_p):
  logits_BV = jax.random.normal(jax.random.key(3), (4, 17)) * 2.0
  logp_BV = process_logits(logits_BV, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
  for b in range(4):
    want = processed_probs(np.asarray(logits_BV[b]), temperature, top_k, top_p, min_p)
    got = np.exp(np.asarray(logp_BV[b], np.float64))
    np.testing.assert_allclose(got, want, atol=1e-6)
    # Exactly the same support: -inf outside, finite inside.
    np.testing.assert_array_equal(np.isfinite(np.asarray(logp_BV[b])), want > 0)


def test_gather_logp():
  logp_BV = jnp.log(jnp.array([[0.1, 0.9], [0.6, 0.4]]))
  np.testing.assert_allclose(gather_logp(logp_BV, jnp.array([1, 0])), np.log([0.9, 0.6]), rtol=1e-6)


# Chi-square critical values at 0.999 (scipy.stats.chi2.ppf(0.999, df), df = 1..6).
_CHI2_999 = {1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515, 6: 22.458}


def _chi2(counts, probs, n):
  support = probs > 0
  expected = n * probs[support]
  return float(np.sum((counts[support] - expected) ** 2 / expected)), int(support.sum()) - 1


@pytest.mark.parametrize("temperature,top_k,top_p,min_p", [
    (0.6, 0, 1.0, 0.0), (1.5, 0, 1.0, 0.0), (1.0, 3, 1.0, 0.0), (1.0, 0, 0.7, 0.0),
    (0.8, 4, 0.85, 0.0), (1.0, 0, 1.0, 0.2),
])
@pytest.mark.slow
def test_sampling_frequencies_chi_square(temperature, top_k, top_p, min_p):
  """20k draws (fixed seed) match the naive reference's mu; none outside it."""
  n = 20_000
  logits_V = jnp.array([1.2, -0.3, 0.5, 2.0, 0.0, 1.0, -1.0])
  logp_BV = process_logits(jnp.tile(logits_V[None, :], (n, 1)), temperature=temperature,
                           top_k=top_k, top_p=top_p, min_p=min_p)
  draws = np.asarray(sample_from_logp(jax.random.split(jax.random.key(0), n), logp_BV))
  counts = np.bincount(draws, minlength=7).astype(np.float64)
  probs = processed_probs(np.asarray(logits_V), temperature, top_k, top_p, min_p)
  assert counts[probs == 0].sum() == 0
  stat, df = _chi2(counts, probs, n)
  assert stat < _CHI2_999[df], (stat, df, counts, probs)
  # Power check: the same draws reject the unprocessed softmax(logits).
  raw = processed_probs(np.asarray(logits_V), 1.0)
  raw_stat, raw_df = _chi2(counts, raw, n)
  assert raw_stat > 10 * _CHI2_999[raw_df]


@pytest.mark.slow
@pytest.mark.parametrize("vocab", [7, 128, 1000])
def test_sample_from_logp_is_the_inverse_cdf_draw(vocab):
  """Each draw equals a float64 numpy inverse-CDF draw with the same uniform
  u (the first id whose cumulative mass exceeds u * total), over vocabularies
  of one block, exactly one block and several blocks plus padding, with ids
  truncated away (-inf), a whole block of zero mass among them."""
  n = 4000
  rng = np.random.RandomState(vocab)
  logp = rng.normal(size=(n, vocab)).astype(np.float32) * 2
  logp[rng.uniform(size=(n, vocab)) < 0.5] = -np.inf  # truncated ids
  if vocab >= 1000:
    logp[:, 256:384] = -np.inf  # block 2 (of 128 ids) has no mass
  logp[np.arange(n), rng.randint(0, vocab, n)] = 0.0  # at least one id per row
  keys = jax.random.split(jax.random.key(1), n)
  draws = np.asarray(sample_from_logp(keys, jnp.asarray(logp)))
  u = np.asarray(jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32))(keys), np.float64)
  cdf = np.cumsum(np.exp(logp.astype(np.float64)), axis=1)
  target = u * cdf[:, -1]
  want = np.argmax(cdf > target[:, None], axis=1)
  assert np.all(np.isfinite(logp[np.arange(n), draws])), "drew an id of zero mass"
  differ = np.flatnonzero(draws != want)
  # Only float32 rounding may move a draw, and only where the target sits at a
  # cumulative-mass boundary.
  gap = np.abs(cdf[differ, want[differ]] - target[differ]) / cdf[differ, -1]
  assert differ.size <= 2 and np.all(gap < 1e-5), (differ, gap)
