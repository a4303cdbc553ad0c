"""The run config's keys and defaults: the shared base of every method config.

Each `configs/<method>.py` calls `get_config(method)` and may change a few
values. Every key is declared once, with its unit and meaning: here, or, for
the sections whose dataclass carries its own defaults (`checkpoint`,
`teacher`, `guard`, `env`, `env.tools`, `objective`, `rollout.mismatch`, `rollout.server`), in that
dataclass, from which the block is built (tests/training/test_config_keys.py
checks that no key is declared twice).
The returned ConfigDict is locked, so a misspelled key (in a file or on the
command line) is an error. The trainer converts it once into frozen,
validated dataclasses (`jaxrl_llm/training/config.py`).

The defaults are the embedded demo: a tiny character model on 2-digit
addition, warm-started by SFT on partly wrong demonstrations, then RL.
"""

from __future__ import annotations

import ml_collections

from jaxrl_llm.checkpointing.config import CheckpointConfig
from jaxrl_llm.envs.config import EnvConfig
from jaxrl_llm.envs.pool import ToolLimits
from jaxrl_llm.model.config import LoraConfig
from jaxrl_llm.sampling.config import ServerConfig
from jaxrl_llm.sampling.mismatch import SamplerMismatch
from jaxrl_llm.teacher.config import TeacherConfig
from jaxrl_llm.training.guards import GuardConfig


def section_block(cls) -> ml_collections.ConfigDict:
  """A config section with the fields and defaults of the dataclass `cls`
  (the dataclass documents each field). A field whose default is itself a
  section dataclass (env.tools) is left out: its own `section_block` fills it."""
  import dataclasses

  block = ml_collections.ConfigDict()
  for f in dataclasses.fields(cls):
    if not dataclasses.is_dataclass(f.default):
      block[f.name] = f.default
  return block


def objective_block(method: str) -> ml_collections.ConfigDict:
  """Every knob of the objectives preset `method`, at the preset's values.

  Written out in full so the resolved config shows the exact objective; a knob
  is changed with `--config.objective.<knob>=...`. If the method name is not a
  preset the block is left empty and validation names the allowed methods.
  """
  import dataclasses

  from jaxrl_llm import objectives

  block = ml_collections.ConfigDict()
  if method in objectives.PRESETS:
    for f in dataclasses.fields(objectives.get_preset(method)):
      value = getattr(objectives.get_preset(method), f.name)
      if value is None:  # typed placeholder, so the command line can set it
        kind = int if str(f.type).startswith("int") else float
        value = ml_collections.config_dict.placeholder(kind)
      block[f.name] = value
  return block


