"""`sft.micro_batch_size` and the reward model's `train.micro_batch_size`: the learner's micro-batches
(learn/learner.py) give the step of the whole batch, and a size that does not fit is a one-line error."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.checks import ConfigError
from jaxrl_llm.reward_model.config import reward_config_from_dict
from jaxrl_llm.reward_model.defaults import reward_model_config
from jaxrl_llm.training.config import from_config_dict
from jaxrl_llm.model.build import make_model
from jaxrl_llm.training.inputs import check_batch_shards, run_data
from jaxrl_llm.training.sft import run_sft, sft_plan
from jaxrl_llm.reward_model.trainer import RewardModelRun
from jaxrl_llm.training.tiny import TINY_MODEL, apply_settings
from tests.run_helpers import load_config, shrink


def _sft(micro: int):
  cfg = from_config_dict(shrink(load_config("gspo"), **{"sft.steps": 3, "sft.batch_size": 32,
                                                          "sft.micro_batch_size": micro}))
  data = run_data(cfg)
  model_cfg, params = make_model(cfg.model, data.tokenizer, data.mesh, jax.random.key(0))
  with jax.sharding.use_abstract_mesh(data.mesh.abstract_mesh):
    params, info = run_sft(params, model_cfg, data.train_examples, data.tokenizer, sft_plan(data.cfg), mesh=data.mesh,
                           log=lambda s: None)
  return params, info


def test_sft_in_micro_batches_takes_the_whole_batch_step():
  whole, info_whole = _sft(0)
  micro, info_micro = _sft(8)  # 4 micro-batches of 8 rows, one per device
  np.testing.assert_allclose(info_micro["sft_loss_start"], info_whole["sft_loss_start"], rtol=1e-5)
  np.testing.assert_allclose(info_micro["sft_loss_end"], info_whole["sft_loss_end"], rtol=1e-4)
  for a, b in zip(jax.tree.leaves(micro), jax.tree.leaves(whole)):
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=1e-3, atol=1e-5)


RM = {**TINY_MODEL, "train.steps": 3, "train.batch_size": 16, "train.warmup_steps": 1, "data.n_train": 64,
      "data.n_eval": 16, "eval.every": 0, "log.every": 1, "checkpoint.every_steps": 0, "export": False}


def _rm(tmp_path, objective: str, micro: int) -> dict:
  cfg = reward_config_from_dict(apply_settings(reward_model_config(), {**RM, "objective": objective, "train.micro_batch_size": micro}))
  run = RewardModelRun(cfg, str(tmp_path / f"{objective}_{micro}"), log=lambda s: None, devices=jax.devices()[:2])
  return run.run()


@pytest.mark.parametrize("objective", ["bradley_terry", "dpo"])
def test_reward_model_and_dpo_in_micro_batches_take_the_whole_batch_step(tmp_path, objective):
  whole, micro = _rm(tmp_path, objective, 0), _rm(tmp_path, objective, 4)
  for key in ("train_loss_first", "train_loss_last", "eval_loss_end", "eval_margin_end"):
    np.testing.assert_allclose(micro[key], whole[key], rtol=1e-4, atol=1e-6, err_msg=key)


def test_micro_batch_sizes_that_do_not_fit_are_one_line_errors(tmp_path):
  with pytest.raises(ConfigError, match=r"config\.sft\.micro_batch_size.*must divide sft\.batch_size=32"):
    from_config_dict(shrink(load_config("gspo"), **{"sft.batch_size": 32, "sft.micro_batch_size": 12}))
  with pytest.raises(ConfigError, match=r"config\.train\.micro_batch_size.*must divide train\.batch_size=16"):
    reward_config_from_dict(apply_settings(reward_model_config(), {**RM, "train.micro_batch_size": 5}))
  rl = from_config_dict(shrink(load_config("gspo"), **{"sft.steps": 5, "sft.batch_size": 32,
                                                       "sft.micro_batch_size": 4}))
  with pytest.raises(ConfigError, match=r"config\.sft\.micro_batch_size \(or sft\.batch_size\)=4 must be a multiple "
                                        r"of the 8 batch shards"):
    check_batch_shards(rl, 8)  # before the workdir, the model or the engine exist (Trainer.__init__)
  cfg = reward_config_from_dict(apply_settings(reward_model_config(), {**RM, "train.micro_batch_size": 4}))
  with pytest.raises(ConfigError, match=r"config\.train\.micro_batch_size=4 must be a multiple of the 8 batch"):
    RewardModelRun(cfg, str(tmp_path / "rm"), log=lambda s: None)
