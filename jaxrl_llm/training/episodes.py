"""Multi-turn rollouts: each sample of a step is an episode of the run's environment (`env` section).

    prompts -> G episodes per prompt (envs/episode.py: env.reset, the opening prompt's ids)
    -> rounds: one turn for every live episode, batched (sampling/turns.py), then each episode's
       env.step (tools in the shared ToolPool, in parallel) and its observation's ids appended
    -> RolloutBatch: one row per episode, token in / token out

`EpisodeEngine` is the rollout engine of such a run: it wraps the built-in engine or the `openai` engine
(its weights, synced as usual; the server's turns: sampling/openai_turns.py) and returns the same `RolloutBatch` a single-turn engine does, so every later stage of the
step (training/step.py) is unchanged. A row's prompt is the episode's opening prompt; its response is
everything after it, in order: each turn's ids exactly as sampled, each observation's ids as the
renderer tokenised them once. Three labels per token say what it is:

- `mask_BR`: sampled by the policy. It is the loss mask: an observation's tokens are context for the
  later turns and for the recomputes (pi_prox, pi_ref, which read `context_BR`), and weigh zero in
  every loss term, KL and entropy term, and policy statistic;
- `context_BR`: a real token, the policy's or the environment's;
- `turn_BR`: its turn (an observation carries the turn it precedes).

log mu is recorded for the policy's tokens only (0 on the environment's). The episode's reward is
its reward parts (training/score.py's `episode_rewards`), so the advantage is one per episode,
broadcast over every token the policy sampled in it (docs/objectives.md, section 6).

A round samples every episode of the batch together. With the built-in sampler each episode's KV cache
is kept from one round to the next (`env.keep_cache`, sampling/turns.py's `KeptCache`): a round
encodes only the previous turn's last token and the observation.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import faults
from jaxrl_llm.checks import ConfigError
from jaxrl_llm.envs import registry as env_registry
from jaxrl_llm.envs.base import CONTINUING, STATUSES
from jaxrl_llm.envs.episode import Episode, EpisodeLimits, EpisodeResult
from jaxrl_llm.envs.render import ChatRenderer, PlainRenderer
from jaxrl_llm.model import distributed
from jaxrl_llm.sampling.engine import RolloutBatch
from jaxrl_llm.sampling.episode_slots import EpisodeSlots
from jaxrl_llm.sampling.rollout import FINISH_LENGTH
from jaxrl_llm.sampling.turns import KeptCache, SampledTurns, sample_turns, stop_sequences
from jaxrl_llm.tasks.base import Example

# Statuses an episode ends with (the metrics count each, every step, zeros included).
ENDINGS = tuple(s for s in STATUSES if s not in CONTINUING)
# Endings of an episode that did not finish: no final answer, and no call that failed. A turn cut at
# max_turn_tokens (token_limit); a turn cut by the room left, or an observation with no room for a turn
# after it (context_overflow); the last allowed turn spent on a tool call (turn_limit). They are the
# batch's truncated samples (`RolloutBatch.truncated_B`): the overlong filter takes them out of the loss,
# as it does single-turn answers cut at max_response_len (docs/objectives.md section 6).
UNFINISHED = ("token_limit", "context_overflow", "turn_limit")

# round_sampler(contexts, budgets, round) -> one turn per context (sample_turns' result)
RoundSampler = Callable[[list, list, int], SampledTurns]


def make_renderer(tokenizer, chat_template: bool, tools: Sequence[dict] | None = None):
  """How an episode's messages become ids: the tokenizer's chat template, or plain text (a base model).
  `tools`: the tools' JSON schemas, passed to every rendering as the template's `tools=`."""
  if not chat_template:
    return PlainRenderer(tokenizer)
  return ChatRenderer(tokenizer, tools=list(tools)) if tools else ChatRenderer(tokenizer)


def env_renderer(env_cfg, env, tokenizer, chat_template: bool):
  """The renderer of the run's episodes: with `env.tools_in_template`, the chat template gets the
  environment's tools (their `schema()`)."""
  if not env_cfg.tools_in_template:
    return make_renderer(tokenizer, chat_template)
  tools = [t.schema() for t in getattr(env, "tools", ())]
  if not tools:
    raise ConfigError(f"config.env.tools_in_template=True is invalid: allowed False for env.name={env_cfg.name!r}, "
                      "which has no tools to list")
  return make_renderer(tokenizer, chat_template, tools)


