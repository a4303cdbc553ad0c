"""The countdown Python example without the tool: the control arm of the tool comparison.

    python -m jaxrl_llm.train --config=configs/examples/countdown_no_tool.py

Everything as configs/examples/countdown_python.py (model, task, warm start length and share of
wrong demonstrations, RL steps, prompts and samples per step, evaluation) except that there is no
environment: the right demonstrations answer the expression directly, the wrong ones (60%) answer an
expression with one operator swapped, as in the tool arm, and an episode is one turn. The 3-seed
comparison is in docs/benchmarks.md ("Tools").
"""

import os

from jaxrl_llm.cli import load_config_file


def get_config():
  c = load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "countdown_python.py"))
  c.name = "countdown_no_tool"
  c.task.tool_demos = False
  c.env.name = "none"
  c.rollout.max_response_len = 16  # an expression and EOS: at most 6 tokens
  return c
