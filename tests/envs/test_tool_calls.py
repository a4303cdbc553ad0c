"""Reading tool calls out of a turn: the "json" format (Qwen / Hermes blocks, SmolLM2's list) and the
"tags" format, and the status of each kind of bad call."""

import pytest

from jaxrl_llm.envs.builtin_tools import CALCULATOR, PYTHON
from jaxrl_llm.envs.calls import ToolCall, parse_calls
from jaxrl_llm.envs.tool import Tool

TOOLS = (CALCULATOR, PYTHON)


def json_parse(text):
  return parse_calls(text, TOOLS, "json")


def test_qwen_style_blocks_are_parallel_calls_in_order():
  text = ('Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "7+5"}}\n</tool_call>\n'
          '<tool_call>\n{"name": "python", "arguments": {"code": "print(3)"}}\n</tool_call>')
  parsed = json_parse(text)
  assert parsed.status == "" and parsed.detail == ""
  assert parsed.calls == (ToolCall("calculator", {"expression": "7+5"}), ToolCall("python", {"code": "print(3)"}))


def test_smollm2_style_list_in_one_block():
  text = '<tool_call>[{"name": "calculator", "arguments": {"expression": "1+1"}}, ' \
         '{"name": "calculator", "arguments": {"expression": "2*3"}}]</tool_call>'
  assert json_parse(text).calls == (ToolCall("calculator", {"expression": "1+1"}),
                                    ToolCall("calculator", {"expression": "2*3"}))


def test_arguments_as_a_json_string_are_read():
  # OpenAI's form: "arguments" holds the object serialised.
  text = '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"9-4\\"}"}</tool_call>'
  assert json_parse(text).calls == (ToolCall("calculator", {"expression": "9-4"}),)


def test_no_call_is_a_final_answer():
  parsed = json_parse("The answer is 12.")
  assert parsed.calls == () and parsed.status == ""


@pytest.mark.parametrize("text,status", [
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "7+5"</tool_call>', "malformed_call"),
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "7+5"}}', "malformed_call"),  # unclosed
    ('{"name": "calculator"}</tool_call>', "malformed_call"),  # stray close
    ('<tool_call>[]</tool_call>', "malformed_call"),
    ('<tool_call>{"arguments": {"expression": "1"}}</tool_call>', "malformed_call"),  # no name
    ('<tool_call>"calculator"</tool_call>', "malformed_call"),
    ('<tool_call>{"name": "search", "arguments": {"q": "x"}}</tool_call>', "unknown_tool"),
    ('<tool_call>{"name": "calculator"}</tool_call>', "bad_arguments"),  # no arguments
    ('<tool_call>{"name": "calculator", "arguments": {}}</tool_call>', "bad_arguments"),  # missing expression
    ('<tool_call>{"name": "calculator", "arguments": {"expression": 12}}</tool_call>', "bad_arguments"),
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "1", "x": 2}}</tool_call>', "bad_arguments"),
    ('<tool_call>{"name": "calculator", "arguments": [1]}</tool_call>', "bad_arguments"),
    ('<tool_call>{"name": "calculator", "arguments": "not json"}</tool_call>', "bad_arguments"),
])
def test_bad_calls_get_their_status(text, status):
  parsed = json_parse(text)
  assert (parsed.calls, parsed.status) == ((), status)
  assert parsed.detail  # says what was wrong


def test_first_problem_in_reading_order_wins():
  text = ('<tool_call>{"name": "search", "arguments": {}}</tool_call>'
          '<tool_call>{"name": "calculator"}</tool_call>')
  assert json_parse(text).status == "unknown_tool"


def test_tags_format():
  parsed = parse_calls("First <calc> 7 + 5 </calc>", TOOLS, "tags")
  assert parsed.calls == (ToolCall("calculator", {"expression": "7 + 5"}),) and parsed.status == ""
  parsed = parse_calls("<python>print(1)</python> then <calc>2</calc>", TOOLS, "tags")
  assert parsed.calls == (ToolCall("python", {"code": "print(1)"}), ToolCall("calculator", {"expression": "2"}))
  assert parse_calls("12", TOOLS, "tags").calls == ()
  # Other tags are text, not calls: no unknown_tool in this format.
  assert parse_calls("<b>12</b>", TOOLS, "tags") == parse_calls("12", TOOLS, "tags")


@pytest.mark.parametrize("text,status", [
    ("<calc>7+5", "malformed_call"),
    ("7+5</calc>", "malformed_call"),
    ("<calc>  </calc>", "bad_arguments"),
])
def test_bad_tag_calls(text, status):
  parsed = parse_calls(text, TOOLS, "tags")
  assert (parsed.calls, parsed.status) == ((), status)


def test_bad_format_and_tool_definitions_are_one_line_errors():
  with pytest.raises(ValueError, match=r"call_format='xml' is invalid: allowed \('json', 'tags'\)"):
    parse_calls("", TOOLS, "xml")
  with pytest.raises(ValueError, match="Tool.fn=.*module-level function"):
    Tool(name="t", fn=lambda x: x, description="", parameters={"x": {"type": "string"}})
  with pytest.raises(ValueError, match="Tool.tag='t' is invalid.*exactly one parameter"):
    Tool(name="t", fn="m:f", description="", tag="t", parameters={"a": {"type": "string"}, "b": {"type": "string"}})
  with pytest.raises(ValueError, match=r"Tool.parameters\['a'\]\['type'\]='str' is invalid"):
    Tool(name="t", fn="m:f", description="", parameters={"a": {"type": "str"}})


def test_schema_is_the_function_form_templates_take():
  assert CALCULATOR.schema() == {"type": "function", "function": {
      "name": "calculator", "description": CALCULATOR.description,
      "parameters": {"type": "object", "properties": {"expression": CALCULATOR.parameters["expression"]},
                     "required": ["expression"]}}}
  assert CALCULATOR.fn == "jaxrl_llm.envs.builtin_tools:calculator"
