"""Episodes on the continuous batcher (sampling/episode_slots.py's `EpisodeSlots`) sample the turns of
the lock-step rounds (`sample_turns`, which encodes every context again from its first token): the
same ids, finish codes, and log mu to float rounding, for the growing contexts of test_kept_cache.py's
episodes, with fewer slots than episodes (an episode waits for a slot), chunks shorter than a turn, a
cache compacted on the way, a stop string cut on the host (the slot's cache then holds tokens after
the cut, and the next turn encodes the whole context again), sliding-window layers and a mesh."""

import collections

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

from jaxrl_llm.sampling import continuous
from jaxrl_llm.sampling.config import SamplingConfig
from jaxrl_llm.sampling.episode_slots import EpisodeSlots
from jaxrl_llm.sampling.turns import sample_turns
from sampling_helpers import tiny_model
from test_kept_cache import CASES, CONTEXTS, ROUNDS, B, R, budgets_at, play


def observation(b, rnd):
  return [(7 * b + rnd) % 40 + 1] * ((b + rnd) % 4 + 1)  # test_kept_cache.play's


def play_on_slots(slots: EpisodeSlots) -> dict:
  """test_kept_cache.play's episodes, each turn submitted as soon as its episode needs it. -> {(row,
  round): EndedTurn}"""
  contexts, turns, rnd_of = [list(c) for c in CONTEXTS], {}, [0] * B
  waiting, holding = collections.deque(range(B)), set()
  while waiting or holding:
    while waiting and len(holding) < slots.capacity:
      b = waiting.popleft()
      holding.add(b)
      slots.submit(b, contexts[b], budgets_at(0, [False] * B)[b], 0)
    for t in slots.advance():
      b = t.episode
      rnd = rnd_of[b]
      turns[(b, rnd)] = t
      contexts[b] += list(t.ids) + observation(b, rnd)
      rnd_of[b] += 1
      if (b + rnd) % 5 == 4 or rnd_of[b] == ROUNDS:
        holding.remove(b)
        slots.release(b)
      else:
        slots.submit(b, contexts[b], budgets_at(rnd + 1, [False] * B)[b], rnd + 1)
  return turns


def assert_same_turns(got: dict, reference: list):
  n = 0
  for rnd, (budgets, want) in enumerate(reference):
    for b in range(B):
      if not budgets[b]:
        assert (b, rnd) not in got, (b, rnd)
        continue
      t = got[(b, rnd)]
      assert t.ids == want.ids[b], (rnd, b)
      np.testing.assert_allclose(t.behav_logp, want.behav_logp[b], atol=2e-5, err_msg=f"round {rnd} row {b}")
      assert t.finish == want.finish_B[b], (rnd, b)
      n += 1
  assert n == len(got)


@pytest.fixture
def compactions(monkeypatch):
  calls = []
  real = continuous.compact

  def counted(*args, **kwargs):
    calls.append(1)
    return real(*args, **kwargs)

  monkeypatch.setattr(continuous, "compact", counted)
  return calls


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_slots_sample_the_lock_step_turns(case, compactions):
  spec = CASES[case]
  cfg_m, params = tiny_model()
  cfg = SamplingConfig(temperature=1.0, max_new_tokens=R, pad_id=47, **spec.get("cfg", {}))
  host = dict(tokenizer=spec.get("tokenizer"), stop_strings=spec.get("stop_strings", ()))
  longest = max(len(c) for c in CONTEXTS) + ROUNDS * (R + 4)
  slots = EpisodeSlots(params, cfg_m, cfg, jax.random.key(3), slots=3, chunk=2, context_len=longest, **host)
  got = play_on_slots(slots)
  # (one padded width for every round of the reference: fewer programs to compile, the same turns)
  want = play(lambda c, n, k: sample_turns(params, cfg_m, c, n, cfg, k, context_multiple=64, **host),
              jax.random.key(3))
  assert_same_turns(got, want)
  assert compactions, "the cache was never compacted: the test does not reach that path"
  if case == "host_cut":  # cuts that left tokens after them in a slot's cache
    assert any(0 < len(t.ids) < budgets_at(r, [False] * B)[b] - 1 and t.finish for (b, r), t in got.items())


@pytest.mark.slow
def test_slots_with_sliding_window_layers_and_a_mesh():
  cfg_m, params = tiny_model(layer_types=("sliding_attention", "full_attention"), sliding_window=5)
  cfg = SamplingConfig(temperature=1.0, max_new_tokens=R, pad_id=47)
  mesh = Mesh(np.asarray(jax.devices()[:2]), ("data",))
  longest = max(len(c) for c in CONTEXTS) + ROUNDS * (R + 4)
  slots = EpisodeSlots(params, cfg_m, cfg, jax.random.key(5), slots=4, chunk=3, context_len=longest, mesh=mesh)
  got = play_on_slots(slots)
  want = play(lambda c, n, k: sample_turns(params, cfg_m, c, n, cfg, k, context_multiple=64), jax.random.key(5))
  assert_same_turns(got, want)


def test_slots_refuse_what_does_not_fit():
  cfg_m, params = tiny_model()
  cfg = SamplingConfig(temperature=1.0, max_new_tokens=3, pad_id=47)
  with pytest.raises(ValueError, match="slots=0 must be an int >= 1"):
    EpisodeSlots(params, cfg_m, cfg, jax.random.key(0), slots=0, chunk=2, context_len=16)
  with pytest.raises(ValueError, match=r"slots=3 do not split evenly over data_axis \('data',\) of size 2"):
    EpisodeSlots(params, cfg_m, cfg, jax.random.key(0), slots=3, chunk=2, context_len=16,
                 mesh=Mesh(np.asarray(jax.devices()[:2]), ("data",)))
  slots = EpisodeSlots(params, cfg_m, cfg, jax.random.key(0), slots=1, chunk=2, context_len=16)
  with pytest.raises(ValueError, match=r"budget=4 is outside \[1, max_new_tokens=3\]"):
    slots.submit(0, [1, 2], 4, 0)
  slots.submit(0, [1, 2], 3, 0)
  with pytest.raises(ValueError, match="episode 0's turn is still being sampled"):
    slots.submit(0, [1, 2], 3, 0)
  with pytest.raises(ValueError, match="episode 1 needs a slot, and all 1 are held"):
    slots.submit(1, [1, 2], 3, 0)
