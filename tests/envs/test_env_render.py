"""Golden tests of the token trace: multi-turn conversations with tool calls, rendered by our path
(opening prompt, then each turn's ids as sampled and each observation's template delta), give the ids
of transformers' `apply_chat_template(conversation, tokenize=True)`.

Templates: SmolLM2-135M-Instruct's own (ChatML; it has no tool-call syntax of its own, so calls are
SmolLM2's documented `<tool_call>[...]</tool_call>` text and results are "tool" messages) and
Qwen2.5-Instruct's (tools in the system prompt, structured tool_calls, tool results grouped into one
user turn), both with SmolLM2's real tokenizer from the model cache. A turn's sampled ids are what a
model that writes the turn as the template does would sample: the template's text of the turn
tokenised canonically, then EOS.
"""

import json
import shutil

import numpy as np
import pytest
import transformers

from jaxrl_llm.envs.builtin_tools import CALCULATOR, PYTHON
from jaxrl_llm.envs.render import (ChatRenderer, PlainRenderer, TemplateDeltaError, TokenTrace,
                                   render_episode)
from jaxrl_llm.model.tokenizer import CharTokenizer, load_tokenizer

CLOSE = "<|im_end|>\n"  # what ChatML writes after a turn's content
SYSTEM = {"role": "system", "content": "You can use a calculator."}
USER = {"role": "user", "content": "Mia has 7 apples. She gets 5 more. How many apples does Mia have now?"}


# The module-scoped fixtures run once: the module's tests go to one pytest-xdist worker.
pytestmark = pytest.mark.xdist_group("envs.test_env_render")


@pytest.fixture(scope="module")
def smollm2(smollm2_tokenizer_dir):
  """(our tokenizer, transformers' tokenizer) of SmolLM2-135M-Instruct."""
  return load_tokenizer(smollm2_tokenizer_dir), transformers.AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)


@pytest.fixture(scope="module")
def qwen(qwen_template_dir):
  """The same tokenizer under Qwen2.5's chat template."""
  return load_tokenizer(qwen_template_dir), transformers.AutoTokenizer.from_pretrained(qwen_template_dir)


def reference_ids(hf_tok, conversation, **kwargs):
  return hf_tok.apply_chat_template(conversation, tokenize=True, return_dict=False, **kwargs)


def sampled_turn(hf_tok, conversation, i, **template_vars):
  """The ids a model sampled for conversation[i] when it wrote the turn as the template renders it."""
  before = hf_tok.apply_chat_template(conversation[:i], add_generation_prompt=True, tokenize=False,
                                      **template_vars)
  with_turn = hf_tok.apply_chat_template(conversation[:i + 1], tokenize=False, **template_vars)
  assert with_turn.startswith(before) and with_turn.endswith(CLOSE)
  text = with_turn[len(before):-len(CLOSE)]
  return hf_tok.encode(text, add_special_tokens=False) + [hf_tok.convert_tokens_to_ids("<|im_end|>")]


def trace_of(renderer, conversation, turns):
  """Our trace of `conversation`: the messages before the first assistant turn open it; each assistant
  message is replaced by its sampled ids (turns[k]); the messages between turns are observations."""
  first = next(i for i, m in enumerate(conversation) if m["role"] == "assistant")
  trace = TokenTrace(renderer, conversation[:first])
  observed, k = [], 0
  for m in conversation[first:]:
    if m["role"] == "assistant":
      if k:
        trace.add_observation(observed)
      trace.add_turn(turns[k])
      observed, k = [], k + 1
    else:
      observed.append(m)
  if observed:
    trace.add_observation(observed)
  return trace


def check_labels(rendered, turns):
  """The policy tokens are exactly the sampled turns, in order, each with its turn index; the turn
  index never decreases and starts at 0."""
  ids, policy, turn = rendered.ids_T, rendered.policy_T, rendered.turn_T
  assert not policy[:rendered.prompt_len].any()
  for k, sampled in enumerate(turns):
    assert ids[policy & (turn == k)].tolist() == list(sampled)
  assert policy.sum() == sum(len(t) for t in turns)
  assert turn[0] == 0 and (np.diff(turn) >= 0).all()
  assert ids.dtype == np.int32 and turn.dtype == np.int32 and policy.dtype == bool


def call_text(*calls):
  """SmolLM2's tool-call text: one block holding a JSON list of calls."""
  return "<tool_call>" + json.dumps([{"name": n, "arguments": a} for n, a in calls]) + "</tool_call>"


