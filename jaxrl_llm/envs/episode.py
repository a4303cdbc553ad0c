"""One episode driven turn by turn: the rollout loop's handle on an environment and its token trace.

The rollout loop keeps one `Episode` per live sample and, for each round of sampling:

    ep = Episode(env, renderer, example, limits)        # env.reset; the opening prompt's ids
    while not ep.done:
      ids, truncated = sample(ep.ids, max_new_tokens=ep.turn_budget(), stop=env.stop_strings)
      ep.step(ids, truncated=truncated)                   # env.step; the observation's ids appended
    result = ep.result()                                  # ids, policy mask, turn index, reward parts

(`run_episode` is exactly that loop for one episode.) A batched loop samples every live episode's
`ids` together, steps each, and drops the finished ones. `truncated` means the sampler stopped at
`turn_budget()` tokens without reaching EOS or a stop string.

Besides the environment's own statuses, the episode ends "context_overflow" when its tokens no longer
fit its room: `limits.max_context_tokens`, and `limits.max_response_tokens` after the opening prompt
(a trainer's row width). That is an opening prompt that fills it, a turn cut by the room left rather
than by `max_turn_tokens`, an observation after which no token of a next turn would fit (that
observation is not appended).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Sequence

from jaxrl_llm.checks import check_int
from jaxrl_llm.envs.base import Env, Observation
from jaxrl_llm.envs.calls import RESULT_CLOSE, RESULT_OPEN
from jaxrl_llm.envs.render import RenderedEpisode, Renderer, TokenTrace
from jaxrl_llm.tasks.base import Example


@dataclasses.dataclass(frozen=True)
class EpisodeLimits:
  max_turn_tokens: int  # tokens one turn may sample (the sampler's max_new_tokens per turn)
  max_context_tokens: int  # tokens of the whole episode (prompt, turns, observations): the model's window
  max_response_tokens: int | None = None  # tokens after the opening prompt (turns, observations); None: no bound but the window

  def __post_init__(self):
    check_int("EpisodeLimits.max_turn_tokens", self.max_turn_tokens, 1)
    check_int("EpisodeLimits.max_context_tokens", self.max_context_tokens, 2)
    if self.max_response_tokens is not None:
      check_int("EpisodeLimits.max_response_tokens", self.max_response_tokens, 1)


def reachable_max_tokens(renderer: Renderer, max_turns: int, max_turn_tokens: int, longest_result: str) -> int:
  """The room after the opening prompt (env.max_tokens) in which an episode can reach its turn limit:
  `max_turns` turns of `max_turn_tokens` each and the `max_turns - 1` observations between them, each
  carrying `longest_result` (the longest tool result the task gives, or the env's
  `max_observation_tokens` cut) as `renderer` writes it in the tag format. With less room an episode of
  long turns runs out of it (context_overflow) before its last turn."""
  check_int("reachable_max_tokens: max_turns", max_turns, 1)
  check_int("reachable_max_tokens: max_turn_tokens", max_turn_tokens, 1)
  message = {"role": "tool", "content": f"{RESULT_OPEN}{longest_result}{RESULT_CLOSE}"}
  observation = renderer.observation_ids([], [], [message])
  return max_turns * max_turn_tokens + (max_turns - 1) * len(observation)


@dataclasses.dataclass(frozen=True)
class EpisodeResult:
  rendered: RenderedEpisode  # the ids the policy trains on, with each token's labels
  reward_parts: dict[str, float]  # each part summed over the episode's steps
  status: str  # why the episode ended (envs/base.py's STATUSES)
  detail: str  # the last step's detail, for logs
  n_turns: int  # assistant turns sampled
  turn_reward_parts: tuple[dict[str, float], ...] = ()  # each step's (turn's) own reward parts, in order


class Episode:
  """An environment's episode on one example, with its token trace and limits."""

  def __init__(self, env: Env, renderer: Renderer, example: Example, limits: EpisodeLimits):
    self.env, self.limits = env, limits
    self.trace = TokenTrace(renderer, env.reset(example))
    self.room = limits.max_context_tokens  # the episode's tokens, opening prompt included, at most
    if limits.max_response_tokens is not None:
      self.room = min(self.room, self.trace.prompt_len + limits.max_response_tokens)
    self.reward_parts: collections.Counter = collections.Counter()
    self.turn_parts: list[dict[str, float]] = []  # each step's reward parts (the per-turn rewards)
    self.status, self.detail, self.done = "", "", False
    if self.turn_budget() < 1:
      self._finish("context_overflow", f"the opening prompt is {len(self.trace)} tokens, the room {self.room}")

  @property
  def ids(self) -> list[int]:
    """The episode's ids so far: what the sampler continues from."""
    return self.trace.ids

  def turn_budget(self) -> int:
    """The most tokens the next turn may sample."""
    return min(self.limits.max_turn_tokens, self.room - len(self.trace))

  def _finish(self, status: str, detail: str) -> None:
    self.status, self.detail, self.done = status, detail, True

  def step(self, ids: Sequence[int], *, truncated: bool = False) -> Observation:
    """Appends a sampled turn, gives it to the environment and appends the observation."""
    if self.done:
      raise RuntimeError(f"Episode.step: the episode ended ({self.status})")
    budget = self.turn_budget()
    if len(ids) > budget:
      raise ValueError(f"Episode.step: a turn of {len(ids)} tokens, more than turn_budget()={budget}")
    self.trace.add_turn(ids)
    obs = self.env.step(ids, truncated=truncated)
    if obs.status == "token_limit" and budget < self.limits.max_turn_tokens:
      obs = dataclasses.replace(obs, status="context_overflow",
                                detail=f"the turn was cut at the {budget} tokens left in the context")
    if not obs.done:
      new_ids = self.trace.observation_ids(obs.messages, obs.assistant)
      if len(self.trace) + len(new_ids) >= self.room:
        obs = Observation((), obs.reward_parts, True, "context_overflow",
                          f"{len(self.trace)} tokens and an observation of {len(new_ids)} leave no room for a "
                          f"turn in {self.room}")
      else:
        self.trace.add_observation(obs.messages, new_ids, obs.assistant)
    self.reward_parts.update(obs.reward_parts)
    self.turn_parts.append({k: float(v) for k, v in obs.reward_parts.items()})
    self.status, self.detail, self.done = obs.status, obs.detail, obs.done
    return obs

  def result(self) -> EpisodeResult:
    if not self.done:
      raise RuntimeError(f"Episode.result: the episode is still running after {self.trace.n_turns} turns")
    return EpisodeResult(self.trace.rendered(), {k: float(v) for k, v in self.reward_parts.items()},
                         self.status, self.detail, self.trace.n_turns, tuple(self.turn_parts))


# sample(ids, max_new_tokens, stop_strings) -> (sampled ids, truncated)
SampleFn = Callable[[list[int], int, tuple[str, ...]], tuple[Sequence[int], bool]]


def run_episode(env: Env, renderer: Renderer, example: Example, limits: EpisodeLimits,
                sample: SampleFn) -> EpisodeResult:
  """One episode to its end, sampling each turn with `sample` (the loop a batched rollout runs)."""
  episode = Episode(env, renderer, example, limits)
  while not episode.done:
    ids, truncated = sample(episode.ids, episode.turn_budget(), tuple(env.stop_strings))
    episode.step(ids, truncated=truncated)
  return episode.result()