@dataclasses.dataclass(frozen=True)
class Played:
  """One finished episode and what its turns' tokens were sampled with."""

  result: EpisodeResult
  sampled: list  # every turn's ids as the sampler returned them, in order
  behav_logp: np.ndarray  # f32 log mu of each of those ids


def play(episodes: Sequence[Episode], sample_round: RoundSampler,
         executor: concurrent.futures.Executor | None = None, fault_point: str | None = None) -> list[Played]:
  """Runs `episodes` to their ends: each round samples one turn for every live one (`sample_round`,
  budget 0 for a finished one), then steps the live ones (in parallel on `executor`: their tool calls
  overlap in the pool).

  In a multi-process run every process samples every row (the sampler is one program over the mesh),
  but steps only the episodes of its own rows (`distributed.row_share`): each environment and tool call
  runs once, in one process. After each round the owners' new contexts, budgets and ends are
  all-gathered, and at the end their results (`distributed.gather_objects`); with one process that is
  the episodes themselves. `fault_point`: the reliability matrix's point passed after each round (the
  training's rollouts name one, the evaluation's none, so a count of them is the training's)."""
  lo, hi = distributed.row_share(len(episodes))
  sampled = [[] for _ in episodes]
  logps = [[] for _ in episodes]
  views = _views(episodes, lo, hi, {})
  rnd = 0
  while live := [i for i, (_, _, done, _) in enumerate(views) if not done]:
    contexts = [ids if not done else [] for ids, _, done, _ in views]
    budgets = [budget if not done else 0 for _, budget, done, _ in views]
    turns = sample_round(contexts, budgets, rnd)
    failed: dict[int, BaseException] = {}

    def step(i, turns=turns, failed=failed):
      try:
        episodes[i].step(turns.ids[i], truncated=bool(turns.finish_B[i] == FINISH_LENGTH))
      except Exception as e:  # pylint: disable=broad-except  # raised below, in every process
        failed[i] = e

    own = [i for i in live if lo <= i < hi]
    if executor is None:
      for i in own:
        step(i)
    else:
      list(executor.map(step, own))
    for i in live:
      sampled[i] += turns.ids[i]
      logps[i].append(np.asarray(turns.behav_logp[i], np.float32))
    views = _views(episodes, lo, hi, failed)
    _raise_first_failure(views, failed)
    if fault_point:
      faults.point(fault_point)  # a kill with episodes (and tools) mid-way
    rnd += 1
  results = distributed.gather_objects([ep.result() for ep in episodes[lo:hi]], len(episodes))
  return [Played(results[i], sampled[i], np.concatenate(logps[i]) if logps[i] else np.zeros((0,), np.float32))
          for i in range(len(episodes))]


