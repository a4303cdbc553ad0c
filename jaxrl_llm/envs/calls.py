"""Reading the tool calls out of an assistant turn, in one of two formats (`CALL_FORMATS`).

"json", for chat models (Hermes / Qwen2.5 / Qwen3 chat templates, and SmolLM2's documented tool-use
prompt): each call is a `<tool_call>...</tool_call>` block holding a JSON object
`{"name": ..., "arguments": {...}}`, or a JSON list of such objects (SmolLM2 writes one block with a
list). Several blocks, or a list, are parallel calls, run in the order written. `arguments` may also
be a JSON string holding the object (OpenAI's form).

"tags", for base models without a chat template: `<calc>2+3</calc>`, the tag being the tool's `tag`
and its body the tool's one parameter. The environment answers `<result>5</result>`. Only the tags
of the environment's tools are calls, so "unknown_tool" cannot happen in this format.

A turn without any call is the final answer. A turn whose calls do not parse gets the status
(base.py's STATUSES) of its first problem in reading order: "malformed_call" (bad JSON, an unclosed
or stray tag, no name), "unknown_tool", "bad_arguments" (missing, unknown or mistyped arguments).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence

from jaxrl_llm.checks import check_choice
from jaxrl_llm.envs.tool import Tool

CALL_FORMATS = ("json", "tags")
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
RESULT_OPEN, RESULT_CLOSE = "<result>", "</result>"  # the tag format's observation


@dataclasses.dataclass(frozen=True)
class ToolCall:
  name: str  # a tool of the environment
  arguments: dict  # checked against the tool's parameters


@dataclasses.dataclass(frozen=True)
class ParsedTurn:
  calls: tuple[ToolCall, ...]  # in the order written; () for a final answer or a bad call
  status: str = ""  # "" when every call is well formed, else malformed_call | unknown_tool | bad_arguments
  detail: str = ""  # what was wrong, one line


def _bad(status: str, detail: str) -> ParsedTurn:
  return ParsedTurn((), status, detail)


def _json_blocks(text: str) -> list[str] | ParsedTurn:
  """The bodies of the <tool_call> blocks, or the ParsedTurn of a malformed one."""
  bodies, pos = [], 0
  while True:
    start, stray = text.find(CALL_OPEN, pos), text.find(CALL_CLOSE, pos)
    if stray != -1 and (start == -1 or stray < start):
      return _bad("malformed_call", f"{CALL_CLOSE} without {CALL_OPEN} at character {stray}")
    if start == -1:
      return bodies
    end = text.find(CALL_CLOSE, start + len(CALL_OPEN))
    if end == -1:
      return _bad("malformed_call", f"{CALL_OPEN} at character {start} is not closed")
    bodies.append(text[start + len(CALL_OPEN):end])
    pos = end + len(CALL_CLOSE)


def _json_call(item, by_name: dict[str, Tool]) -> ToolCall | ParsedTurn:
  if not isinstance(item, dict) or not isinstance(item.get("name"), str):
    return _bad("malformed_call", f"a call must be an object with a string 'name', got {str(item)[:80]!r}")
  name = item["name"]
  if name not in by_name:
    return _bad("unknown_tool", f"no tool {name!r}: allowed {sorted(by_name)}")
  if "arguments" not in item:
    return _bad("bad_arguments", f"the call of {name!r} has no 'arguments'")
  arguments = item["arguments"]
  if isinstance(arguments, str):  # OpenAI's form: the object as a JSON string
    try:
      arguments = json.loads(arguments)
    except json.JSONDecodeError:
      return _bad("bad_arguments", f"the arguments of {name!r} are a string that is not a JSON object")
  if not isinstance(arguments, dict):
    return _bad("bad_arguments", f"the arguments of {name!r} must be an object, got {arguments!r}"[:200])
  problem = by_name[name].check_arguments(arguments)
  if problem:
    return _bad("bad_arguments", problem)
  return ToolCall(name, arguments)


def parse_json_calls(text: str, tools: Sequence[Tool]) -> ParsedTurn:
  """The calls of a turn in the "json" format."""
  blocks = _json_blocks(text)
  if isinstance(blocks, ParsedTurn):
    return blocks
  by_name = {t.name: t for t in tools}
  calls = []
  for body in blocks:
    try:
      value = json.loads(body)
    except json.JSONDecodeError as e:
      return _bad("malformed_call", f"{CALL_OPEN} body is not JSON: {e.msg} at character {e.pos}")
    items = value if isinstance(value, list) else [value]
    if not items:
      return _bad("malformed_call", f"{CALL_OPEN} holds an empty list")
    for item in items:
      call = _json_call(item, by_name)
      if isinstance(call, ParsedTurn):
        return call
      calls.append(call)
  return ParsedTurn(tuple(calls))


def parse_tag_calls(text: str, tools: Sequence[Tool]) -> ParsedTurn:
  """The calls of a turn in the "tags" format: <tag>body</tag> for each tool with a tag."""
  by_tag = {t.tag: t for t in tools if t.tag}
  if not by_tag:
    return ParsedTurn(())
  tag_re = re.compile("<(/?)(" + "|".join(re.escape(t) for t in by_tag) + ")>")
  calls, pos = [], 0
  while match := tag_re.search(text, pos):
    closing, tool = match.group(1), by_tag[match.group(2)]
    if closing:
      return _bad("malformed_call", f"</{tool.tag}> without <{tool.tag}> at character {match.start()}")
    close = f"</{tool.tag}>"
    end = text.find(close, match.end())
    if end == -1:
      return _bad("malformed_call", f"<{tool.tag}> at character {match.start()} is not closed")
    body = text[match.end():end].strip()
    if not body:
      return _bad("bad_arguments", f"<{tool.tag}></{tool.tag}> is empty")
    calls.append(ToolCall(tool.name, {tool.tag_argument: body}))
    pos = end + len(close)
  return ParsedTurn(tuple(calls))


def parse_calls(text: str, tools: Sequence[Tool], call_format: str) -> ParsedTurn:
  """The tool calls of one assistant turn's text."""
  check_choice("call_format", call_format, CALL_FORMATS)
  return (parse_json_calls if call_format == "json" else parse_tag_calls)(text, tools)
