"""ObjectiveConfig validation, the preset registry and the generated method table."""

import dataclasses
import subprocess
import sys

import jax.numpy as jnp
import pytest

from jaxrl_llm.objectives import PRESETS, ObjectiveConfig, get_preset, method_table, policy_loss

EXPECTED = {
    "reinforce", "grpo", "dr_grpo", "dapo", "gspo", "gspo_token", "cispo", "decoupled_ppo", "token_tis", "icepop",
    "seq_tis", "seq_mis", "geo_mis", "scalerl_dapo", "scalerl_gspo", "scalerl_cispo", "dppo_tv", "dppo_kl", "trm",
    "trm_avg", "pipelinerl", "sao", "topr", "score_centering", "tis_sc", "mis_sc", "ppo", "ppo_dual_clip", "rloo",
    "reinforce_pp", "reinforce_pp_baseline",
}


def test_registry_names_and_paper_defaults():
  assert set(PRESETS) == EXPECTED
  assert all(name == cfg.name for name, cfg in PRESETS.items())
  assert (PRESETS["dapo"].eps_low, PRESETS["dapo"].eps_high) == (0.2, 0.28)
  assert (PRESETS["gspo"].eps_low, PRESETS["gspo"].eps_high) == (3e-4, 4e-4)
  assert (PRESETS["icepop"].band_low, PRESETS["icepop"].band_high) == (0.5, 5.0)
  assert (PRESETS["sao"].band_low, PRESETS["sao"].band_high) == (0.7, 6.0)
  assert PRESETS["pipelinerl"].is_cap == 1.02 and PRESETS["token_tis"].is_cap == 2.0
  assert PRESETS["trm"].trm_max_delta == 0.05 and PRESETS["trm_avg"].trm_mean_delta == 0.001
  assert PRESETS["ppo_dual_clip"].dual_clip_c == 3.0
  # Methods with one ratio against mu never need the pi_prox recompute.
  assert not any(PRESETS[n].needs_prox for n in ("scalerl_cispo", "pipelinerl", "sao", "topr", "trm", "tis_sc"))
  assert PRESETS["grpo"].needs_prox and PRESETS["token_tis"].needs_prox


def test_get_preset_overrides_and_errors():
  assert get_preset("DAPO", eps_high=0.3).eps_high == 0.3
  for name, cfg in PRESETS.items():  # every knob, name included, round-trips
    assert get_preset(name, **dataclasses.asdict(cfg)) == cfg
  with pytest.raises(ValueError, match=r"unknown method 'grpoo': allowed names are \[.*'grpo'"):
    get_preset("grpoo")
  with pytest.raises(ValueError, match=r"unknown ObjectiveConfig field\(s\) \['epsilon'\]"):
    get_preset("grpo", epsilon=0.2)


@pytest.mark.parametrize("kw,match", [
    (dict(eps_low=0.0), r"eps_low=0.0 is invalid: must lie in the open interval \(0, 1\)"),
    (dict(eps_low=1.5), r"eps_low=1.5 is invalid: must lie in the open interval \(0, 1\)"),
    (dict(eps_high=-0.1), r"eps_high=-0.1 is invalid: must be a finite number > 0"),
    (dict(band_low=5.0, band_high=0.5), r"band_low=5.0 is invalid: must be <= band_high=0.5"),
    (dict(trust_region="ppo", dual_clip_c=0.9), r"dual_clip_c=0.9 is invalid: must be > 1"),
    (dict(trust_region="truncate", dual_clip_c=3.0), r"dual_clip_c=3.0 is invalid: dual-clip bounds a PPO mask"),
    (dict(aggregation="mean"), r"aggregation='mean' is invalid: allowed values are \('token_mean'"),
    (dict(trust_region="clip"), r"trust_region='clip' is invalid: allowed values are \('none', 'ppo', 'truncate'\)"),
    (dict(kappa=0.5), r"kappa=0.5 is invalid: allowed values are 0"),
    (dict(trust_region="ppo", kappa=1), r"trust_region='ppo' is invalid: kappa=1"),
    (dict(correction="trm", correction_ratio="rho", trm_max_delta=None, trm_mean_delta=None),
     r"TRM needs trm_max_delta or trm_mean_delta"),
    (dict(correction="dppo_tv", correction_ratio="c"), r"correction='dppo_tv' needs correction_ratio='rho'"),
    (dict(adv_std_ddof=2), r"adv_std_ddof=2 is invalid: allowed values are 0"),
    (dict(gamma=1.5), r"gamma=1.5 is invalid: must lie in \[0, 1\]"),
    (dict(kl_estimator="k4"), r"kl_estimator='k4' is invalid"),
])
def test_bad_knobs_name_the_field(kw, match):
  with pytest.raises(ValueError, match=match):
    ObjectiveConfig(**kw)


def test_policy_loss_bad_inputs():
  x = jnp.zeros((2, 3))
  mask = jnp.ones((2, 3), bool)
  cfg = get_preset("grpo")
  with pytest.raises(ValueError, match=r"mask_BR has shape \(2, 4\); it must equal logp_BR's shape \(2, 3\)"):
    policy_loss(x, x, x, jnp.zeros(2), jnp.ones((2, 4), bool), cfg, norms=None)
  with pytest.raises(ValueError, match=r"adv_BR has shape \(3,\); allowed shapes are \(2, 3\)"):
    policy_loss(x, x, x, jnp.zeros(3), mask, cfg, norms=None)
  with pytest.raises(ValueError, match="prox_logp_BR is None but ObjectiveConfig\\(name='grpo'\\) needs it"):
    policy_loss(x, None, x, jnp.zeros(2), mask, cfg, norms=None)
  with pytest.raises(ValueError, match="correction='trm' needs kl_BR"):
    policy_loss(x, None, x, jnp.zeros(2), mask, get_preset("trm"), norms=None)
  with pytest.raises(ValueError, match="centering is None"):
    policy_loss(x, None, x, jnp.zeros(2), mask, get_preset("score_centering"), norms=None)
  with pytest.raises(ValueError, match="ref_logp_BR is None"):
    policy_loss(x, x, x, jnp.zeros(2), mask, get_preset("grpo", kl_coef=0.04), norms=None)
  with pytest.raises(TypeError, match="norms must be a BatchNorms"):
    policy_loss(x, x, x, jnp.zeros(2), mask, cfg, norms=3)
  with pytest.raises(TypeError, match="cfg must be an ObjectiveConfig"):
    policy_loss(x, x, x, jnp.zeros(2), mask, "grpo", norms=None)


def test_method_table_has_one_row_per_preset():
  lines = method_table().splitlines()
  assert len(lines) == 2 + len(PRESETS)
  assert all(line.count("|") == 11 for line in lines)  # 10 columns, no stray pipes inside cells
  row = {line.split("|")[1].strip(): line for line in lines[2:]}
  assert "min(c, 2) * M(r)*r in [0.8, 1.2]" in row["token_tis"]
  assert "1[0.9998 <= cbar_i <= 1.0002]" in row["geo_mis"]
  assert "| 1 | seq_mean_token_sum |" in row["score_centering"]
  assert "gamma=1, lambda=0.95, whitened; value coef 0.5, clip 0.2" in row["ppo"]
  assert "KL k1 in reward, beta=0" in row["reinforce_pp"]


def test_module_entry_point_prints_the_table():
  out = subprocess.run([sys.executable, "-m", "jaxrl_llm.objectives"], capture_output=True, text=True,
                       check=True, timeout=120)
  assert method_table() in out.stdout