def test_smollm2_template_two_rounds_of_tools(smollm2):
  tok, hf_tok = smollm2
  conversation = [
      SYSTEM, USER,
      {"role": "assistant", "content": call_text(("calculator", {"expression": "7+5"}))},
      {"role": "tool", "content": "12"},
      {"role": "assistant", "content": "Let me check: " + call_text(("calculator", {"expression": "12-5"}))},
      {"role": "tool", "content": "7"},
      {"role": "assistant", "content": "12"},
  ]
  turns = [sampled_turn(hf_tok, conversation, i) for i in (2, 4, 6)]
  rendered = trace_of(ChatRenderer(tok), conversation, turns).rendered()
  reference = reference_ids(hf_tok, conversation)
  # The reference also holds the template's close after the final turn's EOS ("\n"); the episode ends
  # at that EOS, so nothing after it is in the trace.
  assert rendered.ids_T.tolist() + hf_tok.encode("\n", add_special_tokens=False) == reference
  assert rendered.prompt_len == len(reference_ids(hf_tok, conversation[:2], add_generation_prompt=True))
  check_labels(rendered, turns)
  # The observation after turn 0, decoded: the close's "\n", the tool message, the generation prompt.
  first_obs = rendered.ids_T[(~rendered.policy_T) & (rendered.turn_T == 1)]
  assert tok.decode(first_obs, skip_special_tokens=False) == \
      "\n<|im_start|>tool\n12<|im_end|>\n<|im_start|>assistant\n"


def test_smollm2_template_parallel_calls(smollm2):
  tok, hf_tok = smollm2
  conversation = [
      SYSTEM, USER,
      {"role": "assistant", "content": call_text(("calculator", {"expression": "7+5"}),
                                                 ("python", {"code": "print(7 + 5)"}))},
      {"role": "tool", "content": "12"},
      {"role": "tool", "content": "12\n"},
      {"role": "assistant", "content": "12"},
  ]
  turns = [sampled_turn(hf_tok, conversation, i) for i in (2, 5)]
  rendered = trace_of(ChatRenderer(tok), conversation, turns).rendered()
  assert rendered.ids_T.tolist() + hf_tok.encode("\n", add_special_tokens=False) == \
      reference_ids(hf_tok, conversation)
  check_labels(rendered, turns)


def qwen_call(name, arguments):
  return {"type": "function", "function": {"name": name, "arguments": arguments}}


def test_qwen_template_with_tools_and_parallel_calls(qwen):
  tok, hf_tok = qwen
  tools = [CALCULATOR.schema(), PYTHON.schema()]
  conversation = [
      USER,
      {"role": "assistant", "content": "", "tool_calls": [qwen_call("calculator", {"expression": "7+5"}),
                                                          qwen_call("python", {"code": "print(7 + 5)"})]},
      {"role": "tool", "name": "calculator", "content": "12"},
      {"role": "tool", "name": "python", "content": "12\n"},
      {"role": "assistant", "content": "Both say 12. One more check.",
       "tool_calls": [qwen_call("calculator", {"expression": "12-5"})]},
      {"role": "tool", "name": "calculator", "content": "7"},
      {"role": "assistant", "content": "12"},
  ]
  turns = [sampled_turn(hf_tok, conversation, i, tools=tools) for i in (1, 4, 6)]
  # What the model samples for a structured call is the template's text for it: our renderer only ever
  # sees that text, never the structure.
  assert tok.decode(turns[0], skip_special_tokens=False).startswith('<tool_call>\n{"name": "calculator"')
  rendered = trace_of(ChatRenderer(tok, tools=tools), conversation, turns).rendered()
  reference = reference_ids(hf_tok, conversation, tools=tools)
  assert rendered.ids_T.tolist() + hf_tok.encode("\n", add_special_tokens=False) == reference
  check_labels(rendered, turns)
  # Both results arrive in one user turn, after the close's "\n" of the turn that called them.
  obs = rendered.ids_T[(~rendered.policy_T) & (rendered.turn_T == 1)]
  assert tok.decode(obs, skip_special_tokens=False) == (
      "\n<|im_start|>user\n<tool_response>\n12\n</tool_response>\n<tool_response>\n12\n\n</tool_response>"
      "<|im_end|>\n<|im_start|>assistant\n")


def test_turn_cut_at_its_token_limit(smollm2):
  tok, hf_tok = smollm2
  long_answer = "Mia had 7 apples and got 5 more, so she has 7 + 5 = 12 apples now."
  cut = hf_tok.encode(long_answer, add_special_tokens=False)[:9]  # no EOS: cut at a 9-token limit
  cut_text = hf_tok.decode(cut)
  assert hf_tok.encode(cut_text, add_special_tokens=False) == cut  # the cut ids are canonical for their text
  # (a) The episode ends at the cut: transformers' continue_final_message leaves the turn open as well.
  conversation = [SYSTEM, USER, {"role": "assistant", "content": cut_text}]
  rendered = trace_of(ChatRenderer(tok), conversation, [cut]).rendered()
  assert rendered.ids_T.tolist() == reference_ids(hf_tok, conversation, continue_final_message=True)
  check_labels(rendered, [cut])
  # (b) The episode goes on after the cut turn: the template's whole close ("<|im_end|>\n", not sampled)
  # comes first in the next observation.
  conversation = [SYSTEM, USER, {"role": "assistant", "content": cut_text},
                  {"role": "user", "content": "Your reply was cut off. Answer with the number only."},
                  {"role": "assistant", "content": "12"}]
  turns = [cut, sampled_turn(hf_tok, conversation, 4)]
  rendered = trace_of(ChatRenderer(tok), conversation, turns).rendered()
  assert rendered.ids_T.tolist() + hf_tok.encode("\n", add_special_tokens=False) == \
      reference_ids(hf_tok, conversation)
  check_labels(rendered, turns)
  obs = rendered.ids_T[(~rendered.policy_T) & (rendered.turn_T == 1)]
  assert tok.decode(obs, skip_special_tokens=False).startswith("<|im_end|>\n<|im_start|>user\n")


