"""train.pack: the update's and the recompute's rows packed end to end in buffers (model/packing.py,
training/pack.py) give the padded computation's loss, gradients and log-probs; and the padded update
with each group's prompt shared (train.share_prompt) gives the update of each row on its own.

The reference is the padded update on the same mini-batch (each row [prompt | response] on its own,
or each group as one sequence with its prompt shared): the parameter change under SGD (which is
minus the gradient), the loss and the policy metrics, for every aggregation mode (token_mean,
seq_mean_token_mean, seq_mean_token_sum, constant, group_token_mean), every ratio level (token,
sequence, geometric), Score Centering, TRM's token KL and PPO's value head; then a trainer step
with train.pack on against off.
"""

import dataclasses
import types

import jax
import numpy as np
import pytest

from run_helpers import load_config, make_trainer, shrink
from update_batches import scored_batch, sgd_update
from jaxrl_llm import model as model_lib
from jaxrl_llm.checks import ConfigError
from jaxrl_llm.model.logprobs import forward_flops
from jaxrl_llm.objectives import get_preset
from jaxrl_llm.training.config import from_config_dict
from jaxrl_llm.training.pack import PackPolicy, balanced_order
from jaxrl_llm.training.recompute import RecomputeSpec, policy_logprobs
from jaxrl_llm.training.step import rl_step

V, G, N, P, R, K = 47, 4, 4, 5, 8, 4  # N groups of G rows
B = N * G
N_MICRO = 2
CFG = model_lib.ModelConfig(vocab_size=V, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=48,
                            init_std=0.4)


def _rows(seed=0):
  """Left-padded prompts; long-tailed response lengths (most short, a few full): what packing is for."""
  rng = np.random.default_rng(seed)
  prompt_NP = rng.integers(0, V, (N, P)).astype(np.int32)
  pmask_NP = np.arange(P)[None, :] >= np.array([0, 2, 1, 3])[:, None]
  tokens_BR = rng.integers(0, V, (B, R)).astype(np.int32)
  lengths = np.array([8, 2, 1, 3, 2, 8, 1, 1, 3, 2, 2, 7, 1, 4, 2, 1])
  mask_BR = np.arange(R)[None, :] < lengths[:, None]
  return np.repeat(prompt_NP, G, 0), np.repeat(pmask_NP, G, 0), tokens_BR, mask_BR


def _batch(obj, params, seed=1):
  # pi_prox within 1e-4 of mu: geo_mis keeps sequences whose geometric-mean ratio lies in [0.9998, 1.0002].
  return scored_batch(CFG, obj, params, _rows(seed), K=K, seed=seed, prox_noise=1e-4, ref_noise=0.05)


def _update(obj, params, batch, aux, use_value, prompt_group):
  return sgd_update(CFG, obj, params, batch, aux, group_size=G, n_micro=N_MICRO, prompt_group=prompt_group,
                    use_value=use_value)


def _check_packed_update(preset, group):
  obj = (dataclasses.replace(get_preset("grpo"), kl_coef=0.1, kl_placement="loss") if preset == "grpo_kl"
         else get_preset(preset))
  params = model_lib.init_params(CFG, jax.random.key(0))
  batch, aux = _batch(obj, params)
  use_value = preset == "ppo"
  d_ref, m_ref = _update(obj, params, batch, aux, use_value, group)
  if group > 1:  # the padded shared-prompt reference is itself the unshared update (each row on its own)
    d_rows, m_rows = _update(obj, params, batch, aux, use_value, 1)
    _assert_same_update(d_ref, m_ref, d_rows, m_rows)
  policy = PackPolicy(model_cfg=CFG, mode="on", group=group)
  packing = policy.plan(batch.prompt_mask_BP, batch.attend_BR, chunks=N_MICRO)
  units = B // N_MICRO // group
  assert packing.src_nS.shape[0] < N_MICRO * units  # fewer buffers than units: the rows really pack
  d, m = _update(obj, params, batch.replace(packing=packing), aux, use_value, group)
  _assert_same_update(d, m, d_ref, m_ref)


def _assert_same_update(d, m, d_ref, m_ref):
  scale = max(float(np.abs(x).max()) for x in jax.tree.leaves(d_ref))
  assert scale > 1e-4  # a real update
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5 * scale), d, d_ref)
  for key in ("loss/total", "loss/policy", "entropy/mean"):
    np.testing.assert_allclose(m[key], m_ref[key], rtol=1e-5, atol=1e-6, err_msg=key)


