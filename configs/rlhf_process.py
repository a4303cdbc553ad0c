"""Process supervision on the built-in chained sums: GRPO with per-step advantages from a trained
process reward model, the verifier as gold.

    python -m jaxrl_llm.reward_model --config=configs/process_reward_model.py --workdir=runs/prm_chain
    python -m jaxrl_llm.train --config=configs/rlhf_process.py [--config.data.reward_model=DIR]

The policy writes one running sum per line ("23+8+15=" -> "31\\n46\\n", tasks/chain.py), warm-started on
demonstrations of which sft.wrong_fraction drop every carry (task.chain_errors=every_carry), so the warm
start drops carries when greedy and RL has a systematic mistake to undo. (With one random carry error
per wrong demonstration, the default of the task, a warm start is right when greedy where it has fitted
the data, and RL against the verifier lost greedy accuracy: at temperature 1 a third of its right totals
came after a wrong step, and RL raised those rather than the right chains; docs/benchmarks.md.) The first command
trains the process reward model on such solutions with their per-step labels; the second scores every
line the policy writes with it (p_k = P(step k good) at the token closing line k,
jaxrl_llm/training/model_reward.py) and trains with DeepSeekMath's process advantages
(objective.advantage=grpo_process: step rewards normalised over the group, each token's advantage the
sum of those of the steps ending at or after it; docs/objectives.md eq. 6.10). The verifier still
scores every sample: reward/accuracy and the greedy evaluations are the gold accuracy beside the PRM's
reward/model_mean (the solution's weakest step, data.process_reduce).
"""

from jaxrl_llm.training.defaults import get_config as _base


def get_config():
  c = _base("grpo", name="rlhf_process")
  c.task.name = "chain"
  c.task.digits, c.task.n_numbers = 1, 4  # as configs/process_reward_model.py's data.digits, n_terms
  c.task.chain_errors = "every_carry"  # the module docstring
  c.rollout.max_response_len = 10  # three running sums of up to 2 digits, their newlines, EOS
  c.data.reward = "model"
  c.data.reward_model = "runs/prm_chain"  # the first command's --workdir
  c.objective.advantage = "grpo_process"
  c.train.steps = 40
  c.eval.every = 10
  return c
