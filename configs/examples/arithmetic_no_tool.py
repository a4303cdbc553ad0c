"""The calculator example without the calculator: the control arm of the tool comparison.

    python -m jaxrl_llm.train --config=configs/examples/arithmetic_no_tool.py

Everything as configs/examples/arithmetic_calculator.py (model, task, warm start length and share of
wrong demonstrations, RL steps, prompts and samples per step, evaluation) except that there is no
environment: the right demonstrations answer directly ("115"), the wrong ones (60%) drop the carry as
before, and an episode is one turn. The same budget of SFT and RL steps and samples, so the two runs
measure what the tool adds. The 3-seed comparison is in docs/benchmarks.md ("Tools").
"""

import os

from jaxrl_llm.cli import load_config_file


def get_config():
  c = load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "arithmetic_calculator.py"))
  c.name = "arithmetic_no_tool"
  c.task.tool_demos = False
  c.env.name = "none"
  return c
