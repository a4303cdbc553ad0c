"""A reward model as the RL reward (data.reward=model): the step's advantages are the GRPO advantages
of the reward model's scores of the sampled sequences, scored here again independently (one device,
right-padded, the ids of the RM's training data); the normalisation and mixing formulas written out;
the config's and the preflight's one-line errors."""


import jax
import numpy as np
import pytest
from run_helpers import load_config, shrink

from jaxrl_llm.checkpointing.manager import CheckpointManager
from jaxrl_llm.checks import ConfigError
from jaxrl_llm.model import sharding as sharding_lib
from jaxrl_llm.reward_model import rl_reward
from jaxrl_llm.reward_model.config import reward_config_from_dict
from jaxrl_llm.reward_model.data import sequence_ids
from jaxrl_llm.reward_model.defaults import reward_model_config
from jaxrl_llm.reward_model.scorer import load_reward_model, reward_scores
from jaxrl_llm.training.config import from_config_dict
from jaxrl_llm.training.loop import Trainer
from jaxrl_llm.reward_model.trainer import RewardModelRun
from jaxrl_llm.training.step import build_batch, rollout_and_score
from jaxrl_llm.training.tiny import TINY_MODEL, apply_settings


def rlhf_config(reward_model: str, **overrides):
  return from_config_dict(shrink(load_config("rlhf_arithmetic"), **{"data.reward_model": reward_model,
                                                                    **overrides}))


# The module-scoped fixtures run once: the module's tests go to one pytest-xdist worker.
pytestmark = pytest.mark.xdist_group("reward_model.test_rm_reward")


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory):
  """A reward model trained for a few steps (its scores differ between responses: that is enough)."""
  workdir = str(tmp_path_factory.mktemp("rm"))
  cfg = reward_config_from_dict(apply_settings(reward_model_config(), {
      **TINY_MODEL, "train.steps": 4, "train.batch_size": 16, "train.warmup_steps": 1, "data.n_train": 64,
      "data.n_eval": 8, "eval.every": 0, "log.every": 4, "checkpoint.every_steps": 4, "export": False}))
  RewardModelRun(cfg, workdir, log=lambda s: None).run()
  return workdir


# ---- the formulas -----------------------------------------------------------------------

def test_group_normalise_is_the_formula():
  r = np.array([1.0, 3.0, 2.0, 2.0, -1.0, 5.0], np.float32)
  # group 1: mean 2, population std sqrt(2/3); group 2: mean 2, std sqrt(((-3)^2 + 3^2 + 0) / 3) = sqrt(6)
  want = np.array([-1 / (np.sqrt(2 / 3) + 1e-6), 1 / (np.sqrt(2 / 3) + 1e-6), 0.0,
                   0.0, -3 / (np.sqrt(6) + 1e-6), 3 / (np.sqrt(6) + 1e-6)])
  np.testing.assert_allclose(rl_reward.group_normalise(r, 3), want, rtol=1e-6)


def test_running_moments_are_those_of_every_score_seen():
  rounds = [np.array([1.0, 2.0, 4.0]), np.array([0.5]), np.array([-3.0, 7.0, 2.0, 2.0])]
  m = rl_reward.Moments()
  for i, x in enumerate(rounds):
    m = rl_reward.update_moments(m, x)
    seen = np.concatenate(rounds[:i + 1])
    assert m.count == len(seen)
    np.testing.assert_allclose([m.mean, m.std], [seen.mean(), seen.std()], rtol=1e-12)
  # normalised with the moments of all 8 scores: mean (1 + 2 + 4 + 0.5 - 3 + 7 + 2 + 2) / 8 = 15.5 / 8 = 1.9375
  x = np.array([1.9375, 3.0], np.float32)
  np.testing.assert_allclose(rl_reward.running_normalise(x, m), (x - 1.9375) / (seen.std() + 1e-6), rtol=1e-6,
                             atol=1e-7)
  assert rl_reward.update_moments(m, np.zeros((0,))) == m


