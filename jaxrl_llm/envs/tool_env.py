"""ToolEnv: a task's problem, answered with the help of tools over several turns.

An episode: the opening messages say which tools there are and how to call them (in the environment's
call format, envs/calls.py), then the task's prompt; with `tools_in_template` the chat template says
it (its `tools=` argument, the renderer's) and the opening is the task's prompt alone. Each turn
either calls tools, whose outputs (run in the shared ToolPool) are the observation and the episode
goes on, or calls none and is the final answer, scored by the task's reward function. Anything else
ends the episode with its status (envs/base.py): a malformed call, an unknown tool, bad arguments, a
tool failure, the turn limit, a turn cut at its token limit.

In the "json" format the turn goes into the history as the structured message of its calls
(`Observation.assistant`: `tool_calls`, each with an id, the model's when it wrote a 9-character
alphanumeric one, else `calls.call_id`) and each result as a "tool" message with its call's
`tool_call_id`, so the family's template renders both. A result longer than `max_observation_tokens`
tokens (the tokenizer's, of the result alone) is cut to that many, the last ones `TRUNCATED`, and the
episode goes on.

reward_parts, every step: {"correct": the task's verifier on the final answer, "format": its format
check (0 or 1)}; both 0 on every step but the final answer's, and on an episode that ends otherwise.
The verifier runs under `reward_timeout_s`: by SIGALRM on the main thread (tasks/rewards.py's
`score_one`); on another thread (a rollout that steps its episodes in parallel) in a helper thread that
is waited for until the deadline (a verifier that hangs keeps that daemon thread; the episode scores 0).
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
from collections.abc import Sequence
from typing import Any

from jaxrl_llm.checks import check_choice, check_int
from jaxrl_llm.envs.base import Observation
from jaxrl_llm.envs.calls import (CALL_CLOSE, CALL_FORMATS, CALL_OPEN, PYTHON_TAG, RESULT_CLOSE, RESULT_OPEN,
                                  TOOL_CALL_FORMATS, TOOL_CALLS, assistant_message, call_id, parse_calls)
from jaxrl_llm.envs.pool import ToolPool
from jaxrl_llm.envs.tool import Tool
from jaxrl_llm.tasks.base import Example, Task
from jaxrl_llm.tasks.rewards import score_one

REWARD_PARTS = ("correct", "format")
TRUNCATED = "...[truncated]"  # ends a tool result cut at max_observation_tokens
_MODEL_ID = re.compile(r"[A-Za-z0-9]{9}")  # a call id the model wrote that every template accepts (Mistral's)
# How a call is written, per syntax of the "json" format (envs/calls.py), for the instructions.
_HOW_TO_CALL = {
    "hermes": f"write {CALL_OPEN}{{\"name\": <tool-name>, \"arguments\": <args-json-object>}}{CALL_CLOSE}",
    "llama3": f"reply with only {PYTHON_TAG}{{\"name\": <tool-name>, \"parameters\": <args-json-object>}}",
    "mistral": f"write {TOOL_CALLS}[{{\"name\": <tool-name>, \"arguments\": <args-json-object>}}]",
    "harmony": "send a message on the commentary channel to=functions.<tool-name> whose content is "
               "<args-json-object>",
}


def json_instructions(tools: Sequence[Tool], tool_call_format: str = "hermes") -> str:
  """The system message of the "json" format (the Hermes / Qwen2.5 wording), the call written in
  `tool_call_format`'s syntax."""
  listing = "\n".join(json.dumps(t.schema()["function"]) for t in tools)
  return ("You may call tools to help you answer. They are listed, as JSON function signatures, "
          f"within <tools></tools> XML tags:\n<tools>\n{listing}\n</tools>\n"
          f"To call one, {_HOW_TO_CALL[tool_call_format]}; the result comes back in the next message. Once you "
          "know the answer, reply with it and no tool call.")