def play_slots(episodes: Sequence[Episode], slots, executor: concurrent.futures.Executor | None = None,
               fault_point: str | None = None) -> list[Played]:
  """Runs `episodes` to their ends on a continuous batcher (`slots`: sampling/episode_slots.py's
  `EpisodeSlots`, or any object with its `capacity`, `submit`, `release`, `advance` and `busy`): at most
  `capacity` episodes hold a slot at once, each turn is submitted as soon as its episode needs it,
  and a turn that ends is stepped on `executor` while the slots go on decoding.

  With `slots.ordered` (the built-in sampler's) the schedule depends on the turns alone, not on how
  long a step takes, so the same key gives the same episodes run after run: the steps of the turns
  that ended in one `advance` run during the next one, and their episodes' next turns are submitted
  after it (their slot skips one chunk); episode i plays turn k with the draws of the lock-step
  player's round k, row i (`play`). Otherwise (a server's requests, whose tokens do not depend on
  when they are sent) each step's episode goes on as soon as the step is back. One process only: a
  run of several refuses continuous episodes at start (`EpisodePlayer`)."""
  sampled = [[] for _ in episodes]
  logps = [[] for _ in episodes]
  turn = [0] * len(episodes)
  waiting = collections.deque(i for i, ep in enumerate(episodes) if not ep.done)
  holding: set[int] = set()
  stepping: list[tuple[int, concurrent.futures.Future | None]] = []  # ended turns whose steps are not taken yet
  ordered = getattr(slots, "ordered", True)

  def step(i, ids, finish):
    episodes[i].step(ids, truncated=finish == FINISH_LENGTH)

  while waiting or holding:
    while waiting and len(holding) < slots.capacity:
      i = waiting.popleft()
      holding.add(i)
      slots.submit(i, episodes[i].ids, episodes[i].turn_budget(), 0)
    # the steps in flight run meanwhile
    ended = slots.advance([f for _, f in stepping if f is not None])
    taken = stepping if ordered else [(i, f) for i, f in stepping if f is None or f.done()]
    stepping = [s for s in stepping if s not in taken]
    for i, future in taken:
      if future is not None:
        future.result()  # a step that raised raises here
      turn[i] += 1
      if episodes[i].done:
        holding.discard(i)
        slots.release(i)
      else:
        slots.submit(i, episodes[i].ids, episodes[i].turn_budget(), turn[i])
    for t in ended:
      sampled[t.episode] += t.ids
      logps[t.episode].append(np.asarray(t.behav_logp, np.float32))
      if executor is None:
        step(t.episode, t.ids, t.finish)
        stepping.append((t.episode, None))
      else:
        stepping.append((t.episode, executor.submit(step, t.episode, t.ids, t.finish)))
    if fault_point:
      faults.point(fault_point)
    if holding and not ended and not stepping and not slots.busy():
      raise RuntimeError(f"play_slots: {len(holding)} episodes hold slots, none has a turn queued or a step running")
  return [Played(ep.result(), sampled[i], np.concatenate(logps[i]) if logps[i] else np.zeros((0,), np.float32))
          for i, ep in enumerate(episodes)]


def _views(episodes: Sequence[Episode], lo: int, hi: int, failed: dict[int, BaseException]
           ) -> list[tuple[list[int], int, bool, str]]:
  """(ids, turn budget, done, the step's error or '') of every episode, from the process that steps it."""
  own = [(list(ep.ids), ep.turn_budget() if not ep.done else 0, ep.done,
          f"{type(failed[i]).__name__}: {failed[i]}" if i in failed else "")
         for i, ep in enumerate(episodes[lo:hi], start=lo)]
  return distributed.gather_objects(own, len(episodes))


def _raise_first_failure(views, failed: dict[int, BaseException]) -> None:
  """Raises the error of the first episode whose step failed, in every process (after the views are
  shared, so that no process waits in a collective for one that raised): the exception itself where it
  happened, a RuntimeError naming it elsewhere."""
  first = next((i for i, view in enumerate(views) if view[3]), None)
  if first is None:
    return
  if first in failed:
    raise failed[first]
  raise RuntimeError(f"episode {first} failed in the process that steps it: {views[first][3]}")


