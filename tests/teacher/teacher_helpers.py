"""Helpers of the teacher tests: a tiny model, hand-made rollouts, the update's LossContext."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import model as model_lib
from jaxrl_llm.tasks.base import Example
from jaxrl_llm.model.tokenizer import CharTokenizer
from jaxrl_llm.tasks.pipeline import encode_prompts
from jaxrl_llm.model.logprobs import response_hidden

TOK = CharTokenizer()
CFG = model_lib.ModelConfig.tiny(TOK.vocab_size, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1,
                                 head_dim=16, d_ff=64)
P_LEN, R_LEN = 12, 4


@dataclasses.dataclass(frozen=True)
class FakeSamples:
  """The rollout fields the teacher stage reads."""

  prompt_BP: np.ndarray
  prompt_mask_BP: np.ndarray
  tokens_BR: np.ndarray
  mask_BR: np.ndarray
  prompts: tuple
  answers: tuple
  tags: tuple


def make_samples(tags=("a", "b", "a")):
  """Three rollouts of 2-4 tokens (EOS included) under 12-token prompts."""
  exs = [Example("12+34=", "46"), Example("5+7=", "12"), Example("99+1=", "100")]
  pb = encode_prompts(TOK, exs, P_LEN)
  tokens = np.zeros((3, R_LEN), np.int32)
  mask = np.zeros((3, R_LEN), bool)
  for b, r in enumerate(["46", "13", "10"]):
    ids = TOK.encode(r) + [TOK.eos_id]
    tokens[b, :len(ids)], mask[b, :len(ids)] = ids, True
  return FakeSamples(pb.tokens_BP, pb.mask_BP, tokens, mask, pb.prompts, pb.answers, tuple(tags))


def tiny_params(seed, cfg=CFG):
  return model_lib.init_params(cfg, jax.random.key(seed))


@dataclasses.dataclass(frozen=True)
class StepState:
  """The two TrainState fields an aux provider reads."""

  params: dict
  step: int


@dataclasses.dataclass(frozen=True)
class MicroBatch:
  """The TrainBatch fields an extra loss term reads."""

  mask_BR: jax.Array
  extra_BR: dict


def loss_context(student_params, cfg, samples, extra_BR: dict, aux: dict):
  """A LossContext as the update builds it (token_mean norms of the whole batch)."""
  from jaxrl_llm import objectives as obj_lib
  from jaxrl_llm.training.update import LossContext

  hidden_BRD = response_hidden(student_params, cfg, samples.prompt_BP, samples.prompt_mask_BP,
                               samples.tokens_BR, samples.mask_BR)
  mask_BR = jnp.asarray(samples.mask_BR)
  norms = obj_lib.batch_norms(mask_BR, 1, obj_lib.get_preset("grpo"))
  return LossContext(params=student_params, hidden_BRD=hidden_BRD, logp_BR=jnp.zeros(mask_BR.shape),
                     batch=MicroBatch(mask_BR, {k: jnp.asarray(v) for k, v in extra_BR.items()}),
                     norms=norms, aux=aux)


def student_full_logp(params, cfg, samples, temperature=1.0):
  """Reference: the student's [B, R, V] log-probs from plain logits."""
  h = response_hidden(params, cfg, samples.prompt_BP, samples.prompt_mask_BP, samples.tokens_BR,
                      samples.mask_BR)
  logits = jnp.einsum("BRD,DV->BRV", h, model_lib.lm_head(params, cfg)) / temperature
  return jax.nn.log_softmax(logits, axis=-1)


def teacher_full_logq(stage, teacher_params, samples, n=0):
  """Reference: the teacher's [B, R, V] log-probs on its own context (no kernel)."""
  from jaxrl_llm.objectives.teacher_inputs import (
    build_teacher_inputs,
    gather_predictions,
  )
  ctx_BC, ctx_mask_BC = stage._contexts(samples)
  inp = build_teacher_inputs(ctx_BC, ctx_mask_BC, samples.tokens_BR, samples.mask_BR)
  tcfg = stage.teacher_cfgs[n]
  h, _ = model_lib.forward(teacher_params, tcfg, inp.tokens_BS, inp.positions_BS, inp.mask_BS)
  h = gather_predictions(h, inp.predict_index_BR)
  logits = jnp.einsum("BRD,DV->BRV", h, model_lib.lm_head(teacher_params, tcfg)) / stage.temperature
  return np.asarray(jax.nn.log_softmax(logits, axis=-1))
