"""The request side of the `openai` engine: its `config.rollout.server_*`
settings and the sampling fields of a llama.cpp completions request
(`request_fields`), where what the server cannot express is a ConfigError.
"""

from __future__ import annotations

import dataclasses

from jaxrl_llm.checks import ConfigError
from jaxrl_llm.sampling.config import SamplingConfig

SAMPLER_ORDER = ("temperature", "top_k", "top_p", "min_p")  # SamplingConfig's processing order
# llama.cpp samplers and penalties outside SamplingConfig, switched off (their server defaults are on).
_OFF = {"repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "dry_multiplier": 0.0,
        "xtc_probability": 0.0, "typical_p": 1.0, "mirostat": 0, "dynatemp_range": 0.0, "top_n_sigma": -1.0}
# Request fields that llama.cpp echoes in `generation_settings` under the same name (check_applied_settings).
_APPLIED = ("temperature", "top_k", "top_p", "min_p", "samplers", "n_probs", "post_sampling_probs", *_OFF)


@dataclasses.dataclass(frozen=True)
class ServerEngineConfig:
  """The `server_*` keys of config.rollout (documented in training/defaults.py)."""
  url: str = ""
  model: str = ""
  command: str = "llama-server"
  export: str = "f32"
  sync: str = "restart"
  sync_every: int = 1
  concurrency: int = 8
  timeout_s: float = 120.0
  retries: int = 3
  backoff_s: float = 0.5
  on_failure: str = "resample"
  on_exit: str = "restart"
  wait_s: float = 120.0
  ctx_per_slot: int = 1024  # a managed server's context per slot (prompt + response tokens)
  hf_path: str = ""  # the run's model.hf_path: a GGUF-converted checkpoint's tokenizer goes into the export

  @staticmethod
  def from_rollout(ro, max_prompt_len: int = 0, hf_path: str = "") -> "ServerEngineConfig":
    return ServerEngineConfig(
        url=ro.server_url, model=ro.server_model, command=ro.server_command, export=ro.server_export,
        sync=ro.server_sync, sync_every=ro.sync_every, concurrency=ro.server_concurrency,
        timeout_s=float(ro.server_timeout_s), retries=ro.server_retries, backoff_s=float(ro.server_backoff_s),
        on_failure=ro.server_on_failure, on_exit=ro.server_on_exit, wait_s=float(ro.server_wait_s),
        ctx_per_slot=(max_prompt_len or 512) + ro.max_response_len + 8, hf_path=hf_path)


def request_fields(scfg: SamplingConfig, vocab_size: int) -> dict:
  """The sampling part of a completions request; a ConfigError for what llama.cpp cannot express."""
  if scfg.dtype is not None:
    raise ConfigError(f"config.rollout.sampler_dtype={scfg.dtype!r} is invalid for engine 'openai': the server's "
                      "precision is the exported weights' type (config.rollout.server_export); use 'float32'")
  if scfg.record_raw_logp:
    raise ConfigError("SamplingConfig.record_raw_logp=True is invalid for engine 'openai': the server reports "
                      "one distribution per request (mu), not the raw logits' log-probs next to it")
  if scfg.cache_len is not None:
    raise ConfigError(f"SamplingConfig.cache_len={scfg.cache_len} is invalid for engine 'openai': the server "
                      "sizes its own KV cache (its context per slot)")
  fields = {"max_tokens": scfg.max_new_tokens, "temperature": scfg.temperature, "top_k": scfg.top_k,
            "top_p": scfg.top_p, "min_p": scfg.min_p, "samplers": list(SAMPLER_ORDER),
            "n_probs": max(1, scfg.record_topk), "post_sampling_probs": True, "n": 1, "stream": False,
            "cache_prompt": True, **_OFF}
  if scfg.vocab_limit and scfg.vocab_limit < vocab_size:  # padded rows: never sampled
    fields["logit_bias"] = [[i, False] for i in range(scfg.vocab_limit, vocab_size)]
  return fields
