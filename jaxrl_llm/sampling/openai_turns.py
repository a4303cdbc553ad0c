"""One turn for each of many contexts through the `openai` engine's server: multi-turn episodes
(training/episodes.py) sampled by llama.cpp, token in and token out.

Each live context is one completions request: its prompt is the context's token ids as the episode
holds them (the policy's sampled ids and the environment's rendered ids, never decoded and
re-encoded), max_tokens its budget, with the engine's sampling fields and one log-prob per token
(log mu). Requests run `server.concurrency` at a time, each retried as the engine retries any
request (`OpenAIEngine.post`: a server that died is restarted with the last synced weights).

The server is given no stop strings: llama.cpp leaves a stop string's tokens out of what it returns,
while the environment reads the closing tag of a call and the trainer needs the ids as sampled. The
turn is cut on the host instead, as the built-in sampler's turns are (sampling/turns.py): after its
first end id (EOS or a stop id), or after the fewest ids whose text holds a stop string
(`turns.first_stop`). The ids after a cut were sampled and are dropped, so the kept ids and their
log mu are exactly a prefix of what the server sampled.

A request that still fails after the engine's retries fails the rollout with ServerUnavailable: an
episode cannot continue without its turn, and a row dropped mid-episode would train on a history
the policy did not produce.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Sequence

import jax
import numpy as np

from jaxrl_llm.checks import ConfigError
from jaxrl_llm.sampling.episode_slots import EndedTurn
from jaxrl_llm.sampling.http_client import ServerUnavailable
from jaxrl_llm.sampling.openai_request import read_completion
from jaxrl_llm.sampling.rollout import FINISH_LENGTH, FINISH_STOP
from jaxrl_llm.sampling.turns import SampledTurns, first_stop


def parse_turn(resp: dict, budget: int, *, ends: set, eos_ids: Sequence[int], vocab_size: int,
               stop_strings: Sequence[str], tokenizer) -> tuple[tuple[int, ...], np.ndarray, int]:
  """(ids, log mu, finish) of one completion, cut as the module docstring says."""
  turn = read_completion(resp, max_tokens=budget, ends=ends, eos_ids=eos_ids, vocab_size=vocab_size, what="a turn")
  ids, logp, finish = turn.ids, turn.logp, turn.finish
  cut = first_stop(ids, stop_strings, tokenizer)
  if cut is not None and (cut < len(ids) or finish == FINISH_LENGTH):
    ids, logp, finish = ids[:cut], logp[:cut], FINISH_STOP
  return tuple(ids), np.asarray(logp, np.float32), finish


def sample_turns_openai(engine, contexts: Sequence[Sequence[int]], budgets: Sequence[int], key: jax.Array, *,
                        stop_strings: Sequence[str] = ()) -> SampledTurns:
  """One turn per context through `engine` (an OpenAIEngine with weights synced); budgets[b] = 0 samples
  nothing for row b. Row b's seed is drawn from fold_in(key, b) (`key` the round's, as the built-in
  sampler's)."""
  if engine.client is None:
    raise RuntimeError("sample_turns_openai before sync: the engine's server has no weights yet")
  B = len(contexts)
  if len(budgets) != B or B == 0:
    raise ValueError(f"sample_turns_openai: {B} contexts and {len(budgets)} budgets; allowed the same number, >= 1")
  seeds = np.asarray(jax.vmap(_seed, in_axes=(None, 0))(key, np.arange(B)), np.int64)
  live = [b for b in range(B) if budgets[b]]
  if engine.n_ctx is not None:
    longest = max((len(contexts[b]) + int(budgets[b]) for b in live), default=0)
    if longest > engine.n_ctx:
      raise ConfigError(f"an episode's context of {longest} tokens with its turn exceeds the server's context of "
                        f"{engine.n_ctx} tokens per slot (a server the engine starts gets config.data.max_prompt_len "
                        "+ env.max_tokens + 8)")
  one = _requester(engine, stop_strings)
  out = {b: ((), np.zeros((0,), np.float32), FINISH_LENGTH) for b in range(B) if not budgets[b]}
  with concurrent.futures.ThreadPoolExecutor(engine.cfg.concurrency) as pool:
    for b, turn in zip(live, pool.map(lambda b: one(contexts[b], int(budgets[b]), int(seeds[b])), live)):
      out[b] = turn
  return SampledTurns(ids=tuple(out[b][0] for b in range(B)), behav_logp=tuple(out[b][1] for b in range(B)),
                      finish_B=np.array([out[b][2] for b in range(B)], np.int32))