def test_mixed_reward_is_the_formula():
  model = np.array([0.5, -1.0]); verifier = np.array([1.0, 0.0]); shaping = np.array([0.0, -0.25])
  # 2 * 0.5 + 0.3 * 1 + 0 = 1.3;  2 * -1 + 0 - 0.25 = -2.25
  np.testing.assert_allclose(rl_reward.mixed_reward(model, verifier, shaping, w_rm=2.0, w_v=0.3), [1.3, -2.25],
                             rtol=1e-6)


# ---- the errors -------------------------------------------------------------------------

def test_config_needs_a_reward_model_exactly_with_reward_model():
  with pytest.raises(ConfigError, match=r"config\.data\.reward_model=''.*config\.data\.reward='model'"):
    rlhf_config("")
  with pytest.raises(ConfigError, match=r"config\.data\.reward_model='x'.*config\.data\.reward='auto'"):
    rlhf_config("x", **{"data.reward": "auto"})
  with pytest.raises(ConfigError, match=r"config\.data\.reward_norm='batch'"):
    rlhf_config("x", **{"data.reward_norm": "batch"})


def _preflight_error(tmp_path, reward_model: str) -> str:
  workdir = tmp_path / "run"
  tr = Trainer(rlhf_config(reward_model), str(workdir), log=lambda s: None)
  with pytest.raises(ConfigError) as e:
    tr.run()
  assert not workdir.exists()  # refused before any workdir exists
  assert "\n" not in str(e.value)
  return str(e.value)


def test_preflight_refuses_a_missing_path(tmp_path):
  msg = _preflight_error(tmp_path, str(tmp_path / "nowhere"))
  assert msg.startswith(f"config.data.reward_model={str(tmp_path / 'nowhere')!r}: no such directory")


def test_preflight_refuses_a_workdir_without_checkpoints(tmp_path):
  (tmp_path / "empty").mkdir()
  assert "holds no checkpoint" in _preflight_error(tmp_path, str(tmp_path / "empty"))


def test_preflight_refuses_a_checkpoint_without_a_head(tmp_path):
  ckpts = tmp_path / "policy_run" / "checkpoints"
  mngr = CheckpointManager(str(ckpts))
  mngr.save(3, {"params": {"w": np.zeros((2,), np.float32)}})
  mngr.wait()
  mngr.close()
  msg = _preflight_error(tmp_path, str(tmp_path / "policy_run"))
  assert f"{ckpts / '3'}" in msg and "has no field 'reward_head'" in msg, msg


# ---- the step ---------------------------------------------------------------------------

def _independent_scores(rm_dir, mesh_cfg, tokenizer, samples) -> np.ndarray:
  """r_B of each row's [prompt | sampled response] ids, right-padded, on one device."""
  params, head, rm_cfg = load_reward_model(rm_dir, sharding_lib.make_mesh(mesh_cfg, jax.devices()[:1]))
  params, head = jax.device_get((params, head))
  rows = [list(p[pm]) + list(t[m]) for p, pm, t, m in zip(samples.prompt_BP, samples.prompt_mask_BP,
                                                          samples.tokens_BR, samples.mask_BR)]
  as_text = 0
  for ids, prompt, response, truncated in zip(rows, samples.prompts, samples.responses, samples.truncated_B):
    text_ids = sequence_ids(tokenizer, prompt, response, chat_template=False)  # the RM's training layout
    if not truncated and tokenizer.decode(tokenizer.encode(response)) == response:
      assert ids == text_ids, (ids, text_ids)
      as_text += 1
  assert as_text > 0  # the sampled ids are the RM's training layout of the texts
  T = max(len(r) for r in rows)
  tokens = np.array([r + [0] * (T - len(r)) for r in rows], np.int32)
  mask = np.array([[True] * len(r) + [False] * (T - len(r)) for r in rows])
  return np.asarray(reward_scores(params, head, rm_cfg, tokens, mask))