def test_sampled_ids_are_kept_where_a_decode_reencode_would_drift(smollm2):
  tok, hf_tok = smollm2
  (the,) = hf_tok.encode("The", add_special_tokens=False)
  (t, he) = hf_tok.convert_tokens_to_ids(["T", "he"])
  assert hf_tok.decode([t, he]) == "The"
  canonical = sampled_turn(hf_tok, [SYSTEM, USER, {"role": "assistant", "content": "The answer is 12"}], 2)
  assert canonical[0] == the
  sampled = [t, he] + canonical[1:]  # the policy sampled "The" as two tokens: a valid, non-canonical path
  conversation = [SYSTEM, USER, {"role": "assistant", "content": "The answer is 12"},
                  {"role": "user", "content": "Sure?"}, {"role": "assistant", "content": "Yes"}]
  second = sampled_turn(hf_tok, conversation, 4)
  rendered = trace_of(ChatRenderer(tok), conversation, [sampled, second]).rendered()
  ids = rendered.ids_T.tolist()
  check_labels(rendered, [sampled, second])  # the sampled ids verbatim, [T, he] included
  # A decode / re-encode path (render the conversation as text, tokenise it) drifts from what was sampled:
  # one token shorter, "The" where the policy sampled "T" "he", and every later position shifted.
  retokenised = reference_ids(hf_tok, conversation)
  p = rendered.prompt_len
  assert retokenised[:p] == ids[:p] and retokenised[p] == the and ids[p:p + 2] == [t, he]
  # One token fewer for "The", one more for the final close ("\n") that the trace does not hold.
  assert len(retokenised) == len(ids)
  assert retokenised[p + 1:-1] == ids[p + 2:]  # the rest agrees, one position earlier


CHATML_LOOP = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' }}{PREFIX}{{ m['content'] + "
               "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


@pytest.mark.parametrize("template,message", [
    # writes the number of messages first: every added message rewrites the first line
    ("{{ messages|length }}\n" + CHATML_LOOP.replace("{PREFIX}", ""), "not rendered where its generation prompt"),
    # writes an empty thinking block before the last assistant turn only (as Qwen3's template does):
    # the block vanishes once a message follows the turn
    (CHATML_LOOP.replace("{PREFIX}", "{% if loop.last and m['role'] == 'assistant' %}<think></think>{% endif %}"),
     "rewrites the conversation when 1 message"),
])
def test_template_that_rewrites_history_is_refused(smollm2_tokenizer_dir, tmp_path, template, message):
  # No delta exists: that is an error, never a silent re-tokenisation.
  shutil.copytree(smollm2_tokenizer_dir, tmp_path / "t")
  (tmp_path / "t" / "chat_template.jinja").write_text(template)
  tok = load_tokenizer(str(tmp_path / "t"))
  trace = TokenTrace(ChatRenderer(tok), [USER])
  trace.add_turn(tok.encode("12") + [tok.eos_id])
  with pytest.raises(TemplateDeltaError, match=message) as e:
    trace.add_observation([{"role": "user", "content": "Sure?"}])
  assert "not prefix-stable" in str(e.value)


def test_plain_renderer_for_a_base_model():
  tok = CharTokenizer()
  opening = [{"role": "system", "content": "Tools: <calc>...</calc>\n\n"}, {"role": "user", "content": "7+5=?\n"}]
  turns = [tok.encode("<calc>7+5</calc>"), tok.encode(" so 12") + [tok.eos_id]]
  rendered = render_episode(PlainRenderer(tok), opening,
                            [(turns[0], [{"role": "tool", "content": "<result>12</result>"}]), (turns[1], [])])
  text = "Tools: <calc>...</calc>\n\n7+5=?\n<calc>7+5</calc><result>12</result> so 12"
  assert rendered.ids_T.tolist() == [tok.bos_id] + tok.encode(text) + [tok.eos_id]
  assert rendered.prompt_len == 1 + len("Tools: <calc>...</calc>\n\n7+5=?\n")
  check_labels(rendered, turns)
  # The result's 20 characters are the environment's, labelled as coming before turn 1.
  assert tok.decode(rendered.ids_T[(~rendered.policy_T) & (rendered.turn_T == 1)]) == "<result>12</result>"


def test_trace_order_is_enforced():
  trace = TokenTrace(PlainRenderer(CharTokenizer()), [{"role": "user", "content": "1+1="}])
  with pytest.raises(ValueError, match="no turn to follow"):
    trace.add_observation([{"role": "tool", "content": "x"}])
  trace.add_turn([5])
  with pytest.raises(ValueError, match="the previous turn has no observation yet"):
    trace.add_turn([6])
  with pytest.raises(ValueError, match="turn 0 has no observation after it, but turn 1 follows"):
    render_episode(PlainRenderer(CharTokenizer()), [{"role": "user", "content": "1"}], [([5], []), ([6], [])])
