"""Verified weight syncs of an external rollout engine (`config.rollout.server.sync_check`).

After every weight push (weight_sync.py) the `openai` engine asks the server
two things before it samples with it:

1. Which weights it serves. llama.cpp's GET /props reports `model_path`, the
   -m file the running server loaded (tools/server/server-context.cpp,
   get_res_props); the engine's export names that file after the policy
   version (`policy-v{version}.{export}.gguf`, and `general.name` inside it),
   so a restart that did not happen, or happened on another file, shows.
   SGLang's POST /update_weights_from_disk takes a `weight_version` string
   with the model path, and GET /get_weight_version (newer releases:
   /model_info) answers `{"weight_version": ...}`.
2. How it scores a fixed probe: `PROBE_LEN` token ids drawn once from the
   vocabulary with a fixed seed (the same in every run of a vocabulary, so
   also across a resume). llama.cpp's server has no prompt log-probs (its
   /v1/completions refuses `echo`: "Only no echo is supported"), so each of
   the probe's L - 1 positions t is one request of one token (`probe_request`):
   prompt probe[:t], the token probe[t] forced by a logit bias of +1e4 at
   temperature 0, and `post_sampling_probs: false`, with which llama.cpp
   reports the sampled token's `logprob` under the softmax of the raw logits
   (server-context.cpp, populate_token_probs -> get_token_probabilities reads
   the context's logits, which the sampler chain, the logit bias included,
   does not change). That is log pi(probe[t] | probe[:t]) at temperature 1,
   which the trainer computes with `response_logprobs` on the params just
   pushed (`trainer_logp`, in float32 whatever the run's compute dtype: the
   server's activations are float32). Requests go one at a time, so that
   each reuses the previous prompt's cache and no batching changes the sums.

A server reporting another version, or a max |delta log p| over the probe
above the tolerance, fails the step with `SyncCheckFailed`, one line naming
the version, the max |delta log p| and the tolerance; a sync (the server
taking the weights, and the check) that runs past
`config.rollout.server.sync_timeout_s` fails it with `SyncTimeout`.

Tolerances (`SYNC_TOLERANCE`, per export type, in nats): measured by
scripts/sync_tolerance.py between llama.cpp's server (the build of
scripts/build_llama_server.sh, started with the engine's flags) and the
trainer: the largest max |delta log p| over 8 probe seeds on the tiny model
(init scales 0.02 and 0.1) and SmolLM2-135M-Instruct, times a margin of 4,
rounded up to 1, 2 or 5 x 10^k (docs/benchmarks.md, "Sync check
tolerances", has the numbers). The differences are the export's rounding of
the weights (f16; Q8_0 and Q4_0 blocks), llama.cpp's own arithmetic (for the
non-f32 exports an f16 KV cache, flash attention and 8-bit activations in
the quantised matmuls) and summation order, and they grow with the model's
depth and the sharpness of its logits (the tiny model at init scale 0.3,
logits that swing by tens of nats, stays inside them with less room), and
a model far larger than those measured may need `sync_check_tol` (a check
that fails on the first sync, before any update, is such a case). For the
quantised exports the tolerance is wide (a few nats): there the check mostly
rests on the reported version and catches only weights far from the
policy's. "hf" (sync='sglang', a float32 Hugging Face checkpoint) is not
measured against SGLang (it needs a GPU): it is the trainer's own
bfloat16-compute forward against its float32 one on the same models, with
the same margin. SGLang's `--dtype auto` serves a float32 checkpoint in
float16 (srt/configs/model_config.py, _get_and_verify_dtype), which has
three more mantissa bits than bfloat16: the proxy errs on the wide side.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.checks import ConfigError
from jaxrl_llm.model.config import ModelConfig
from jaxrl_llm.model.logprobs import response_logprobs
from jaxrl_llm.sampling.http_client import ServerClient, ServerUnavailable
from jaxrl_llm.sampling.openai_request import SAMPLERS_OFF

PROBE_LEN = 32  # token ids in the probe: PROBE_LEN - 1 scored positions
PROBE_SEED = 20250528  # the probe's draw: fixed, so every run (and resume) of a vocabulary uses one probe
FORCE_BIAS = 1e4  # logit bias that makes the probe's token the argmax (logits are O(10))
# max |delta log p| allowed on the probe per export type (module docstring; scripts/sync_tolerance.py)
SYNC_TOLERANCE = {"f32": 1e-3, "f16": 0.2, "q8_0": 5.0, "q4_0": 20.0, "hf": 2.0}
_VERSION = re.compile(r"policy-v(\d+)\.")


class SyncCheckFailed(ConfigError):
  """The server does not serve the weights just pushed (or cannot say so)."""


class SyncTimeout(ConfigError):
  """A weight sync ran past config.rollout.server.sync_timeout_s."""


@dataclasses.dataclass(frozen=True)
class SyncCheck:
  """What one verified sync found (the engine's `engine/sync_*` metrics)."""
  version: int  # the policy version pushed
  served: str  # what the server reports serving (a file, a version string)
  served_version: int  # the policy version that names, -1 when it names none
  max_abs_dlogp: float  # max over the probe of |log p(server) - log p(trainer)|
  tolerance: float


class Deadline:
  """The end of one sync's time (`sync_timeout_s`, from the end of the export): what is left, or a
  SyncTimeout naming what was under way."""

  def __init__(self, seconds: float, version: int):
    self.seconds, self.version, self.end = seconds, version, time.monotonic() + seconds

  def remaining(self) -> float:
    return self.end - time.monotonic()

  def left(self, doing: str) -> float:
    """Seconds left; a SyncTimeout when none are (`doing`: what the sync was waiting for)."""
    left = self.remaining()
    if left <= 0:
      raise self.timeout(doing)
    return left

  def timeout(self, doing: str) -> SyncTimeout:
    return SyncTimeout(f"rollout engine: the weight sync of policy version {self.version} timed out: {doing} "
                       f"did not finish within config.rollout.server.sync_timeout_s={self.seconds:g} s")


def probe_ids(vocab_size: int, exclude=(), seed: int = PROBE_SEED) -> np.ndarray:
  """int32 [PROBE_LEN]: ids drawn uniformly (with `seed`; the engine's is PROBE_SEED) from [0, vocab_size)
  minus `exclude` (padding, end-of-sequence and stop ids, which a server may treat specially)."""
  allowed = np.setdiff1d(np.arange(vocab_size), np.asarray(sorted(set(exclude)), np.int64))
  if allowed.size == 0:
    raise ConfigError(f"no token id in [0, {vocab_size}) outside {sorted(set(exclude))} for the sync probe")
  return np.random.default_rng(seed).choice(allowed, PROBE_LEN).astype(np.int32)


def version_of(served: str) -> int:
  """The policy version a served file or version string names (policy-v7.f32.gguf, "7"); -1 if none."""
  if served.strip().isdigit():
    return int(served)
  found = _VERSION.search(served)
  return int(found.group(1)) if found else -1


def tolerance(export: str, override: float) -> float:
  """`override` (config.rollout.server.sync_check_tol) when > 0, else the measured one of `export`."""
  return override if override > 0 else SYNC_TOLERANCE[export]


@functools.partial(jax.jit, static_argnames=("model_cfg",))
def _logp(params, probe_1L, model_cfg: ModelConfig):
  mask_1L = jnp.ones(probe_1L.shape, bool)
  out = response_logprobs(params, model_cfg, probe_1L[:, :1], mask_1L[:, :1], probe_1L[:, 1:], mask_1L[:, 1:],
                          temperature=1.0, impl="naive")
  return out.logp_BR[0]


def trainer_logp(params, model_cfg: ModelConfig, probe_L: np.ndarray) -> np.ndarray:
  """f32 [L - 1]: log pi(probe[t] | probe[:t]) for t = 1 .. L - 1 at temperature 1, computed in float32."""
  cfg32 = dataclasses.replace(model_cfg, compute_dtype="float32")
  return np.asarray(_logp(params, jnp.asarray(probe_L)[None], cfg32), np.float32)


def probe_request(model_name: str, prefix: list[int], token: int) -> dict:
  """The /v1/completions request that scores `token` after `prefix` (module docstring, point 2)."""
  return {"model": model_name, "prompt": prefix, "max_tokens": 1, "n": 1, "stream": False, "seed": 0,
          "temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "samplers": ["temperature"],
          "n_probs": 1, "post_sampling_probs": False, "backend_sampling": False, "cache_prompt": True,
          "logit_bias": [[int(token), FORCE_BIAS]], **SAMPLERS_OFF}


def parse_probe_answer(answer: dict, token: int) -> float:
  """log p of the forced `token` in a probe_request's answer; a ValueError for anything else."""
  entry = answer["choices"][0]["logprobs"]["content"][0]
  if int(entry["id"]) != token:
    raise ValueError(f"it answered token {entry['id']} where the probe forced {token} (a logit bias it ignores)")
  if "logprob" not in entry:
    raise ValueError(f"its answer has no pre-sampling `logprob` (post_sampling_probs=false ignored): {entry}")
  logp = float(entry["logprob"])
  if math.isnan(logp) or logp > 1e-6:
    raise ValueError(f"log-prob {logp} of token {token} is not a log-probability")
  return logp


def engine_logp(client: ServerClient, model_name: str, probe_L: np.ndarray, deadline: Deadline, *,
                timeout_s: float, retries: int, backoff_s: float) -> np.ndarray:
  """f32 [L - 1]: the server's log p(probe[t] | probe[:t]), one request per position, in order.

  A request that fails (ServerUnavailable) is retried `retries` times after `backoff_s` * 2^attempt,
  within the deadline; then, or for an answer that is not the forced token's log-prob, SyncCheckFailed."""
  out = np.zeros(len(probe_L) - 1, np.float32)
  for t in range(1, len(probe_L)):
    token, attempt = int(probe_L[t]), 0
    while True:
      wait = min(timeout_s, deadline.left(f"the probe's request {t} of {len(probe_L) - 1}"))
      try:
        answer = client.post("/v1/completions", probe_request(model_name, [int(i) for i in probe_L[:t]], token),
                             timeout_s=wait)
        out[t - 1] = parse_probe_answer(answer, token)
        break
      except ServerUnavailable as e:
        if deadline.remaining() <= 0:
          raise deadline.timeout(f"the probe's request {t} of {len(probe_L) - 1}") from None
        if attempt >= retries:
          raise SyncCheckFailed(f"rollout engine: the weight sync of policy version {deadline.version} is not "
                                f"verified: the server at {client.base_url} did not score the probe ({e})") from None
        time.sleep(min(backoff_s * 2 ** attempt, max(0.0, deadline.remaining())))
        attempt += 1
      except (KeyError, IndexError, TypeError, ValueError) as e:
        raise SyncCheckFailed(f"rollout engine: the weight sync of policy version {deadline.version} is not "
                              f"verified: the server at {client.base_url} cannot score the probe: "
                              f"{type(e).__name__}: {e}") from None
  return out


def tolerance_source(kind: str, configured: float) -> str:
  """Where a sync check's tolerance came from, for its error message."""
  if configured > 0:
    return "config.rollout.server.sync_check_tol"
  return f"measured for {kind!r} weights, config.rollout.server.sync_check_tol sets another"


def failure_message(check: SyncCheck, tag: str, n_probe: int, tol_source: str) -> str:
  """SyncCheckFailed's text: the version, what the server says it serves, the max |delta log p| and the
  tolerance (`tag`: the exported weights' name, which the server should report)."""
  if check.served == tag:
    says = f"the server reports serving it ({check.served}), but its"
  elif check.served_version >= 0:
    says = f"the server reports serving version {check.served_version} ({check.served}), and its"
  else:
    says = f"the server reports serving {check.served!r}, not {tag!r}, and its"
  return (f"rollout engine: the weight sync of policy version {check.version} is not verified: {says} log-probs "
          f"of the probe ({n_probe} fixed tokens) differ from the trainer's by max |delta log p| = "
          f"{check.max_abs_dlogp:.3g} (tolerance {check.tolerance:g}, {tol_source}; "
          "config.rollout.server.sync_check=False turns the check off)")