@pytest.mark.slow
@pytest.mark.parametrize("norm", ["none", "group", "running"])
def test_step_advantages_are_grpo_of_the_reward_models_scores(rm_dir, tmp_path, norm):
  cfg = rlhf_config(rm_dir, **{"data.reward_norm": norm, "sft.steps": 20})
  tr = Trainer(cfg, str(tmp_path), log=lambda s: None)
  state, _, _ = tr._begin(None)  # pylint: disable=protected-access
  with jax.sharding.use_abstract_mesh(tr.mesh.abstract_mesh):
    sb = rollout_and_score(tr.context, state, jax.random.key(3))
    batch, _ = build_batch(tr.context, state, sb)
  r = _independent_scores(rm_dir, cfg.mesh, tr.tokenizer, sb.samples)
  G = cfg.rollout.group_size
  np.testing.assert_allclose(sb.stats["reward/model_mean"], r.mean(), rtol=1e-5)
  np.testing.assert_allclose(sb.stats["reward/model_std"], r.std(), rtol=1e-4)
  if norm == "group":  # (r - mean_g) / (std_g + 1e-6), population std
    r_NG = r.reshape(-1, G)
    r = ((r_NG - r_NG.mean(1, keepdims=True)) / (r_NG.std(1, keepdims=True) + 1e-6)).reshape(-1)
  if norm == "running":  # the first round: the moments are this round's scores'
    r = (r - r.mean()) / (r.std() + 1e-6)
  # InstructGPT's KL in the reward (the config's objective.kl_placement=reward, k1, beta=kl_coef)
  mask = np.asarray(batch.mask_BR)
  k1 = np.where(mask, np.asarray(batch.prox_logp_BR) - np.asarray(batch.ref_logp_BR), 0.0).sum(1)
  R_NG = (r - cfg.objective.kl_coef * k1).reshape(-1, G)
  # GRPO (ddof 1): (R_i - mean_g R) / (std_g R + 1e-6) on every sampled token of row i
  adv = ((R_NG - R_NG.mean(1, keepdims=True)) / (R_NG.std(1, ddof=1, keepdims=True) + 1e-6)).reshape(-1)
  assert mask.any(axis=1).all()
  got = np.asarray(batch.adv_BR)
  np.testing.assert_allclose(got, np.where(mask, adv[:, None], 0.0), rtol=1e-3, atol=1e-3)
  assert np.abs(adv).max() > 0.1  # the scores differ within groups: a real test
  # The gold verifier still scores every sample (the task's own reward, not the reward model's).
  assert set(np.unique(sb.scores.correct_B)) <= {0.0, 1.0}


def test_running_moments_go_through_the_checkpoint_tree():
  from jaxrl_llm.training.model_reward import MOMENTS_KEY, RewardModelExtension

  cfg = rlhf_config("x")
  ext = RewardModelExtension(cfg.data)
  ext.replicated = sharding_lib.replicated(sharding_lib.make_mesh(cfg.mesh))
  ext.moments = rl_reward.Moments(count=24.0, mean=0.25, m2=3.5)  # values f32 holds exactly
  tree = ext.checkpoint_trees()[MOMENTS_KEY]
  saved = tree.get()
  ext.moments = rl_reward.Moments()
  tree.set(saved)
  assert ext.moments == rl_reward.Moments(count=24.0, mean=0.25, m2=3.5)
  assert RewardModelExtension(rlhf_config("x", **{"data.reward_norm": "group"}).data).checkpoint_trees() == {}


def test_a_config_saved_before_the_keys_reads_with_the_verifier_reward():
  from jaxrl_llm.training.provenance import complete, plain_config

  saved = plain_config(from_config_dict(shrink(load_config("grpo"))))
  for k in ("reward_model", "reward_model_weight", "verifier_weight", "reward_norm"):
    del saved["data"][k]
  data = from_config_dict(complete(saved)).data
  assert (data.reward, data.reward_model, data.reward_model_weight, data.verifier_weight, data.reward_norm) == (
      "auto", "", 1.0, 0.0, "none")
