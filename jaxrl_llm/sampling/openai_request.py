"""The request side of the `openai` engine: the sampling fields of a llama.cpp
completions request (`request_fields`), where what the server cannot express is
a ConfigError; and the completion it returns, read by `read_completion` (a `Sample`). The engine's own settings are `config.rollout.server`
(sampling/config.py's ServerConfig).
"""

from __future__ import annotations

import dataclasses
import math

from jaxrl_llm.checks import ConfigError
from jaxrl_llm.sampling.config import SamplingConfig
from jaxrl_llm.sampling.rollout import FINISH_EOS, FINISH_LENGTH, FINISH_STOP

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


def read_completion(resp: dict, *, max_tokens: int, ends: set, eos_ids, vocab_size: int, topk: int = 0,
                    pad_id: int = 0, what: str = "answer") -> Sample:
  """The ids, log mu and (topk > 0) the top-k of a completions response, up to and including its first
  end id (`ends`: the trainer's EOS and stop ids), whether or not the server stopped there. A malformed
  response raises KeyError, IndexError, TypeError or ValueError (the engine retries it); a server that
  stopped on a token the trainer does not end on is a ConfigError (`what`: the answer or turn, for it)."""
  choice = resp["choices"][0]
  content = (choice.get("logprobs") or {})["content"]
  ids, logp, top_ids, top_logp = [], [], [], []
  finish = FINISH_LENGTH
  for entry in content:
    tok = int(entry["id"])
    if not 0 <= tok < vocab_size:
      raise ValueError(f"token id {tok} outside the vocabulary [0, {vocab_size})")
    ids.append(tok)
    logp.append(log_prob(float(entry["prob"])))
    if topk:
      tops = sorted(entry.get("top_probs") or [], key=lambda t: -float(t["prob"]))[:topk]
      top_ids.append([int(t["id"]) for t in tops] + [pad_id] * (topk - len(tops)))
      top_logp.append([log_prob(float(t["prob"])) for t in tops] + [-math.inf] * (topk - len(tops)))
    if tok in ends:
      finish = FINISH_EOS if tok in eos_ids else FINISH_STOP
      break
  if len(ids) > max_tokens:
    raise ValueError(f"{len(ids)} tokens for max_tokens={max_tokens}")
  if finish == FINISH_LENGTH and len(ids) < max_tokens and choice.get("finish_reason") == "stop":
    raise ConfigError(f"the server stopped {what} on token {ids[-1] if ids else None}, which is not in the "
                      f"trainer's end ids {sorted(ends)}: the served model's end-of-generation tokens differ "
                      "from the trainer's")
  return Sample(ids, logp, top_ids, top_logp, finish)
