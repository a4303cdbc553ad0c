"""Tool-call formats of the chat families (envs/calls.py): Hermes / Qwen, Llama 3.1, Mistral and GPT-OSS's
harmony. Each family's parser on its own syntax, the family read off the chat template, and whole
episodes (calls parsed from the sampled ids, the history as structured `tool_calls` and
`tool_call_id` messages) whose ids equal transformers' `apply_chat_template(conversation,
tokenize=True)` of the same conversation.

No real tokenizer of these families is available offline, so each family is a character-level
tokenizer with the family's special tokens, under a short template that mimics the family's published
one where it matters here: how it writes a tool call, a tool result, the tools (`tools=`), the end
of a turn and the generation prompt (the Llama 3.1 template below is Meta's, abridged; the Qwen2.5
template is the published one, from conftest.py).
"""

import json

import pytest
import transformers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from conftest import QWEN25_TEMPLATE
from jaxrl_llm.checks import ConfigError
from jaxrl_llm.envs import registry
from jaxrl_llm.envs.builtin_tools import CALCULATOR, PYTHON
from jaxrl_llm.envs.calls import ToolCall, detect_tool_call_format, parse_calls, resolve_tool_call_format
from jaxrl_llm.envs.config import EnvConfig
from jaxrl_llm.envs.episode import Episode, EpisodeLimits
from jaxrl_llm.envs.render import ChatRenderer, PlainRenderer
from jaxrl_llm.envs.tool_env import TRUNCATED, ToolEnv
from jaxrl_llm.model.tokenizer import CharTokenizer, load_tokenizer
from jaxrl_llm.tasks.base import Example
from jaxrl_llm.tasks.countdown import CountdownTask
from jaxrl_llm.tasks.word_problems import WordProblemTask

TOOLS = (CALCULATOR, PYTHON)
EXAMPLE = Example(prompt="Reply with only the final number. Mia has 7 apples. She gets 5 more. How many now?",
                  answer="12")
WIDE = EpisodeLimits(max_turn_tokens=1024, max_context_tokens=16384)

