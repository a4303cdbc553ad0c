"""The reward-model run's keys and defaults (`configs/reward_model.py` returns them).

Every key is declared once, with its unit and meaning; the checkpoint block
is built from CheckpointConfig's defaults (checkpointing/config.py documents
each key). The ConfigDict is locked, so a misspelled key is an error.

The defaults are the built-in run: the tiny character model, fresh, learns
the arithmetic task's gold preference (correct answer over a wrong one) in
about a minute on 2 CPU cores.
"""

from __future__ import annotations

import dataclasses

import ml_collections

from jaxrl_llm.checkpointing.config import CheckpointConfig


def reward_model_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.name = "reward_model"  # what the run calls itself (console, summary, default workdir <workdir_root>/<name>-<UTC time>)
  c.objective = "bradley_terry"  # bradley_terry: a score per response from preference pairs {prompt, chosen, rejected} (reward_model/loss.py) | process: a score per reasoning step from stepwise rows {prompt, completions, labels} (reward_model/process.py) | dpo: the policy itself from the pairs, Direct Preference Optimization (objectives/preference.py; the dpo block)
  c.seed = 0  # PRNG seed of the head and fresh trunk init, the pair order and the held-out split
  c.workdir_root = "./runs"  # runs go to <workdir_root>/<name>-<UTC timestamp> unless --workdir is given
  c.init_checkpoint = ""  # the trunk's params from a run's workdir (newest step: a policy or a reward model) or a HF directory of the same model; "": fresh (or model.hf_path's weights)
  c.export = True  # at the end, write <workdir>/hf: a Hugging Face <Family>ForSequenceClassification folder (num_labels 1)

  c.data = ml_collections.ConfigDict()
  c.data.path = ""  # preference rows {prompt, chosen, rejected[, margin]} (objective=process: stepwise rows {prompt, completions, labels}), .jsonl or .parquet; "": the built-in arithmetic pairs (process: the built-in chained sums)
  c.data.eval_path = ""  # held-out rows; "": hold out data.eval_fraction of data.path (by prompt)
  c.data.eval_fraction = 0.2  # held-out share of the rows (file) or of the problem space (built-in)
  c.data.chat_template = False  # plain-text rows: wrap the prompt as a user message with the tokenizer's chat template (message rows always use it)
  c.data.max_len = 0  # tokens per sequence (prompt + response + EOS), right-padded; longer ones are an error; 0: the longest, rounded up to a multiple of 8
  c.data.n_train = 4000  # built-in: training pairs (the training problems in reshuffled passes; label noise is drawn per pair)
  c.data.n_eval = 256  # built-in: held-out pairs, at most one per held-out problem
  c.data.task = "arithmetic"  # built-in pairs: arithmetic (a carry error rejected) | word_problems (the SmolLM2 example's task; another operation's result rejected)
  c.data.max_number = 20  # built-in, data.task=word_problems: operands drawn from [2, max_number]
  c.data.digits = 2  # built-in, data.task=arithmetic: first operand size in decimal digits
  c.data.digits2 = 1  # built-in, data.task=arithmetic: second operand size in decimal digits; 0: same as data.digits
  c.data.ops = "+"  # built-in, data.task=arithmetic: operators drawn, a subset of "+-*"
  c.data.n_terms = 3  # built-in, objective=process: summands per chained sum (tasks/chain.py; data.digits is their size)
  c.data.step_separator = "\n"  # objective=process: the text closing every step; its last token carries the step's label (TRL's step_separator)
  c.data.end_step = False  # objective=process: one more labelled step per solution, the tokenizer's EOS after its last step, labelled good when the solution is complete and every step good (reward_model/process.py): a solution that stops early then scores low at its end, though each of its steps is good
  c.data.truncated_fraction = 0.0  # built-in, objective=process, needs data.end_step: share of the solutions cut after a random step before the last (their steps keep their labels, the end step is bad; a file's rows say 'complete' themselves)
  c.data.step_errors = "carry"  # built-in, objective=process: the mistake of a wrong solution's first wrong step: carry (the carry error) | varied (a carry error, a units digit off by 1-9, or another number, a third each; reward_model/process.py)
  c.data.label_noise = 0.0  # built-in: share of training pairs whose chosen and rejected are swapped (process: of step labels flipped; seeded); held-out rows never are

  c.model = ml_collections.ConfigDict()
  c.model.hf_path = ""  # a Hugging Face checkpoint directory (architecture, tokenizer, weights); empty: the tiny model below
  c.model.d_model = 64  # tiny model: residual width D
  c.model.n_layers = 2  # tiny model: layers L
  c.model.n_heads = 4  # tiny model: query heads N
  c.model.n_kv_heads = 2  # tiny model: key/value heads K
  c.model.d_ff = 128  # tiny model: SwiGLU hidden width F
  c.model.vocab_multiple = 1  # tiny model: vocabulary rounded up to a multiple of this
  c.model.param_dtype = "float32"  # dtype of the trained params
  c.model.compute_dtype = "float32"  # dtype the matmuls run in
  c.model.remat = "auto"  # none | full | save_dots | auto (full for model.hf_path, none for the tiny model)
  c.model.attention_impl = "auto"  # auto | xla | splash (model/splash.py): splash on TPU, xla elsewhere

  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = -1  # devices on the data axis (pairs); -1: all devices not used by the others
  c.mesh.fsdp = 1  # devices on the fsdp axis (params sharded)
  c.mesh.tensor = 1  # devices on the tensor axis (heads, MLP, vocabulary)

  c.train = ml_collections.ConfigDict()
  c.train.steps = 400  # optimizer steps
  c.train.batch_size = 128  # pairs per step (a multiple of mesh.data x mesh.fsdp)
  c.train.micro_batch_size = 0  # rows per forward/backward inside a step (gradients summed exactly: learn/learner.py); 0: the whole batch; divides train.batch_size, a multiple of mesh.data x mesh.fsdp
  c.train.lr = 3e-3  # peak learning rate (linear warm-up, then cosine decay to train.lr_decay_to)
  c.train.warmup_steps = 30  # optimizer steps of linear warm-up
  c.train.lr_decay_to = 0.1  # share of train.lr at the last step; 1: constant
  c.train.weight_decay = 0.1  # AdamW decoupled weight decay (the built-in pairs are learned as a rule, not by heart, with it)
  c.train.b1 = 0.9  # Adam beta1
  c.train.b2 = 0.99  # Adam beta2
  c.train.clip_norm = 1.0  # global gradient-norm clip; 0 disables
  c.train.margin = 0.0  # Bradley-Terry margin m of pairs without a margin of their own: -log sigmoid(r_c - r_r - m)
  c.train.center_coef = 0.0  # centring penalty coef * mean((r_c + r_r)^2) (TRL's center_rewards_coefficient); 0 off
  c.train.last_step_only = False  # objective=process: train on each solution's last step label only (TRL's train_on_last_step_only; held-out rows keep every step)

  c.eval = ml_collections.ConfigDict()
  c.eval.every = 100  # also score the held-out pairs every this many steps; 0: at the start and the end only

  c.log = ml_collections.ConfigDict()
  c.log.every = 10  # write metrics.jsonl and a console line every this many steps (and the last)

  c.dpo = ml_collections.ConfigDict()  # objective=dpo only
  c.dpo.beta = 0.1  # beta of the implicit reward beta * log(pi / pi_ref), per sequence (Rafailov et al. 2023 use 0.1-0.5)
  c.dpo.loss_type = "sigmoid"  # sigmoid: DPO (with label_smoothing: conservative DPO) | robust: rDPO, unbiased under label noise eps | ipo: IPO's squared loss (m / beta - 1 / (2 beta))^2
  c.dpo.label_smoothing = 0.0  # eps in [0, 0.5): the assumed share of flipped labels (sigmoid, robust); 0 for ipo
  c.dpo.reference = ""  # pi_ref: "" the initial policy (fresh, model.hf_path or init_checkpoint), frozen; else a run's workdir (newest step) or a HF directory of the same model

  c.checkpoint = ml_collections.ConfigDict()
  for f in dataclasses.fields(CheckpointConfig):
    c.checkpoint[f.name] = f.default
  c.checkpoint.every_steps = 200  # (CheckpointConfig's 50 is for RL steps, each far longer)
  c.lock()
  return c
