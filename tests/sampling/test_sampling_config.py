"""SamplingConfig validation: bad input names the field, its value, the range."""

import pytest

from jaxrl_llm.sampling.config import SamplingConfig


@pytest.mark.parametrize("kwargs,match", [
    (dict(top_p=0.0), r"top_p=0.0 must be in \(0, 1\]"),
    (dict(top_p=1.5), r"top_p=1.5 must be in \(0, 1\]"),
    (dict(top_p=-0.1), r"top_p"),
    (dict(top_k=-1), r"top_k=-1 is out of range"),
    (dict(temperature=-0.5), r"temperature=-0.5 must be >= 0"),
    (dict(min_p=1.0), r"min_p=1.0 must be in \[0, 1\)"),
    (dict(max_new_tokens=0), r"max_new_tokens=0"),
    (dict(n_samples=0), r"n_samples=0"),
    (dict(record_topk=-2), r"record_topk=-2"),
    (dict(dtype="int8"), r"dtype='int8'"),
    (dict(eos_ids=(2,), stop_ids=(2, 3)), r"\[2\] are in both eos_ids and stop_ids"),
    (dict(eos_ids=(-1,)), r"eos_ids holds -1"),
    (dict(cache_len=4, max_new_tokens=4), r"cache_len=4 is out of range"),
    (dict(temperature=float("nan")), r"temperature=nan must be finite"),
])
def test_bad_values_raise_value_error(kwargs, match):
  with pytest.raises(ValueError, match=match):
    SamplingConfig(**kwargs)


@pytest.mark.parametrize("kwargs", [dict(top_k=2.0), dict(temperature="1"), dict(record_raw_logp=1),
                                    dict(eos_ids=3), dict(n_samples=True)])
def test_bad_types_raise_type_error(kwargs):
  with pytest.raises(TypeError, match=next(iter(kwargs))):
    SamplingConfig(**kwargs)


def test_vocab_bounds():
  cfg = SamplingConfig(top_k=33)
  with pytest.raises(ValueError, match=r"top_k=33 exceeds the vocabulary size 32"):
    cfg.check_vocab(32)
  SamplingConfig(top_k=32).check_vocab(32)
  with pytest.raises(ValueError, match=r"eos_ids holds \[40\]"):
    SamplingConfig(eos_ids=(40,)).check_vocab(32)
  with pytest.raises(ValueError, match=r"record_topk=64"):
    SamplingConfig(record_topk=64).check_vocab(32)


def test_prompt_longer_than_cache():
  cfg = SamplingConfig(max_new_tokens=8, cache_len=20)
  assert cfg.cache_slots(12) == 20
  with pytest.raises(ValueError, match=r"prompt length 13 \+ max_new_tokens 8 = 21 exceeds SamplingConfig.cache_len=20"):
    cfg.cache_slots(13)
  assert SamplingConfig(max_new_tokens=8).cache_slots(13) == 21


def test_equal_configs_hash_equal():
  # Lists and ints normalise, so equal configs share one compiled sampler.
  a = SamplingConfig(temperature=1, eos_ids=[1, 2], top_p=1)
  b = SamplingConfig(temperature=1.0, eos_ids=(1, 2), top_p=1.0)
  assert a == b and hash(a) == hash(b)
  assert SamplingConfig(temperature=0.0).greedy and not SamplingConfig().greedy