# Meta's Llama 3.1 template, abridged (no built-in tools): custom tools go into the first user message,
# a call is the whole message {"name": ..., "parameters": ...}, a tool result is an "ipython" message.
LLAMA31_TEMPLATE = r"""{{- bos_token }}
{%- if not tools is defined %}{%- set tools = none %}{%- endif %}
{%- if not date_string is defined %}{%- set date_string = "26 Jul 2024" %}{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is not none %}{{- "Environment: ipython\n" }}{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- if tools is not none %}
    {%- set first_user_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}
{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

# The same, every tool written as Meta's template writes its built-in tools (`builtin_tools`):
# <|python_tag|>NAME.call(key="value", ...) and <|eom_id|>.
LLAMA31_BUILTIN_TEMPLATE = LLAMA31_TEMPLATE.replace('''        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}''', '''        {{- '<|python_tag|>' + tool_call.name + '.call(' }}
        {%- for arg_name, arg_val in tool_call.arguments | items %}
            {{- arg_name + '="' + arg_val + '"' }}
            {%- if not loop.last %}{{- ", " }}{%- endif %}
        {%- endfor %}
        {{- ")<|eom_id|>" }}''')
assert LLAMA31_BUILTIN_TEMPLATE != LLAMA31_TEMPLATE

# Mistral's v3 template (Mistral-7B-Instruct-v0.3), the system prompt as the v7 templates write it:
# tools before the last user message, calls as "[TOOL_CALLS] [...]" with 9-character ids, results
# as [TOOL_RESULTS] with the call's id; no generation prompt.
MISTRAL_TEMPLATE = r"""{%- set user_messages = messages | selectattr("role", "equalto", "user") | list %}
{{- bos_token }}
{%- for message in messages %}
    {%- if message.role == "system" %}
        {{- "[SYSTEM_PROMPT]" + message.content + "[/SYSTEM_PROMPT]" }}
    {%- elif message.role == "user" %}
        {%- if tools and message == user_messages[-1] %}
            {{- "[AVAILABLE_TOOLS] " + tools | tojson + "[/AVAILABLE_TOOLS]" }}
        {%- endif %}
        {{- "[INST] " + message.content + "[/INST]" }}
    {%- elif message.tool_calls is defined and message.tool_calls is not none %}
        {{- "[TOOL_CALLS] [" }}
        {%- for tool_call in message.tool_calls %}
            {%- set out = tool_call.function | tojson %}
            {{- out[:-1] }}
            {%- if not tool_call.id is defined or tool_call.id | length != 9 %}
                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
            {%- endif %}
            {{- ', "id": "' + tool_call.id + '"}' }}
            {%- if not loop.last %}{{- ", " }}{%- else %}{{- "]" + eos_token }}{%- endif %}
        {%- endfor %}
    {%- elif message.role == "assistant" %}
        {{- " " + message.content | trim + eos_token }}
    {%- elif message.role == "tool" %}
        {{- '[TOOL_RESULTS] {"content": ' + message.content | tojson + ", " }}
        {%- if not message.tool_call_id is defined or message.tool_call_id | length != 9 %}
            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
        {%- endif %}
        {{- '"call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
    {%- endif %}
{%- endfor %}
"""

# GPT-OSS's harmony template, abridged: tools in the developer message as a TypeScript namespace, a
# call as a commentary message to functions.NAME ended by <|call|>, the analysis as `thinking`, a
# result as a message from functions.NAME; the generation prompt is "<|start|>assistant".
HARMONY_TEMPLATE = r"""{{- "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message." }}
{%- if tools %}{{- "\nCalls to these tools must go to the commentary channel: 'functions'." }}{%- endif %}
{{- "<|end|>" }}
{%- if tools or messages[0].role == "system" %}
    {{- "<|start|>developer<|message|>" }}
    {%- if messages[0].role == "system" %}{{- "# Instructions\n\n" + messages[0].content + "\n\n" }}{%- endif %}
    {%- if tools %}
        {{- "# Tools\n\n## functions\n\nnamespace functions {\n\n" }}
        {%- for tool in tools %}
            {{- "// " + tool.function.description + "\ntype " + tool.function.name + " = (_: " + tool.function.parameters | tojson + ") => any;\n\n" }}
        {%- endfor %}
        {{- "} // namespace functions" }}
    {%- endif %}
    {{- "<|end|>" }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == "user" %}
        {{- "<|start|>user<|message|>" + message.content + "<|end|>" }}
    {%- elif message.role == "assistant" and message.tool_calls %}
        {%- if message.thinking %}
            {{- "<|start|>assistant<|channel|>analysis<|message|>" + message.thinking + "<|end|>" }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {{- "<|start|>assistant to=functions." + tool_call.function.name + "<|channel|>commentary json<|message|>" }}
            {{- tool_call.function.arguments | tojson + "<|call|>" }}
        {%- endfor %}
    {%- elif message.role == "assistant" %}
        {{- "<|start|>assistant<|channel|>final<|message|>" + message.content }}
        {{- "<|return|>" if loop.last and not add_generation_prompt else "<|end|>" }}
    {%- elif message.role == "tool" %}
        {{- "<|start|>functions." + message.name + " to=assistant<|channel|>commentary<|message|>" }}
        {{- message.content | tojson + "<|end|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- "<|start|>assistant" }}{%- endif %}
"""

# A template in the style of Mistral's v11 tokenizers (Mistral Small 3.2, Magistral): each call written
# as [TOOL_CALLS]NAME[ARGS]{...}, the tools before the last user message, no call ids.
MISTRAL_V11_TEMPLATE = r"""{%- set user_messages = messages | selectattr("role", "equalto", "user") | list %}
{{- bos_token }}
{%- for message in messages %}
    {%- if message.role == "system" %}
        {{- "[SYSTEM_PROMPT]" + message.content + "[/SYSTEM_PROMPT]" }}
    {%- elif message.role == "user" %}
        {%- if tools and message == user_messages[-1] %}
            {{- "[AVAILABLE_TOOLS]" + tools | tojson + "[/AVAILABLE_TOOLS]" }}
        {%- endif %}
        {{- "[INST]" + message.content + "[/INST]" }}
    {%- elif message.role == "assistant" %}
        {{- message.content }}
        {%- if message.tool_calls is defined and message.tool_calls is not none %}
            {%- for tool_call in message.tool_calls %}
                {{- "[TOOL_CALLS]" + tool_call.function.name + "[ARGS]" + tool_call.function.arguments | tojson }}
            {%- endfor %}
        {%- endif %}
        {{- eos_token }}
    {%- elif message.role == "tool" %}
        {{- "[TOOL_RESULTS]" + message.content + "[/TOOL_RESULTS]" }}
    {%- endif %}
{%- endfor %}
"""

# family -> (template, special tokens, eos token, every EOS id's token, what the template writes after
# a turn's EOS)
FAMILIES = {
    "hermes": (QWEN25_TEMPLATE, ["<|im_start|>", "<|im_end|>"], "<|im_end|>", ["<|im_end|>"], "\n"),
    "llama3": (LLAMA31_TEMPLATE, ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                                  "<|eom_id|>", "<|python_tag|>"], "<|eot_id|>", ["<|eot_id|>", "<|eom_id|>"], ""),
    "mistral": (MISTRAL_TEMPLATE, ["<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
                                   "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[SYSTEM_PROMPT]",
                                   "[/SYSTEM_PROMPT]"], "</s>", ["</s>"], ""),
    "llama3_builtin": (LLAMA31_BUILTIN_TEMPLATE, ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                                                  "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"], "<|eot_id|>",
                       ["<|eot_id|>", "<|eom_id|>"], ""),
    "mistral_v11": (MISTRAL_V11_TEMPLATE, ["<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[ARGS]",
                                           "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]",
                                           "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"], "</s>", ["</s>"], ""),
    "harmony": (HARMONY_TEMPLATE, ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>",
                                   "<|return|>", "<|call|>"], "<|return|>", ["<|return|>", "<|call|>"], ""),
}
BOS = {"llama3": "<|begin_of_text|>", "llama3_builtin": "<|begin_of_text|>", "mistral": "<s>", "mistral_v11": "<s>"}
FORMAT = {**{f: f for f in FAMILIES}, "llama3_builtin": "llama3", "mistral_v11": "mistral"}  # the parser each family's template selects


def family_dir(root, family: str) -> str:
  """A tokenizer directory: one id per printable character, the family's special tokens, its template."""
  template, specials, eos, eos_tokens, _ = FAMILIES[family]
  chars = [chr(i) for i in range(32, 127)] + ["\n"]
  tok = Tokenizer(models.WordLevel({"<unk>": 0, **{c: i + 1 for i, c in enumerate(chars)}}, unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
  tok.decoder = decoders.Fuse()
  tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
  out = root / family
  out.mkdir()
  tok.save(str(out / "tokenizer.json"))
  config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos, "pad_token": eos,
            "clean_up_tokenization_spaces": False, "chat_template": template}
  if family in BOS:
    config["bos_token"] = BOS[family]
  (out / "tokenizer_config.json").write_text(json.dumps(config))
  (out / "generation_config.json").write_text(json.dumps({"eos_token_id": [tok.token_to_id(t) for t in eos_tokens]}))
  return str(out)


def call(name, arguments, i):
  return {"id": i, "type": "function", "function": {"name": name, "arguments": arguments}}


def conversation_of(family: str, opening: list) -> list:
  """Two rounds of calls (parallel in the first where the family writes them in one turn: not Llama
  3.1's template, and not harmony, whose every call ends the turn at <|call|>), then the answer; the
  calls and results exactly as ToolEnv writes them (ids call<turn><index>)."""
  first = [call("calculator", {"expression": "7+5"}, "call00000")]
  results = [{"role": "tool", "name": "calculator", "tool_call_id": "call00000", "content": "12"}]
  if family in ("hermes", "mistral", "mistral_v11"):
    first.append(call("python", {"code": "print(7 + 5)"}, "call00001"))
    results.append({"role": "tool", "name": "python", "tool_call_id": "call00001", "content": "12\n"})
  second = {"role": "assistant", "content": "Let me check." if family == "hermes" else "",
            "tool_calls": [call("calculator", {"expression": "12-5"}, "call00100")]}
  if family == "harmony":
    second["thinking"] = "Let me check."
  return [*opening, {"role": "assistant", "content": "", "tool_calls": first}, *results, second,
          {"role": "tool", "name": "calculator", "tool_call_id": "call00100", "content": "7"},
          {"role": "assistant", "content": "12"}]


def sampled_turn(family, hf_tok, conversation, i, **template_vars):
  """The ids a model sampled for conversation[i] when it wrote the turn as the template renders it:
  the template's text of the turn, tokenised, up to its last EOS."""
  before = hf_tok.apply_chat_template(conversation[:i], add_generation_prompt=True, tokenize=False, **template_vars)
  after = hf_tok.apply_chat_template(conversation[:i + 1], tokenize=False, **template_vars)
  assert after.startswith(before)
  ids = hf_tok.encode(after[len(before):], add_special_tokens=False)
  eos = set(hf_tok.convert_tokens_to_ids(FAMILIES[family][3]))
  last = max(k for k, t in enumerate(ids) if t in eos)
  return ids[:last + 1]


@pytest.mark.parametrize("tools_in_template", [False, True])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_episode_ids_equal_transformers_rendering(family, tools_in_template, pool, tmp_path):
  path = family_dir(tmp_path, family)
  tok, hf_tok = load_tokenizer(path), transformers.AutoTokenizer.from_pretrained(path)
  fmt = resolve_tool_call_format(EnvConfig().tool_call_format, tok.chat_template)  # "auto": off the template
  assert fmt == FORMAT[family]
  assert registry.make_env(EnvConfig(name="calculator"), WordProblemTask(), pool, tok).tool_call_format == fmt
  env = ToolEnv(WordProblemTask(), TOOLS, pool, tokenizer=tok, tool_call_format=fmt,
                tools_in_template=tools_in_template)
  template_vars = {"tools": [t.schema() for t in TOOLS]} if tools_in_template else {}
  opening = env.reset(EXAMPLE)
  assert [m["role"] for m in opening] == (["user"] if tools_in_template else ["system", "user"])
  conversation = conversation_of(family, opening)
  turns_at = [i for i, m in enumerate(conversation) if m["role"] == "assistant"]
  turns = [sampled_turn(family, hf_tok, conversation, i, **template_vars) for i in turns_at]

  episode = Episode(env, ChatRenderer(tok, **template_vars), EXAMPLE, WIDE)
  for k, (i, turn) in enumerate(zip(turns_at, turns)):
    obs = episode.step(turn)
    if k < len(turns) - 1:  # a call: parsed back to the conversation's message, results as its tool messages
      nxt = turns_at[k + 1]
      assert obs.status == "tool_result" and obs.assistant == conversation[i]
      assert list(obs.messages) == conversation[i + 1:nxt]
  assert (episode.status, episode.reward_parts) == ("answer", {"correct": 1.0, "format": 1.0})
  rendered = episode.result().rendered
  reference = hf_tok.apply_chat_template(conversation, tokenize=True, return_dict=False, **template_vars)
  tail = hf_tok.encode(FAMILIES[family][4], add_special_tokens=False)  # written after the final EOS
  assert rendered.ids_T.tolist() + tail == reference
  assert rendered.prompt_len == len(hf_tok.apply_chat_template(conversation[:turns_at[0]], tokenize=True,
                                                               return_dict=False, add_generation_prompt=True,
                                                               **template_vars))
  policy = rendered.ids_T[rendered.policy_T].tolist()
  assert policy == [t for turn in turns for t in turn]  # the sampled ids verbatim
  if tools_in_template:  # the template wrote the tools' schemas, our instructions are not there
    opening_text = tok.decode(rendered.ids_T[:rendered.prompt_len], skip_special_tokens=False)
    assert CALCULATOR.description in opening_text and "You may call tools" not in opening_text


def test_parsers_read_each_familys_syntax():
  calc = ToolCall("calculator", {"expression": "7+5"})
  # Llama 3.1: the message is the call; with <|python_tag|>; several separated by ";"; "arguments" read too.
  for text in ['{"name": "calculator", "parameters": {"expression": "7+5"}}',
               '<|python_tag|>{"name": "calculator", "parameters": {"expression": "7+5"}}',
               ' {"name": "calculator", "arguments": {"expression": "7+5"}}\n']:
    assert parse_calls(text, TOOLS, "json", "llama3").calls == (calc,), text
  two = parse_calls('<|python_tag|>{"name": "calculator", "parameters": {"expression": "7+5"}}; '
                    '{"name": "python", "parameters": {"code": "1"}}', TOOLS, "json", "llama3")
  assert two.calls == (calc, ToolCall("python", {"code": "1"}))
  # Meta's built-in tools' form.
  assert parse_calls('<|python_tag|>calculator.call(expression="7+5")', TOOLS, "json", "llama3").calls == (calc,)
  final = parse_calls("The answer is 12.", TOOLS, "json", "llama3")
  assert (final.calls, final.status, final.content) == ((), "", "The answer is 12.")
  # Mistral: [TOOL_CALLS] and a list, the model's ids kept, the text before it the content.
  parsed = parse_calls('Sure. [TOOL_CALLS][{"name": "calculator", "arguments": {"expression": "7+5"}, '
                       '"id": "abcDEF123"}]', TOOLS, "json", "mistral")
  assert parsed.calls == (ToolCall("calculator", {"expression": "7+5"}, "abcDEF123"),)
  assert parsed.content == "Sure."
  # Mistral's v11 form: each call after its own [TOOL_CALLS], with or without [CALL_ID] and [ARGS].
  parsed = parse_calls('Sure.[TOOL_CALLS]calculator[ARGS]{"expression": "7+5"}[TOOL_CALLS]python[CALL_ID]'
                       'abcDEF123[ARGS]{"code": "1"}', TOOLS, "json", "mistral")
  assert parsed.calls == (calc, ToolCall("python", {"code": "1"}, "abcDEF123")) and parsed.content == "Sure."
  assert parse_calls('[TOOL_CALLS]calculator{"expression": "7+5"}', TOOLS, "json", "mistral").calls == (calc,)
  # Harmony: the recipient in the channel (as the brief form writes it) or in the header; analysis
  # is the thinking; the final channel is the content.
  for text in ['<|start|>assistant<|channel|>commentary to=functions.calculator <|constrain|>json<|message|>'
               '{"expression": "7+5"}<|call|>',
               '<|channel|>analysis<|message|>add them<|end|><|start|>assistant to=functions.calculator'
               '<|channel|>commentary json<|message|>{"expression": "7+5"}<|call|>']:
    assert parse_calls(text, TOOLS, "json", "harmony").calls == (calc,), text
  assert parse_calls('<|channel|>analysis<|message|>add them<|end|><|start|>assistant to=functions.calculator'
                     '<|channel|>commentary json<|message|>{"expression": "7+5"}', TOOLS, "json",
                     "harmony").thinking == "add them"
  final = parse_calls("<|channel|>analysis<|message|>7+5<|end|><|start|>assistant<|channel|>final<|message|>12",
                      TOOLS, "json", "harmony")
  assert (final.calls, final.content, final.thinking) == ((), "12", "7+5")


@pytest.mark.parametrize("fmt,text,status", [
    ("llama3", '{"name": "calculator", "parameters": {"expression": "7+5"}', "malformed_call"),
    ("llama3", '<|python_tag|>print(7 + 5)', "malformed_call"),
    ("llama3", '<|python_tag|>calculator.call("7+5")', "malformed_call"),
    ("llama3", '<|python_tag|>calculator.call(expression=x)', "malformed_call"),
    ("llama3", '<|python_tag|>search.call(q="x")', "unknown_tool"),
    ("llama3", '<|python_tag|>calculator.call(expression=7)', "bad_arguments"),
    ("llama3", '{"name": "calculator", "parameters": {"expression": "7+5"}} and more', "malformed_call"),
    ("llama3", '{"name": "search", "parameters": {"q": "x"}}', "unknown_tool"),
    ("llama3", '{"name": "calculator"}', "bad_arguments"),
    ("mistral", '[TOOL_CALLS][{"name": "calculator", "arguments": {"expression": "7+5"}}', "malformed_call"),
    ("mistral", "[TOOL_CALLS][]", "malformed_call"),
    ("mistral", '[TOOL_CALLS][{"name": "calculator", "arguments": {"expression": 7}}]', "bad_arguments"),
    ("mistral", '[TOOL_CALLS]calculator[ARGS]{"expression": "7+5"', "malformed_call"),
    ("mistral", '[TOOL_CALLS]calculator[ARGS]{"expression": "7+5"} done', "malformed_call"),
    ("mistral", '[TOOL_CALLS]search[ARGS]{"q": "x"}', "unknown_tool"),
    ("mistral", '[TOOL_CALLS][ARGS]{"expression": "7+5"}', "malformed_call"),
    ("harmony", '<|channel|>commentary to=functions.calculator json<|message|>{"expression": ', "malformed_call"),
    ("harmony", '<|channel|>commentary to=browser.search<|message|>{"q": "x"}<|call|>', "unknown_tool"),
    ("harmony", '<|channel|>commentary to=functions.search<|message|>{"q": "x"}<|call|>', "unknown_tool"),
    ("harmony", '<|channel|>commentary to=functions.calculator', "malformed_call"),
])
def test_bad_calls_of_each_family_get_their_status(fmt, text, status):
  parsed = parse_calls(text, TOOLS, "json", fmt)
  assert (parsed.calls, parsed.status) == ((), status) and parsed.detail


def test_the_family_is_read_off_the_template_or_set_in_the_config(tmp_path):
  assert [detect_tool_call_format(FAMILIES[f][0]) for f in FAMILIES] == [FORMAT[f] for f in FAMILIES]
  assert detect_tool_call_format(None) == "hermes"  # no template: SmolLM2's documented <tool_call>
  assert detect_tool_call_format("{{ messages[0].content }}") == "hermes"
  assert resolve_tool_call_format("mistral", LLAMA31_TEMPLATE) == "mistral"  # the config's choice wins
  with pytest.raises(ConfigError, match=r"config\.env\.tool_call_format='qwen' is invalid: allowed "
                                        r"\('auto', 'hermes', 'llama3', 'mistral', 'harmony'\)"):
    EnvConfig(name="calculator", tool_call_format="qwen")
  with pytest.raises(ConfigError, match=r"config\.env\.tool_call_format='llama3' is invalid.*call_format='tags'"):
    EnvConfig(name="calculator", call_format="tags", tool_call_format="llama3")
  with pytest.raises(ConfigError, match=r"config\.env\.tools_in_template=True is invalid.*call_format='tags'"):
    EnvConfig(name="calculator", call_format="tags", tools_in_template=True)
  with pytest.raises(ConfigError, match=r"config\.env\.max_observation_tokens=128 is out of range: allowed in \[0, 127\]"):
    EnvConfig(name="calculator", max_observation_tokens=128)


def test_long_tool_result_is_cut_with_a_marker_and_the_episode_goes_on(pool):
  tok = CharTokenizer()
  call = tok.encode("<python>print('x' * 300)</python>")
  example = Example(prompt="3,5,7>22:", answer="3*5+7")

  def episode(cap):
    env = ToolEnv(CountdownTask(), (PYTHON,), pool, call_format="tags", tokenizer=tok, max_observation_tokens=cap,
                  instructions=False)
    room = len(PlainRenderer(tok).opening_ids(env.reset(example))) + len(call) + 100
    ep = Episode(env, PlainRenderer(tok), example, EpisodeLimits(max_turn_tokens=64, max_context_tokens=room))
    return ep, ep.step(call)

  _, uncut = episode(0)  # 301 characters of output leave no room in the 100 tokens after the call
  assert uncut.status == "context_overflow"
  ep, obs = episode(40)
  assert obs.status == "tool_result"
  # 40 tokens: the first 40 - 14 = 26 characters of the output, then the 14 of "...[truncated]".
  assert len(TRUNCATED) == 14
  assert obs.messages == ({"role": "tool", "content": "<result>" + "x" * 26 + TRUNCATED + "</result>"},)
  assert not ep.done
  with pytest.raises(ValueError, match=r"ToolEnv.max_observation_tokens=14 is out of range: allowed 0 or more "
                                       r"than the 14 tokens"):
    ToolEnv(CountdownTask(), (PYTHON,), pool, call_format="tags", tokenizer=tok, max_observation_tokens=14)


def test_tools_in_template_needs_a_chat_template():
  from jaxrl_llm.training.config import from_config_dict
  from jaxrl_llm.training.defaults import get_config

  c = get_config("grpo")
  c.env.name, c.env.tools_in_template, c.data.chat_template = "calculator", True, False
  with pytest.raises(ConfigError, match=r"config\.env\.tools_in_template=True is invalid.*data\.chat_template=False"):
    from_config_dict(c)
