"""The RL-side knobs of RLHF against a learned reward model, each against its formula written out here:
the adaptive KL coefficient (Ziegler et al. 2019) and its resume, the missing-EOS penalty, the clip
of the normalised reward, and an ensemble's mean - k * std (two tiny reward models scored again
independently, one device, right-padded); the config's one-line errors."""

import dataclasses
import shutil
import types

import jax
import numpy as np
import pytest
from run_helpers import load_config, make_trainer, shrink

from jaxrl_llm.checks import ConfigError
from jaxrl_llm.model import sharding as sharding_lib
from jaxrl_llm.objectives import kl_control
from jaxrl_llm.reward_model import rl_reward
from jaxrl_llm.reward_model.config import reward_config_from_dict
from jaxrl_llm.reward_model.defaults import reward_model_config
from jaxrl_llm.reward_model.scorer import load_reward_model, reward_scores
from jaxrl_llm.training.config import from_config_dict
from jaxrl_llm.training.score import Scores
from jaxrl_llm.training.tiny import TINY_MODEL, apply_settings

# The module-scoped fixtures run once: the module's tests go to one pytest-xdist worker.
pytestmark = pytest.mark.xdist_group("reward_model.test_rlhf_knobs")


def rlhf_config(reward_model: str = "x", **overrides):
  return from_config_dict(shrink(load_config("rlhf_arithmetic"), **{"data.reward_model": reward_model,
                                                                    **overrides}))


# ---- the adaptive KL coefficient ----------------------------------------------------------

def test_adaptive_kl_coef_follows_ziegler_et_al_for_a_sequence_of_kls():
  # Ziegler et al.'s own setting: beta_0 = 0.1, KL_target = 6 nats, horizon 10000, 512 samples a step
  # (K_beta = 512 / 10000 = 0.0512). e_t = clip((KL - 6) / 6, -0.2, 0.2):
  #   KL 9   -> 0.5, clipped 0.2     beta 0.1 * (1 + 0.0512 * 0.2)     = 0.101024
  #   KL 6   -> 0                     beta unchanged                    = 0.101024
  #   KL 0   -> -1, clipped -0.2      beta 0.101024 * (1 - 0.01024)     = 0.09998954...
  #   KL 6.6 -> 0.1                   beta * (1 + 0.00512)
  kls = [9.0, 6.0, 0.0, 6.6]
  want = [0.101024, 0.101024, 0.101024 * (1 - 0.01024), 0.101024 * (1 - 0.01024) * (1 + 0.00512)]
  beta, got = 0.1, []
  for kl in kls:
    beta = kl_control.next_kl_coef(beta, kl, target=6.0, horizon=10000.0, n_samples=512)
    got.append(beta)
  np.testing.assert_allclose(got, want, rtol=1e-12)
  assert [kl_control.kl_error(k, 6.0) for k in kls] == pytest.approx([0.2, 0.0, -0.2, 0.1])


def test_answer_kl_is_the_mean_over_answers_of_the_sum_over_tokens():
  kl = np.array([[0.5, 1.0, 7.0], [2.0, -1.0, 3.0], [9.0, 9.0, 9.0]])
  mask = np.array([[True, True, False], [True, True, True], [False, False, False]])
  # row 0: 0.5 + 1 = 1.5; row 1: 2 - 1 + 3 = 4; row 2 has no sampled token and does not count
  assert kl_control.answer_kl(kl, mask) == pytest.approx((1.5 + 4.0) / 2)
  assert kl_control.answer_kl(kl, np.zeros_like(mask)) == 0.0


