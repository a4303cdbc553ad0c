"""The request side of the `openai` engine: the sampling fields of a llama.cpp
completions request (`request_fields`), where what the server cannot express is
a ConfigError; and the parsed completion it returns (`Sample`). The engine's own settings are `config.rollout.server`
(sampling/config.py's ServerConfig).
"""

from __future__ import annotations

import dataclasses
import math

from jaxrl_llm.checks import ConfigError
from jaxrl_llm.sampling.config import SamplingConfig

SAMPLER_ORDER = ("temperature", "top_k", "top_p", "min_p")  # SamplingConfig's processing order
# llama.cpp samplers and penalties outside SamplingConfig, switched off (their server defaults are on).
SAMPLERS_OFF = {"repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "dry_multiplier": 0.0,
        "xtc_probability": 0.0, "typical_p": 1.0, "mirostat": 0, "dynatemp_range": 0.0, "top_n_sigma": -1.0}
# Request fields that llama.cpp echoes in `generation_settings` under the same name (check_applied_settings).
APPLIED_FIELDS = ("temperature", "top_k", "top_p", "min_p", "samplers", "n_probs", "post_sampling_probs", *SAMPLERS_OFF)


def request_fields(scfg: SamplingConfig, vocab_size: int) -> dict:
  """The sampling part of a completions request; a ConfigError for what llama.cpp cannot express."""
  if scfg.dtype is not None:
    raise ConfigError(f"config.rollout.sampler_dtype={scfg.dtype!r} is invalid for engine 'openai': the server's "
                      "precision is the exported weights' type (config.rollout.server.export); use 'float32'")
  if scfg.record_raw_logp:
    raise ConfigError("SamplingConfig.record_raw_logp=True is invalid for engine 'openai': the server reports "
                      "one distribution per request (mu), not the raw logits' log-probs next to it")
  if scfg.cache_len is not None:
    raise ConfigError(f"SamplingConfig.cache_len={scfg.cache_len} is invalid for engine 'openai': the server "
                      "sizes its own KV cache (its context per slot)")
  fields = {"max_tokens": scfg.max_new_tokens, "temperature": scfg.temperature, "top_k": scfg.top_k,
            "top_p": scfg.top_p, "min_p": scfg.min_p, "samplers": list(SAMPLER_ORDER),
            "n_probs": max(1, scfg.record_topk), "post_sampling_probs": True, "n": 1, "stream": False,
            "cache_prompt": True, **SAMPLERS_OFF}
  if scfg.vocab_limit and scfg.vocab_limit < vocab_size:  # padded rows: never sampled
    fields["logit_bias"] = [[i, False] for i in range(scfg.vocab_limit, vocab_size)]
  return fields


@dataclasses.dataclass
class Sample:
  """One completion as the engine parses it from the server's response."""
  ids: list[int]
  logp: list[float]
  top_ids: list[list[int]]
  top_logp: list[list[float]]
  finish: int


def log_prob(p: float) -> float:
  """log p of a probability the server reports (-inf for 0)."""
  return math.log(p) if p > 0 else -math.inf
