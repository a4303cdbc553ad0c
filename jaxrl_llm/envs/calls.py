"""Reading the tool calls out of an assistant turn (`CALL_FORMATS`), in the syntax of a model family
(`TOOL_CALL_FORMATS`), and writing them back as a structured chat message.

"json", for chat models: each call is a JSON object naming a tool and holding its arguments, written
in the syntax of the model's family (`env.tool_call_format`; "auto" reads the family off the chat
template's text, `detect_tool_call_format`):

- "hermes" (Hermes / Qwen2.5 / Qwen3 chat templates, and SmolLM2's documented tool-use prompt): each
  call is a `<tool_call>...</tool_call>` block holding `{"name": ..., "arguments": {...}}`, or a JSON
  list of such objects (SmolLM2 writes one block with a list). The text outside the blocks is the
  message's content.
- "llama3" (Llama 3.1 / 3.2 / 3.3's templates for custom tools): the whole assistant message is the
  call, `{"name": ..., "parameters": {...}}`, optionally after `<|python_tag|>`; several calls are
  separated by ";" (vLLM's llama3_json reading). The built-in tools' form of Meta's template,
  `<|python_tag|>NAME.call(key="value")`, is one call too. A message that does not start with "{"
  or the tag is the final answer.
- "mistral" (Mistral v3 templates: Mistral-7B-Instruct-v0.3, Mistral-Nemo, Small): `[TOOL_CALLS]`
  then a JSON list `[{"name": ..., "arguments": {...}, "id": ...}]`; the text before it is content.
  Templates of v11 tokenizers and later (Mistral Small 3.2, Magistral, Devstral) write each call as
  `[TOOL_CALLS]NAME[ARGS]{...}` (with `[CALL_ID]ID` before `[ARGS]` where they keep ids): the same
  parser reads both.
- "harmony" (GPT-OSS): each message of the turn is `<|start|>assistant<|channel|>C ... <|message|>
  body <|end|>` (the first one's `<|start|>assistant` is the generation prompt's), and a call is a
  message to `to=functions.NAME` (in the header before or after `<|channel|>`), its body the JSON
  arguments, ended by `<|call|>`. The "final" channel is the content, "analysis" the thinking.

Several calls in a turn are parallel calls, run in the order written. `arguments` may also be a
JSON string holding the object (OpenAI's form).

"tags", for base models without a chat template: `<calc>2+3</calc>`, the tag being the tool's `tag`
and its body the tool's one parameter. The environment answers `<result>5</result>`. Only the tags
of the environment's tools are calls, so "unknown_tool" cannot happen in this format.

A turn without any call is the final answer. A turn whose calls do not parse gets the status
(base.py's STATUSES) of its first problem in reading order: "malformed_call" (bad JSON, an unclosed
or stray tag, no name), "unknown_tool", "bad_arguments" (missing, unknown or mistyped arguments).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from collections.abc import Sequence

from jaxrl_llm.checks import check_choice
from jaxrl_llm.envs.tool import Tool

CALL_FORMATS = ("json", "tags")
# env.tool_call_format: the syntax of a "json" call; auto reads it off the chat template
TOOL_CALL_FORMATS = ("auto", "hermes", "llama3", "mistral", "harmony")
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
RESULT_OPEN, RESULT_CLOSE = "<result>", "</result>"  # the tag format's observation
PYTHON_TAG = "<|python_tag|>"  # Llama 3.1: a tool call follows
TOOL_CALLS = "[TOOL_CALLS]"  # Mistral: a JSON list of calls follows
H_START, H_CHANNEL, H_MESSAGE = "<|start|>", "<|channel|>", "<|message|>"  # harmony's message markers
H_ENDS = ("<|call|>", "<|end|>", "<|return|>")  # harmony: what ends a message
# Template text -> family, first match wins (`detect_tool_call_format`): each marker is written by
# that family's template only (GPT-OSS's channels, Mistral's [TOOL_CALLS], Hermes' <tool_call>, Llama
# 3.1's python tag or header tokens).
_TEMPLATE_MARKERS = (("harmony", ("<|channel|>", "<|constrain|>")), ("mistral", (TOOL_CALLS,)),
                     ("hermes", (CALL_OPEN,)), ("llama3", (PYTHON_TAG, "<|start_header_id|>")))


@dataclasses.dataclass(frozen=True)
class ToolCall:
  name: str  # a tool of the environment
  arguments: dict  # checked against the tool's parameters
  id: str = ""  # the call's id as the model wrote it (Mistral's "id"); "" when it wrote none


@dataclasses.dataclass(frozen=True)
class ParsedTurn:
  calls: tuple[ToolCall, ...]  # in the order written; () for a final answer or a bad call
  status: str = ""  # "" when every call is well formed, else malformed_call | unknown_tool | bad_arguments
  detail: str = ""  # what was wrong, one line
  content: str = ""  # the turn's text outside its calls (harmony: the final channel's), stripped
  thinking: str = ""  # harmony: the analysis channel's text; "" in the other formats


def _bad(status: str, detail: str) -> ParsedTurn:
  return ParsedTurn((), status, detail)


def detect_tool_call_format(template: str | None) -> str:
  """The family whose call syntax a chat template writes (`_TEMPLATE_MARKERS`); "hermes" for a template
  with none of them, or none at all (SmolLM2's documented <tool_call> prompt)."""
  for fmt, markers in _TEMPLATE_MARKERS:
    if template and any(m in template for m in markers):
      return fmt
  return "hermes"


def resolve_tool_call_format(tool_call_format: str, template: str | None) -> str:
  """`env.tool_call_format`, with "auto" read off `template`."""
  check_choice("config.env.tool_call_format", tool_call_format, TOOL_CALL_FORMATS)
  return detect_tool_call_format(template) if tool_call_format == "auto" else tool_call_format


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


def _json_call(item, by_name: dict[str, Tool], key: str = "arguments") -> ToolCall | ParsedTurn:
  """A call object {"name": ..., key: {...}} checked against the tools (Llama's key is "parameters";
  "arguments" is read there too)."""
  if not isinstance(item, dict) or not isinstance(item.get("name"), str):
    return _bad("malformed_call", f"a call must be an object with a string 'name', got {str(item)[:80]!r}")
  name = item["name"]
  if name not in by_name:
    return _bad("unknown_tool", f"no tool {name!r}: allowed {sorted(by_name)}")
  if key not in item and "arguments" in item:
    key = "arguments"
  if key not in item:
    return _bad("bad_arguments", f"the call of {name!r} has no {key!r}")
  arguments = item[key]
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
  call_id = item.get("id")
  return ToolCall(name, arguments, call_id if isinstance(call_id, str) else "")


def _calls_of(items, by_name: dict[str, Tool], key: str = "arguments") -> list[ToolCall] | ParsedTurn:
  calls = []
  for item in items:
    call = _json_call(item, by_name, key)
    if isinstance(call, ParsedTurn):
      return call
    calls.append(call)
  return calls


def parse_json_calls(text: str, tools: Sequence[Tool]) -> ParsedTurn:
  """The calls of a turn in the "hermes" syntax: <tool_call> blocks."""
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
    got = _calls_of(items, by_name)
    if isinstance(got, ParsedTurn):
      return got
    calls += got
  content = text.split(CALL_OPEN, 1)[0].strip() if calls else text.strip()
  return ParsedTurn(tuple(calls), content=content)


def parse_llama3_calls(text: str, tools: Sequence[Tool]) -> ParsedTurn:
  """The calls of a turn in Llama 3.1's syntax: the message is `{"name": ..., "parameters": ...}`
  (after `<|python_tag|>` or not), several separated by ";"; or, the built-in tools' form (Meta's
  template for `builtin_tools`), `<|python_tag|>NAME.call(key="value", ...)`."""
  body = text.strip()
  if body.startswith(PYTHON_TAG):
    body = body[len(PYTHON_TAG):].strip()
    if not body.startswith("{"):
      return _llama3_builtin_call(body, {t.name: t for t in tools})
  elif not body.startswith("{"):
    return ParsedTurn((), content=body)
  by_name, decoder, calls, pos = {t.name: t for t in tools}, json.JSONDecoder(), [], 0
  while True:
    try:
      value, pos = decoder.raw_decode(body, pos)
    except json.JSONDecodeError as e:
      return _bad("malformed_call", f"the call is not JSON: {e.msg} at character {e.pos}")
    got = _calls_of([value], by_name, "parameters")
    if isinstance(got, ParsedTurn):
      return got
    calls += got
    rest = body[pos:].lstrip()
    if not rest:
      return ParsedTurn(tuple(calls))
    if not rest.startswith(";"):
      return _bad("malformed_call", f"text after a call, {rest[:40]!r}: calls are separated by ';'")
    pos = len(body) - len(rest) + 1
    while pos < len(body) and body[pos].isspace():
      pos += 1


def _llama3_builtin_call(body: str, by_name: dict[str, Tool]) -> ParsedTurn:
  """`NAME.call(key="value", ...)`: one call, its arguments Python literals by keyword."""
  try:
    tree = ast.parse(body, mode="eval").body
  except SyntaxError as e:
    return _bad("malformed_call", f"{PYTHON_TAG} is followed by neither JSON nor NAME.call(...): {e.msg}")
  if not (isinstance(tree, ast.Call) and isinstance(tree.func, ast.Attribute) and tree.func.attr == "call"
          and isinstance(tree.func.value, ast.Name)):
    return _bad("malformed_call", f"{PYTHON_TAG} is followed by neither JSON nor NAME.call(...): {body[:40]!r}")
  if tree.args or any(k.arg is None for k in tree.keywords):
    return _bad("malformed_call", f"{tree.func.value.id}.call takes its arguments by keyword only")
  try:
    arguments = {k.arg: ast.literal_eval(k.value) for k in tree.keywords}
  except ValueError:
    return _bad("malformed_call", f"the arguments of {tree.func.value.id}.call are not literals")
  got = _calls_of([{"name": tree.func.value.id, "parameters": arguments}], by_name, "parameters")
  return got if isinstance(got, ParsedTurn) else ParsedTurn(tuple(got))


_V11_CALL = re.compile(r"\s*([A-Za-z0-9_.\-]+)\s*(?:\[CALL_ID\]\s*([A-Za-z0-9]+)\s*)?(?:\[ARGS\])?")


def parse_mistral_calls(text: str, tools: Sequence[Tool]) -> ParsedTurn:
  """The calls of a turn in Mistral's syntax: `[TOOL_CALLS]` and a JSON list of calls (tokenizers up
  to v7), or each call as `[TOOL_CALLS]NAME[ARGS]{...}`, with `[CALL_ID]ID` before `[ARGS]` where
  the template writes ids (v11 and later: Mistral Small 3.2, Magistral, Devstral)."""
  start = text.find(TOOL_CALLS)
  if start == -1:
    return ParsedTurn((), content=text.strip())
  body = text[start + len(TOOL_CALLS):].strip()
  by_name = {t.name: t for t in tools}
  if not body.startswith(("[", "{")):
    return _mistral_v11_calls(text[start:], by_name, content=text[:start].strip())
  try:
    value = json.loads(body)
  except json.JSONDecodeError as e:
    return _bad("malformed_call", f"{TOOL_CALLS} is not followed by JSON: {e.msg} at character {e.pos}")
  items = value if isinstance(value, list) else [value]
  if not items:
    return _bad("malformed_call", f"{TOOL_CALLS} holds an empty list")
  got = _calls_of(items, by_name)
  return got if isinstance(got, ParsedTurn) else ParsedTurn(tuple(got), content=text[:start].strip())


def _mistral_v11_calls(text: str, by_name: dict[str, Tool], content: str) -> ParsedTurn:
  """`[TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{...}` repeated (text starts at the first [TOOL_CALLS]); [CALL_ID]
  is optional, and so is [ARGS] (a decode that dropped the special token)."""
  calls, decoder = [], json.JSONDecoder()
  for piece in text.split(TOOL_CALLS)[1:]:
    head = _V11_CALL.match(piece)
    if head is None:
      return _bad("malformed_call", f"{TOOL_CALLS} is not followed by a tool name: {piece[:40]!r}")
    rest = piece[head.end():].lstrip()
    try:
      arguments, end = decoder.raw_decode(rest)
    except json.JSONDecodeError as e:
      return _bad("malformed_call", f"the arguments of {head.group(1)!r} are not JSON: {e.msg} at character {e.pos}")
    if rest[end:].strip():
      return _bad("malformed_call", f"text after the arguments of {head.group(1)!r}: {rest[end:].strip()[:40]!r}")
    item = {"name": head.group(1), "arguments": arguments}
    if head.group(2):
      item["id"] = head.group(2)
    got = _calls_of([item], by_name)
    if isinstance(got, ParsedTurn):
      return got
    calls += got
  return ParsedTurn(tuple(calls), content=content)


_RECIPIENT = re.compile(r"to=([^\s<]+)")
_CHANNEL = re.compile(re.escape(H_CHANNEL) + r"(\w+)")


def parse_harmony_calls(text: str, tools: Sequence[Tool]) -> ParsedTurn:
  """The calls of a turn in the harmony syntax (GPT-OSS): messages to `functions.NAME`."""
  by_name, calls, final, thinking = {t.name: t for t in tools}, [], [], []
  for segment in text.split(H_START):
    if H_MESSAGE not in segment:
      if H_CHANNEL in segment or _RECIPIENT.search(segment):
        return _bad("malformed_call", f"a harmony header without {H_MESSAGE}: {segment[:60]!r}")
      if segment.strip():
        final.append(segment.strip())  # text outside any message
      continue
    header, body = segment.split(H_MESSAGE, 1)
    ends = [i for i in (body.find(e) for e in H_ENDS) if i != -1]
    body = body[:min(ends)] if ends else body
    recipient, channel = _RECIPIENT.search(header), _CHANNEL.search(header)
    if recipient is None:
      (thinking if channel and channel.group(1) == "analysis" else final).append(body.strip())
      continue
    name = recipient.group(1)
    if not name.startswith("functions."):
      return _bad("unknown_tool", f"a message to {name!r}: tools are called as functions.NAME, allowed "
                                  f"{sorted(by_name)}")
    try:
      arguments = json.loads(body)
    except json.JSONDecodeError as e:
      return _bad("malformed_call", f"the message to {name} is not JSON: {e.msg} at character {e.pos}")
    got = _calls_of([{"name": name[len("functions."):], "arguments": arguments}], by_name)
    if isinstance(got, ParsedTurn):
      return got
    calls += got
  return ParsedTurn(tuple(calls), content="\n".join(final), thinking="\n".join(thinking))


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


_JSON_PARSERS = {"hermes": parse_json_calls, "llama3": parse_llama3_calls, "mistral": parse_mistral_calls,
                 "harmony": parse_harmony_calls}


def parse_calls(text: str, tools: Sequence[Tool], call_format: str, tool_call_format: str = "hermes"
                ) -> ParsedTurn:
  """The tool calls of one assistant turn's text; `tool_call_format` (resolved, not "auto") is the
  syntax of a "json" call."""
  check_choice("call_format", call_format, CALL_FORMATS)
  if call_format == "tags":
    return parse_tag_calls(text, tools)
  check_choice("tool_call_format", tool_call_format, tuple(_JSON_PARSERS))
  return _JSON_PARSERS[tool_call_format](text, tools)


def call_id(turn: int, index: int) -> str:
  """The id of call `index` of turn `turn` when the model wrote none: 9 alphanumeric characters, the
  only ids Mistral's templates accept ("call00001" is turn 0's second call)."""
  return f"call{turn:03d}{index:02d}"


def assistant_message(parsed: ParsedTurn, ids: Sequence[str]) -> dict:
  """A turn's calls as the structured chat message templates render (OpenAI's form: `tool_calls`
  with an `id`, `type` "function" and the `function`'s name and arguments as an object), its text
  outside the calls as `content`, harmony's analysis as `thinking` (GPT-OSS's template reads it)."""
  message = {"role": "assistant", "content": parsed.content}
  if parsed.thinking:
    message["thinking"] = parsed.thinking
  message["tool_calls"] = [{"id": i, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                           for c, i in zip(parsed.calls, ids, strict=True)]
  return message
