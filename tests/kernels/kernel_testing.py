"""Shared helpers of the kernel tests: shapes, tiles, tolerances, a comparer.

Shapes are deliberately not multiples of the tiles: N = 37 rows over
block_n = 16 (3 row blocks, the last padded), D = 24 (padded to 32 inside the
Pallas kernels), V = 301 columns over block_v = 64 and chunk_v = 128 (ragged
last tile / overlapping last chunk).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.kernels import VocabTiles

N, D, V = 37, 24, 301
TILES = VocabTiles(block_n=16, block_v=64, chunk_v=128)

# (forward atol/rtol, gradient atol/rtol relative to the gradient's max |.|).
# f32: sums over V = 301 in tiles / chunks vs one pass; the lse-type sums of positive terms are within
# V u ~ 2e-5 relative, the rest within a few ulps in practice.
# bf16: inputs are bf16 but all maths is f32; outputs of d hidden / d w are
# rounded to bf16 (8 mantissa bits: relative 2^-8 ~ 4e-3) on both sides: two f32 values a rounding
# apart can round to neighbouring bf16 numbers, one ulp <= 2^-7 ~ 8e-3 of max |.|, so grad is 2 ulps.
# Measured over 4 seeds (relative to max(1, max |expected|)): f32 fwd <= 9.1e-7, grad <= 9.9e-7;
# bf16 fwd <= 1.2e-6, grad <= 2.8e-3 (a bf16 ulp, as bounded above).
TOLERANCES = {
    jnp.float32: dict(fwd=2e-5, grad=2e-5),
    jnp.bfloat16: dict(fwd=2e-4, grad=1.6e-2),
}

# The two streaming paths; the Pallas kernels run in interpret mode on CPU.
IMPLS = [
    pytest.param(dict(impl="xla_chunked"), id="xla_chunked"),
    pytest.param(dict(impl="pallas", interpret=True), id="pallas_interpret"),
]


def random_inputs(seed: int, dtype, n=N, d=D, v=V, scale=0.4):
  k1, k2 = jax.random.split(jax.random.key(seed))
  hidden_ND = jax.random.normal(k1, (n, d), jnp.float32).astype(dtype)
  w_DV = (scale * jax.random.normal(k2, (d, v), jnp.float32)).astype(dtype)
  return hidden_ND, w_DV


def ragged_mask(n=N, keep=29):
  """The first `keep` rows are real tokens, the rest padding."""
  return jnp.arange(n) < keep


def assert_close(actual, expected, tol: float, what: str):
  """|actual - expected| <= tol * max(1, max |expected|), elementwise."""
  actual = np.asarray(jnp.asarray(actual, jnp.float32))
  expected = np.asarray(jnp.asarray(expected, jnp.float32))
  assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
  assert np.all(np.isfinite(actual)), f"{what}: non-finite values"
  scale = max(1.0, float(np.max(np.abs(expected))))
  err = float(np.max(np.abs(actual - expected)))
  assert err <= tol * scale, f"{what}: max error {err:.3g} > {tol * scale:.3g}"
