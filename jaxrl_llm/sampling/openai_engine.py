"""The `openai` rollout engine: samples through an OpenAI-compatible completions server.

The engine sends each sample as one request to `POST /v1/completions` with
the prompt as a list of token ids (no text round trip, no BOS added: llama.cpp
inserts BOS only before a string prompt) and reads back, per generated token,
its id and its probability under the distribution the server sampled from:

    {"prompt": [ids], "max_tokens": R, "seed": s, "temperature": T, "top_k": k, "top_p": p, "min_p": m,
     "samplers": ["temperature", "top_k", "top_p", "min_p"], "n_probs": max(1, K), "post_sampling_probs": true,
     + every other llama.cpp sampler switched off}
    -> choices[0].logprobs.content[t] = {"id", "prob", "top_probs": [{"id", "prob"}, ...]}, finish_reason

Why this endpoint and these fields (llama.cpp's tools/server, README and
server-task.cpp / server-context.cpp of the llama.cpp that llama-cpp-python
0.3.36 vendors):

* Exact token ids. The OpenAI format's `logprobs.tokens` are strings, which
  do not identify ids (byte fragments, several ids with one spelling).
  llama.cpp's /v1/completions accepts a token-id prompt and copies its native
  options (n_probs, post_sampling_probs, samplers) from the request, and with
  n_probs > 0 its `logprobs.content` entries carry each token's `id`. (The
  native /completion endpoint has the same data as `completion_probabilities`
  and `tokens`, but is not OpenAI-shaped.) llama-cpp-python's own Python
  server is no alternative: its prompt is a string, its `n` is ignored, and
  its logprobs are those of the raw logits.
* mu, not the raw model. `post_sampling_probs: true` returns the
  probabilities of the candidates after the whole sampler chain, i.e. of
  the renormalised distribution the token was drawn from (without it
  llama.cpp reports softmax(logits) at temperature 1). The chain order is
  ours (SamplingConfig: temperature, then top-k, top-p, min-p), given
  explicitly: llama.cpp's default order applies the temperature last, and
  its defaults (top_k 40, top_p 0.95, min_p 0.05, repetition penalties)
  would change mu silently, so every knob is sent. temperature 0 is greedy
  (llama.cpp's temperature sampler keeps the argmax only: prob 1, log mu 0,
  as the built-in sampler records).
* EOS. A sampled end-of-generation token is part of the answer's tokens and
  probabilities, as in our sampler. eos_ids / stop_ids the server does not
  stop on are applied here, by cutting the answer after the first one: the
  tokens before it were drawn exactly as if the server had stopped there.
* n. `n_samples` = G requests of one completion each, with seeds drawn
  from the step's key: per-sample seeds make a draw reproducible and a
  failed request costs one sample, not a group.

What the server cannot express is an error at construction: another
sampler dtype (the server's precision is the export type), raw log-probs
next to mu's, a KV cache length, TRM's token KL (it recomputes mu from the
trainer's copy of the sampler, which here is a llama.cpp build).

Failures. Each request has a timeout; one that fails (refused, reset, timed out, HTTP 5xx, malformed
answer) is retried `server.retries` times with exponential back-off. A request that still fails is
resampled with a new seed (`server.on_failure="resample"`, up to `server.retries` rounds) or its
sample is dropped (`"drop"`: all-masked, length 0). A server process that has died is restarted on
its current weights (`server.on_exit="restart"`), waited for (`"wait"`, an external server), or is
an error (`"error"`); the requests in flight are then sent again, so no sample is lost. HTTP 4xx is
a configuration error, never retried. `metrics()` counts all of it.

Weights (`sync(params, version)`, weight_sync.py): every `server.sync_every` steps the policy is
exported (GGUF, `server.export` type) and the server process restarted on it; `sync_s` / `export_s`
/ `reload_s` measure it. Each sample records the policy version it was drawn with
(`RolloutBatch.version_B`). Every sync is then verified (`server.sync_check`, sync_check.py): the
server must report the version pushed, score a fixed probe within the export type's tolerance of the
trainer on the exported weights (the export's rounding included: `WeightSync.expected`), and, from
the second sync, not closer to the previous sync's exported weights than to the new ones (the rule:
sync_check.closer_to_previous), or the step fails with a one-line SyncCheckFailed; a sync past
`server.sync_timeout_s` fails it with a SyncTimeout. `engine/sync_version` (the version the server
reports, -1 when it names none), `engine/sync_probe_max_abs_dlogp`, `engine/sync_probe_dist_new`,
`engine/sync_probe_dist_prev` (the mean |delta log p| to the new and the previous exported weights),
`engine/sync_check_failures` and `engine/sync_timeouts` record it.

At start the engine checks that the server serves the expected model
(`server.model`, /v1/models), that its vocabulary has the trainer's size
(/v1/models meta.n_vocab) and that its tokenizer encodes a probe text to the
trainer's ids (/tokenize): a mismatch is an error before any rollout. In a run of several processes, process 0
makes and drives the engine (sampling/primary_engine.py).
"""