def episode_batch(played: Sequence[Played], examples: Sequence[Example], *, prompt_len: int, response_len: int,
                  tokenizer, version: int = -1) -> RolloutBatch:
  """The rows of finished episodes (one per episode, `examples[b]` the example of row b): opening
  prompts left-padded to `prompt_len`, responses right-padded to `response_len` (module docstring)."""
  B, P, R = len(played), prompt_len, response_len
  pad = tokenizer.pad_id
  prompt_BP, prompt_mask_BP = np.full((B, P), pad, np.int32), np.zeros((B, P), bool)
  tokens_BR, mask_BR = np.full((B, R), pad, np.int32), np.zeros((B, R), bool)
  context_BR, turn_BR = np.zeros((B, R), bool), np.zeros((B, R), np.int32)
  behav_BR = np.zeros((B, R), np.float32)
  responses = []
  for b, ep in enumerate(played):
    r = ep.result.rendered
    p, resp = r.prompt_len, r.ids_T[r.prompt_len:]
    if p > P or len(resp) > R:
      raise ValueError(f"episode {b}: an opening prompt of {p} tokens and a response of {len(resp)} do not fit "
                       f"the batch's {P} + {R} (data.max_prompt_len, env.max_tokens)")
    policy = r.policy_T[p:]
    # Token in, token out: the ids trained on are the ids the sampler returned, in order.
    if not np.array_equal(resp[policy], np.asarray(ep.sampled, np.int32)) or len(ep.behav_logp) != policy.sum():
      raise RuntimeError(f"episode {b}: its policy tokens are not the {len(ep.sampled)} ids sampled")
    prompt_BP[b, P - p:], prompt_mask_BP[b, P - p:] = r.ids_T[:p], True
    n = len(resp)
    tokens_BR[b, :n], mask_BR[b, :n], context_BR[b, :n], turn_BR[b, :n] = resp, policy, True, r.turn_T[p:]
    behav_BR[b, np.flatnonzero(policy)] = ep.behav_logp
    responses.append(tokenizer.decode(resp.tolist()))
  statuses = tuple(ep.result.status for ep in played)
  return RolloutBatch(
      prompt_BP=prompt_BP, prompt_mask_BP=prompt_mask_BP, tokens_BR=tokens_BR, mask_BR=mask_BR,
      behav_logp_BR=jnp.asarray(behav_BR), truncated_B=np.asarray([s in UNFINISHED for s in statuses]),
      length_B=mask_BR.sum(axis=1).astype(np.int32),
      topk_ids_BRK=jnp.zeros((B, R, 0), np.int32), topk_logp_BRK=jnp.zeros((B, R, 0), np.float32),
      prompts=tuple(e.prompt for e in examples), answers=tuple(e.answer for e in examples),
      tags=tuple(e.tag for e in examples), responses=tuple(responses), version_B=np.full((B,), version, np.int32),
      context_BR=context_BR, turn_BR=turn_BR, statuses=statuses,
      reward_parts=tuple(dict(ep.result.reward_parts) for ep in played),
      turn_reward_parts=tuple(tuple(dict(t) for t in ep.result.turn_reward_parts) for ep in played))


def episode_metrics(samples: RolloutBatch) -> dict:
  """env/*: how many of the batch's episodes ended with each status, their turns and observation tokens."""
  counts = collections.Counter(samples.statuses)
  out = {f"env/status_{s}": float(counts.get(s, 0)) for s in ENDINGS}
  turns_B = np.where(samples.mask_BR, samples.turn_BR, -1).max(axis=1) + 1
  out["env/turns_mean"] = float(turns_B.mean())
  out["env/observation_tokens_mean"] = float((samples.context_BR & ~samples.mask_BR).sum(axis=1).mean())
  return out


def longest_opening(env_cfg, task, tokenizer, chat_template: bool, examples: Sequence[Example]) -> int:
  """Tokens of the longest opening prompt the environment writes for `examples`; a ConfigError (one
  line) when it cannot start an episode on one of them."""
  with env_registry.make_pool(env_cfg) as pool:  # no worker starts: reset calls no tool
    env = env_registry.make_env(env_cfg, task, pool, tokenizer)
    renderer = env_renderer(env_cfg, env, tokenizer, chat_template)
    longest = 1
    for i, ex in enumerate(examples):
      try:
        longest = max(longest, len(renderer.opening_ids(env.reset(ex))))
      except Exception as e:  # noqa: BLE001 - the environment's or the renderer's: one line before any workdir
        raise ConfigError(f"config.env.name={env_cfg.name!r} cannot start an episode on example {i} "
                          f"({ex.prompt[:60]!r}): {type(e).__name__}: {e}") from None
  return longest


