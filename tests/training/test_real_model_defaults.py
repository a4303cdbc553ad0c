"""Defaults that a checkpoint model needs and the tiny model does not: remat and micro-batches."""

import dataclasses

import pytest

from jaxrl_llm.training.config import from_config_dict, micro_batch_for_tokens
from jaxrl_llm.training.defaults import get_config


@pytest.mark.parametrize("mini,seq,tokens,multiple,want", [
    (64, 72, 2048, 1, 16),  # 16 x 72 = 1152 <= 2048 < 32 x 72
    (64, 72, 2048, 8, 16),
    (48, 100, 2048, 1, 16),  # divisors of 48: 24 x 100 is over, 16 x 100 fits
    (64, 300, 128, 8, 8),  # over budget even at the smallest shard multiple: that multiple
    (12, 10, 1000, 1, 12),  # the whole mini-batch fits
])
def test_micro_batch_for_tokens(mini, seq, tokens, multiple, want):
  got = micro_batch_for_tokens(mini, seq, tokens, multiple)
  assert got == want and mini % got == 0 and got % multiple == 0


def _cfg(**model):
  c = get_config("grpo")
  for k, v in model.items():
    c.model[k] = v
  return from_config_dict(c)


def test_checkpoint_model_gets_remat_and_token_budgeted_micro_batches():
  tiny = _cfg()
  assert tiny.model.remat_policy == "none"
  assert tiny.with_micro_batch(8, 1) is tiny  # the tiny model: the whole mini-batch
  real = _cfg(hf_path="/some/checkpoint")
  assert real.model.remat_policy == "full"
  mini = real.mini_batch_size
  seq = 40 + real.rollout.max_response_len
  resolved = real.with_micro_batch(40, 1)
  assert resolved.micro_batch_size == micro_batch_for_tokens(mini, seq, 2048)
  assert resolved.micro_batch_size * seq <= 2048 < mini * seq
  # An explicit size or budget wins; an explicit remat too.
  set_size = dataclasses.replace(real, train=dataclasses.replace(real.train, micro_batch_size=mini // 2))
  assert set_size.with_micro_batch(40, 1).micro_batch_size == mini // 2
  budget = dataclasses.replace(real, train=dataclasses.replace(real.train, micro_batch_tokens=10 ** 9))
  assert budget.with_micro_batch(40, 1).micro_batch_size == mini
  assert _cfg(hf_path="/x", remat="save_dots").model.remat_policy == "save_dots"
