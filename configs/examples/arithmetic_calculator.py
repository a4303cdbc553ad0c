"""Multi-turn episodes with a tool on the embedded default: addition with a calculator.

    python -m jaxrl_llm.train --config=configs/examples/arithmetic_calculator.py

The default model (character tokenizer, D 128, 4 layers) and the built-in arithmetic task (a 2-digit
plus a 1-digit number), nothing downloaded. Each sample is an episode of the "calculator" environment
in the plain tag format (envs/calls.py): the model may write "<calc>47+8</calc>", the turn stops at
the closing tag, the environment answers "<result>55</result>"
(computed in a tool worker process, envs/pool.py), and the next turn gives the final answer, scored by
the task's verifier. The warm start's right demonstrations call the calculator, its wrong ones (60%)
answer from memory with the carry dropped (task.tool_demos), so RL can learn that calling the tool
pays. The loss weighs the model's own tokens only: "<result>55</result>" is context for the last
turn, with zero weight (dump a step with --config.log.dump_steps='(1,)' and look at it with
`python -m jaxrl_llm.inspect`: the environment's tokens are grey). metrics.jsonl counts how the
episodes ended (env/status_answer, env/status_malformed_call, ...).

One run (seed 0, 2 CPU cores shared with other jobs, load about 8): the warm start took 527 s, the 30
RL steps 5-20 s each, 986 s in all; the train reward went from 0.19 to 0.53, the turns per episode
from 1.23 to 1.76 (more calls), and the greedy held-out accuracy of whole episodes from 0.06 to 0.92.
A shorter warm start (150 steps of 64) left too few working calls: the policy learned to answer
without the tool instead (0.05 -> 0.14). These runs (and docs/benchmarks.md's "Tools") had 3 turns
of 24 tokens in 64, where a second call and its result never left room for a third turn (the episode
ended context_overflow); the limits below allow what fits, 2 turns (a second call ends turn_limit),
the same episodes with the status that says why.
"""

from jaxrl_llm.envs.episode import reachable_max_tokens
from jaxrl_llm.envs.render import PlainRenderer
from jaxrl_llm.model.tokenizer import CharTokenizer
from jaxrl_llm.training.defaults import get_config as _base


def get_config():
  c = _base("gspo", name="arithmetic_calculator")
  c.task.tool_demos = True
  c.env.name = "calculator"
  c.env.call_format = "tags"
  c.env.instructions = False  # the warm start taught the format; the opening prompt is "47+8=" alone
  c.env.max_turns = 2  # a call and, after its result, the answer (a second call ends the episode: turn_limit)
  c.env.max_turn_tokens = 20  # "<calc>99+9</calc>" is 17 tokens
  # 2 turns of 20 and "<result>108</result>" (99 + 9, the largest sum) between them: 60
  c.env.max_tokens = reachable_max_tokens(PlainRenderer(CharTokenizer()), c.env.max_turns, c.env.max_turn_tokens,
                                          str(10**c.task.digits - 1 + 10**c.task.digits2 - 1))
  c.env.workers = 2
  c.rollout.max_response_len = 42  # the warm start's longest demonstration, EOS included, is 41 tokens
  c.rollout.prompts_per_step = 16
  c.rollout.group_size = 8
  c.sft.steps = 200  # shorter or smaller warm starts leave too few calls that work for RL to find
  c.train.steps = 30
  c.eval.n_examples = 64
  return c
