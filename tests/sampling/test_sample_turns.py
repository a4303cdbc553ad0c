"""One turn per context (sampling/turns.py): per-row budgets and stop sequences cut exactly what the
unconstrained sampler would have sampled, and the host-side cut at a stop string."""

import dataclasses

import jax
import numpy as np
import pytest

from jaxrl_llm.model.tokenizer import CharTokenizer
from jaxrl_llm.sampling.config import SamplingConfig
from jaxrl_llm.sampling.rollout import FINISH_EOS, FINISH_LENGTH, FINISH_STOP
from jaxrl_llm.sampling.turns import first_stop, sample_turns, stop_sequences
from sampling_helpers import tiny_model

CONTEXTS = [[5, 9, 2, 33, 17, 8], [41, 3], [7, 7, 19, 25], [11], [30, 31], [4, 4, 4], [12, 13, 14, 15, 16], [9]]
R = 12


# The module-scoped fixtures run once: the module's tests go to one pytest-xdist worker.
pytestmark = pytest.mark.xdist_group("sampling.test_sample_turns")


@pytest.fixture(scope="module")
def free_turns():
  """The model, and one unconstrained turn of R tokens per context (no EOS, no stop)."""
  cfg_m, params = tiny_model()
  cfg = SamplingConfig(temperature=1.0, max_new_tokens=R, pad_id=47)
  free = sample_turns(params, cfg_m, CONTEXTS, [R] * len(CONTEXTS), cfg, jax.random.key(3), context_multiple=8)
  return cfg_m, params, cfg, free


@pytest.mark.slow
def test_free_turns_run_to_length(free_turns):
  *_, free = free_turns
  assert [len(t) for t in free.ids] == [R] * len(CONTEXTS)
  assert (free.finish_B == FINISH_LENGTH).all()
  assert all(np.isfinite(lp).all() and (lp <= 0).all() for lp in free.behav_logp)


@pytest.mark.slow
def test_budgets_cut_the_same_draws(free_turns):
  """Row b with budget n samples the first n tokens of its unconstrained turn, with the same log mu;
  budget 0 samples nothing; every row's draws are its own (fold_in(key, b)), whatever the others do."""
  cfg_m, params, cfg, free = free_turns
  budgets = [3, R, 0, 1, 5, 0, 7, 2]
  cut = sample_turns(params, cfg_m, CONTEXTS, budgets, cfg, jax.random.key(3), context_multiple=8)
  for b, n in enumerate(budgets):
    assert cut.ids[b] == free.ids[b][:n], b
    np.testing.assert_array_equal(cut.behav_logp[b], free.behav_logp[b][:n])
  assert [int(f) for f in cut.finish_B[[0, 1, 3, 4, 6, 7]]] == [FINISH_LENGTH] * 6


@pytest.mark.slow
def test_stop_sequences_end_a_row_where_they_first_appear(free_turns):
  """A stop sequence taken from row 0's own tokens (positions 4, 5, 6) ends row 0 right after its first
  occurrence, finish "stop"; rows where it never occurs run on unchanged."""
  cfg_m, params, cfg, free = free_turns
  seq = free.ids[0][4:7]
  stopped = sample_turns(params, cfg_m, CONTEXTS, [R] * len(CONTEXTS),
                         dataclasses.replace(cfg, stop_sequences=(seq,)), jax.random.key(3), context_multiple=8)
  for b, ids in enumerate(free.ids):
    first = next((t for t in range(2, R) if ids[t - 2:t + 1] == seq), None)
    want = ids if first is None else ids[:first + 1]
    assert stopped.ids[b] == want, b
    assert stopped.finish_B[b] == (FINISH_LENGTH if first is None else FINISH_STOP), b
    np.testing.assert_array_equal(stopped.behav_logp[b], free.behav_logp[b][:len(want)])
  assert len(stopped.ids[0]) <= 7


@pytest.mark.slow
def test_eos_still_ends_a_turn(free_turns):
  cfg_m, params, cfg, free = free_turns
  eos = free.ids[1][2]
  out = sample_turns(params, cfg_m, CONTEXTS[:2], [R, R], dataclasses.replace(cfg, eos_ids=(eos,)),
                     jax.random.key(3), context_multiple=8)
  assert out.ids[1][-1] == eos and out.finish_B[1] == FINISH_EOS and len(out.ids[1]) <= 3


def test_first_stop_and_stop_sequences_on_text():
  tok = CharTokenizer()
  ids = tok.encode("<calc>1+2</calc> and more")
  assert first_stop(ids, ("</calc>",), tok) == len("<calc>1+2</calc>")
  assert first_stop(ids, ("</python>",), tok) is None
  assert first_stop(ids, (), tok) is None
  assert first_stop(tok.encode("</calc>") + [tok.eos_id], ("</calc>",), tok) == 7
  assert stop_sequences(tok, ("</calc>", "", "</calc>")) == (tuple(tok.encode("</calc>")),)


@pytest.mark.slow
def test_host_cut_at_a_stop_string_the_loop_did_not_see(free_turns):
  """A tokenizer that spells a stop string in other pieces than its own encoding: the turn is cut on
  the host after the token that completes the string; the kept ids and log mu are a prefix of the draw."""
  cfg_m, params, cfg, free = free_turns

  class Letters:  # id i is the letter chr(97 + i % 26); "stop" is the text of row 2's tokens 3..5
    def decode(self, ids):
      return "".join(chr(97 + int(i) % 26) for i in ids)

  tok = Letters()
  target = tok.decode(free.ids[2][3:6])
  out = sample_turns(params, cfg_m, CONTEXTS, [R] * len(CONTEXTS), cfg, jax.random.key(3), context_multiple=8,
                     tokenizer=tok, stop_strings=(target,))
  for b, ids in enumerate(free.ids):
    n = first_stop(ids, (target,), tok)
    assert out.ids[b] == (ids if n is None else ids[:n]), b
    assert out.finish_B[b] == (FINISH_LENGTH if n is None else FINISH_STOP), b
  assert len(out.ids[2]) <= 6


def test_sampling_config_checks_stop_sequences():
  assert SamplingConfig(stop_sequences=[[1, 2], (3,)]).stop_sequences == ((1, 2), (3,))
  with pytest.raises(ValueError, match="empty sequence"):
    SamplingConfig(stop_sequences=((),))
  with pytest.raises(ValueError, match="token ids are ints >= 0"):
    SamplingConfig(stop_sequences=((1, -2),))
  with pytest.raises(ValueError, match=r"stop_sequences holds \[99\], outside the vocabulary"):
    SamplingConfig(stop_sequences=((1, 99),)).check_vocab(48)


@pytest.mark.slow
def test_budget_checks(free_turns):
  cfg_m, params, cfg, _ = free_turns
  with pytest.raises(ValueError, match=r"budgets\[1\]=13 is outside \[0, max_new_tokens=12\]"):
    sample_turns(params, cfg_m, CONTEXTS[:2], [1, 13], cfg, jax.random.key(0))
  with pytest.raises(ValueError, match="context 0 is empty"):
    sample_turns(params, cfg_m, [[], [1]], [1, 1], cfg, jax.random.key(0))
