"""Supervised warm start on demonstrations (some of them wrong on purpose).

Teacher-forced cross-entropy on the response tokens (demo + EOS) only, as a
loss of the learner (learn/learner.py): `sft.micro_batch_size` splits a
step's batch into micro-batches whose gradients sum to the batch's. The
built-in tasks make a configurable share of demos systematically wrong, so
imitation plateaus below what the verifier can teach during RL.
"""

from __future__ import annotations

import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.model import lora
from jaxrl_llm import faults
from jaxrl_llm.checks import ConfigError, bad, check_float, check_int
from jaxrl_llm.learn.learner import POLICY, Group, LearnSpec, Learner, LossOut, Slot, make_learner
from jaxrl_llm.objectives.aggregation import WeightedSum
from jaxrl_llm.tasks.base import Example
from jaxrl_llm.model import sharding as sharding_lib
from jaxrl_llm.model.logprobs import response_logprobs
from jaxrl_llm.tasks.pipeline import encode_prompts
from jaxrl_llm.learn.optim import adamw, warmup_schedule

@dataclasses.dataclass(frozen=True)
class SFTConfig:
  """The run config's `sft` section (keys documented in training/defaults.py)."""

  steps: int
  batch_size: int
  lr: float
  warmup_steps: int
  wrong_fraction: float
  micro_batch_size: int

  def __post_init__(self):
    check_int("config.sft.steps", self.steps, 0)
    check_int("config.sft.batch_size", self.batch_size, 1)
    check_int("config.sft.micro_batch_size", self.micro_batch_size, 0)
    if self.micro_batch_size and self.batch_size % self.micro_batch_size:
      raise bad("config.sft.micro_batch_size", self.micro_batch_size,
                f"must divide sft.batch_size={self.batch_size}; 0 uses the whole batch")
    check_float("config.sft.lr", self.lr, 0.0, 1.0, low_open=True)
    check_int("config.sft.warmup_steps", self.warmup_steps, 0)
    check_float("config.sft.wrong_fraction", self.wrong_fraction, 0.0, 1.0)


@dataclasses.dataclass(frozen=True)
class SFTPlan:
  """One supervised run: how long, how fast, on which shapes (built from a RunConfig by `sft_plan`)."""

  steps: int  # optimizer steps; 0: none
  batch_size: int  # demonstrations per step
  micro_batch_size: int  # demonstrations per forward/backward inside a step (exact accumulation)
  lr: float  # peak learning rate (linear warm-up, cosine decay to 10%)
  warmup_steps: int
  max_prompt_len: int  # prompts left-padded to this
  max_response_len: int  # demonstrations (EOS included) right-padded to this
  seed: int  # the demonstrations' draw
  impl: str  # kernels.impl of the log-probs
  chat_template: bool  # prompts wrapped as a user message


def sft_plan(cfg) -> SFTPlan:
  """The warm start of the run config `cfg` (sections sft, data, rollout, kernels)."""
  return SFTPlan(steps=cfg.sft.steps, batch_size=cfg.sft.batch_size,
                 micro_batch_size=cfg.sft.micro_batch_size or cfg.sft.batch_size, lr=cfg.sft.lr, warmup_steps=cfg.sft.warmup_steps,
                 max_prompt_len=cfg.data.max_prompt_len, max_response_len=cfg.rollout.max_response_len,
                 seed=cfg.seed, impl=cfg.kernels.impl, chat_template=cfg.data.chat_template)


def encode_responses(tokenizer, texts, max_response_len: int) -> tuple[np.ndarray, np.ndarray]:
  """Right-padded response tokens followed by EOS: (tokens_BR, mask_BR)."""
  B = len(texts)
  tokens_BR = np.full((B, max_response_len), tokenizer.pad_id, np.int32)
  mask_BR = np.zeros((B, max_response_len), bool)
  for b, text in enumerate(texts):
    ids = tokenizer.encode(text) + [tokenizer.eos_id]
    if len(ids) > max_response_len:
      raise ValueError(f"demonstration {text!r} is {len(ids)} tokens with EOS, more than "
                       f"rollout.max_response_len={max_response_len}")
    tokens_BR[b, :len(ids)] = ids
    mask_BR[b, :len(ids)] = True
  return tokens_BR, mask_BR


