"""The run config's `env` section: whether a run's samples are multi-turn episodes of an environment,
and their limits. Each field is a key, `--config.env.<field>=...` (training/defaults.py builds the
block from these defaults, `env.tools` from `ToolLimits`'); `name = "none"` is a single-turn run.
The environment's name is checked against envs/registry.py by the run config (training/config.py).
"""

from __future__ import annotations

import dataclasses

from jaxrl_llm.checks import bad, check_bool, check_choice, check_int
from jaxrl_llm.envs.calls import CALL_FORMATS, TOOL_CALL_FORMATS
from jaxrl_llm.envs.pool import ToolLimits

NO_ENV = "none"  # env.name of a single-turn run: one response per sample, scored by the verifier


@dataclasses.dataclass(frozen=True)
class EnvConfig:
  name: str = NO_ENV  # none: single-turn samples | an environment of envs/registry.py (calculator, python): multi-turn episodes
  call_format: str = "json"  # json: JSON tool calls in a chat model's syntax (tool_call_format) | tags: <calc>..</calc>, base models
  tool_call_format: str = "auto"  # call_format=json: auto (read off the chat template, envs/calls.py) | hermes: <tool_call>{...}</tool_call> (Qwen, SmolLM2) | llama3: the message is {"name", "parameters"} (Llama 3.1) | mistral: [TOOL_CALLS][...] | harmony: to=functions.NAME (GPT-OSS)
  tools_in_template: bool = False  # call_format=json: pass the tools' JSON schemas to the chat template's own tools= argument (and open with the task's prompt alone); False: the tools' instructions as a system message (env.instructions)
  max_observation_tokens: int = 0  # a tool result longer than this many tokens is cut to it, ending in "...[truncated]", and the episode goes on; 0: no cut (a result that leaves no room ends it, context_overflow)
  instructions: bool = True  # open each episode with the tools' instructions (a system message); False: the task's prompt alone (a model that learned the call format in its warm start)
  max_turns: int = 4  # assistant turns per episode, the final answer's included
  max_turn_tokens: int = 32  # tokens one turn may sample (its EOS or closing tag included); a turn cut there ends its episode (status token_limit)
  max_tokens: int = 128  # tokens of an episode after its opening prompt: every turn and observation (the response length R of its batch row; rollout.max_response_len then bounds only the warm start's demonstrations)
  keep_cache: bool = True  # the built-in sampler keeps each episode's KV cache from turn to turn and encodes only the new tokens; False: every turn encodes the whole history again (same turns, sampling/turns.py); on continuous slots (rollout.continuous_slots) the cache is always kept
  workers: int = 2  # tool worker processes (one ToolPool per run)
  tools: ToolLimits = ToolLimits()  # what one tool call may use (time, CPU, memory, output, files)

  def __post_init__(self):
    if not isinstance(self.name, str) or not self.name:
      raise bad("config.env.name", self.name, f"{NO_ENV!r} or a registered environment's name")
    check_choice("config.env.call_format", self.call_format, CALL_FORMATS)
    check_choice("config.env.tool_call_format", self.tool_call_format, TOOL_CALL_FORMATS)
    check_bool("config.env.tools_in_template", self.tools_in_template)
    if self.call_format == "tags" and self.tool_call_format != "auto":
      raise bad("config.env.tool_call_format", self.tool_call_format,
                "'auto' with env.call_format='tags' (a chat model's call syntax is read with call_format='json')")
    if self.call_format == "tags" and self.tools_in_template:
      raise bad("config.env.tools_in_template", True, "False with env.call_format='tags' (a base model has no "
                "chat template to take the tools)")
    check_bool("config.env.instructions", self.instructions)
    check_int("config.env.max_turns", self.max_turns, 1)
    check_int("config.env.max_turn_tokens", self.max_turn_tokens, 1)
    check_int("config.env.max_tokens", self.max_tokens, 1)
    if self.max_turn_tokens > self.max_tokens:
      raise bad("config.env.max_turn_tokens", self.max_turn_tokens,
                f"at most env.max_tokens={self.max_tokens} (a turn is part of its episode)")
    check_int("config.env.max_observation_tokens", self.max_observation_tokens, 0, self.max_tokens - 1)
    check_bool("config.env.keep_cache", self.keep_cache)
    check_int("config.env.workers", self.workers, 1)
    if not isinstance(self.tools, ToolLimits):
      raise bad("config.env.tools", self.tools, "a ToolLimits (envs/pool.py)")

  @property
  def active(self) -> bool:
    """The run's samples are episodes of an environment."""
    return self.name != NO_ENV
