"""Rollout stage: prompts -> the sampler (n per prompt) -> host-side samples.

The sampler runs on `sampler_params`: the trainer's params, or a snapshot k
steps old (staleness), possibly cast to a lower precision by the sampler
(SamplingConfig.dtype). Either makes mu differ from pi_prox.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from jaxrl_llm.sampling import generate as sampling_lib
from jaxrl_llm.sampling.config import SamplingConfig
from jaxrl_llm.sampling.rollout import FINISH_LENGTH
from jaxrl_llm.training.config import RolloutConfig
from jaxrl_llm.training.data import PromptBatch


@dataclasses.dataclass(frozen=True)
class Samples:
  """B = prompts x G samples on the host, a prompt's samples consecutive."""

  prompt_BP: np.ndarray  # int32 [B, P]
  prompt_mask_BP: np.ndarray  # bool [B, P]
  tokens_BR: np.ndarray  # int32 [B, R]
  mask_BR: np.ndarray  # bool [B, R]
  behav_logp_BR: np.ndarray  # f32 [B, R]
  truncated_B: np.ndarray  # bool [B]: cut at max_response_len without EOS
  length_B: np.ndarray  # int32 [B]: response tokens (EOS included)
  topk_ids_BRK: np.ndarray  # int32 [B, R, K], K = record_topk (0: empty)
  topk_logp_BRK: np.ndarray  # f32 [B, R, K]
  prompts: tuple[str, ...]  # [B]
  answers: tuple[str, ...]  # [B]
  tags: tuple[str, ...]  # [B] task tags (Example.tag)
  responses: tuple[str, ...]  # [B] decoded text up to EOS


def sampling_config(cfg: RolloutConfig, tokenizer, *, greedy: bool = False) -> SamplingConfig:
  return SamplingConfig(
      temperature=0.0 if greedy else cfg.temperature, top_k=0 if greedy else cfg.top_k,
      top_p=1.0 if greedy else cfg.top_p, max_new_tokens=cfg.max_response_len,
      n_samples=1 if greedy else cfg.group_size, eos_ids=(tokenizer.eos_id,), pad_id=tokenizer.pad_id,
      record_topk=0 if greedy else cfg.record_topk,
      dtype=None if cfg.sampler_dtype == "float32" else cfg.sampler_dtype)


def sample(sampler_params, model_cfg, prompts: PromptBatch, scfg: SamplingConfig, key, tokenizer,
           batch_sharding=None) -> Samples:
  tokens_BP, mask_BP = prompts.tokens_BP, prompts.mask_BP
  if batch_sharding is not None:
    tokens_BP, mask_BP = jax.device_put((tokens_BP, mask_BP), batch_sharding)
  ro = sampling_lib.generate(sampler_params, model_cfg, tokens_BP, mask_BP, scfg, key)
  ro = jax.device_get(ro)
  G = scfg.n_samples
  idx = np.asarray(ro.prompt_index_B)
  tokens_BR = np.asarray(ro.tokens_BR, np.int32)
  B, R = tokens_BR.shape
  K = scfg.record_topk
  return Samples(
      prompt_BP=np.repeat(prompts.tokens_BP, G, axis=0), prompt_mask_BP=np.repeat(prompts.mask_BP, G, axis=0),
      tokens_BR=tokens_BR, mask_BR=np.asarray(ro.mask_BR, bool),
      behav_logp_BR=np.asarray(ro.behav_logp_BR, np.float32),
      truncated_B=np.asarray(ro.finish_reason_B) == FINISH_LENGTH, length_B=np.asarray(ro.length_B, np.int32),
      topk_ids_BRK=np.asarray(ro.topk_ids_BRK, np.int32) if K else np.zeros((B, R, 0), np.int32),
      topk_logp_BRK=np.asarray(ro.topk_logp_BRK, np.float32) if K else np.zeros((B, R, 0), np.float32),
      prompts=tuple(prompts.prompts[i] for i in idx), answers=tuple(prompts.answers[i] for i in idx),
      tags=tuple(prompts.tags[i] for i in idx),
      responses=tuple(tokenizer.decode(row) for row in tokens_BR))


def concat_samples(parts: list[Samples]) -> Samples:
  out = {}
  for f in dataclasses.fields(Samples):
    vals = [getattr(p, f.name) for p in parts]
    out[f.name] = sum(vals, ()) if isinstance(vals[0], tuple) else np.concatenate(vals, axis=0)
  return Samples(**out)


def select_rows(s: Samples, rows: np.ndarray) -> Samples:
  out = {}
  for f in dataclasses.fields(Samples):
    v = getattr(s, f.name)
    out[f.name] = tuple(v[i] for i in rows) if isinstance(v, tuple) else v[rows]
  return Samples(**out)