class EpisodePlayer:
  """Plays episodes of the run's environment with given weights, for the rollout engine and the
  evaluation: the renderer, the limits, the stop strings and the run's `ToolPool` (which it owns;
  `close` stops its workers)."""

  def __init__(self, run_cfg, task, tokenizer):
    if run_cfg.rollout.continuous_slots and jax.process_count() > 1:
      raise ConfigError(f"config.rollout.continuous_slots={run_cfg.rollout.continuous_slots} is invalid for episodes "
                        f"in a run of {jax.process_count()} processes: allowed 0 (every process would have to agree "
                        "on each chunk's schedule, which depends on environments that only the row's owner steps)")
    env_cfg = self.env_cfg = run_cfg.env
    self.task, self.tokenizer = task, tokenizer
    self.prompt_len = run_cfg.data.max_prompt_len  # resolved to fit the openings (training/inputs.py)
    self.format_weight = run_cfg.data.format_weight  # the format part's weight in an episode's reward
    self.pool = env_registry.make_pool(env_cfg)
    env = self.make_env()
    self.renderer = env_renderer(env_cfg, env, tokenizer, run_cfg.data.chat_template)
    self.stop_strings = tuple(env.stop_strings)
    self.limits = EpisodeLimits(max_turn_tokens=env_cfg.max_turn_tokens,
                                max_context_tokens=self.prompt_len + env_cfg.max_tokens,
                                max_response_tokens=env_cfg.max_tokens)
    self._executor = concurrent.futures.ThreadPoolExecutor(env_cfg.workers, thread_name_prefix="episode-step")
    # rollout.continuous_slots > 0: the built-in sampler plays episodes on that many slots (play_slots)
    self.slots, self.chunk = run_cfg.rollout.continuous_slots, run_cfg.rollout.decode_chunk

  def make_env(self):
    return env_registry.make_env(self.env_cfg, self.task, self.pool, self.tokenizer)

  def play(self, params, model_cfg, examples: Sequence[Example], sampling_cfg, key, *, mesh=None,
           version: int = -1) -> RolloutBatch:
    """One episode per example (row b plays `examples[b]`) with the built-in sampler on `params`
    (`turn_source`). -> their RolloutBatch."""
    return self.play_rounds(self.turn_source(params, model_cfg, sampling_cfg, key, mesh=mesh), examples,
                            version=version)

  def turn_source(self, params, model_cfg, sampling_cfg, key, *, mesh=None):
    """The built-in sampler's turns on `params`: on `slots` continuous slots (`slot_sampler`) where
    rollout.continuous_slots > 0, else in lock-step rounds (`round_sampler`)."""
    if self.slots:
      return self.slot_sampler(params, model_cfg, sampling_cfg, key, mesh=mesh)
    return self.round_sampler(params, model_cfg, sampling_cfg, key, mesh=mesh)

  def _turn_cfg(self, sampling_cfg):
    return dataclasses.replace(sampling_cfg, n_samples=1, max_new_tokens=self.env_cfg.max_turn_tokens, record_topk=0,
                               stop_sequences=stop_sequences(self.tokenizer, self.stop_strings))

  def slot_sampler(self, params, model_cfg, sampling_cfg, key, *, mesh=None) -> EpisodeSlots:
    """The built-in sampler's episodes on rollout.continuous_slots slots, rollout.decode_chunk decode
    steps between looks (sampling/episode_slots.py): the turns `round_sampler` gives for the same key."""
    return EpisodeSlots(params, model_cfg, self._turn_cfg(sampling_cfg), key, slots=self.slots, chunk=self.chunk,
                        context_len=self.limits.max_context_tokens, mesh=mesh, tokenizer=self.tokenizer,
                        stop_strings=self.stop_strings)

  def round_sampler(self, params, model_cfg, sampling_cfg, key, *, mesh=None) -> RoundSampler:
    """The built-in sampler's rounds on `params`: every turn sampled with `sampling_cfg`'s processing
    (temperature, top-k, top-p, dtype; greedy for the evaluation), at most env.max_turn_tokens tokens,
    stopped at the environment's stop strings; round k with fold_in(key, k), row b of it with
    fold_in(that, b); with env.keep_cache each row's KV cache kept from round to round."""
    turn_cfg = self._turn_cfg(sampling_cfg)

    if self.env_cfg.keep_cache:
      kept = KeptCache(params, model_cfg, turn_cfg, mesh=mesh, tokenizer=self.tokenizer, stop_strings=self.stop_strings)

      def sample_round(contexts, budgets, rnd):
        return kept(contexts, budgets, jax.random.fold_in(key, rnd))
    else:
      def sample_round(contexts, budgets, rnd):
        return sample_turns(params, model_cfg, contexts, budgets, turn_cfg, jax.random.fold_in(key, rnd),
                            mesh=mesh, tokenizer=self.tokenizer, stop_strings=self.stop_strings)

    return sample_round

  def play_rounds(self, turns, examples: Sequence[Example], *, version: int = -1,
                  fault_point: str | None = None) -> RolloutBatch:
    """One episode per example, their turns from `turns` (any engine's): a RoundSampler (`play`) or
    continuous slots (`play_slots`). -> their RolloutBatch."""
    episodes = [Episode(self.make_env(), self.renderer, ex, self.limits) for ex in examples]
    if callable(getattr(turns, "advance", None)):
      try:
        played = play_slots(episodes, turns, self._executor, fault_point)
      finally:
        turns.close()
    else:
      played = play(episodes, turns, self._executor, fault_point)
    return episode_batch(played, examples, prompt_len=self.prompt_len, response_len=self.env_cfg.max_tokens,
                         tokenizer=self.tokenizer, version=version)

  def close(self) -> None:
    self._executor.shutdown(wait=True)
    self.pool.close()