def tag_instructions(tools: Sequence[Tool]) -> str:
  """The opening text of the "tags" format, for a base model: one example per tool."""
  lines = [f"<{t.tag}>...</{t.tag}> {t.description[0].lower() + t.description[1:]}" for t in tools if t.tag]
  return ("Tools: write a tool's tag around its input and its result follows in "
          f"{RESULT_OPEN}{RESULT_CLOSE}.\n" + "\n".join(lines) + "\n\n")


@dataclasses.dataclass
class ToolEnv:
  """One episode at a time of `task` with `tools` (see the module's docstring)."""

  task: Task
  tools: tuple[Tool, ...]
  pool: ToolPool
  call_format: str = "json"  # json: JSON calls in a chat model's syntax (tool_call_format) | tags: <calc>..</calc> for a base model
  max_turns: int = 4  # assistant turns per episode, the final answer's included
  tokenizer: Any = None  # decodes a turn given as ids (model/tokenizer.py); not needed for text turns
  reward_timeout_s: float = 5.0  # the task's reward function's time limit (tasks/rewards.py's score_one)
  name: str = "tools"
  instructions: bool = True  # open with the tools' instructions (a system message); False: the task's prompt alone
  tool_call_format: str = "hermes"  # call_format=json: hermes | llama3 | mistral | harmony (envs/calls.py; "auto" is resolved before)
  tools_in_template: bool = False  # the chat template lists the tools (the renderer's tools=): open with the prompt alone
  max_observation_tokens: int = 0  # a tool result's tokens (the tokenizer's) at most, cut ending in TRUNCATED; 0: no cut

  def __post_init__(self):
    check_choice("ToolEnv.call_format", self.call_format, CALL_FORMATS)
    check_choice("ToolEnv.tool_call_format", self.tool_call_format, TOOL_CALL_FORMATS[1:])
    check_int("ToolEnv.max_observation_tokens", self.max_observation_tokens, 0)
    if self.max_observation_tokens:
      if self.tokenizer is None:
        raise ValueError("ToolEnv.max_observation_tokens counts tokens: it needs ToolEnv.tokenizer")
      marker = len(self.tokenizer.encode(TRUNCATED))
      if self.max_observation_tokens <= marker:
        raise ValueError(f"ToolEnv.max_observation_tokens={self.max_observation_tokens} is out of range: allowed "
                         f"0 or more than the {marker} tokens of {TRUNCATED!r}")
    check_int("ToolEnv.max_turns", self.max_turns, 1)
    self.tools = tuple(self.tools)
    names = [t.name for t in self.tools]
    if not names or len(set(names)) != len(names):
      raise ValueError(f"ToolEnv.tools={names} is invalid: allowed one or more tools with distinct names")
    if self.call_format == "tags" and not all(t.tag for t in self.tools):
      raise ValueError(f"ToolEnv.tools={names}: call_format='tags' needs a tag on every tool")
    self._by_name = {t.name: t for t in self.tools}
    self._example: Example | None = None
    self.turns, self.done = 0, True

  @property
  def stop_strings(self) -> tuple[str, ...]:
    """In the tag format a turn ends at a tool's closing tag, where the result is due."""
    return tuple(f"</{t.tag}>" for t in self.tools) if self.call_format == "tags" else ()

  def reset(self, example: Example) -> list[dict]:
    self._example, self.turns, self.done = example, 0, False
    if not self.instructions or self.tools_in_template:
      return [{"role": "user", "content": example.prompt}]
    if self.call_format == "json":
      return [{"role": "system", "content": json_instructions(self.tools, self.tool_call_format)},
              {"role": "user", "content": example.prompt}]
    return [{"role": "system", "content": tag_instructions(self.tools)},
            {"role": "user", "content": example.prompt}]

  def _end(self, status: str, detail: str = "", parts: dict | None = None) -> Observation:
    self.done = True
    return Observation((), parts or dict.fromkeys(REWARD_PARTS, 0.0), True, status, detail)

  @property
  def _markers_in_text(self) -> bool:
    """The call syntax is written with special tokens (<|python_tag|>, [TOOL_CALLS], harmony's), which
    the parser must see: such a turn is decoded with them, less its closing EOS."""
    return self.call_format == "json" and self.tool_call_format != "hermes"

  def _text(self, turn: str | Sequence[int], *, markers: bool = False) -> str:
    if isinstance(turn, str):
      return turn
    if self.tokenizer is None:
      raise TypeError("ToolEnv.step: a turn given as token ids needs ToolEnv.tokenizer to decode it")
    ids = [int(i) for i in turn]
    if not markers:
      return self.tokenizer.decode(ids)
    if ids and ids[-1] in self.tokenizer.eos_ids:
      ids = ids[:-1]
    return self.tokenizer.decode(ids, skip_special_tokens=False)

  def _cut(self, content: str) -> str:
    """`content` within max_observation_tokens tokens: its first ones, then TRUNCATED."""
    if not self.max_observation_tokens:
      return content
    ids = self.tokenizer.encode(content)
    if len(ids) <= self.max_observation_tokens:
      return content
    keep = self.max_observation_tokens - len(self.tokenizer.encode(TRUNCATED))
    return self.tokenizer.decode(ids[:keep]) + TRUNCATED

  def _result_message(self, name: str, content: str, tool_call_id: str) -> dict:
    if self.call_format == "json":
      return {"role": "tool", "name": name, "tool_call_id": tool_call_id, "content": self._cut(content)}
    return {"role": "tool", "content": f"{RESULT_OPEN}{self._cut(content)}{RESULT_CLOSE}"}

  def _score(self, text: str) -> tuple[float, float, int]:
    """score_one's (total, correct, status) of the final answer `text`, under the time limit on any thread."""
    ex = self._example
    args = (self.task.reward_fn, self.task.format_fn, 1.0, self.reward_timeout_s, ex.prompt, text, ex.answer)
    if threading.current_thread() is threading.main_thread():
      return score_one(*args)
    out = []
    worker = threading.Thread(target=lambda: out.append(score_one(*args)), daemon=True, name="tool-env-reward")
    worker.start()
    worker.join(self.reward_timeout_s)
    return out[0] if out else (0.0, 0.0, 2)

  def step(self, turn: str | Sequence[int], *, truncated: bool = False) -> Observation:
    if self._example is None or self.done:
      raise RuntimeError(f"ToolEnv.step: no episode is running (reset first); turns so far {self.turns}")
    text = self._text(turn, markers=self._markers_in_text)
    self.turns += 1
    if truncated:
      return self._end("token_limit", f"turn {self.turns - 1} was cut before it ended")
    parsed = parse_calls(text, self.tools, self.call_format, self.tool_call_format)
    if parsed.status:
      return self._end(parsed.status, parsed.detail)
    if not parsed.calls:
      # the answer as the verifier reads it: harmony's final channel, else the turn's text
      answer = parsed.content if self.tool_call_format == "harmony" and self.call_format == "json" else self._text(turn)
      total, correct, failed = self._score(answer)
      detail = {0: "", 1: "the reward function raised", 2: "the reward function timed out"}[failed]
      return self._end("answer", detail, {"correct": correct, "format": total - correct})
    if self.turns >= self.max_turns:
      return self._end("turn_limit", f"turn {self.turns - 1} called a tool, and it was the last allowed")
    outcomes = self.pool.run_many([(self._by_name[c.name].fn, c.arguments) for c in parsed.calls])
    for call, outcome in zip(parsed.calls, outcomes):
      if outcome.status not in ("ok", "tool_error"):
        return self._end(outcome.status, f"{call.name}: {outcome.detail}")
    ids = [c.id if _MODEL_ID.fullmatch(c.id) else call_id(self.turns - 1, i) for i, c in enumerate(parsed.calls)]
    messages = tuple(self._result_message(c.name, o.output if o.status == "ok" else f"error: {o.output}", i)
                     for c, o, i in zip(parsed.calls, outcomes, ids))
    status = "tool_error" if any(o.status == "tool_error" for o in outcomes) else "tool_result"
    assistant = assistant_message(parsed, ids) if self.call_format == "json" else None
    return Observation(messages, dict.fromkeys(REWARD_PARTS, 0.0), False, status, assistant=assistant)