@pytest.mark.parametrize("preset", ["grpo_kl", "dr_grpo", "gspo", "geo_mis", "score_centering", "trm", "ppo"])
def test_packed_update_equals_the_padded_update(preset):
  """Groups sharing their prompt, padded, equal each row on its own; packed, they equal the padded. Each aggregation mode, level and extra term at least once, in
  as few compiled updates as cover them: seq_mean_token_mean with a KL-to-reference loss term
  (grpo_kl), constant (dr_grpo), seq_mean_token_sum with Score Centering (score_centering) and with
  TRM's token KL (trm), token_mean with PPO's value head (ppo); token, sequence (gspo) and geometric
  (geo_mis) levels."""
  _check_packed_update(preset, G)


@pytest.mark.parametrize("preset", ["dapo", "gspo", "ppo"])
def test_packed_rows_update_equals_the_padded_update(preset):
  """Units of one row each (no shared prompt)."""
  _check_packed_update(preset, 1)


def test_packed_update_under_group_token_mean():
  obj = dataclasses.replace(get_preset("grpo"), aggregation="group_token_mean")
  params = model_lib.init_params(CFG, jax.random.key(0))
  batch, aux = _batch(obj, params)
  d_ref, m_ref = _update(obj, params, batch, aux, False, G)
  packing = PackPolicy(model_cfg=CFG, mode="on", group=G).plan(batch.prompt_mask_BP, batch.attend_BR, N_MICRO)
  d, m = _update(obj, params, batch.replace(packing=packing), aux, False, G)
  scale = max(float(np.abs(x).max()) for x in jax.tree.leaves(d_ref))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5 * scale), d, d_ref)
  np.testing.assert_allclose(m["loss/total"], m_ref["loss/total"], rtol=1e-5)


def test_packed_recompute_equals_the_padded():
  params = model_lib.init_params(CFG, jax.random.key(2))
  prompt_BP, pmask_BP, tokens_BR, mask_BR = _rows(3)
  rows = types.SimpleNamespace(prompt_BP=prompt_BP, prompt_mask_BP=pmask_BP, tokens_BR=tokens_BR, mask_BR=mask_BR)
  spec = RecomputeSpec(model_cfg=CFG, temperature=0.7, impl="naive", chunk=8)
  want, _ = policy_logprobs(params, rows, spec)
  pack = PackPolicy(model_cfg=CFG, mode="on", group=1)
  got, _ = policy_logprobs(params, rows, RecomputeSpec(**{**spec.__dict__, "pack": pack}))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  assert np.all(want[~mask_BR] == 0) and np.all(want[mask_BR] < 0)


def test_auto_packs_long_tailed_rows_and_not_full_ones():
  _, pmask, _, mask = _rows()
  policy = PackPolicy(model_cfg=CFG, mode="auto", group=1)
  packed = policy.plan(pmask, mask, chunks=2)
  unit = P + R
  assert policy.buffer_lengths(P, R) == (unit, 20, 2 * unit)  # 1, 1.5 (rounded up) and 2 units of 13
  assert packed is not None and packed.length in policy.buffer_lengths(P, R)
  # The length chosen is the cheapest of the three by the FLOP count.
  costs = {}
  for S in policy.buffer_lengths(P, R):
    fixed = PackPolicy(model_cfg=CFG, mode="on", group=1, length=S).plan(pmask, mask, chunks=2)
    costs[S] = forward_flops(CFG, fixed.src_nS.shape[0] // 2, S)
  assert packed.length == min(costs, key=costs.get)
  assert policy.plan(pmask, np.ones_like(mask), chunks=2) is None  # every row full: nothing to gain
  assert PackPolicy(model_cfg=CFG, mode="off").plan(pmask, mask) is None
  assert PackPolicy(model_cfg=CFG, mode="on", group=1).plan(pmask, np.ones_like(mask)) is not None
  with pytest.raises(ValueError, match=r"train.pack_length=10 is shorter than one unit of 13 slots"):
    PackPolicy(model_cfg=CFG, mode="on", length=10).plan(pmask, mask)
  # Buffer counts are multiples of the mesh's batch shards (here 4 shards over 2 chunks: even counts).
  sharded = PackPolicy(model_cfg=CFG, mode="on", group=1, shards=4).plan(pmask, mask, chunks=2)
  assert sharded.src_nS.shape[0] % 4 == 0


def test_trainer_step_packed_equals_padded(tmp_path, quiet_log):
  out = {}
  for pack in ("off", "on"):
    c = shrink(load_config("grpo"), **{"train.pack": pack, "train.micro_batch_size": 8, "train.share_prompt": "on"})
    tr = make_trainer(from_config_dict(c), tmp_path / pack, quiet_log)
    state = tr.start_rl(tr.init_state(jax.random.key(0)))
    state, metrics = rl_step(tr.context, state)
    out[pack] = (jax.device_get(state.params), metrics)
  (p_off, m_off), (p_on, m_on) = out["off"], out["on"]
  assert m_on["pack/update_frac"] == 1.0 and 0 < m_on["pack/fill"] <= 1
  assert m_off["grad/norm"] > 0
  for key in ("loss/total", "grad/norm", "entropy/mean", "reward/mean"):
    np.testing.assert_allclose(m_on[key], m_off[key], rtol=1e-4, atol=1e-6, err_msg=key)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), p_on, p_off)


