"""Off-policy regimes: staleness makes c != 1 and fires the correction masks;
on-policy with one update per batch gives r = c = 1."""

import json

import numpy as np
import pytest

from run_helpers import load_config, make_trainer, shrink
from jaxrl_llm.training.config import from_config_dict


def _rows(tmp_path):
  return [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_on_policy_one_update_gives_unit_ratios(tmp_path, quiet_log):
  # IcePop needs pi_prox (trust region on r, correction on c): both ratios are computed.
  cfg = from_config_dict(shrink(load_config("icepop"), **{"rollout.staleness": 0, "train.steps": 2}))
  make_trainer(cfg, tmp_path, quiet_log).run()
  for r in _rows(tmp_path):
    for name in ("r", "c", "rho"):
      # f32 recompute of the same params and temperature as the f32 sampler: equal to ~1e-5
      assert abs(r[f"ratio/{name}_min"] - 1.0) < 1e-4 and abs(r[f"ratio/{name}_max"] - 1.0) < 1e-4, (name, r)
    assert r["correction/masked_frac"] == 0.0 and r["trust/clip_frac"] == 0.0


@pytest.mark.slow
def test_staleness_two_moves_c_and_fires_the_masks(tmp_path, quiet_log):
  cfg = from_config_dict(shrink(load_config("icepop"), **{
      "rollout.staleness": 2, "train.steps": 6, "train.lr": 3e-2, "train.warmup_steps": 0,
      "objective.band_low": 0.9, "objective.band_high": 1.1}))
  make_trainer(cfg, tmp_path, quiet_log).run()
  rows = _rows(tmp_path)
  # The first two steps sample with the initial params, which are also pi_prox at step 1.
  late = rows[2:]
  assert all(abs(r["ratio/c_mean"] - 1.0) > 1e-3 or r["ratio/c_max"] - r["ratio/c_min"] > 1e-2 for r in late)
  assert max(r["kl/prox_behav"] for r in late) > 1e-4
  assert max(r["correction/masked_frac"] for r in late) > 0.0
  # r stays 1 on the single update per batch: only c carries the lag
  assert all(abs(r["ratio/r_max"] - 1.0) < 1e-4 for r in rows)


@pytest.mark.slow
def test_bf16_sampler_makes_c_differ_from_one(tmp_path, quiet_log):
  cfg = from_config_dict(shrink(load_config("token_tis"), **{"rollout.sampler_dtype": "bfloat16",
                                                             "train.steps": 1}))
  make_trainer(cfg, tmp_path, quiet_log).run()
  (r,) = _rows(tmp_path)
  assert r["ratio/c_max"] - r["ratio/c_min"] > 1e-3
  assert abs(r["ratio/r_max"] - 1.0) < 1e-4


@pytest.mark.slow
def test_several_updates_per_batch_move_r(tmp_path, quiet_log):
  cfg = from_config_dict(shrink(load_config("grpo"), **{"train.mini_batches": 4, "train.epochs": 2,
                                                        "train.steps": 1, "train.lr": 1e-2,
                                                        "train.warmup_steps": 0}))
  make_trainer(cfg, tmp_path, quiet_log).run()
  (r,) = _rows(tmp_path)
  assert r["update/count"] == 8
  assert r["ratio/r_max"] > 1.0 + 1e-3 or r["ratio/r_min"] < 1.0 - 1e-3
  np.testing.assert_allclose(r["ratio/c_mean"], 1.0, atol=1e-4)


@pytest.mark.slow
def test_staleness_k_samples_with_the_params_from_k_steps_before(tmp_path, quiet_log):
  # Step s must sample with theta_{s-k}: after 3 steps with k = 2 the buffer is
  # (theta_1, theta_2), theta_s being the params after s steps.
  cfg = from_config_dict(shrink(load_config("grpo"), **{
      "rollout.staleness": 2, "train.steps": 3, "train.lr": 1e-2, "train.warmup_steps": 0}))
  tr = make_trainer(cfg, tmp_path, quiet_log)
  after = []
  tr.hooks.append(lambda t, state, metrics: after.append(np.asarray(state.params["embed_VD"])))
  tr.run()
  lag = [np.asarray(p["embed_VD"]) for p in tr.final_state.lag_params]
  assert len(lag) == 2
  np.testing.assert_array_equal(lag[0], after[0])
  np.testing.assert_array_equal(lag[1], after[1])
  assert np.abs(after[2] - after[1]).max() > 0  # the steps really moved the params
