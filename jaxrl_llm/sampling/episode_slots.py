"""Episodes on the continuous batcher: each episode holds a slot of one decode state from its first turn
to its end, and its turns run as they come, not in lock-step rounds.

The lock-step player (training/episodes.py's `play`) samples one turn for every episode of the batch,
waits for the longest, steps every environment, and starts the next round; a finished episode still
takes a row of every later round. Here (`rollout.continuous_slots` > 0 in a run with an environment)
the scheduler (`training/episodes.play_slots`) and these slots work as the single-turn continuous
batcher does (sampling/continuous.py), with an episode's turns in place of samples:

    submit:  an episode that needs a turn (its first, or the next after its environment answered)
             queues it on its slot; a new episode takes a free slot;
    advance: the queued turns are admitted as one block of their rows only (`continuous.admit`: the
             slot keeps its cache and appends only what is new since its last turn, the turn's last
             token and the observation); then one chunk of decode steps; the turns that ended are
             read on the host, cut after a stop string the loop did not see (`turns._host_turns`),
             and returned;
    release: a finished episode's slot is free for the next queued episode.

Randomness is the lock-step player's: turn k of episode i draws token t with
fold_in(fold_in(fold_in(key, k), i), t), so both give the same turns for the same key, up to the float
rounding of another attention layout (tests/training/test_episode_slots.py). The KV cache is kept
per episode in its slot. A turn cut on the host after tokens the loop had fed leaves them in the
slot's cache: the episode's next turn then encodes its whole context again (rare: only a subword
tokenizer that writes a stop string in other pieces does it).

Cache room: a slot's valid slots never exceed the episode's room (`context_len`), and a block is at
most that long; when the next block and chunk would not fit, `continuous.compact` moves each row's
valid slots to the front.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from jaxrl_llm.model import sharding as sharding_lib
from jaxrl_llm.model.config import ModelConfig
from jaxrl_llm.sampling import continuous
from jaxrl_llm.sampling.config import SamplingConfig
from jaxrl_llm.sampling.generate import resolve_data_axis, sampler_model_config
from jaxrl_llm.sampling.loop import DecodeState
from jaxrl_llm.sampling.turns import _host_turns


@dataclasses.dataclass(frozen=True)
class EndedTurn:
  """One turn of an episode, sampled and read on the host."""

  episode: int
  ids: tuple[int, ...]  # as sampled, cut after its first stop string
  behav_logp: np.ndarray  # f32 log mu of each id
  finish: int  # FINISH_EOS / FINISH_STOP / FINISH_LENGTH


def _round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


class EpisodeSlots:
  """The built-in sampler's slots for episodes (module docstring). cfg: the turn's sampling settings
  (n_samples 1, max_new_tokens the per-turn limit, the stop strings' ids); key: the rollout's key;
  slots: episodes decoded at once; chunk: decode steps between two looks at which turns ended;
  context_len: the most tokens an episode holds (opening prompt, turns, observations)."""

  def __init__(self, params, model_cfg: ModelConfig, cfg: SamplingConfig, key: jax.Array, *, slots: int,
               chunk: int, context_len: int, mesh: Mesh | None = None, tokenizer=None,
               stop_strings: Sequence[str] = (), block_multiple: int = 16):
    if cfg.n_samples != 1:
      raise ValueError(f"EpisodeSlots: SamplingConfig.n_samples={cfg.n_samples}; one turn per episode needs 1")
    for name, value, least in (("slots", slots, 1), ("chunk", chunk, 1), ("context_len", context_len, 2)):
      if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"EpisodeSlots: {name}={value!r} must be an int >= {least}")
    cfg.check_vocab(model_cfg.vocab_size)
    self.params, self.cfg, self.key, self.chunk = params, cfg, key, chunk
    self.run_cfg = sampler_model_config(model_cfg, cfg)
    self.tokenizer, self.stop_strings = tokenizer, tuple(stop_strings)
    self.block_multiple = block_multiple
    self.capacity = slots
    self.data_axis, self.shards = (), 1
    if mesh is not None:
      self.data_axis = resolve_data_axis(mesh, None)
      self.shards = int(np.prod([mesh.shape[a] for a in self.data_axis]))
      if slots % self.shards:
        raise ValueError(f"EpisodeSlots: slots={slots} do not split evenly over data_axis {self.data_axis!r} of "
                         f"size {self.shards}")
    self.mesh = mesh
    self.width = _round_up(context_len, block_multiple)  # the widest block: a whole context
    # A row's valid slots (at most context_len, all a compaction keeps) + the next block + a chunk.
    self.cache_len = _round_up(context_len + self.width + chunk, 64)
    state = continuous.idle_state(self.run_cfg, cfg, slots, self.cache_len)
    self.state: DecodeState = state.replace(budget_B=jnp.zeros((slots,), jnp.int32))
    self.free = list(range(slots))  # lowest first: the same slots for the same turns, run after run
    self.slot_of: dict[int, int] = {}  # episode -> its slot
    self.held: list[tuple[int, ...]] = [()] * slots  # the ids whose keys and values the slot's cache holds
    self.queued: list[tuple[int, int, tuple[int, ...], int, int]] = []  # (slot, episode, context, budget, turn)
    self.running: dict[int, tuple[int, tuple[int, ...], int]] = {}  # slot -> (episode, context, budget)

  def busy(self) -> bool:
    """Whether a turn is queued or decoding."""
    return bool(self.queued or self.running)

  def submit(self, episode: int, context: Sequence[int], budget: int, turn: int) -> None:
    """Queues episode `episode`'s turn `turn` after `context` (its ids so far), at most `budget` tokens.
    Its first turn takes a free slot (a ValueError when none is: the caller holds at most `capacity`)."""
    if not 1 <= budget <= self.cfg.max_new_tokens:
      raise ValueError(f"EpisodeSlots.submit: budget={budget} is outside [1, max_new_tokens={self.cfg.max_new_tokens}]")
    if len(context) > self.width:
      raise ValueError(f"EpisodeSlots.submit: a context of {len(context)} ids is longer than context_len")
    slot = self.slot_of.get(episode)
    if slot is None:
      if not self.free:
        raise ValueError(f"EpisodeSlots.submit: episode {episode} needs a slot, and all {self.capacity} are held")
      slot = self.slot_of[episode] = self.free.pop(0)
      self.held[slot] = ()
    if slot in self.running or any(q[0] == slot for q in self.queued):
      raise ValueError(f"EpisodeSlots.submit: episode {episode}'s turn is still being sampled")
    self.queued.append((slot, episode, tuple(int(i) for i in context), int(budget), int(turn)))

  def release(self, episode: int) -> None:
    """Episode `episode` ended: its slot takes the next episode (and forgets this one's cache then)."""
    slot = self.slot_of.pop(episode)
    self.held[slot] = ()
    self.free.append(slot)
    self.free.sort()

  def _admit(self) -> None:
    blocks, keep, start = [], [], []
    for slot, _, context, _, _ in self.queued:
      held = self.held[slot]
      if held and len(context) > len(held) and context[:len(held)] == held:
        blocks.append(context[len(held):])
        keep.append(True)
        start.append(len(held))
      else:  # a first turn, or a cache that holds tokens a host-side cut dropped: the whole context
        blocks.append(context)
        keep.append(False)
        start.append(0)
    E = self.block_multiple  # a power of two times it: a few compiled widths
    while E < max(len(b) for b in blocks):
      E *= 2
    E = min(E, self.width)
    self._make_room(E)
    N = continuous.admitted_rows(len(self.queued), self.capacity, self.shards)
    rows_N = np.full((N,), self.capacity, np.int32)  # padding past the last slot: dropped
    episode_N, turn_N, budget_N, start_N = (np.zeros((N,), np.int32) for _ in range(4))
    keep_N = np.zeros((N,), bool)
    block_NE, mask_NE = np.full((N, E), self.cfg.pad_id, np.int32), np.zeros((N, E), bool)
    for n, ((slot, episode, _, budget, turn), ids) in enumerate(zip(self.queued, blocks)):
      block_NE[n, E - len(ids):], mask_NE[n, E - len(ids):] = ids, True
      rows_N[n], episode_N[n], turn_N[n], budget_N[n] = slot, episode, turn, budget
      keep_N[n], start_N[n] = keep[n], start[n]
    self.state = continuous.admit(self.params, self.state, block_NE, mask_NE, rows_N, episode_N, self.key, start_N,
                                  keep_N, turn_N, budget_N, model_cfg=self.run_cfg, cfg=self.cfg, mesh=self.mesh,
                                  data_axis=self.data_axis)
    for slot, episode, context, budget, _ in self.queued:
      self.running[slot] = (episode, context, budget)
    self.queued = []

  def _make_room(self, block: int) -> None:
    """Compacts the cache when a block of `block` slots and a chunk would not fit after its last write."""
    if int(self.state.cache.index) + block + self.chunk > self.cache_len:
      self.state = continuous.compact(self.state, mesh=self.mesh, data_axis=self.data_axis)

  ordered = True  # play_slots takes the steps of one advance's turns after the next advance, all of them

  def close(self) -> None:
    self.state = None  # the cache

  def advance(self, steps=()) -> list[EndedTurn]:
    """Admits the queued turns, decodes one chunk, and returns the turns that ended (slot order); [] when
    nothing is queued or decoding. `steps` (the environments' steps in flight) are not waited for."""
    if self.queued:
      self._admit()
    if not self.running:
      return []
    self._make_room(0)
    self.state = continuous.decode_chunk(self.params, self.state, model_cfg=self.run_cfg, cfg=self.cfg,
                                         chunk=self.chunk, mesh=self.mesh, data_axis=self.data_axis)
    active = np.asarray(sharding_lib.fetch(self.state.active_B))
    ended = sorted(s for s in self.running if not active[s])
    if not ended:
      return []
    budgets = [self.running[s][2] if s in ended else 0 for s in range(self.capacity)]
    out = _host_turns(self.state, budgets, self.tokenizer, self.stop_strings)
    turns = []
    for s in ended:
      episode, context, _ = self.running.pop(s)
      ids = out.turns.ids[s]
      fed = max(int(out.length_B[s]) - 1, 0)  # the turn's last token is sampled but not fed
      kept = min(len(ids), fed)
      # Tokens fed after a host-side cut stay in the cache: the next turn encodes the context again.
      self.held[s] = context + ids[:kept] if kept == fed else ()
      turns.append(EndedTurn(episode, ids, out.turns.behav_logp[s], int(out.turns.finish_B[s])))
    return turns