from __future__ import annotations

import concurrent.futures
import math
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from jaxrl_llm.checks import ConfigError
from jaxrl_llm.model.config import ModelConfig
from jaxrl_llm.model.io.gguf_export import check_tokenizer_exportable
from jaxrl_llm.model.tokenizer import CharTokenizer
from jaxrl_llm.sampling.config import SamplingConfig, ServerConfig
from jaxrl_llm.sampling.engine import RolloutBatch, register_engine
from jaxrl_llm.sampling.http_client import ServerClient, ServerRejected, ServerUnavailable
from jaxrl_llm.sampling.openai_request import APPLIED_FIELDS, Sample, read_completion, request_fields
from jaxrl_llm.sampling.rollout import FINISH_LENGTH
from jaxrl_llm.sampling.server_process import LlamaServerProcess
from jaxrl_llm.sampling.sync_check import (
    Deadline, SyncCheck, SyncCheckFailed, SyncTimeout, engine_logp, failure_message, probe_distances, probe_ids,
    tolerance, tolerance_source, trainer_logp, version_of)
from jaxrl_llm.sampling.weight_sync import Exported, NoSync, RestartSync, SGLangDiskSync, WeightSync

_PROBE = "The quick brown fox jumps over 13 lazy dogs; 2+3=5.\n"


