"""One turn for each of many contexts: the built-in sampler inside a multi-turn rollout.

A multi-turn episode (jaxrl_llm/envs/) alternates turns the policy samples with observations an
environment appends. Each round of a batched rollout (training/episodes.py) samples one turn for every
live episode, continuing from that episode's ids so far: `sample_turns` is that round. A turn ends at
EOS, at a stop string (a tool call's closing tag, e.g. "</calc>"), or at the row's own token budget
(`budget_B`: the per-turn limit, or what is left of the episode's), which is finish reason "length":
the turn was cut.

Stop strings are matched twice. Inside the jitted decode loop as token sequences
(`SamplingConfig.stop_sequences`, each string's own tokenisation): exact for the character tokenizer
and for a model that writes the closing tag the way it is tokenised alone. Then on the host, on the
decoded text (`first_stop`): a turn whose text holds a stop string that the loop did not see (a
subword tokenizer wrote the tag in other pieces) is cut after the token that completes it. Cutting
keeps a prefix of what was sampled, so the kept ids and their log mu are still exactly the sampled
ones; the tokens after the cut were sampled but are dropped.

Two ways to run the rounds of one batch, giving the same turns (tests/sampling/test_kept_cache.py):

- `KeptCache` (the trainer's): the KV cache is kept from one round to the next. A round encodes only
  what is new in each row's context since the last: the previous turn's last token (sampled but not
  yet fed) and the environment's observation, with the jitted `extend`, then runs `decode`. The
  cache grows by one block of new tokens and R decode slots per round; its slots need not be
  contiguous per row (attention reads the valid ones, RoPE takes each token's own position), so a
  row whose turn ended early leaves invalid slots behind, and the tokens a host-side cut dropped are
  marked invalid before the next block.
- `sample_turns`: every round encodes each context again from its first token with the jitted
  `prefill`. A round costs a forward over the whole history of every live episode. It is the
  reference the kept cache is tested against, and the path of a one-off turn.

Blocks are left-padded to a multiple of a few tokens so that the programs compile for a few shapes
only; every row of the batch is sampled each round (a row with budget 0, a finished episode, gets a
one-token dummy block and its output is dropped), so the batch's shape does not change from round
to round.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl_llm.model import sharding as sharding_lib
from jaxrl_llm.model.config import ModelConfig
from jaxrl_llm.sampling.config import SamplingConfig
from jaxrl_llm.sampling.generate import resolve_data_axis, sampler_model_config
from jaxrl_llm.sampling.loop import DecodeState, decode, extend, prefill
from jaxrl_llm.sampling.rollout import FINISH_STOP


@dataclasses.dataclass(frozen=True)
class SampledTurns:
  """One turn per row, on the host."""

  ids: tuple[tuple[int, ...], ...]  # [B] the turn's ids as sampled (its EOS or stop string included); () at budget 0
  behav_logp: tuple[np.ndarray, ...]  # [B] f32 [len(ids[b])] log mu of each id (mu: the distribution sampled from)
  finish_B: np.ndarray  # int32 [B] FINISH_EOS / FINISH_STOP / FINISH_LENGTH (cut at the row's budget)


def stop_sequences(tokenizer, stop_strings: Sequence[str]) -> tuple[tuple[int, ...], ...]:
  """Each stop string's own tokenisation, for `SamplingConfig.stop_sequences`."""
  seqs = (tuple(int(i) for i in tokenizer.encode(s)) for s in stop_strings if s)
  return tuple(dict.fromkeys(s for s in seqs if s))


def first_stop(ids: Sequence[int], stop_strings: Sequence[str], tokenizer) -> int | None:
  """The fewest leading ids whose text holds one of `stop_strings`, or None when the text holds none."""
  if not stop_strings or not len(ids):
    return None

  def holds(n: int) -> bool:
    text = tokenizer.decode(list(ids[:n]))
    return any(s in text for s in stop_strings)

  if not holds(len(ids)):
    return None
  lo, hi = 1, len(ids)  # holds(hi); the text of a longer prefix extends a shorter one's
  while lo < hi:
    mid = (lo + hi) // 2
    if holds(mid):
      hi = mid
    else:
      lo = mid + 1
  return lo


def _check_round(model_cfg: ModelConfig, contexts, budgets, cfg: SamplingConfig, who: str) -> list[int]:
  if cfg.n_samples != 1:
    raise ValueError(f"{who}: SamplingConfig.n_samples={cfg.n_samples}; one turn per context needs 1")
  B, R = len(contexts), cfg.max_new_tokens
  if len(budgets) != B or B == 0:
    raise ValueError(f"{who}: {B} contexts and {len(budgets)} budgets; allowed the same number, >= 1")
  budgets = [int(n) for n in budgets]
  for b, (ctx, n) in enumerate(zip(contexts, budgets)):
    if not 0 <= n <= R:
      raise ValueError(f"{who}: budgets[{b}]={n} is outside [0, max_new_tokens={R}]")
    if n and not len(ctx):
      raise ValueError(f"{who}: context {b} is empty")
  cfg.check_vocab(model_cfg.vocab_size)
  return budgets