def test_kl_controller_moves_beta_with_the_measured_kl_and_checkpoints_it():
  from jaxrl_llm.training.kl_controller import COEF_KEY, KLController

  cfg = rlhf_config(**{"objective.kl_target": 2.0, "objective.kl_horizon": 64.0})
  ctl = KLController(cfg.objective)
  ctl.replicated = sharding_lib.replicated(sharding_lib.make_mesh(cfg.mesh))
  assert ctl.objective(cfg.objective).kl_coef == pytest.approx(0.05)
  prox = np.log(np.array([[0.5, 0.25, 0.9], [0.2, 0.8, 0.1]], np.float32))
  ref = np.log(np.array([[0.25, 0.5, 0.3], [0.1, 0.8, 0.2]], np.float32))
  mask = np.array([[True, True, False], [True, True, True]])
  # k1 summed per answer: row 0 log 2 + log 0.5 = 0; row 1 log 2 + 0 + log 0.5 = 0 -> KL_t = 0, e = -0.2;
  # scaled prox: add log 3 to each token of row 0's two tokens -> row 0 = 2 log 3; KL_t = log 3 = 1.0986
  prox[0, :2] += np.log(3.0)
  kl_t = np.log(3.0)
  stats = ctl.observe(prox, ref, mask)
  e = max(-0.2, min(0.2, (kl_t - 2.0) / 2.0))  # -0.4507 -> -0.2
  beta_1 = 0.05 * (1 + 2 / 64 * e)
  assert stats["kl/coef"] == pytest.approx(0.05) and stats["kl/answer"] == pytest.approx(kl_t, rel=1e-6)
  assert stats["kl/error"] == pytest.approx(-0.2)
  assert ctl.coef == pytest.approx(beta_1, rel=1e-7) and ctl.coef == float(np.float32(ctl.coef))
  assert ctl.objective(cfg.objective).kl_coef == ctl.coef
  tree = ctl.checkpoint_trees()[COEF_KEY]
  saved, kept = tree.get(), ctl.coef
  ctl.coef = 123.0
  tree.set(saved)
  assert ctl.coef == kept


@pytest.mark.slow
def test_each_step_folds_the_controllers_beta_into_the_reward_and_a_resume_keeps_it(tmp_path, quiet_log,
                                                                                      monkeypatch):
  """A GRPO run with InstructGPT's k1 KL in the reward and the controller on (K_beta = 32 / 64): each
  step's advantages are computed with beta_t (the coefficient batch_advantages receives), beta_t
  follows the rule from the logged KL_t (0 nats at first, pi_prox = pi_ref, so e = -0.2 and beta
  falls), and the run restarted on its workdir restores beta from the checkpoint."""
  from jaxrl_llm.training import step as step_lib

  used = []
  real = step_lib.obj_lib.batch_advantages
  def spy(*args, **kwargs):
    used.append(args[3].kl_coef)  # the ObjectiveConfig the step's advantages use
    return real(*args, **kwargs)
  monkeypatch.setattr(step_lib.obj_lib, "batch_advantages", spy)
  overrides = {"objective.kl_coef": 0.5, "objective.kl_placement": "reward", "objective.kl_estimator": "k1",
               "objective.kl_target": 0.01, "objective.kl_horizon": 64.0, "train.steps": 2,
               "train.lr": 3e-3, "train.warmup_steps": 0, "checkpoint.every_steps": 1, "eval.every": 0}

  def trainer(log):
    return make_trainer(from_config_dict(shrink(load_config("grpo"), **overrides)), tmp_path, log)

  full = trainer(quiet_log)
  full.run()
  B = 8 * 4  # shrink's prompts_per_step x group_size
  beta = 0.5
  assert len(used) == len(full.history) == 2
  for row, coef in zip(full.history, used):
    assert row["kl/coef"] == coef == pytest.approx(beta, rel=1e-6)
    beta = float(np.float32(beta * (1 + B / 64.0 * np.clip((row["kl/answer"] - 0.01) / 0.01, -0.2, 0.2))))
  ctl = full.extension("kl_controller")
  assert ctl.coef == pytest.approx(beta, rel=1e-6) and ctl.coef != 0.5  # it moved
  logs = []
  again = trainer(logs.append)
  again._begin(None)  # pylint: disable=protected-access  (the restore, as a resumed run starts)
  assert any("resumed from checkpoint step 2" in line for line in logs), logs
  assert again.extension("kl_controller").coef == ctl.coef


# ---- the reward's formulas ----------------------------------------------------------------

