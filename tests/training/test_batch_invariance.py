"""Batch invariance of the trainer's recomputed log-probs (issue 43, item 1).

The trainer's per-token log pi of a given sample must be bitwise the same (==, no tolerance)
whatever else runs beside it: the micro-batch size, packed or padded rows, a shared prompt or not,
its position in the batch, 1 or 4 devices on the data axis. The model is the default run's
(configs/gspo.py: D 128, 4 layers, 4 heads, MLP 256, the character vocabulary), f32.

With `rollout.exact` the recompute runs each row alone (model/invariant.py, RecomputeSpec.rowwise):
every case below is ==. The batched recompute (the default) is not, on XLA:CPU (a dot and a row
reduction that round with the row count, and the attention's key length under packing and sharing;
model/invariant.py): its measured max |delta| is noted below, and it is held to a rounding bound.
"""

import types

import jax
import numpy as np
import pytest

from run_helpers import load_config
from jaxrl_llm import model as model_lib
from jaxrl_llm.model import sharding as sharding_lib
from jaxrl_llm.model.tokenizer import CharTokenizer
from jaxrl_llm.training.config import from_config_dict
from jaxrl_llm.training.pack import PackPolicy
from jaxrl_llm.training.recompute import RecomputeSpec, policy_logprobs

G, N, P, R = 8, 4, 8, 6  # N prompts x G samples, the default run's prompt and response lengths
B = N * G
CFG = from_config_dict(load_config("gspo")).model.build(CharTokenizer().vocab_size)


@pytest.fixture(scope="module")
def setup():
  params = model_lib.init_params(CFG, jax.random.key(0))
  rng = np.random.default_rng(0)
  V = CFG.vocab_size
  prompt_BP = np.repeat(rng.integers(3, V, (N, P)).astype(np.int32), G, 0)
  plen_B = np.repeat(rng.integers(4, P + 1, N), G)  # left-padded prompts of 4 to 8 tokens
  pmask_BP = np.arange(P)[None, :] >= (P - plen_B)[:, None]
  tokens_BR = rng.integers(3, V, (B, R)).astype(np.int32)
  mask_BR = np.arange(R)[None, :] < rng.integers(1, R + 1, B)[:, None]  # responses of 1 to 6 tokens
  rows = types.SimpleNamespace(prompt_BP=prompt_BP, prompt_mask_BP=pmask_BP, tokens_BR=tokens_BR, mask_BR=mask_BR)
  return params, rows


def _logp(params, rows, *, rowwise, chunk=B, devices=1, **spec):
  mesh = sharding_lib.make_mesh(sharding_lib.MeshConfig(data=devices, fsdp=1, tensor=1), jax.devices()[:devices])
  s = RecomputeSpec(model_cfg=CFG, temperature=1.0, impl="xla_chunked", chunk=chunk,
                    sharding=sharding_lib.batch_sharding(mesh), rowwise=rowwise, **spec)
  with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
    return policy_logprobs(sharding_lib.shard_params(params, CFG, mesh), rows, s)[0]


def _select(rows, idx):
  return types.SimpleNamespace(**{k: v[idx] for k, v in vars(rows).items()})


# Each case: the rows of the whole batch (one chunk of B rows, one device) computed another way,
# -> log-probs in the batch's row order.
CASES = {
    "micro_batch_1": lambda p, r, rw: _logp(p, r, rowwise=rw, chunk=1),
    "micro_batch_2": lambda p, r, rw: _logp(p, r, rowwise=rw, chunk=2),
    "micro_batch_4": lambda p, r, rw: _logp(p, r, rowwise=rw, chunk=4),
    "micro_batch_16": lambda p, r, rw: _logp(p, r, rowwise=rw, chunk=16),
    "packed": lambda p, r, rw: _logp(p, r, rowwise=rw, pack=PackPolicy(CFG, mode="on")),
    "shared_prompt": lambda p, r, rw: _logp(p, r, rowwise=rw, prompt_group=G, always_share=True),
    # each row alone (a batch of one), at another position: the batch reversed
    "alone": lambda p, r, rw: np.concatenate([_logp(p, _select(r, [b]), rowwise=rw, chunk=1) for b in range(B)]),
    "reversed": lambda p, r, rw: _logp(p, _select(r, np.arange(B)[::-1]), rowwise=rw)[::-1],
    "4_devices": lambda p, r, rw: _logp(p, r, rowwise=rw, devices=4),
}
# The batched recompute (rowwise=False) against its one-chunk batch, measured on this model and these
# rows (XLA:CPU, jax 0.10.2, the suite's XLA flags): max |delta| 9.5e-7 for micro-batches of 1 and 2
# rows and each row alone, 4.8e-7 for micro-batches of 4 and the shared prompt; micro-batches of 16,
# packed rows, the reversed batch and 4 devices were equal here by the shapes' luck, not by
# construction (with the default XLA flags and a vocabulary of 20, 4 devices and packing differ by
# 4.8e-7 too). Which cases round alike depends on the CPU's kernels, so the batched path is held to a
# rounding bound below (a tolerance, named as one), not to a list of unequal cases.
BATCHED_MEASURED = {"micro_batch_1": 9.5e-7, "micro_batch_4": 4.8e-7, "shared_prompt": 4.8e-7}


@pytest.mark.parametrize("case", list(CASES))
def test_rowwise_recompute_is_bitwise_batch_invariant(setup, case):
  params, rows = setup
  want = _logp(params, rows, rowwise=True)
  got = CASES[case](params, rows, True)
  assert got.shape == (B, R) and np.all(got[~rows.mask_BR] == 0) and np.all(got[rows.mask_BR] < 0)
  assert np.array_equal(got, want), f"{case}: max |delta| {np.abs(got - want).max():.3g}"


def test_rowwise_recompute_is_the_padded_forward_of_each_row(setup):
  """The invariant program computes the same function: each row equals the batched recompute of that
  row alone to f32 rounding (the reference), and the masked tokens are 0."""
  params, rows = setup
  want = np.concatenate([_logp(params, _select(rows, [b]), rowwise=False, chunk=1) for b in range(0, B, 7)])
  got = _logp(params, rows, rowwise=True)[::7]
  np.testing.assert_allclose(got, want, rtol=0, atol=2e-6)


@pytest.mark.parametrize("case", list(BATCHED_MEASURED))
def test_batched_recompute_differs_by_rounding_only(setup, case):
  """Not bitwise (see BATCHED_MEASURED): a tolerance of 4 f32 ulps at |log p| ~ 4 (4 x 4.8e-7), which
  a real difference in what is computed (a wrong mask, position or layout) would exceed."""
  params, rows = setup
  want = _logp(params, rows, rowwise=False)
  got = CASES[case](params, rows, False)
  assert np.abs(got - want).max() <= 2e-6