def episode_player(run_cfg, task, tokenizer) -> EpisodePlayer | None:
  """The run's EpisodePlayer, None for a single-turn run (env.name = 'none')."""
  return EpisodePlayer(run_cfg, task, tokenizer) if run_cfg.env.active else None


class EpisodeEngine:
  """The rollout engine of a run with an environment: episodes played with the wrapped engine.

  `sync` and the weights are the wrapped engine's: the built-in `JaxSampler` (its mismatch and
  sharding included) samples each round's turns in the trainer's process (sampling/turns.py); the
  `openai` engine sends them to its server as token-id prompts (sampling/openai_turns.py).
  `generate` plays G episodes per prompt with `player` (whose pool the caller closes) and returns
  their `RolloutBatch`.
  """

  def __init__(self, inner, player: EpisodePlayer, sampling_cfg):
    self.inner, self.player, self.sampling_cfg = inner, player, sampling_cfg

  @property
  def version(self) -> int:
    return self.inner.version

  def sync(self, params, version: int) -> None:
    self.inner.sync(params, version)

  def metrics(self) -> dict[str, float]:
    """The wrapped engine's counters (the openai engine's requests, syncs and checks); none for the built-in."""
    return self.inner.metrics()

  def generate(self, prompts, key) -> RolloutBatch:
    """G episodes per prompt of a `PromptBatch`, a prompt's episodes consecutive."""
    inner, G = self.inner, self.sampling_cfg.n_samples
    examples = [Example(prompt=p, answer=a, tag=t) for p, a, t in zip(prompts.prompts, prompts.answers, prompts.tags)
                for _ in range(G)]
    return self.player.play_rounds(inner.turn_sampler(self.player, key), examples, version=inner.version,
                                   fault_point="episode_round")

  def close(self) -> None:
    self.inner.close()
