"""A process reward model: a score per reasoning step, from stepwise labels. On the built-in chained
sums (tasks/chain.py: one running sum per line, half the solutions with a mistake that propagates, a
quarter cut early) with the tiny model.

    python -m jaxrl_llm.reward_model --config=configs/process_reward_model.py --workdir=runs/prm_chain
    python -m jaxrl_llm.reward_model --config=configs/process_reward_model.py --config.data.path=steps.jsonl

A file holds TRL's stepwise rows {prompt, completions: [step, ...], labels: [bool, ...]}. The run logs the
held-out step accuracy and the share of solutions whose first wrong step it finds
(first_error_accuracy), and exports a transformers token classifier (<workdir>/hf). RL against it:
configs/rlhf_process.py. Keys and their meaning: jaxrl_llm/reward_model/defaults.py.
"""

from jaxrl_llm.reward_model.defaults import reward_model_config


def get_config():
  c = reward_model_config()
  c.name = "prm_chain"
  c.objective = "process"
  c.data.digits, c.data.n_terms = 1, 4  # the chained sums configs/rlhf_process.py's policy writes (three steps)
  # RL against a PRM that saw only whole solutions with carry errors learned to stop after one line, and
  # with an end step, to write units-digit errors: both holes closed, it gains as the verifier does
  # (docs/benchmarks.md, "Process rewards that help").
  c.data.end_step = True  # the EOS after the last step labelled with the outcome (complete and right)
  c.data.truncated_fraction = 0.25  # a quarter of the solutions cut early: their end step bad
  c.data.step_errors = "varied"  # a carry error, a units digit off, or another number
  return c
