"""What an environment hands the rollout loop: an episode's opening messages, then one `Observation`
per assistant turn.

An environment holds one episode at a time: `reset(example)` starts it and returns its opening
messages (chat messages: dicts with "role" and "content"); `step(turn)` takes the assistant's turn,
its text or its token ids exactly as sampled, and returns what follows. The rollout loop keeps one
environment per live episode; the tool worker pool (envs/pool.py) they call is shared.

Every step ends in one of `STATUSES`. Two go on (`CONTINUING`: the observation's messages are
appended and the policy samples the next turn); every other one ends the episode, and a failure
ends only its own episode: the caller goes on with the others.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

from jaxrl_llm.tasks.base import Example

# status -> what happened. The set is fixed: metrics count episodes per status.
STATUSES = {
    # going on
    "tool_result": "the turn called tools; their results are the observation",
    "tool_error": "a tool refused its input (ToolError: a syntax error, a division by zero); the error is "
                  "the observation and the model may try again",
    # ended
    "answer": "a turn without a tool call: the final answer, scored",
    "malformed_call": "a tool call that does not parse (bad JSON, an unclosed tag, no name)",
    "unknown_tool": "a call names a tool the environment does not have",
    "bad_arguments": "a call's arguments are missing, unknown or of the wrong type",
    "tool_timeout": "a tool ran past its wall-clock or CPU-time limit",
    "tool_crash": "a tool raised an unexpected exception, or its worker process died",
    "tool_output_overflow": "a tool printed or returned more than its output cap",
    "tool_memory": "a tool ran out of its worker's address space",
    "turn_limit": "the last allowed turn called a tool: no turn is left to read its result (the episode did not "
                "finish, as after token_limit and context_overflow)",
    "token_limit": "a turn was cut at its token limit before it ended",
    "context_overflow": "the episode's tokens no longer fit its room (the model's context, or the tokens a trainer's "
                        "row holds after the opening prompt)",
}
CONTINUING = frozenset({"tool_result", "tool_error"})


@dataclasses.dataclass(frozen=True)
class Observation:
  """What follows one assistant turn."""

  messages: tuple[dict, ...]  # appended to the conversation (role "tool" or "user"); () when done
  reward_parts: dict[str, float]  # this step's reward terms, the same keys every step; an episode's is the sum
  done: bool  # no further turn is sampled; implied by status (checked)
  status: str  # one of STATUSES
  detail: str = ""  # why, in one line, for logs (never shown to the model)
  # The turn as a structured assistant message (its calls as `tool_calls`, calls.py's
  # `assistant_message`) that the chat template renders in the history; None: the turn's text.
  assistant: dict | None = None

  def __post_init__(self):
    if self.status not in STATUSES:
      raise ValueError(f"Observation.status={self.status!r} is invalid: allowed {tuple(STATUSES)}")
    if self.done != (self.status not in CONTINUING):
      raise ValueError(f"Observation.done={self.done!r} contradicts status={self.status!r}: "
                       f"only {sorted(CONTINUING)} go on")
    if self.done and self.messages:
      raise ValueError(f"Observation.messages must be empty when done, got {len(self.messages)} "
                       f"(status={self.status!r})")
    if self.done and self.assistant is not None:
      raise ValueError(f"Observation.assistant must be None when done (status={self.status!r}): no "
                       "observation follows the turn")


class Env(Protocol):
  """A multi-turn environment (registered by name in envs/registry.py)."""

  name: str
  # Strings that end a turn besides EOS: the sampler stops there and the environment answers (the
  # plain tag format's closing tags, e.g. "</calc>"); () when turns end at EOS only.
  stop_strings: tuple[str, ...]

  def reset(self, example: Example) -> list[dict]:
    """Starts an episode on `example`; returns its opening messages (system and user)."""
    ...

  def step(self, turn: str | Sequence[int], *, truncated: bool = False) -> Observation:
    """The assistant's turn: its text, or its token ids as sampled. `truncated`: the sampler cut the
    turn at its token limit before it ended."""
    ...