def _seed(key: jax.Array, row) -> jax.Array:
  """The server's seed for row `row` of a round whose key is `key`: the same whether the row's turn is
  sent in lock-step (`sample_turns_openai`) or as it comes (`OpenAISlots`)."""
  return jax.random.randint(jax.random.fold_in(key, row), (), 0, 2**31 - 1)


def _requester(engine, stop_strings: Sequence[str]):
  """(context, budget, seed) -> (ids, log mu, finish) of one turn: one completions request, retried as
  the engine retries any request; a malformed answer is retried too."""
  parse = dict(ends=engine.ends, eos_ids=tuple(engine.scfg.eos_ids), vocab_size=engine.model_cfg.vocab_size,
               stop_strings=tuple(stop_strings), tokenizer=engine.tokenizer)

  def checked(resp: dict, budget: int):
    try:
      return parse_turn(resp, budget, **parse)
    except ConfigError:
      raise
    except (KeyError, IndexError, TypeError, ValueError) as e:  # retried as any malformed answer is
      raise ServerUnavailable(f"malformed completion ({type(e).__name__}: {e}): {str(resp)[:160]}") from None

  def one(context: Sequence[int], budget: int, seed: int):
    payload = {"model": engine.model_name, "prompt": [int(i) for i in context], "seed": seed,
               **engine.fields, "max_tokens": budget}
    return engine.post("/v1/completions", payload, lambda resp: checked(resp, budget))

  return one


class OpenAISlots:
  """Episodes' turns through the server as they come (training/episodes.play_slots' side, as
  sampling/episode_slots.py's `EpisodeSlots` is the built-in sampler's): each turn is one request, sent
  as soon as its episode needs it, `server.concurrency` in flight; the server batches them. Every
  episode may hold a place at once (the server keeps no state of an episode between its requests).
  Turn k of episode i sends the seed the lock-step round k sends for row i (`_seed`), so a server
  whose answer depends on the request alone gives the same episodes both ways."""

  capacity = 1 << 30
  ordered = False  # a step's result is taken as soon as it is back: the tokens do not depend on when

  def __init__(self, engine, key: jax.Array, *, stop_strings: Sequence[str] = ()):
    if engine.client is None:
      raise RuntimeError("OpenAISlots before sync: the engine's server has no weights yet")
    self.engine, self.key = engine, key
    self._one = _requester(engine, stop_strings)
    self._pool = concurrent.futures.ThreadPoolExecutor(engine.cfg.concurrency, thread_name_prefix="episode-turn")
    self._flying: dict[concurrent.futures.Future, int] = {}

  def submit(self, episode: int, context: Sequence[int], budget: int, turn: int) -> None:
    if engine_ctx := self.engine.n_ctx:
      if len(context) + budget > engine_ctx:
        raise ConfigError(f"an episode's context of {len(context) + budget} tokens with its turn exceeds the "
                          f"server's context of {engine_ctx} tokens per slot (a server the engine starts gets "
                          "config.data.max_prompt_len + env.max_tokens + 8)")
    seed = int(_seed(jax.random.fold_in(self.key, turn), episode))
    self._flying[self._pool.submit(self._one, tuple(context), int(budget), seed)] = episode

  def release(self, episode: int) -> None:
    pass

  def busy(self) -> bool:
    return bool(self._flying)

  def advance(self, steps: Sequence[concurrent.futures.Future] = ()) -> list[EndedTurn]:
    """The turns whose requests came back (episode order), after waiting for the first of them or of
    the environments' `steps` to finish; [] when none of either is in flight. A request that failed
    after the engine's retries raises here."""
    if not self._flying and not steps:
      return []
    concurrent.futures.wait([*self._flying, *steps], return_when=concurrent.futures.FIRST_COMPLETED)
    out = []
    for future in [f for f in self._flying if f.done()]:
      episode = self._flying.pop(future)
      ids, logp, finish = future.result()
      out.append(EndedTurn(episode, tuple(ids), np.asarray(logp, np.float32), int(finish)))
    return sorted(out, key=lambda t: t.episode)

  def close(self) -> None:
    self._pool.shutdown(wait=True, cancel_futures=True)


def round_sampler(engine, key: jax.Array, *, stop_strings: Sequence[str]):
  """Episodes' rounds on `engine` (the OpenAIEngine's turn_sampler): (contexts, budgets, round k) ->
  `sample_turns_openai` with fold_in(key, k), stopped at `stop_strings`."""
  def sample_round(contexts, budgets, rnd):
    return sample_turns_openai(engine, contexts, budgets, jax.random.fold_in(key, rnd), stop_strings=stop_strings)
  return sample_round
