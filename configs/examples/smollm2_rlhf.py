"""RLHF on SmolLM2-135M-Instruct: GRPO on its word problems against a trained reward model, the
verifier as gold.

    python -m jaxrl_llm.convert fetch --model smollm2-135m     # once
    python -m jaxrl_llm.reward_model --config=configs/examples/smollm2_reward_model.py --workdir=runs/rm_smollm2
    python -m jaxrl_llm.train --config=configs/examples/smollm2_rlhf.py [--config.data.reward_model=DIR]

configs/examples/smollm2_word_problems.py (the same model, problems, learning rate and steps) with
the reward model's score as the reward (data.reward=model, scored on the device inside the step)
in place of math-verify's, and InstructGPT's k1 KL to the starting policy inside the reward. The
verifier still scores every sample: metrics.jsonl has the proxy (reward/model_mean) beside the gold
(reward/accuracy, and the greedy held-out eval/accuracy every eval.every steps). The measured run is
in docs/benchmarks.md ("RLHF on SmolLM2").
"""

import os

from jaxrl_llm.cli import load_config_file


def get_config():
  c = load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "smollm2_word_problems.py"))
  c.name = "smollm2_rlhf"
  c.data.reward = "model"
  c.data.reward_model = "runs/rm_smollm2"  # the reward model's --workdir
  c.data.reward_norm = "running"
  c.objective.kl_coef, c.objective.kl_placement, c.objective.kl_estimator = 0.05, "reward", "k1"
  # The RL-side knobs, off here (docs/objectives.md, (7.3a) and (7.3b)): objective.kl_target (beta adapted to
  # a KL target, Ziegler et al.), data.reward_clip, data.missing_eos_penalty, and an ensemble
  # (data.reward_model="DIR1,DIR2" with data.reward_model_uncertainty_k).
  c.eval.every = 5
  return c
