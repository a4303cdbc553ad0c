"""Fixtures of the environment tests: one tool pool with short limits, and SmolLM2-135M-Instruct's
tokenizer (from the packaged GGUF in the model cache) under its own chat template and under Qwen2.5's."""

import os

import pytest

from jaxrl_llm.envs.pool import ToolPool

from tool_fixtures import TEST_LIMITS

# Qwen2.5-Instruct's chat template (tokenizer_config.json of Qwen/Qwen2.5-*-Instruct), as published.
QWEN25_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""


@pytest.fixture(scope="session")
def pool():
  with ToolPool(2, TEST_LIMITS) as p:
    yield p


@pytest.fixture(scope="session")
def smollm2_tokenizer_dir(tmp_path_factory):
  """A directory with SmolLM2-135M-Instruct's tokenizer files and chat template, built from the packaged
  GGUF (model/io/pretrained.py: fetched once per machine into the model cache). Skips when it is neither
  cached nor downloadable."""
  from jaxrl_llm.model.io.gguf_arch import gguf_hf_config
  from jaxrl_llm.model.io.gguf_reader import GGUFFile
  from jaxrl_llm.model.io.gguf_tokenizer import gguf_tokenizer_files
  from jaxrl_llm.model.io.pretrained import PipDownloadError, fetch_model

  try:
    path = fetch_model("smollm2-135m")
  except PipDownloadError as e:
    pytest.skip(f"SmolLM2-135M-Instruct is not in the model cache and the package index is not reachable: {e}")
  gg = GGUFFile(path)
  hf = gguf_hf_config(gg)
  files = gguf_tokenizer_files(gg, hf["vocab_size"], max_length=hf["max_position_embeddings"])
  out = tmp_path_factory.mktemp("smollm2_tokenizer")
  for name, content in files.items():
    (out / name).write_text(content)
  return str(out)


@pytest.fixture(scope="session")
def qwen_template_dir(smollm2_tokenizer_dir, tmp_path_factory):
  """SmolLM2's tokenizer under Qwen2.5's chat template (no Qwen tokenizer is available offline; the
  template only needs <|im_start|> and <|im_end|>, which SmolLM2's vocabulary has as special tokens)."""
  out = tmp_path_factory.mktemp("qwen_template")
  for name in os.listdir(smollm2_tokenizer_dir):
    content = open(os.path.join(smollm2_tokenizer_dir, name)).read()
    (out / name).write_text(QWEN25_TEMPLATE if name == "chat_template.jinja" else content)
  return str(out)