def get_config(method: str = "gspo", name: str | None = None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.method = method  # objectives preset name: one of jaxrl_llm.objectives.PRESETS
  c.name = name or method  # what the run calls itself (summary, console, workdir): the method, or a recipe on it
  c.seed = 0  # PRNG seed of init, sampling, data order and the task split
  c.workdir_root = "./runs"  # runs go to <workdir_root>/<method>-<UTC timestamp> unless --workdir is given
  c.init_checkpoint = ""  # new run's params from a run workdir (newest step) or a HF directory; "" = fresh init

  # ---- task and data -------------------------------------------------------
  c.task = ml_collections.ConfigDict()
  c.task.name = "arithmetic"  # a task of tasks/registry.py: arithmetic | countdown | chain (chained sums, one running sum per line: steps for process rewards) | word_problems | word_problems_qa (the same, plain "Question: ...\nAnswer:" prompts for a base model) | file (prompts from data.path)
  c.task.digits = 2  # arithmetic: first operand size in decimal digits; chain: summand size
  c.task.digits2 = 1  # arithmetic: second operand size in decimal digits; 0: same as task.digits
  c.task.ops = "+"  # arithmetic: operators drawn, a subset of "+-*"
  c.task.n_numbers = 3  # countdown: numbers to combine; chain: summands (n_numbers - 1 steps)
  c.task.max_number = 9  # countdown: numbers drawn from [1, max_number]; word_problems: operands from [2, max_number]
  c.task.eval_fraction = 0.2  # share of the problem space (or of the file's rows) held out for eval
  c.task.n_train = 20000  # examples in the training pool (built-in tasks; files use every row)
  c.task.chain_errors = "one"  # chain: what a wrong demonstration (sft.wrong_fraction of them) gets wrong: one (one random step's carry error, the rest continued from it) | every_carry (every step with a carry drops it, as the arithmetic task's wrong demonstrations: a well-fitted warm start then drops carries when greedy, tasks/chain.py)
  c.task.tool_demos = False  # arithmetic: the warm start's right demonstrations call the calculator in the tag format (<calc>47+68</calc><result>115</result>115; env.name=calculator, env.call_format=tags); the wrong ones answer without it

  c.data = ml_collections.ConfigDict()
  c.data.path = ""  # task.name=file: training rows, .jsonl or .parquet
  c.data.eval_path = ""  # task.name=file: held-out rows; empty: hold out task.eval_fraction of data.path
  c.data.prompt_key = "prompt"  # row key of the prompt text (a user message for the chat template)
  c.data.answer_key = "answer"  # row key of the reference answer given to the verifier
  c.data.tag_key = ""  # row key of the task tag (teacher.route_by_tag); "": every row is tagged "file"
  c.data.reward = "auto"  # auto (the task's own) or a reward of tasks/registry.py: arithmetic | countdown | math_verify; model: the reward model data.reward_model (the task's own verifier stays the gold accuracy)
  c.data.reward_model = ""  # data.reward=model: a reward model's workdir (python -m jaxrl_llm.reward_model), newest step, or several comma-separated (an ensemble); "": none
  c.data.reward_model_weight = 1.0  # data.reward=model: w_rm in R = w_rm * norm(r_rm) + w_v * r_verifier (reward_model/rl_reward.py; InstructGPT's KL in the reward: objective.kl_placement=reward)
  c.data.verifier_weight = 0.0  # data.reward=model: w_v, the verifier's (task's own) reward mixed in; 0: the reward model alone
  c.data.reward_norm = "none"  # data.reward=model: norm(r_rm): none | running (mean/std of every score so far, checkpointed) | group (mean/std of the prompt's G samples)
  c.data.process_reduce = "min"  # data.reward=model with a process reward model: a solution's r_rm from its steps' P(good): min (Math-Shepherd) | prod (Lightman et al.); each step's own P(good) is its reward under objective.advantage=grpo_process
  c.data.reward_model_uncertainty_k = 0.0  # data.reward=model with several reward models (data.reward_model="a,b,..."): r_rm = mean - k * std over the members (population std, ddof 0); 0: their mean
  c.data.reward_clip = 0.0  # data.reward=model: c > 0 clips norm(r_rm) to [-c, c] (after data.reward_norm, before the weights); 0: off
  c.data.missing_eos_penalty = 0.0  # subtracted from the reward of a sample cut at its length limit without EOS (TRL's missing_eos_penalty; any data.reward); 0: off
  c.data.format_weight = 0.0  # reward bonus for a well-formed final answer (0 disables)
  c.data.reward_timeout_s = 5.0  # seconds one reward call may take; past it: reward 0, counted
  c.data.reward_workers = 0  # reward worker processes; 0 scores in the trainer process
  c.data.max_prompt_len = 0  # tokens; prompts are left-padded to this, longer ones are an error; 0: the longest train or eval prompt (chat template included) rounded up to a multiple of 8 (built-in arithmetic: "47+8=" is 5, so 8)
  c.data.chat_template = False  # wrap the prompt as a user message with the tokenizer's chat template

  # ---- model -----------------------------------------------------------------
  c.model = ml_collections.ConfigDict()
  c.model.hf_path = ""  # a Hugging Face checkpoint directory; empty: the tiny model below from scratch
  c.model.d_model = 128  # tiny model: residual width D
  c.model.n_layers = 4  # tiny model: layers L
  c.model.n_heads = 4  # tiny model: query heads N
  c.model.n_kv_heads = 4  # tiny model: key/value heads K
  c.model.d_ff = 256  # tiny model: SwiGLU hidden width F
  c.model.vocab_multiple = 1  # tiny model: vocabulary rounded up to a multiple of this (tensor parallelism needs V % mesh.tensor == 0); the padded ids are never sampled
  c.model.param_dtype = "float32"  # dtype of the trained params
  c.model.compute_dtype = "float32"  # dtype the trainer's matmuls run in
  c.model.remat = "auto"  # none | full | save_dots | auto: activation recompute in the backward pass; auto: full for a checkpoint model (model.hf_path), none for the tiny one
  c.model.attention_impl = "auto"  # auto | xla | splash: attention of the full-sequence passes (update, recomputes, SFT); splash is jax's Pallas TPU kernel (model/splash.py); auto: splash on TPU, xla elsewhere; decoding always xla
  # LoRA / QLoRA (model/lora.py; the fields: model/config.py's LoraConfig): rank 0 trains the full model; rank r
  # puts adapters on model.lora.targets, only they train, and the frozen base (quantised with model.lora.quant) is the KL reference
  c.model.lora = section_block(LoraConfig)

  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = -1  # devices on the data axis (batch); -1: all devices not used by the others
  c.mesh.fsdp = 1  # devices on the fsdp axis (params sharded)
  c.mesh.tensor = 1  # devices on the tensor axis (heads, MLP)

  c.kernels = ml_collections.ConfigDict()
  c.kernels.impl = "auto"  # vocabulary ops (log-probs, entropy, Score Centering top-k, TRM KL, distillation): auto | pallas | xla_chunked | naive (naive materialises [B, R, V]; pallas is Triton on GPU, Mosaic on TPU, and the Triton kernels interpreted elsewhere)

  # ---- SFT warm start ---------------------------------------------------------
  c.sft = ml_collections.ConfigDict()
  c.sft.steps = 300  # supervised steps before RL; 0 skips the warm start
  c.sft.batch_size = 128  # demonstrations per step
  c.sft.micro_batch_size = 0  # demonstrations per forward/backward inside a step (gradients summed exactly: learn/learner.py); 0: the whole batch; divides sft.batch_size, a multiple of mesh.data x mesh.fsdp
  c.sft.lr = 1e-3  # peak learning rate (warm-up then cosine decay to 10%); 3e-3 under-fits (docs/benchmarks.md)
  c.sft.warmup_steps = 50  # linear LR warm-up, steps: step k at lr * (k + 1) / warmup_steps (optim.warmup_schedule)
  c.sft.wrong_fraction = 0.6  # share of demonstrations that are systematically wrong (carry dropped)

  # ---- rollout -------------------------------------------------------------
  c.rollout = ml_collections.ConfigDict()
  c.rollout.engine = "builtin"  # what samples the rollouts: a name of sampling/engine.py's registry
  c.rollout.prompts_per_step = 64  # prompts per RL step
  c.rollout.group_size = 8  # samples per prompt (G)
  c.rollout.max_response_len = 6  # tokens generated per sample (R), EOS included
  c.rollout.temperature = 1.0  # sampling temperature
  c.rollout.top_k = 0  # sample from the k most likely tokens; 0 disables
  c.rollout.top_p = 1.0  # nucleus sampling mass; 1 disables
  c.rollout.sampler_dtype = "float32"  # float32 | bfloat16: a lower-precision sampler makes mu != pi_prox
  c.rollout.sampler_sharding = "fsdp"  # built-in engine: fsdp (sample with the params as the trainer splits them: each decode step gathers the fsdp-split weights or, as XLA:TPU chooses, reduces every row's partial sums over fsdp) | tensor (at each sync gather them over fsdp into a copy in sampler_dtype split over tensor only: one all-gather per step, more memory; each decode step reads 1/tensor of every weight: 3.3x slower than fsdp for Qwen3-8B on a v5p 4x4x4 slice, docs/tpu.md's decode layouts)
  c.rollout.staleness = 0  # k: step s samples with the params step s-k started from (PipelineRL-k; k updates ago with one update per step); 0 is on-policy
  c.rollout.overlap = False  # generate the next k = staleness steps' batches in the background while step s updates (a queue of depth k >= 1; the same samples as the synchronous run with that staleness; training/async_rollout.py)
  c.rollout.continuous_slots = 0  # 0: each step's samples decode as one static batch (every row waits for the longest); N: N slots, each taking the next queued sample when its own ends (continuous batching, sampling/continuous.py; long-tailed response lengths); with an environment, each episode holds a slot and its turns run as they come, not in lock-step rounds (sampling/episode_slots.py; one process only)
  c.rollout.decode_chunk = 16  # continuous batching: decode steps between two looks at which samples ended
  c.rollout.exact = False  # record log mu with the trainer's row-wise full-sequence program (sampling/exact.py), and recompute log pi_prox / pi_ref each row alone (model/invariant.py): log mu == log pi_prox bit for bit on-policy, in any micro-batch, layout or data-axis size; built-in engine, top_k 0, top_p 1, record_topk 0
  c.rollout.record_topk = 0  # sampler's top-k log-probs kept per token (Score Centering's top-k form); 0: none
  # Mismatch on purpose (built-in engine), combinable with sampler_dtype and staleness: quant, quant_group,
  # noise, noise_seed, each documented in sampling/mismatch.py (SamplerMismatch).
  c.rollout.mismatch = section_block(SamplerMismatch)
  # External engine 'openai' (sampling/openai_engine.py: an OpenAI-compatible completions server, llama.cpp's):
  # url, model, command, export, sync, sync_every, ..., the check of every sync (sync_check, sync_check_tol,
  # sync_timeout_s), each documented in sampling/config.py (ServerConfig).
  c.rollout.server = section_block(ServerConfig)

  # ---- multi-turn episodes with tools: jaxrl_llm/envs/config.py documents each key ----
  # env.name = "none": single-turn samples (every run before environments, unchanged). Otherwise each
  # sample is an episode of that environment (training/episodes.py): turns of at most env.max_turn_tokens,
  # env.max_tokens after the opening prompt in all, tools run under env.tools' limits.
  c.env = section_block(EnvConfig)
  c.env.tools = section_block(ToolLimits)  # one tool call's limits, each documented in jaxrl_llm/envs/pool.py

  # ---- filters and reward shaping ---------------------------------------------
  c.filters = ml_collections.ConfigDict()
  c.filters.dynamic_sampling = False  # DAPO: drop groups whose rewards are all equal, refill by sampling more
  c.filters.max_refill_rounds = 3  # bound on extra sampling rounds per step when refilling
  c.filters.overlong_filter = False  # mask out of the loss samples cut at max_response_len (no EOS)
  c.filters.overlong_buffer = 0  # DAPO soft overlong penalty: tokens before max_response_len where it starts; 0 off
  c.filters.overlong_penalty = 1.0  # reward subtracted at max_response_len, linear over the buffer

  # ---- update ------------------------------------------------------------------
  c.train = ml_collections.ConfigDict()
  c.train.steps = 160  # RL steps (one batch of rollouts each)
  c.train.epochs = 1  # passes over each batch (K)
  c.train.mini_batches = 1  # optimizer updates per pass: the batch is split into this many mini-batches
  c.train.prox = "recompute"  # log pi_prox: recompute (one forward pass over the batch before its updates) | detach (the update's own log-probs, gradient stopped: the same number at one update per batch, a pass fewer; not with several updates, GAE or a KL to the reference)
  c.train.micro_batch_size = 0  # samples per forward/backward inside a mini-batch; 0: from micro_batch_tokens
  c.train.pack = "auto"  # the update's and the recompute's rows packed end to end in fixed buffers, each row (or group sharing a prompt) a document its tokens alone attend within (exact; model/packing.py): auto (where it costs fewer forward FLOPs than padding, by 10%: long-tailed response lengths) | on (always) | off
  c.train.pack_length = 0  # slots per packing buffer; 0: the cheapest in forward FLOPs of 1, 1.5 and 2 padded sequences (prompt + response, or prompt + G responses when shared), chosen per micro-batch set
  c.train.share_prompt = "auto"  # run each group's prompt once in the update's and the recompute's forward passes, its G responses attending to it (exact; model/logprobs.response_hidden): auto (where micro- and mini-batches hold whole groups and it costs fewer FLOPs: long prompts, short responses) | on (always; refuse a config without whole groups) | off
  c.train.micro_batch_tokens = 0  # with micro_batch_size 0: the largest micro-batch of at most this many tokens (prompt + response) that divides the mini-batch; 0: 2048 for a checkpoint model (model.hf_path), the whole mini-batch for the tiny one
  c.train.lr = 3e-4  # peak learning rate (linear warm-up, then train.lr_decay_to)
  c.train.warmup_steps = 10  # optimizer updates of linear warm-up: update k at lr * (k + 1) / warmup_steps; 0: lr from the first
  c.train.lr_decay_to = 0.1  # after warm-up, cosine decay to this share of train.lr at the last update; 1: constant
  c.train.weight_decay = 0.0  # AdamW decoupled weight decay
  c.train.b1 = 0.9  # Adam beta1
  c.train.b2 = 0.99  # Adam beta2
  c.train.clip_norm = 1.0  # global gradient-norm clip; 0 disables
  c.train.value_lr = 1e-3  # PPO: learning rate of the value head (its loss weight and clip are objective knobs)

  # ---- evaluation and logging ------------------------------------------------
  c.eval = ml_collections.ConfigDict()
  c.eval.n_examples = 256  # held-out examples scored greedily at the start and the end
  c.eval.every = 0  # also evaluate every this many RL steps; 0: start and end only
  c.eval.batch_size = 256  # examples greedy-decoded at once (rounded up to the mesh's batch shards): lower it where the evaluation's prefill or decode does not fit (python -m jaxrl_llm.compile says so); result-changing on resume (another batch shape can move the greedy answers' last bits)

  # ---- runs without a learning signal (training/guards.py) ---------------------------
  c.guard = section_block(GuardConfig)

  c.log = ml_collections.ConfigDict()
  c.log.progress = True  # show a progress bar
  c.log.every = 1  # write metrics.jsonl every this many RL steps (and at every step with an evaluation)
  c.log.kl_to_ref = True  # log KL(pi || pi_ref) even when objective.kl_coef = 0 (one extra forward per step)
  c.log.dump_steps = ()  # RL steps (1-based) whose batch and per-token factors go to <workdir>/dumps (python -m jaxrl_llm.inspect)

  # ---- checkpoints and resume: jaxrl_llm/checkpointing/config.py documents each key ----
  # A run whose workdir holds checkpoints resumes from the newest intact one.
  c.checkpoint = section_block(CheckpointConfig)

  # ---- teacher (on-policy distillation, SDPO, SRPO, RLSD): jaxrl_llm/teacher/config.py ----
  c.teacher = section_block(TeacherConfig)

  # Every knob of the master equation (jaxrl_llm/objectives/config.py documents
  # each one), at the values of the `method` preset; `name` records the preset.
  c.objective = objective_block(method)
  c.lock()
  return c