def test_pack_settings_are_checked():
  with pytest.raises(ConfigError, match="config.train.pack"):
    from_config_dict(shrink(load_config("grpo"), **{"train.pack": "yes"}))
  with pytest.raises(ConfigError, match="config.train.pack_length"):
    from_config_dict(shrink(load_config("grpo"), **{"train.pack_length": -1}))


def test_balanced_order_deals_whole_groups_by_token_count():
  """Units of 2 rows holding 14, 13, 5 and 6 tokens (4 prompt slots each) over 2 chunks: longest
  first, each to the lighter chunk: 14 -> chunk 0, 13 -> 1, 6 -> 1, 5 -> 0, so units {0, 2} and {1, 3},
  19 tokens each."""
  P_, R_ = 2, 6
  pmask = np.ones((8, P_), bool)
  lengths = np.array([5, 5, 6, 3, 1, 0, 1, 1])
  attend = np.arange(R_)[None, :] < lengths[:, None]
  order = balanced_order(pmask, attend, chunks=2, unit=2)
  np.testing.assert_array_equal(order, [0, 1, 4, 5, 2, 3, 6, 7])
  np.testing.assert_array_equal(balanced_order(pmask, attend, chunks=1, unit=2), np.arange(8))


def _equal_units(rows: int, group: int, L: int):
  """Masks of `rows` rows (P prompt, R response slots) whose units of `group` rows all hold L tokens: the
  first row's prompt is whole (P tokens), the responses share the rest, as evenly as it divides."""
  pmask = np.ones((rows, P), bool)
  resp = np.zeros((rows, R), bool)
  left = L - P
  for u in range(rows // group):
    for g in range(group):
      n = left // group + (g < left % group)
      resp[u * group + g, :n] = True
  return pmask, resp


@pytest.mark.parametrize("mode,group,shards,chunks", [("auto", 1, 1, 2), ("auto", 1, 1, 1), ("on", 1, 1, 1),
                                                     ("on", 2, 2, 2), ("auto", 4, 1, 1), ("auto", 1, 2, 2)])
def test_largest_bounds_every_packing_plan_chooses(mode, group, shards, chunks):
  """PackPolicy.largest (the packed programs the compile command plans) against `plan` itself: no batch
  is packed at more forward FLOPs, over batches of equal-length units (every length) and 300 of random
  lengths, among them 8 rows of 4, 7, 5, 1, 7, 6, 7, 2 response tokens, which auto packs in more
  buffers than any equal-length batch is given; under "on" a batch of full rows is given the bound."""
  policy = PackPolicy(model_cfg=CFG, mode=mode, group=group, shards=shards)
  rows = 8 * chunks
  S, n = policy.largest(rows // chunks, P, R, chunks)
  bound = forward_flops(CFG, n, S)
  rng = np.random.default_rng(0)
  batches = [_equal_units(rows, group, L) for L in range(P + group, P + group * R + 1)]
  batches += [(np.ones((rows, P), bool), np.arange(R)[None, :] < rng.integers(1, R + 1, rows)[:, None])
              for _ in range(300)]
  if rows == 8:
    batches.append((np.ones((8, P), bool), np.arange(R)[None, :] < np.array([4, 7, 5, 1, 7, 6, 7, 2])[:, None]))
  seen = []
  for pmask, resp in batches:
    packed = policy.plan(pmask, resp, chunks=chunks)
    if packed is not None:
      seen.append(forward_flops(CFG, packed.src_nS.shape[0] // chunks, packed.length))
  assert seen and max(seen) <= bound
  if mode == "on":  # full rows: the shortest length at the ladder's top
    full = policy.plan(np.ones((rows, P), bool), np.ones((rows, R), bool), chunks=chunks)
    assert (full.length, full.src_nS.shape[0] // chunks) == (S, n)
  assert PackPolicy(model_cfg=CFG, mode="off").largest(rows, P, R) is None
