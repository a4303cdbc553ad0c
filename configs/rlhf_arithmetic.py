"""RLHF on the built-in arithmetic task: GRPO against a trained reward model, the verifier as gold.

    python -m jaxrl_llm.reward_model --config=configs/reward_model.py --workdir=runs/rm_arithmetic
    python -m jaxrl_llm.train --config=configs/rlhf_arithmetic.py [--config.data.reward_model=DIR]

The first command trains the reward model on the arithmetic preference pairs (a correct answer over a
wrong one; configs/reward_model.py); the second samples with the tiny policy, scores every sample with
that reward model on the device (data.reward=model, jaxrl_llm/training/model_reward.py) and trains on
its scores alone (data.verifier_weight=0). The task's verifier still scores every sample: metrics.jsonl
logs the proxy (reward/model_mean, reward/model_std) beside the gold accuracy (reward/accuracy, and the
greedy evaluations every eval.every steps), so a policy that pleases the reward model without getting
the sums right shows as the two curves parting. The formulas of the reward (normalisation, mixing,
the KL to pi_ref in the reward): jaxrl_llm/reward_model/rl_reward.py.
"""

from jaxrl_llm.training.defaults import get_config as _base


def get_config():
  c = _base("grpo", name="rlhf_arithmetic")
  c.data.reward = "model"
  c.data.reward_model = "runs/rm_arithmetic"  # the first command's --workdir
  c.data.reward_norm = "running"  # the reward model's scale is arbitrary (Bradley-Terry sees differences only)
  # InstructGPT's KL to the warm-started policy inside the reward: R - beta * sum_t (log pi - log pi_ref).
  c.objective.kl_coef, c.objective.kl_placement, c.objective.kl_estimator = 0.05, "reward", "k1"
  # The RL-side knobs, off here (docs/objectives.md, (7.3a) and (7.3b)): objective.kl_target (beta adapted to
  # a KL target, Ziegler et al.), data.reward_clip, data.missing_eos_penalty, and an ensemble
  # (data.reward_model="DIR1,DIR2" with data.reward_model_uncertainty_k).
  # The reward model was trained on these problems' shape (configs/reward_model.py's data.digits, digits2, ops).
  c.task.digits, c.task.digits2, c.task.ops = 2, 1, "+"
  c.train.steps = 40
  c.eval.every = 10  # the gold verifier's greedy accuracy along the way
  return c