def sft_loss(trees: dict, mb, aux, norm, *, model_cfg, impl: str) -> LossOut:
  """The mean negative log-likelihood of the demonstrations' tokens, a `LossFn` of the learner
  (learn/learner.py): this micro-batch's share of -sum(log p * m) / max(sum(m), 1) over the step's batch."""
  del aux
  prompt_BP, prompt_mask_BP, resp_BR, resp_mask_BR = mb
  lp = response_logprobs(trees[POLICY], model_cfg, prompt_BP, prompt_mask_BP, resp_BR, resp_mask_BR,
                         temperature=1.0, impl=impl)
  m = resp_mask_BR.astype(jnp.float32)
  num = -jnp.sum(lp.logp_BR * m) / norm
  return LossOut(objective=num, loss=WeightedSum(num, jnp.sum(m) / norm))


def sft_norm(batch) -> jax.Array:
  """The step's token count (at least 1), the loss's normaliser over every micro-batch."""
  return jnp.maximum(jnp.sum(batch[3].astype(jnp.float32)), 1.0)


def sft_optimizer(plan: SFTPlan):
  """The warm start's AdamW: warmup, then decay to a tenth of `plan.lr` over its steps."""
  return adamw(warmup_schedule(plan.lr, plan.warmup_steps, plan.steps, decay_to=0.1), b1=0.9, b2=0.99,
               weight_decay=0.0, clip_norm=1.0)


def sft_learner(model_cfg, plan: SFTPlan, tx, params, opt_state, batch_sharding) -> Learner:
  """The SFT step on the learner for params and opt_state placed as given: apply(slots, frozen,
  (prompt_BP, prompt_mask_BP, resp_BR, resp_mask_BR), None) -> (slots, loss); slots are donated."""
  spec = LearnSpec(loss_fn=functools.partial(sft_loss, model_cfg=model_cfg, impl=plan.impl), norms_fn=sft_norm,
                   groups=(Group(POLICY, tx, lora=True),),  # a LoRA model trains its adapters only (model/lora.py)
                   n_micro=plan.batch_size // plan.micro_batch_size, report=lambda out: out.loss.value())
  return make_learner(spec, *sft_slots(params, opt_state), batch_sharding)


def sft_slots(params, opt_state) -> tuple[dict, dict]:
  """The learner's (slots, frozen) of the policy's params and its optimizer state."""
  trainable, frozen = lora.partition(params)
  return {POLICY: Slot(trainable, opt_state)}, {POLICY: frozen}


def run_sft(params, model_cfg, examples: list[Example], tokenizer, plan: SFTPlan, *, mesh, log=print):
  """Returns (params, {'sft_loss_start', 'sft_loss_end', 'sft_time_s'})."""
  steps = plan.steps
  if steps == 0:
    return params, {"sft_steps": 0}
  shards = sharding_lib.batch_shards(mesh)
  if plan.micro_batch_size % shards:
    raise ConfigError(f"config.sft.micro_batch_size={plan.micro_batch_size} (0: sft.batch_size) must be a multiple "
                      f"of the {shards} batch shards of the mesh (mesh.data x mesh.fsdp)")
  tx = sft_optimizer(plan)
  opt_state = sharding_lib.onto_mesh(tx.init(lora.trainable(params)), mesh)
  rows = sharding_lib.batch_sharding(mesh, ndim=1)
  learner = sft_learner(model_cfg, plan, tx, params, opt_state, rows)
  slots, frozen = sft_slots(params, opt_state)
  rng = np.random.default_rng(plan.seed)
  t0, losses = time.time(), []
  for i in range(steps):
    faults.point("sft_step")
    batch = [examples[int(j)] for j in rng.integers(len(examples), size=plan.batch_size)]
    pb = encode_prompts(tokenizer, batch, plan.max_prompt_len, plan.chat_template)
    resp_BR, resp_mask_BR = encode_responses(tokenizer, [e.demo for e in batch], plan.max_response_len)
    slots, loss = sharding_lib.pace(
        learner.apply(slots, frozen, sharding_lib.put((pb.tokens_BP, pb.mask_BP, resp_BR, resp_mask_BR), rows), None))
    if i == 0 or i == steps - 1 or (i + 1) % 100 == 0:
      losses.append(float(loss))
      log(f"sft step {i + 1}/{steps}: loss {losses[-1]:.4f}")
  params = lora.join(slots[POLICY].params, frozen[POLICY])
  return params, {"sft_steps": steps, "sft_loss_start": losses[0], "sft_loss_end": losses[-1],
                  "sft_time_s": time.time() - t0}