def _left_padded(rows: Sequence[Sequence[int]], multiple: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
  """(tokens, mask) [B, W]: each row right-aligned in a width W that is a multiple of `multiple`."""
  W = -(-max(len(r) for r in rows) // multiple) * multiple
  tokens = np.full((len(rows), W), pad_id, np.int32)
  mask = np.zeros((len(rows), W), bool)
  for b, r in enumerate(rows):
    tokens[b, W - len(r):], mask[b, W - len(r):] = r, True
  return tokens, mask


def _rows(mesh: Mesh | None, B: int, who: str) -> tuple[tuple[str, ...], NamedSharding | None]:
  """The batch axes rows are split over, and that sharding (none without a mesh)."""
  if mesh is None:
    return (), None
  data_axis = resolve_data_axis(mesh, None)
  shards = int(np.prod([mesh.shape[a] for a in data_axis]))
  if B % shards:
    raise ValueError(f"{who}: {B} contexts do not split evenly over data_axis {data_axis!r} of size {shards}")
  return data_axis, NamedSharding(mesh, PartitionSpec(data_axis))


class _Turn(NamedTuple):
  turns: SampledTurns
  length_B: np.ndarray  # tokens the loop sampled per row (before a host-side cut)


def _host_turns(state: DecodeState, budgets: list[int], tokenizer, stop_strings: Sequence[str]) -> _Turn:
  """The decoded turns on the host, each cut after its first stop string (module docstring)."""
  tokens_BR, logp_BR, length_B, finish_B = (np.asarray(x) for x in sharding_lib.fetch(
      (state.tokens_BR, state.behav_logp_BR, state.length_B, state.finish_reason_B)))
  finish_B = finish_B.astype(np.int32)
  ids, logps = [], []
  for b, n in enumerate(budgets):
    if not n:
      ids.append(())
      logps.append(np.zeros((0,), np.float32))
      continue
    k = int(length_B[b])
    cut = first_stop(tokens_BR[b, :k], stop_strings, tokenizer) if tokenizer is not None else None
    if cut is not None and (cut < k or finish_B[b] != FINISH_STOP):
      k, finish_B[b] = cut, FINISH_STOP
    ids.append(tuple(int(i) for i in tokens_BR[b, :k]))
    logps.append(logp_BR[b, :k].astype(np.float32))
  return _Turn(SampledTurns(ids=tuple(ids), behav_logp=tuple(logps), finish_B=finish_B), length_B.astype(np.int32))


def sample_turns(params, model_cfg: ModelConfig, contexts: Sequence[Sequence[int]], budgets: Sequence[int],
                 cfg: SamplingConfig, key: jax.Array, *, mesh: Mesh | None = None, tokenizer=None,
                 stop_strings: Sequence[str] = (), context_multiple: int = 64) -> SampledTurns:
  """Samples one turn after each of the B `contexts` (token ids, each at least one when its budget is > 0).

  budgets[b]: the most tokens row b may sample, in [0, cfg.max_new_tokens]; 0 samples nothing for that
  row (it gets ()). cfg: the turn's sampling settings, n_samples 1, max_new_tokens the per-turn limit,
  stop_sequences the stop strings' ids (`stop_sequences`). key: row b samples with fold_in(key, b), as
  in `generate`. mesh: rows (and the KV cache) split over its batch axes, as `generate` does.
  tokenizer, stop_strings: the host-side cut at a stop string (module docstring); no cut without them.
  """
  budgets = _check_round(model_cfg, contexts, budgets, cfg, "sample_turns")
  B, R = len(contexts), cfg.max_new_tokens
  rows = [list(ctx) if n else [cfg.pad_id] for ctx, n in zip(contexts, budgets)]
  tokens_BP, mask_BP = _left_padded(rows, context_multiple, cfg.pad_id)
  budget_B = np.maximum(np.asarray(budgets, np.int32), 1)
  inputs = (tokens_BP, mask_BP, budget_B)
  data_axis, rows_sharding = _rows(mesh, B, "sample_turns")
  if rows_sharding is not None:
    inputs = sharding_lib.put(inputs, rows_sharding)
  run_cfg = sampler_model_config(model_cfg, cfg)
  state = prefill(params, inputs[0], inputs[1], key, inputs[2], model_cfg=run_cfg, cfg=cfg,
                  cache_len=tokens_BP.shape[1] + R, mesh=mesh, data_axis=data_axis)
  state = decode(params, state, model_cfg=run_cfg, cfg=cfg, mesh=mesh, data_axis=data_axis)
  return _host_turns(state, budgets, tokenizer, stop_strings).turns


class KeptCache:
  """The rounds of one batch of episodes, sampled with the KV cache kept from one turn to the next.

  Call it once per round with every row's whole context so far (a row's context must extend what it
  was at the previous round by the turn sampled then, as kept, and anything after it) and the same
  arguments as `sample_turns`; it returns the same turns `sample_turns` would (up to the float
  rounding of a different attention layout), encoding only each row's new tokens. One instance per
  batch: its cache holds exactly those B rows.

  block_multiple: new tokens per round are left-padded to a multiple of it (a few compiled shapes);
  slot_multiple: the cache's slots are a multiple of it (a few compiled cache lengths).
  """

  def __init__(self, params, model_cfg: ModelConfig, cfg: SamplingConfig, *, mesh: Mesh | None = None,
               tokenizer=None, stop_strings: Sequence[str] = (), block_multiple: int = 16,
               slot_multiple: int = 64):
    self.params, self.model_cfg, self.cfg, self.mesh = params, model_cfg, cfg, mesh
    self.run_cfg = sampler_model_config(model_cfg, cfg)
    self.tokenizer, self.stop_strings = tokenizer, tuple(stop_strings)
    self.block_multiple, self.slot_multiple = block_multiple, slot_multiple
    self.cache = None  # the KVCache after the last round's decode
    self.held: list[tuple[int, ...]] = []  # per row: the context ids whose keys and values the cache holds
    self.drop_BS: np.ndarray | None = None  # slots of tokens a host-side cut dropped, invalid from the next round

  @property
  def slots(self) -> int:
    """The cache's length in slots (0 before the first round)."""
    return 0 if self.cache is None else self.cache.length

  def __call__(self, contexts: Sequence[Sequence[int]], budgets: Sequence[int], key: jax.Array) -> SampledTurns:
    budgets = _check_round(self.model_cfg, contexts, budgets, self.cfg, "KeptCache")
    B, R = len(contexts), self.cfg.max_new_tokens
    first = self.cache is None
    if not first and B != len(self.held):
      raise ValueError(f"KeptCache: {B} contexts, but its cache holds {len(self.held)} rows")
    new = []
    for b, (ctx, n) in enumerate(zip(contexts, budgets)):
      if not n:
        new.append([self.cfg.pad_id])  # a finished row: a dummy token, its output dropped
        continue
      held = () if first else self.held[b]
      if tuple(ctx[:len(held)]) != held or len(ctx) == len(held):
        raise ValueError(f"KeptCache: context {b} ({len(ctx)} ids) does not extend the {len(held)} ids its "
                         f"cache holds by at least one")
      new.append(list(ctx[len(held):]))
    tokens_BE, mask_BE = _left_padded(new, self.block_multiple, self.cfg.pad_id)
    start_B = np.asarray([len(self.held[b]) if not first and n else 0 for b, n in enumerate(budgets)], np.int32)
    index = 0 if first else int(self.cache.index)
    E = tokens_BE.shape[1]
    cache_len = -(-(index + E + R) // self.slot_multiple) * self.slot_multiple
    budget_B = np.maximum(np.asarray(budgets, np.int32), 1)
    inputs = (tokens_BE, mask_BE, start_B, self.drop_BS, budget_B)
    data_axis, rows_sharding = _rows(self.mesh, B, "KeptCache")
    if rows_sharding is not None:
      inputs = sharding_lib.put(inputs, rows_sharding)
    tokens_BE, mask_BE, start_B, drop_BS, budget_B = inputs
    state = extend(self.params, self.cache, tokens_BE, mask_BE, start_B, drop_BS, key, budget_B,
                   model_cfg=self.run_cfg, cfg=self.cfg, cache_len=cache_len, mesh=self.mesh, data_axis=data_axis)
    # Decode in segments from the block's end (a static bound on the first slot decode writes).
    state = decode(self.params, state, model_cfg=self.run_cfg, cfg=self.cfg, prompt_len=cache_len - R,
                   mesh=self.mesh, data_axis=data_axis)
    self.cache = state.cache
    out = _host_turns(state, budgets, self.tokenizer, self.stop_strings)
    # Response token t of row b went to slot index + E + t when it was fed, at step t + 1: every
    # sampled token but the last. Of those, the ones a host-side cut dropped leave the context.
    base = index + E
    drop_BS = np.zeros((B, cache_len), bool)
    held = []
    for b, n in enumerate(budgets):
      if not n:
        held.append(self.held[b] if not first else ())
        continue
      fed = max(int(out.length_B[b]) - 1, 0)
      kept = min(len(out.turns.ids[b]), fed)
      drop_BS[b, base + kept:base + fed] = True
      held.append(tuple(contexts[b]) + out.turns.ids[b][:kept])
    self.held = held
    self.drop_BS = drop_BS if drop_BS.any() else None
    return out.turns
