"""Verified weight syncs of an external rollout engine (`config.rollout.server.sync_check`).

After every weight push (weight_sync.py) the `openai` engine asks the server
two things before it samples with it, and compares the second with the
trainer's (point 3):

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
   which the trainer computes with `response_logprobs` (`trainer_logp`, in
   float32 whatever the run's compute dtype: the server's activations are
   float32). Requests go one at a time, so that each reuses the previous
   prompt's cache and no batching changes the sums.
3. Which weights the log-probs are those of. The trainer scores the probe
   (`trainer_logp`) on the weights the server should hold: the export of
   the params just pushed, rounded as it is written (`WeightSync.expected`,
   weight_sync.exported_weights: f16 rounding or gguf's Q8_0 / Q4_0 blocks
   for the weight matrices, the checkpoint's dtype for "hf"), log p_new, and
   keeps those of the previous verified sync, log p_prev (the probe's 31
   numbers: the previous weights themselves are not kept). With the server's
   log p_s, over the probe's positions t:

       dist_new  = mean_t |log p_s - log p_new|    (engine/sync_probe_dist_new)
       dist_prev = mean_t |log p_s - log p_prev|   (engine/sync_probe_dist_prev)
       gap       = mean_t |log p_new - log p_prev| (how far the update moved the probe)

   The sync fails when dist_prev < dist_new and dist_prev < gap / 2: the
   server's log-probs are closer to the previous weights' than to the new
   ones, and within half the update's own move of them (`closer_to_previous`).
   Why the mean: the server's arithmetic adds an error to every position, and
   the mean of 31 of them is steadier than their max, which the one position
   with the sharpest logits decides. Why the second clause: where the update
   moves the probe by less than the server's arithmetic error, which of the
   two distances is smaller is a coin toss, and dist_prev < dist_new alone
   fails honest servers. Measured (docs/benchmarks.md, "Syncs one step
   behind"): SmolLM2-135M, one AdamW step at lr 1e-5 (gap 0.017) and an
   honest llama.cpp on the q8_0 export, dist_new 0.101 and dist_prev 0.099. An honest server (log p_s = log p_new + e) has
   dist_prev >= gap - mean|e| (triangle inequality), so it fails the rule only
   if its error e nearly reproduces the update backwards; a server one sync
   behind (log p_s = log p_prev + e) fails it whenever gap > 2 mean|e|. So
   the rule catches weights one sync old when the update moves the probe by
   more than twice the server's error (one AdamW step of the tiny model, every
   export type: docs/benchmarks.md, "Syncs one step behind"), and cannot
   where it moves it less: there the server's own arithmetic moves its
   log-probs more than the update does, and no probe of this length tells the
   two weights apart (the two distances then stay close to each other). A
   server several syncs behind has failed at the sync where it first fell one
   behind, if that update moved the probe enough. (An update that did not
   change the exported weights has gap = 0: nothing fails.)
   The first sync has no previous one: only the tolerance below applies.

A server reporting another version, or a max |delta log p| between its
log-probs and log p_new above the tolerance, fails the step with
`SyncCheckFailed`, one line naming the version, the max |delta log p| and the
tolerance; a server whose log-probs are the previous weights' (point 3) fails
it with one line naming the version, dist_prev, dist_new, gap and the rule. A
sync (the server taking the weights, and the check) that runs past
`config.rollout.server.sync_timeout_s` fails it with `SyncTimeout`.

Tolerances (`SYNC_TOLERANCE`, per export type, in nats, on max |delta log p|
against the exported weights): measured by scripts/sync_tolerance.py between
llama.cpp's server (the build of scripts/build_llama_server.sh, started with
the engine's flags) and the trainer on the weights read back from the
exported file (which are the weights `exported_weights` gives): the largest
max |delta log p| over 8 probe seeds on the tiny model (init scales 0.02 and
0.1) and SmolLM2-135M-Instruct, times a margin of 4, rounded up to 1, 2 or
5 x 10^k (docs/benchmarks.md, "Sync check tolerances", column "read back").
The export's rounding is in log p_new, so what is left is llama.cpp's own
arithmetic (for the non-f32 exports an f16 KV cache, flash attention and
8-bit activations in the quantised matmuls) and summation order, which grow
with the model's depth and the sharpness of its logits (the tiny model at
init scale 0.3, logits that swing by tens of nats, stays inside them with
less room), and a model far larger than those measured may need
`sync_check_tol` (a check that fails on the first sync, before any update, is
such a case); it sets the tolerance of every export type. "hf"
(sync='sglang', a Hugging Face checkpoint in the params' dtype) is not
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
# max |delta log p| allowed on the probe against the exported weights, per export type (module docstring;
# scripts/sync_tolerance.py's "read back" column x 4: f32 2.4e-4, f16 0.021, q8_0 0.70, q4_0 1.1, hf 0.39)
SYNC_TOLERANCE = {"f32": 1e-3, "f16": 0.1, "q8_0": 5.0, "q4_0": 5.0, "hf": 2.0}
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
  max_abs_dlogp: float  # max over the probe of |log p(server) - log p_new| (the exported weights')
  tolerance: float
  dist_new: float  # mean over the probe of |log p(server) - log p_new|
  dist_prev: float = math.nan  # mean over the probe of |log p(server) - log p_prev|; NaN: no previous sync
  gap: float = math.nan  # mean over the probe of |log p_new - log p_prev|; NaN: no previous sync
  prev_version: int = -1  # the policy version of log p_prev, -1: none

  @property
  def stale(self) -> bool:
    """The server's log-probs are the previous weights' (module docstring, point 3)."""
    return closer_to_previous(self.dist_new, self.dist_prev, self.gap)


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


def closer_to_previous(dist_new: float, dist_prev: float, gap: float) -> bool:
  """The decision rule of point 3 (module docstring): dist_prev < dist_new and dist_prev < gap / 2. False
  without a previous sync (NaN distances)."""
  return bool(dist_prev < dist_new and 2.0 * dist_prev < gap)


def probe_distances(theirs_L: np.ndarray, new_L: np.ndarray, prev_L: np.ndarray | None) -> tuple[float, ...]:
  """(max_abs_dlogp, dist_new, dist_prev, gap) of the server's probe log-probs `theirs_L` against those of the
  new weights and of the previous ones (None: no previous sync, NaN for the last two); module docstring."""
  d_new = np.abs(theirs_L.astype(np.float64) - new_L)
  if prev_L is None:
    return float(d_new.max()), float(d_new.mean()), math.nan, math.nan
  return (float(d_new.max()), float(d_new.mean()), float(np.abs(theirs_L.astype(np.float64) - prev_L).mean()),
          float(np.abs(new_L.astype(np.float64) - prev_L).mean()))


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
  """SyncCheckFailed's text: the version, what the server says it serves, and either the max |delta log p|
  and the tolerance or, for a server whose log-probs are the previous weights', both distances, the gap and
  the rule (`tag`: the exported weights' name, which the server should report)."""
  if check.served == tag and check.stale:
    return (f"rollout engine: the weight sync of policy version {check.version} is not verified: the server "
            f"reports serving it ({check.served}), but its log-probs of the probe ({n_probe} fixed tokens) are "
            f"those of the previous sync's weights (version {check.prev_version}): mean |delta log p| = "
            f"{check.dist_prev:.3g} to them, {check.dist_new:.3g} to version {check.version}'s, which the update "
            f"moved by {check.gap:.3g} (rule: fails when the distance to the previous weights is below the "
            "distance to the new ones and below half the update's move; config.rollout.server.sync_check=False "
            "turns the check off)")
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