class OpenAIEngine:
  """A rollout engine over an OpenAI-compatible completions server (llama.cpp's)."""

  def __init__(self, *, model_cfg: ModelConfig, sampling_cfg: SamplingConfig, tokenizer,
               settings: ServerConfig, weight_sync: WeightSync | None = None,
               process: LlamaServerProcess | None = None):
    self.model_cfg, self.scfg, self.tokenizer, self.cfg = model_cfg, sampling_cfg, tokenizer, settings
    self.fields = request_fields(sampling_cfg, model_cfg.vocab_size)
    self.ends = set(sampling_cfg.eos_ids) | set(sampling_cfg.stop_ids)
    self.process = process
    self.weight_sync = weight_sync or NoSync()
    self.client: ServerClient | None = None
    self.model_name, self.n_ctx = settings.model, None
    self.version, self.synced_step = -1, None
    self._lock, self._recover_lock = threading.Lock(), threading.Lock()
    self._restarts_this_call = 0
    self.counters = dict.fromkeys(("requests", "retries", "failed_requests", "resampled", "dropped",
                                   "server_exits", "server_restarts", "syncs", "sync_check_failures",
                                   "sync_timeouts"), 0)
    self.timings = dict.fromkeys(("sync_s", "export_s", "reload_s"), 0.0)
    self.last_check: SyncCheck | None = None
    # the last verified sync: its version and its exported weights' probe log-probs (log p_prev of the next)
    self.previous: tuple[int, np.ndarray | None] = (-1, None)
    # the sync check's probe: fixed for a vocabulary, clear of padding, end and stop ids and padded rows
    self.probe_L = probe_ids(sampling_cfg.vocab_limit or model_cfg.vocab_size,
                             {sampling_cfg.pad_id, *self.ends})
    if settings.url:  # an external server: check it now, before any training
      self.connect(settings.url)

  # ---- the server --------------------------------------------------------------

  def connect(self, url: str) -> None:
    """Talk to the server at `url` from now on, after checking what it serves (`check_server`); the
    weight sync calls it once its first server has started."""
    self.client = ServerClient(url, timeout_s=self.cfg.timeout_s)
    self.check_server()

  def check_server(self) -> None:
    """Model id, vocabulary size, tokenizer and context of the server (ConfigErrors naming what differs)."""
    url = self.client.base_url
    deadline = time.monotonic() + self.cfg.wait_s
    while True:
      try:
        models = self.client.get("/v1/models").get("data") or []
        break
      except ServerUnavailable as e:
        waits = self.process is not None or self._waits()
        if time.monotonic() > deadline or not waits:
          within = f" within config.rollout.server.wait_s={self.cfg.wait_s:g} s" if waits else ""
          raise ConfigError(f"config.rollout.server.url={url!r}: no OpenAI-compatible server answers{within} "
                            f"({e})") from None
        time.sleep(min(self.cfg.backoff_s, max(0.0, deadline - time.monotonic())))
    ids = [m.get("id") for m in models]
    if self.cfg.model and self.cfg.model not in ids:
      raise ConfigError(f"config.rollout.server.model={self.cfg.model!r}: the server at {url} serves {ids}")
    if not self.cfg.model and len(ids) != 1:
      raise ConfigError(f"config.rollout.server.model='' but the server at {url} serves {len(ids)} models {ids}: "
                        "name the one to sample from")
    self.model_name = self.cfg.model or ids[0]
    meta = models[ids.index(self.model_name)].get("meta") or {}
    n_vocab = meta.get("n_vocab")
    if n_vocab is not None and int(n_vocab) != self.model_cfg.vocab_size:
      raise ConfigError(f"the server at {url} serves {self.model_name!r} with a vocabulary of {n_vocab} tokens; the "
                        f"trainer's model has {self.model_cfg.vocab_size}: another vocabulary")
    probe = self._probe_text()
    ours = self._encode(probe)
    try:
      theirs = self.client.post("/tokenize", {"content": probe, "add_special": False}).get("tokens")
    except ServerRejected:  # a server without /tokenize: the size check above is all there is
      logging.warning("rollout engine: %s has no /tokenize; only the vocabulary size was checked", url)
      theirs = ours
    if theirs != ours:
      at = next((i for i, (a, b) in enumerate(zip(theirs, ours)) if a != b), min(len(theirs), len(ours)))
      raise ConfigError(f"the server at {url} ({self.model_name!r}) tokenizes {probe[:40]!r} differently from the "
                        f"trainer (first difference at token {at}: server {theirs[at:at + 3]}, trainer "
                        f"{ours[at:at + 3]}): another vocabulary")
    try:
      props = self.client.get("/props")
      self.n_ctx = (props.get("default_generation_settings") or {}).get("n_ctx")
    except (ServerRejected, ServerUnavailable):
      self.n_ctx = None
    self.check_applied_settings(ours[:1] or [0])

  def check_applied_settings(self, prompt_ids: list[int]) -> None:
    """Every sampling field as the server applies it (llama.cpp's native /completion echoes its
    `generation_settings`): llama.cpp ignores what it does not know (a sampler name, an option) without an
    error, so a field it did not take would change mu silently. A ConfigError names the field."""
    probe = {k: v for k, v in self.fields.items() if k not in ("max_tokens", "n", "logit_bias")}
    try:
      applied = self.client.post("/completion", {"prompt": prompt_ids, "n_predict": 1, "seed": 0, **probe})
    except ServerRejected:  # another server (vLLM, SGLang): no native endpoint to ask
      logging.warning("rollout engine: %s has no llama.cpp /completion; the applied sampling settings are not "
                      "checked", self.client.base_url)
      return
    settings = applied.get("generation_settings") or {}
    expected = {k: self.fields[k] for k in APPLIED_FIELDS}
    expected.update(ignore_eos=False, min_keep=0)
    for key, want in expected.items():
      got = settings.get(key)
      same = got == want if isinstance(want, (list, bool)) or got is None else math.isclose(
          float(got), float(want), rel_tol=1e-6, abs_tol=1e-7)
      if not same:
        raise ConfigError(f"the server at {self.client.base_url} applies {key}={got!r} where the engine asked for "
                          f"{want!r}: it would sample from another distribution than the one recorded as mu")

  def _probe_text(self) -> str:
    if isinstance(self.tokenizer, CharTokenizer):  # every character of the vocabulary
      specials = {self.tokenizer.pad_id, self.tokenizer.eos_id, self.tokenizer.bos_id}
      return self.tokenizer.decode([i for i in range(self.tokenizer.vocab_size) if i not in specials])
    return _PROBE

  def _encode(self, text: str) -> list[int]:
    if isinstance(self.tokenizer, CharTokenizer):
      return self.tokenizer.encode(text)
    return self.tokenizer.encode(text, add_special_tokens=False)

  def _waits(self) -> bool:
    return self.cfg.on_exit == "wait"

  def _recover(self, err: Exception) -> bool:
    """After a failed request: bring a dead server back as configured. True when it was down and is
    back (the failed attempt does not count against the retries)."""
    with self._recover_lock:
      if self.process is not None:
        if self.process.alive():
          return False
        with self._lock:
          self.counters["server_exits"] += 1
        code = self.process.exit_code
        if self.cfg.on_exit != "restart":
          raise RuntimeError(f"rollout engine: the llama.cpp server on {self.process.url} exited (code {code}) "
                             f"and config.rollout.server.on_exit={self.cfg.on_exit!r}") from None
        if self._restarts_this_call > self.cfg.retries:
          raise RuntimeError(f"rollout engine: the llama.cpp server exited {self._restarts_this_call} times during "
                             f"one rollout (last code {code}): {err}") from None
        logging.warning("rollout engine: llama.cpp server exited (code %s); restarting it on %s", code,
                        self.process.model_path)
        self.process.start(self.process.model_path)
        self._restarts_this_call += 1
        with self._lock:
          self.counters["server_restarts"] += 1
        return True
      try:
        self.client.get("/health", timeout_s=min(5.0, self.cfg.timeout_s))
        return False  # it answers: the failure was the request's own
      except (ServerUnavailable, ServerRejected):
        pass
      if not self._waits():
        raise RuntimeError(f"rollout engine: the server at {self.client.base_url} does not answer ({err}) and "
                           f"config.rollout.server.on_exit={self.cfg.on_exit!r}") from None
      logging.warning("rollout engine: the server at %s does not answer; waiting up to %g s", self.client.base_url,
                      self.cfg.wait_s)
      deadline = time.monotonic() + self.cfg.wait_s
      while time.monotonic() < deadline:
        try:
          self.client.get("/health", timeout_s=min(5.0, self.cfg.timeout_s))
          with self._lock:
            self.counters["server_exits"] += 1
          return True
        except (ServerUnavailable, ServerRejected):
          time.sleep(min(1.0, self.cfg.backoff_s))
      raise RuntimeError(f"rollout engine: the server at {self.client.base_url} did not come back within "
                         f"config.rollout.server.wait_s={self.cfg.wait_s:g} s ({err})") from None

  def post(self, path: str, payload: dict, parse=lambda answer: answer):
    """POST, `parse` the answer; retried on ServerUnavailable (a malformed answer included)."""
    attempt = 0
    while True:
      with self._lock:
        self.counters["requests"] += 1
      try:
        return parse(self.client.post(path, payload))
      except ServerUnavailable as e:
        back = self._recover(e)
        if not back:
          if attempt >= self.cfg.retries:
            raise
          with self._lock:
            self.counters["retries"] += 1
          time.sleep(self.cfg.backoff_s * 2 ** attempt)
          attempt += 1

  # ---- the contract ---------------------------------------------------------------

  def wants_params(self, version: int) -> bool:
    """Whether `sync(params, version)` reads `params` (then gathered to the host: primary_engine.py)."""
    return self.weight_sync.kind != "none" and not self._synced_recently(version)

  def _synced_recently(self, version: int) -> bool:
    return self.synced_step is not None and version - self.synced_step < self.cfg.sync_every

  def sync(self, params, version: int) -> None:
    """Push `params` to the server when `server.sync_every` steps have passed since the last push, and
    verify that it serves them (`server.sync_check`)."""
    if self._synced_recently(version):
      return
    t0 = time.perf_counter()
    exported = self.weight_sync.export(params, version)
    if exported is None:  # the server's weights are not ours to set
      return
    deadline = Deadline(self.cfg.sync_timeout_s, version)  # from the end of the export: the server's part
    try:
      reload_s = self.weight_sync.load(self, exported, deadline)
      if self.cfg.sync_check:
        self.verify(params, exported, deadline)
    except SyncTimeout:
      with self._lock:
        self.counters["sync_timeouts"] += 1
      raise
    with self._lock:
      self.counters["syncs"] += 1
      self.timings["export_s"] = exported.export_s
      self.timings["reload_s"] = reload_s
      self.timings["sync_s"] = time.perf_counter() - t0
    self.version, self.synced_step = version, version

  def verify(self, params, exported: Exported, deadline: Deadline) -> SyncCheck:
    """The server serves `exported` (it says so) and scores the probe as the trainer does the exported
    weights of `params`, within the tolerance, and not as it does the previous verified sync's
    (sync_check.py, point 3); a SyncCheckFailed naming the version and what differs otherwise."""
    served = self.weight_sync.served(self, deadline)
    theirs = engine_logp(self.client, self.model_name, self.probe_L, deadline, timeout_s=self.cfg.timeout_s,
                         retries=self.cfg.retries, backoff_s=self.cfg.backoff_s)
    held, held_cfg = self.weight_sync.expected(params)
    new_L = trainer_logp(held, held_cfg, self.probe_L)
    del held
    prev_version, prev_L = self.previous if self.previous[0] < exported.version else (-1, None)
    max_abs, dist_new, dist_prev, gap = probe_distances(theirs, new_L, prev_L)
    tol = tolerance(self.weight_sync.kind, self.cfg.sync_check_tol)
    check = SyncCheck(version=exported.version, served=served, served_version=version_of(served),
                      max_abs_dlogp=max_abs, tolerance=tol, dist_new=dist_new, dist_prev=dist_prev, gap=gap,
                      prev_version=prev_version)
    self.last_check = check
    same = served == exported.tag
    if same and check.max_abs_dlogp <= tol and not check.stale:  # (a NaN is not <=)
      self.previous = (exported.version, new_L)
      return check
    with self._lock:
      self.counters["sync_check_failures"] += 1
    raise SyncCheckFailed(failure_message(check, exported.tag, len(self.probe_L),
                                          tolerance_source(self.weight_sync.kind, self.cfg.sync_check_tol)))

  def generate(self, prompts, key) -> RolloutBatch:
    if self.client is None:
      raise RuntimeError("OpenAIEngine.generate before sync: the engine's server has no weights yet")
    scfg = self.scfg
    G, R, K = scfg.n_samples, scfg.max_new_tokens, scfg.record_topk
    n_prompts = prompts.tokens_BP.shape[0]
    B = n_prompts * G
    seeds = np.asarray(jax.random.randint(key, (B,), 0, 2**31 - 1), np.int64)
    rows = [prompts.tokens_BP[b // G][prompts.mask_BP[b // G]].astype(int).tolist() for b in range(B)]
    if self.n_ctx is not None:
      longest = max(len(r) for r in rows)
      if longest + R > self.n_ctx:
        raise ConfigError(f"a prompt of {longest} tokens + config.rollout.max_response_len={R} exceeds the server's "
                          f"context of {self.n_ctx} tokens per slot (a server the engine starts gets "
                          "config.data.max_prompt_len + max_response_len + 8, 512 for the prompt when it is 0)")
    self._restarts_this_call = 0
    samples: dict[int, Sample] = {}
    pending, last_error = list(range(B)), None
    for round_ in range(self.cfg.retries + 1 if self.cfg.on_failure == "resample" else 1):
      if round_:
        with self._lock:
          self.counters["resampled"] += len(pending)
        logging.warning("rollout engine: resampling %d samples whose requests failed", len(pending))
      failed = []
      with concurrent.futures.ThreadPoolExecutor(self.cfg.concurrency) as pool:
        futures = {pool.submit(self._sample, rows[b], int(seeds[b]) + round_ * 7919): b for b in pending}
        for fut in concurrent.futures.as_completed(futures):
          b = futures[fut]
          try:
            samples[b] = fut.result()
          except ServerUnavailable as e:
            last_error = e
            with self._lock:
              self.counters["failed_requests"] += 1
            logging.warning("rollout engine: sample %d failed after %d retries: %s", b, self.cfg.retries, e)
            failed.append(b)
      pending = sorted(failed)
      if not pending:
        break
    if not samples:  # nothing came back: a server that refuses every request (llama.cpp answers 500 to an
      # option it does not implement), not bad luck; a batch of empty rows would train on nothing
      raise RuntimeError(f"rollout engine: all {B} requests of the rollout failed; the last: {last_error}")
    with self._lock:
      self.counters["dropped"] += len(pending)
    return self._batch(prompts, samples, B, R, K)

  def close(self) -> None:
    if self.process is not None:
      self.process.stop()
    self.weight_sync.close()

  def turn_sampler(self, player, key):
    """Episode turns sent as they come (`OpenAISlots`); in rounds for several processes (`round_sampler`)."""
    from jaxrl_llm.sampling import openai_turns  # pylint: disable=import-outside-toplevel
    make = openai_turns.round_sampler if jax.process_count() > 1 else openai_turns.OpenAISlots
    return make(self, key, stop_strings=player.stop_strings)

  def metrics(self) -> dict[str, float]:
    """Counters since the start (requests, retries, failures, restarts, syncs, failed checks, timeouts), the
    last sync's seconds and what its check found (the version the server reports, max |delta log p| and the
    mean distances to the new and, from the second sync, the previous exported weights)."""
    with self._lock:
      out = {f"engine/{k}": float(v) for k, v in self.counters.items()}
      out.update({f"engine/{k}": v for k, v in self.timings.items()})
      if self.last_check is not None:  # the last verified (or failed) sync
        out["engine/sync_version"] = float(self.last_check.served_version)
        out["engine/sync_probe_max_abs_dlogp"] = self.last_check.max_abs_dlogp
        out["engine/sync_probe_dist_new"] = self.last_check.dist_new
        if self.last_check.prev_version >= 0:  # NaN on the first sync: left out
          out["engine/sync_probe_dist_prev"] = self.last_check.dist_prev
    return out

  # ---- one sample --------------------------------------------------------------------

  def _sample(self, prompt_ids: list[int], seed: int) -> Sample:
    payload = {"model": self.model_name, "prompt": prompt_ids, "seed": seed, **self.fields}
    return self.post("/v1/completions", payload, self._parse_checked)

  def _parse_checked(self, resp: dict) -> Sample:
    try:
      return self._parse(resp)
    except ConfigError:
      raise
    except (KeyError, IndexError, TypeError, ValueError) as e:
      raise ServerUnavailable(f"malformed completion ({type(e).__name__}: {e}): {str(resp)[:160]}") from None

  def _parse(self, resp: dict) -> Sample:
    return read_completion(resp, max_tokens=self.scfg.max_new_tokens, ends=self.ends, eos_ids=self.scfg.eos_ids,
                           vocab_size=self.model_cfg.vocab_size, topk=self.scfg.record_topk, pad_id=self.scfg.pad_id,
                           what="an answer")

  def _batch(self, prompts, samples: dict[int, Sample], B: int, R: int, K: int) -> RolloutBatch:
    pad, G = self.scfg.pad_id, self.scfg.n_samples
    tokens = np.full((B, R), pad, np.int32)
    mask = np.zeros((B, R), bool)
    logp = np.zeros((B, R), np.float32)
    top_ids = np.full((B, R, K), pad, np.int32)
    top_logp = np.zeros((B, R, K), np.float32)
    finish = np.full((B,), FINISH_LENGTH, np.int32)
    length = np.zeros((B,), np.int32)
    for b, s in samples.items():
      n = len(s.ids)
      tokens[b, :n], mask[b, :n], logp[b, :n], finish[b], length[b] = s.ids, True, s.logp, s.finish, n
      if K:
        top_ids[b, :n], top_logp[b, :n] = s.top_ids, s.top_logp
    dropped = np.array([b not in samples for b in range(B)])
    idx = np.arange(B) // G
    return RolloutBatch(
        prompt_BP=np.repeat(prompts.tokens_BP, G, axis=0), prompt_mask_BP=np.repeat(prompts.mask_BP, G, axis=0),
        tokens_BR=tokens, mask_BR=mask, behav_logp_BR=jnp.asarray(logp),
        truncated_B=(finish == FINISH_LENGTH) & ~dropped, length_B=length,
        topk_ids_BRK=jnp.asarray(top_ids), topk_logp_BRK=jnp.asarray(top_logp),
        prompts=tuple(prompts.prompts[i] for i in idx), answers=tuple(prompts.answers[i] for i in idx),
        tags=tuple(prompts.tags[i] for i in idx), responses=tuple(self.tokenizer.decode(row) for row in tokens),
        version_B=np.full((B,), self.version, np.int32))


def make_openai_engine(*, model_cfg, sampling_cfg, tokenizer, batch_sharding=None, run_cfg=None,
                       settings: ServerConfig | None = None, ctx_per_slot: int = 1024,
                       hf_path: str = "") -> OpenAIEngine:
  """The registry's factory: the settings of run_cfg.rollout.server (or given), the weight sync they name.

  `ctx_per_slot` is a started server's context per slot (prompt + response tokens) and `hf_path` the
  run's model.hf_path (a GGUF-converted checkpoint's tokenizer goes into the export); with run_cfg
  both come from it."""
  del batch_sharding  # the server holds the rows
  if run_cfg is not None:
    if run_cfg.objective.needs_token_kl:
      raise ConfigError(f"config.rollout.engine='openai' cannot serve objective {run_cfg.method!r}: its token "
                        "KL(mu || pi_theta) recomputes mu with the trainer's own sampler, not the server")
    settings = settings or run_cfg.rollout.server
    ctx_per_slot = (run_cfg.data.max_prompt_len or 512) + run_cfg.response_len + 8  # an episode: env.max_tokens
    hf_path = run_cfg.model.hf_path
  settings = settings or ServerConfig()
  process = None
  if settings.managed:
    check_tokenizer_exportable(tokenizer, hf_path)  # before any training, not at the first sync
    process = LlamaServerProcess(settings.command, alias=settings.model or "jaxrl_llm-policy",
                                 slots=settings.concurrency, ctx_per_slot=ctx_per_slot,
                                 wait_s=settings.wait_s, log_dir=RestartSync.make_dir(),
                                 exact=settings.export == "f32")
    sync = RestartSync(model_cfg=model_cfg, tokenizer=tokenizer, qtype=settings.export, hf_path=hf_path,
                       out_dir=process.log_dir)
  elif settings.sync == "sglang":
    sync = SGLangDiskSync(model_cfg=model_cfg)
  else:
    sync = NoSync()
  return OpenAIEngine(model_cfg=model_cfg, sampling_cfg=sampling_cfg, tokenizer=tokenizer, settings=settings,
                      weight_sync=sync, process=process)


register_engine("openai", make_openai_engine)
