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

First version, on purpose simple: every round encodes each context again from its first token with the
jitted `prefill` (the KV cache is not kept from one turn to the next), then runs `decode`. A round
therefore costs a forward over the whole history of every live episode, which is cheap next to the
decode for short episodes and grows with their length. Contexts are left-padded to a multiple of
`context_multiple` tokens so that the programs compile for a few lengths only; every row of the batch
is sampled each round (a row with budget 0, a finished episode, gets a one-token dummy context and its
output is dropped), so the batch's shape does not change from round to round.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl_llm.model.config import ModelConfig
from jaxrl_llm.sampling.config import SamplingConfig
from jaxrl_llm.sampling.generate import _resolve_data_axis, sampler_model_config
from jaxrl_llm.sampling.loop import decode, prefill
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
  if cfg.n_samples != 1:
    raise ValueError(f"sample_turns: SamplingConfig.n_samples={cfg.n_samples}; one turn per context needs 1")
  B, R = len(contexts), cfg.max_new_tokens
  if len(budgets) != B or B == 0:
    raise ValueError(f"sample_turns: {B} contexts and {len(budgets)} budgets; allowed the same number, >= 1")
  budgets = [int(n) for n in budgets]
  for b, (ctx, n) in enumerate(zip(contexts, budgets)):
    if not 0 <= n <= R:
      raise ValueError(f"sample_turns: budgets[{b}]={n} is outside [0, max_new_tokens={R}]")
    if n and not len(ctx):
      raise ValueError(f"sample_turns: context {b} is empty")
  cfg.check_vocab(model_cfg.vocab_size)
  rows = [list(ctx) if n else [cfg.pad_id] for ctx, n in zip(contexts, budgets)]
  P = -(-max(len(r) for r in rows) // context_multiple) * context_multiple
  tokens_BP = np.full((B, P), cfg.pad_id, np.int32)
  mask_BP = np.zeros((B, P), bool)
  for b, r in enumerate(rows):
    tokens_BP[b, P - len(r):], mask_BP[b, P - len(r):] = r, True
  budget_B = np.maximum(np.asarray(budgets, np.int32), 1)
  inputs = (tokens_BP, mask_BP, budget_B)
  data_axis = ()
  if mesh is not None:
    data_axis = _resolve_data_axis(mesh, None)
    shards = int(np.prod([mesh.shape[a] for a in data_axis]))
    if B % shards:
      raise ValueError(f"sample_turns: {B} contexts do not split evenly over data_axis {data_axis!r} of size {shards}")
    inputs = jax.device_put(inputs, NamedSharding(mesh, PartitionSpec(data_axis)))
  run_cfg = sampler_model_config(model_cfg, cfg)
  state = prefill(params, inputs[0], inputs[1], key, inputs[2], model_cfg=run_cfg, cfg=cfg, cache_len=P + R,
                  mesh=mesh, data_axis=data_axis)
  state = decode(params, state, model_cfg=run_cfg, cfg=cfg, mesh=mesh, data_axis=data_axis)
  tokens_BR, logp_BR, length_B, finish_B = (np.asarray(x) for x in jax.device_get(
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
  return SampledTurns(ids=tuple(ids), behav_logp=tuple(logps), finish_B=finish_B)