def test_ensemble_reward_is_mean_minus_k_population_std():
  r = np.array([[1.0, -2.0, 0.5], [3.0, -2.0, 1.5], [2.0, 1.0, -1.0]])
  # column 0: mean 2, population std sqrt((1 + 1 + 0) / 3); column 1: mean -1, std sqrt((1 + 1 + 4) / 3);
  # column 2: mean 1/3, std sqrt(((1/6)^2 + (7/6)^2 + (4/3)^2) / 3)
  std = np.sqrt([2 / 3, 6 / 3, ((1 / 6) ** 2 + (7 / 6) ** 2 + (4 / 3) ** 2) / 3])
  want = np.array([2.0, -1.0, 1 / 3]) - 0.5 * std
  np.testing.assert_allclose(rl_reward.ensemble_reward(r, 0.5), want, rtol=1e-6)
  np.testing.assert_allclose(rl_reward.ensemble_reward(r, 0.0), [2.0, -1.0, 1 / 3], rtol=1e-6)


def test_clip_and_missing_eos_terms():
  x = np.array([-3.0, -0.5, 0.0, 1.75, 2.5], np.float32)
  np.testing.assert_array_equal(rl_reward.clip_reward(x, 2.0), [-2.0, -0.5, 0.0, 1.75, 2.0])
  np.testing.assert_array_equal(rl_reward.clip_reward(x, 0.0), x)  # 0: off
  np.testing.assert_array_equal(rl_reward.missing_eos_shaping(np.array([True, False, True]), 0.75),
                                [-0.75, 0.0, -0.75])


def _fake_samples(truncated, G=2):
  """What score_rewards reads of a batch, for rows whose scores are given."""
  B = len(truncated)
  return types.SimpleNamespace(truncated_B=np.array(truncated), sampled_B=np.ones(B, bool), episodic=False,
                               length_B=np.full(B, 3, np.int32), mask_BR=np.ones((B, 3), bool))


def test_reward_model_reward_is_normalised_clipped_then_penalised(monkeypatch):
  """R_i = w_rm clip_c(norm(r_i)) + w_v v_i - p [cut without EOS], through the two extensions."""
  from jaxrl_llm.training.eos_penalty import MissingEosPenalty
  from jaxrl_llm.training.model_reward import RewardModelExtension

  cfg = rlhf_config(**{"data.reward_norm": "group", "data.reward_clip": 1.0, "data.reward_model_weight": 2.0,
                       "data.verifier_weight": 0.5, "data.missing_eos_penalty": 0.3})
  ext = RewardModelExtension(cfg.data)
  ext.run_cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, group_size=2))
  r = np.array([0.0, 4.0, 1.0, 1.0], np.float32)
  monkeypatch.setattr(ext, "model_scores", lambda samples, per_token=False: r)
  samples = _fake_samples([False, True, True, False])
  v = np.array([1.0, 0.0, 1.0, 1.0], np.float32)
  scores = Scores(reward_B=v, correct_B=v, failed_B=np.zeros(4, bool), timed_out_B=np.zeros(4, bool))
  scores, stats = ext.score_rewards(None, samples, scores)
  scores, eos_stats = MissingEosPenalty(cfg.data).score_rewards(None, samples, scores)
  # group (0, 4): mean 2, std 2 -> -1/(1 + 5e-7), +1/(1 + 5e-7), inside the clip; group (1, 1): 0, 0
  z = 2.0 / (2.0 + 1e-6)
  want = 2.0 * np.array([-z, z, 0.0, 0.0]) + 0.5 * v - 0.3 * np.array([0, 1, 1, 0])
  np.testing.assert_allclose(scores.reward_B, want, rtol=1e-6)
  assert eos_stats["reward/missing_eos_frac"] == 0.5
  # with a tighter clip, c = 0.5 bounds the normalised score before the weight
  cfg2 = dataclasses.replace(cfg.data, reward_clip=0.5)
  ext.cfg = cfg2
  scores2, _ = ext.score_rewards(None, samples, Scores(reward_B=v, correct_B=v, failed_B=np.zeros(4, bool),
                                                       timed_out_B=np.zeros(4, bool)))
  np.testing.assert_allclose(scores2.reward_B, 2.0 * np.array([-0.5, 0.5, 0.0, 0.0]) + 0.5 * v, rtol=1e-6)
  assert stats["reward/model_clipped_frac"] == 0.0


