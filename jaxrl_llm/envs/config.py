"""The run config's `env` section: whether a run's samples are multi-turn episodes of an environment,
and their limits. Each field is a key, `--config.env.<field>=...` (training/defaults.py builds the
block from these defaults, `env.tools` from `ToolLimits`'); `name = "none"` is a single-turn run.
The environment's name is checked against envs/registry.py by the run config (training/config.py).
"""

from __future__ import annotations

import dataclasses

from jaxrl_llm.checks import bad, check_bool, check_choice, check_int
from jaxrl_llm.envs.calls import CALL_FORMATS
from jaxrl_llm.envs.pool import ToolLimits

NO_ENV = "none"  # env.name of a single-turn run: one response per sample, scored by the verifier


@dataclasses.dataclass(frozen=True)
class EnvConfig:
  name: str = NO_ENV  # none: single-turn samples | an environment of envs/registry.py (calculator, python): multi-turn episodes
  call_format: str = "json"  # json: <tool_call>{...}</tool_call>, for a chat template | tags: <calc>..</calc>, base models
  instructions: bool = True  # open each episode with the tools' instructions (a system message); False: the task's prompt alone (a model that learned the call format in its warm start)
  max_turns: int = 4  # assistant turns per episode, the final answer's included
  max_turn_tokens: int = 32  # tokens one turn may sample (its EOS or closing tag included); a turn cut there ends its episode (status token_limit)
  max_tokens: int = 128  # tokens of an episode after its opening prompt: every turn and observation (the response length R of its batch row; rollout.max_response_len then bounds only the warm start's demonstrations)
  keep_cache: bool = True  # the built-in sampler keeps each episode's KV cache from turn to turn and encodes only the new tokens; False: every turn encodes the whole history again (same turns, sampling/turns.py)
  workers: int = 2  # tool worker processes (one ToolPool per run)
  tools: ToolLimits = ToolLimits()  # what one tool call may use (time, CPU, memory, output, files)

  def __post_init__(self):
    if not isinstance(self.name, str) or not self.name:
      raise bad("config.env.name", self.name, f"{NO_ENV!r} or a registered environment's name")
    check_choice("config.env.call_format", self.call_format, CALL_FORMATS)
    check_bool("config.env.instructions", self.instructions)
    check_int("config.env.max_turns", self.max_turns, 1)
    check_int("config.env.max_turn_tokens", self.max_turn_tokens, 1)
    check_int("config.env.max_tokens", self.max_tokens, 1)
    if self.max_turn_tokens > self.max_tokens:
      raise bad("config.env.max_turn_tokens", self.max_turn_tokens,
                f"at most env.max_tokens={self.max_tokens} (a turn is part of its episode)")
    check_bool("config.env.keep_cache", self.keep_cache)
    check_int("config.env.workers", self.workers, 1)
    if not isinstance(self.tools, ToolLimits):
      raise bad("config.env.tools", self.tools, "a ToolLimits (envs/pool.py)")

  @property
  def active(self) -> bool:
    """The run's samples are episodes of an environment."""
    return self.name != NO_ENV
