"""The KV cache kept from one turn to the next (sampling/turns.py's `KeptCache`) samples the turns that
encoding every context again from its first token does (`sample_turns`, the reference), round after
round of episodes whose contexts grow by each turn and an observation: the same ids, the same finish
codes, log mu equal to float rounding. Covered: rows that finish early (budget 0, a dummy block),
per-row budgets, stop sequences seen inside the decode loop, a stop string cut only on the host (the
cached tokens sampled after the cut must leave the context), a model with sliding-window layers
(whose cache keeps each slot's position), and rows split over a mesh."""

import dataclasses

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

from jaxrl_llm.sampling.config import SamplingConfig
from jaxrl_llm.sampling.turns import KeptCache, sample_turns
from sampling_helpers import tiny_model

CONTEXTS = [[5, 9, 2, 33, 17, 8], [41, 3], [7, 7, 19, 25], [11], [30, 31], [4, 4, 4], [12, 13, 14, 15, 16], [9]]
B, R, ROUNDS = len(CONTEXTS), 7, 4


class Letters:
  """id i is the letter chr(97 + i % 26): a tokenizer under which "c" is ids 2 and 28, which the
  decode loop does not know as a stop, so the turn is cut on the host."""

  def decode(self, ids):
    return "".join(chr(97 + int(i) % 26) for i in ids)


def budgets_at(rnd, done):
  return [0 if done[b] else (R if (b + rnd) % 3 else 3 + b % 4) for b in range(B)]


def play(sample, key):
  """ROUNDS rounds over growing contexts: each turn as kept, then an observation of 1-4 ids; row b
  finishes after a round where (b + rnd) % 5 == 4. -> each round's turns."""
  contexts, done, rounds = [list(c) for c in CONTEXTS], [False] * B, []
  for rnd in range(ROUNDS):
    budgets = budgets_at(rnd, done)
    turns = sample([c if not d else [] for c, d in zip(contexts, done)], budgets, jax.random.fold_in(key, rnd))
    rounds.append((budgets, turns))
    for b in range(B):
      if done[b]:
        continue
      contexts[b] += list(turns.ids[b]) + [(7 * b + rnd) % 40 + 1] * ((b + rnd) % 4 + 1)
      done[b] = (b + rnd) % 5 == 4
  return rounds


def assert_same_rounds(kept, reference):
  for rnd, ((budgets, got), (_, want)) in enumerate(zip(kept, reference)):
    for b in range(B):
      assert got.ids[b] == want.ids[b], (rnd, b)
      np.testing.assert_allclose(got.behav_logp[b], want.behav_logp[b], atol=2e-5, err_msg=f"round {rnd} row {b}")
      if budgets[b]:
        assert got.finish_B[b] == want.finish_B[b], (rnd, b)


CASES = {
    "free": dict(),
    "loop_stop": dict(cfg=dict(stop_sequences=((3,), (20, 21)), eos_ids=(5,))),
    "host_cut": dict(tokenizer=Letters(), stop_strings=("c",)),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_kept_cache_samples_the_reference_turns(case):
  spec = CASES[case]
  cfg_m, params = tiny_model()
  cfg = SamplingConfig(temperature=1.0, max_new_tokens=R, pad_id=47, **spec.get("cfg", {}))
  host = dict(tokenizer=spec.get("tokenizer"), stop_strings=spec.get("stop_strings", ()))
  kept = KeptCache(params, cfg_m, cfg, block_multiple=4, slot_multiple=8, **host)
  got = play(kept, jax.random.key(3))
  want = play(lambda c, n, k: sample_turns(params, cfg_m, c, n, cfg, k, context_multiple=64, **host), jax.random.key(3))
  assert_same_rounds(got, want)
  # The case did what it is named for: turns of several lengths, and for host_cut, cuts that dropped
  # tokens the cache had been fed (the next round would differ if they stayed valid).
  lengths = {len(t.ids[b]) for _, t in got for b in range(B)}
  assert len(lengths) >= 3, lengths
  if case == "host_cut":
    assert any(0 < len(t.ids[b]) < n - 1 and t.finish_B[b] for n_B, t in got for b, n in enumerate(n_B))
  # The cache holds only what the rounds wrote: at most each round's block and R decode slots.
  assert kept.slots <= ROUNDS * (8 + 8 + R) + 8


@pytest.mark.slow
def test_kept_cache_with_sliding_window_layers_and_a_mesh():
  """Local layers read each slot's own position, so they must see the kept cache exactly as a fresh
  one; rows split over a 2-device data axis (the cache split with them)."""
  cfg_m, params = tiny_model(layer_types=("sliding_attention", "full_attention"), sliding_window=5)
  cfg = SamplingConfig(temperature=1.0, max_new_tokens=R, pad_id=47)
  mesh = Mesh(np.asarray(jax.devices()[:2]), ("data",))
  kept = KeptCache(params, cfg_m, cfg, mesh=mesh, block_multiple=4, slot_multiple=8)
  got = play(kept, jax.random.key(5))
  want = play(lambda c, n, k: sample_turns(params, cfg_m, c, n, cfg, k, context_multiple=64), jax.random.key(5))
  assert_same_rounds(got, want)


def test_kept_cache_refuses_a_context_that_does_not_extend_its_own():
  cfg_m, params = tiny_model()
  cfg = SamplingConfig(temperature=1.0, max_new_tokens=3, pad_id=47)
  kept = KeptCache(params, cfg_m, cfg, block_multiple=4, slot_multiple=8)
  first = kept(CONTEXTS[:2], [3, 3], jax.random.key(0))
  with pytest.raises(ValueError, match=r"context 1 \(\d+ ids\) does not extend the \d+ ids its cache holds"):
    kept([CONTEXTS[0] + list(first.ids[0]), [40] + CONTEXTS[1] + list(first.ids[1])], [3, 3], jax.random.key(1))
  with pytest.raises(ValueError, match="3 contexts, but its cache holds 2 rows"):
    kept(CONTEXTS[:3], [3, 3, 3], jax.random.key(1))