def test_missing_eos_penalty_goes_to_the_last_step_of_step_rewards():
  from jaxrl_llm.training.eos_penalty import MissingEosPenalty

  cfg = rlhf_config(**{"data.missing_eos_penalty": 0.25})
  step_r = np.array([[0.5, 0.0, 0.2], [0.1, 0.3, 0.0]], np.float32)
  ends = np.array([[True, False, True], [True, True, False]])
  scores = Scores(reward_B=np.array([0.7, 0.4], np.float32), correct_B=np.zeros(2, np.float32),
                  failed_B=np.zeros(2, bool), timed_out_B=np.zeros(2, bool), step_reward_BR=step_r, step_end_BR=ends)
  out, _ = MissingEosPenalty(cfg.data).score_rewards(None, _fake_samples([False, True]), scores)
  np.testing.assert_allclose(out.reward_B, [0.7, 0.15], rtol=1e-6)
  np.testing.assert_allclose(out.step_reward_BR, [[0.5, 0.0, 0.2], [0.1, 0.05, 0.0]], rtol=1e-6)
  np.testing.assert_array_equal(scores.step_reward_BR, step_r)  # the input is not written to


# ---- an ensemble of two tiny reward models ---------------------------------------------------

@pytest.fixture(scope="module")
def rm_dirs(tmp_path_factory):
  """Two reward models trained for a few steps from different seeds (their scores differ)."""
  dirs = []
  for seed in (0, 1):
    workdir = str(tmp_path_factory.mktemp(f"rm{seed}"))
    cfg = reward_config_from_dict(apply_settings(reward_model_config(), {
        **TINY_MODEL, "seed": seed, "train.steps": 2, "train.batch_size": 16, "train.warmup_steps": 0,
        "data.n_train": 32, "data.n_eval": 8, "eval.every": 0, "log.every": 2, "checkpoint.every_steps": 2,
        "export": False}))
    from jaxrl_llm.reward_model.trainer import RewardModelRun
    RewardModelRun(cfg, workdir, log=lambda s: None).run()
    dirs.append(workdir)
  return dirs


def _scores_one_device(rm_dir, mesh_cfg, samples) -> np.ndarray:
  """r_B of each row's [prompt | sampled response] ids, right-padded, on one device."""
  params, head, rm_cfg = load_reward_model(rm_dir, sharding_lib.make_mesh(mesh_cfg, jax.devices()[:1]))
  params, head = jax.device_get((params, head))
  rows = [list(p[pm]) + list(t[c]) for p, pm, t, c in zip(samples.prompt_BP, samples.prompt_mask_BP,
                                                          samples.tokens_BR, samples.context_BR)]
  T = max(len(r) for r in rows)
  tokens = np.array([r + [0] * (T - len(r)) for r in rows], np.int32)
  mask = np.array([[True] * len(r) + [False] * (T - len(r)) for r in rows])
  return np.asarray(reward_scores(params, head, rm_cfg, tokens, mask), np.float64)


def test_ensemble_reward_of_two_reward_models_is_mean_minus_k_std(rm_dirs):
  from jaxrl_llm.extension import SetupEnv
  from jaxrl_llm.training.model_reward import RewardModelExtension

  k = 1.5
  cfg = rlhf_config(",".join(rm_dirs), **{"data.reward_norm": "none", "data.reward_model_uncertainty_k": k})
  assert cfg.data.reward_models == tuple(rm_dirs)
  ext = RewardModelExtension(cfg.data)
  ext.preflight(cfg)
  mesh = sharding_lib.make_mesh(cfg.mesh)
  logs = []
  ext.setup(SetupEnv(run_cfg=cfg, model_cfg=None, tokenizer=types.SimpleNamespace(vocab_size=16), mesh=mesh,
                     train_examples=(), sft=None, log=logs.append), None)
  assert len(logs) == 2  # one line per member
  # 8 rows of left-padded prompts and responses of random ids (what scoring reads of a batch)
  rng = np.random.default_rng(0)
  B, P, R = 8, 5, 4
  prompt_mask = np.arange(P)[None, :] >= rng.integers(0, 3, size=(B, 1))
  context = np.arange(R)[None, :] < rng.integers(1, R + 1, size=(B, 1))
  samples = types.SimpleNamespace(prompt_BP=rng.integers(3, 14, size=(B, P)).astype(np.int32),
                                  prompt_mask_BP=prompt_mask, tokens_BR=rng.integers(3, 14, size=(B, R)).astype(np.int32),
                                  context_BR=context)
  r_MB = np.stack([_scores_one_device(d, cfg.mesh, samples) for d in rm_dirs])
  assert np.abs(r_MB[0] - r_MB[1]).max() > 1e-3  # the members disagree: the std term is real
  # mean over the two members minus k * population std, |r_0 - r_1| / 2 for two members
  want = r_MB.mean(0) - k * np.abs(r_MB[0] - r_MB[1]) / 2
  np.testing.assert_allclose(ext.model_scores(samples), want, rtol=1e-4, atol=1e-5)


