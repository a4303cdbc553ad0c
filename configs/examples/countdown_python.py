"""Multi-turn episodes with a sandboxed Python tool on the embedded default: countdown.

    python -m jaxrl_llm.train --config=configs/examples/countdown_python.py

The default model (character tokenizer, D 128, 4 layers) and the built-in countdown task (three numbers
from 1-9 and a target: "2,6,8>10:", answer an expression such as "2*8-6"), nothing downloaded. Each
sample is an episode of the "python" environment in the plain tag format (envs/calls.py): the model
may write "<python>2*8-6</python>", the turn stops at the closing tag, the program runs in a tool
worker process under env.tools' limits (envs/pool.py) and the environment answers with what it
prints, "<result>10\\n</result>"; the last turn is the expression, scored by the task's verifier.
Code helps here as a checker: an expression whose value is wrong can be seen to be wrong and replaced.
The warm start's right demonstrations (task.tool_demos, tasks/countdown.py) check their expression,
half of them after a first try with one operator swapped; the wrong ones (60%) answer a swapped
expression from memory. The control arm without the tool is configs/examples/countdown_no_tool.py;
the 3-seed comparison is in docs/benchmarks.md ("Tools").

That comparison ran with 4 turns of 24 tokens in 96, where a third call and its result never left room
for a fourth turn (the episode ended context_overflow, or earlier on a long printed value); the limits
below allow what fits, 3 turns with every printed value cut to 24 tokens (a third call ends turn_limit).
"""

from jaxrl_llm.envs.episode import reachable_max_tokens
from jaxrl_llm.envs.render import PlainRenderer
from jaxrl_llm.model.tokenizer import CharTokenizer
from jaxrl_llm.training.defaults import get_config as _base


def get_config():
  c = _base("gspo", name="countdown_python")
  c.task.name = "countdown"
  c.task.n_numbers = 3
  c.task.max_number = 9
  c.task.tool_demos = True
  c.env.name = "python"
  c.env.call_format = "tags"
  c.env.instructions = False  # the warm start taught the format; the opening prompt is "2,6,8>10:" alone
  c.env.max_turns = 3  # a try, a check and the answer (a third call ends the episode: turn_limit)
  c.env.max_turn_tokens = 24  # "<python>9*9*9</python>" is 22 tokens
  # what a program prints, cut to 24 tokens ("-0.047619047619047616\n", the longest value of three numbers
  # from 1-9, is 22); 3 turns of 24 and 2 results of 24 in their tags: 154
  c.env.max_observation_tokens = 24
  c.env.max_tokens = reachable_max_tokens(PlainRenderer(CharTokenizer()), c.env.max_turns, c.env.max_turn_tokens,
                                          "x" * c.env.max_observation_tokens)
  c.env.workers = 2
  c.rollout.max_response_len = 92  # the warm start's longest demonstration, EOS included, is 91 tokens
  c.rollout.prompts_per_step = 16
  c.rollout.group_size = 8
  c.sft.steps = 300
  c.train.steps = 30
  c.eval.n_examples = 64
  return c