def test_an_ensemble_of_process_reward_models_is_refused(rm_dirs, tmp_path):
  import json
  import os
  pdir = tmp_path / "prm"
  shutil.copytree(rm_dirs[1], pdir)
  with open(os.path.join(pdir, "config.json")) as f:
    saved = json.load(f)
  with open(os.path.join(pdir, "config.json"), "w") as f:
    json.dump({**saved, "objective": "process"}, f)
  from jaxrl_llm.training.model_reward import RewardModelExtension
  cfg = rlhf_config(f"{rm_dirs[0]},{pdir}")
  with pytest.raises(ConfigError, match=r"its members' objectives are \['bradley_terry', 'process'\]"):
    RewardModelExtension(cfg.data).preflight(cfg)


# ---- the errors -------------------------------------------------------------------------------

@pytest.mark.parametrize("overrides, pattern", [
    ({"data.reward_clip": -1.0}, r"config\.data\.reward_clip=-1\.0 is out of range: allowed \[0\.0"),
    ({"data.reward_clip": 1.0, "data.reward": "auto", "data.reward_model": ""},
     r"config\.data\.reward_clip=1\.0 is invalid: .*needs config\.data\.reward='model'"),
    ({"data.missing_eos_penalty": -0.5}, r"config\.data\.missing_eos_penalty=-0\.5 is out of range"),
    ({"data.reward_model_uncertainty_k": 1.0}, r"config\.data\.reward_model_uncertainty_k=1\.0 is invalid: "
     r".*two or more reward models"),
    ({"data.reward_model_uncertainty_k": -1.0, "data.reward_model": "a,b"},
     r"config\.data\.reward_model_uncertainty_k=-1\.0 is out of range"),
    ({"data.reward_model": "a,,b"}, r"config\.data\.reward_model='a,,b' is invalid: .*none empty"),
    ({"data.reward_model": "a,a"}, r"config\.data\.reward_model='a,a' is invalid"),
    ({"objective.kl_target": -1.0}, r"ObjectiveConfig\.kl_target=-1\.0 is invalid: must be a finite number >= 0"),
    ({"objective.kl_target": 1.0, "objective.kl_placement": "loss"},
     r"ObjectiveConfig\.kl_target=1\.0 is invalid: .*kl_placement='reward'"),
    ({"objective.kl_target": 1.0, "objective.kl_coef": 0.0}, r"ObjectiveConfig\.kl_target=1\.0 is invalid: "
     r".*needs kl_coef > 0"),
    ({"objective.kl_horizon": 0.0}, r"ObjectiveConfig\.kl_horizon=0\.0 is invalid: must be a finite number > 0"),
    ({"objective.kl_target": 1.0, "objective.kl_horizon": 16.0},
     r"config\.objective\.kl_horizon=16\.0 is invalid: must be >= the step's 32 samples"),
])
def test_bad_knob_values_are_one_line_errors(overrides, pattern):
  with pytest.raises(ConfigError, match=pattern) as e:
    rlhf_config(**overrides)
  assert "\n" not in str(e.value)


def test_the_knobs_default_off():
  cfg = rlhf_config()
  assert (cfg.objective.kl_target, cfg.data.reward_clip, cfg.data.missing_eos_penalty,
          cfg.data.reward_model_uncertainty_k) == (0.0, 0.0, 0.0, 0.0)
  from jaxrl_llm.training.extensions import extensions_for
  assert [e.name for e in extensions_for(cfg)] == ["reward_model"]
  on = rlhf_config(**{"objective.kl_target": 1.0, "data.missing_eos_penalty": 0.1})
  assert [e.name for e in extensions_for(on)] == ["reward_model", "missing_eos_penalty", "kl_controller"]
