"""The sampler's configuration: how logits become the behaviour policy mu.

The processing order is the one Hugging Face's warpers use: temperature, then
top-k, then top-p (on the top-k-renormalised distribution), then min-p. The
recorded behaviour log-probs are those of the distribution after all of it.
"""

from __future__ import annotations

import dataclasses

from jaxrl_llm.checks import DTYPES, bad, check_bool, check_choice, check_float, check_int
from jaxrl_llm.sampling.mismatch import SamplerMismatch
from jaxrl_llm.model.io.gguf_export import GGUF_EXPORT_TYPES

# An external engine's server (engine 'openai', sampling/openai_engine.py): how it gets the weights
# (sampling/weight_sync.py), what a request that keeps failing costs, what a server that died gets.
SERVER_SYNCS = ("restart", "sglang", "none")
SERVER_ON_FAILURE = ("resample", "drop")
SERVER_ON_EXIT = ("restart", "wait", "error")



def _check_int(name: str, value, low: int, high: int | None = None) -> None:
  check_int(f"SamplingConfig.{name}", value, low, high)


def _check_float(name: str, value) -> float:
  return check_float(f"SamplingConfig.{name}", value)


def _check_ids(name: str, ids) -> tuple[int, ...]:
  if not isinstance(ids, (tuple, list)):
    raise TypeError(f"SamplingConfig.{name} must be a tuple of token ids, got {ids!r}")
  for i in ids:
    if isinstance(i, bool) or not isinstance(i, int) or i < 0:
      raise ValueError(f"SamplingConfig.{name} holds {i!r}: token ids are ints >= 0")
  return tuple(ids)


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """How to sample, what to record. Hashable: it is a static jit argument.

  Attributes:
    temperature: logits are divided by it; 0 means greedy (argmax, and the
      recorded log mu is 0 = log 1, the greedy policy being a point mass).
    top_k: keep the k most likely tokens; 0 disables.
    top_p: keep the smallest set of most likely tokens whose mass reaches
      top_p, in (0, 1]; 1 disables.
    min_p: keep tokens with p >= min_p * p_max, in [0, 1); 0 disables.
    max_new_tokens: response length R (the output arrays are [B, R]).
    n_samples: samples per prompt; the samples of one prompt are consecutive
      rows (a group), row b belongs to prompt b // n_samples.
    eos_ids: tokens that end a row with finish reason "eos".
    stop_ids: tokens that end a row with finish reason "stop".
    stop_sequences: token sequences that end a row with finish reason "stop"
      once the row's sampled tokens end with one (a multi-token stop string
      such as a tool call's closing tag, sampling/turns.py); the sequence is
      part of the response.
    pad_id: written after a row has finished.
    record_topk: record the k most likely ids and their log mu per position;
      0 disables.
    record_raw_logp: also record log softmax(logits)[y] at temperature 1 and
      without truncation (the sampling model's own log-prob).
    dtype: cast floating params and the model's compute dtype to this before
      sampling ("bfloat16" for a cheaper sampler than an f32 trainer); None
      samples with the params and model config exactly as given.
    vocab_limit: ids >= vocab_limit are never sampled (rows of a vocabulary
      padded past the tokenizer's, which it cannot decode); 0 disables.
    cache_len: KV cache slots S; None means P + max_new_tokens. A prompt of
      length P with P + max_new_tokens > cache_len is an error.
  """

  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  min_p: float = 0.0
  max_new_tokens: int = 128
  n_samples: int = 1
  eos_ids: tuple[int, ...] = ()
  stop_ids: tuple[int, ...] = ()
  stop_sequences: tuple[tuple[int, ...], ...] = ()
  pad_id: int = 0
  record_topk: int = 0
  record_raw_logp: bool = False
  dtype: str | None = None
  cache_len: int | None = None
  vocab_limit: int = 0

  def __post_init__(self):
    temperature = _check_float("temperature", self.temperature)
    if temperature < 0:
      raise ValueError(f"SamplingConfig.temperature={temperature} must be >= 0 (0 means greedy)")
    top_p = _check_float("top_p", self.top_p)
    if not 0.0 < top_p <= 1.0:
      raise ValueError(f"SamplingConfig.top_p={top_p} must be in (0, 1] (1 disables)")
    min_p = _check_float("min_p", self.min_p)
    if not 0.0 <= min_p < 1.0:
      raise ValueError(f"SamplingConfig.min_p={min_p} must be in [0, 1) (0 disables)")
    _check_int("top_k", self.top_k, 0)
    _check_int("max_new_tokens", self.max_new_tokens, 1)
    _check_int("n_samples", self.n_samples, 1)
    _check_int("pad_id", self.pad_id, 0)
    _check_int("record_topk", self.record_topk, 0)
    _check_int("vocab_limit", self.vocab_limit, 0)
    eos_ids = _check_ids("eos_ids", self.eos_ids)
    stop_ids = _check_ids("stop_ids", self.stop_ids)
    if not isinstance(self.stop_sequences, (tuple, list)):
      raise TypeError(f"SamplingConfig.stop_sequences must be a tuple of token-id tuples, got {self.stop_sequences!r}")
    stop_sequences = tuple(_check_ids("stop_sequences (an entry)", seq) for seq in self.stop_sequences)
    if any(not seq for seq in stop_sequences):
      raise ValueError("SamplingConfig.stop_sequences holds an empty sequence: each needs at least one id")
    both = sorted(set(eos_ids) & set(stop_ids))
    if both:
      raise ValueError(f"SamplingConfig: ids {both} are in both eos_ids and stop_ids; the finish reason would be ambiguous")
    if not isinstance(self.record_raw_logp, bool):
      raise TypeError(f"SamplingConfig.record_raw_logp must be a bool, got {self.record_raw_logp!r}")
    if self.dtype is not None:
      check_choice("SamplingConfig.dtype", self.dtype, DTYPES)
    if self.cache_len is not None:
      _check_int("cache_len", self.cache_len, self.max_new_tokens + 1)
    # Normalise numbers and id lists so equal configs hash equal (one compile).
    object.__setattr__(self, "temperature", temperature)
    object.__setattr__(self, "top_p", top_p)
    object.__setattr__(self, "min_p", min_p)
    object.__setattr__(self, "eos_ids", eos_ids)
    object.__setattr__(self, "stop_ids", stop_ids)
    object.__setattr__(self, "stop_sequences", stop_sequences)

  @property
  def greedy(self) -> bool:
    return self.temperature == 0.0

  def check_vocab(self, vocab_size: int) -> None:
    """Checks the fields bounded by the vocabulary (known only with the model)."""
    if self.top_k > vocab_size:
      raise ValueError(f"SamplingConfig.top_k={self.top_k} exceeds the vocabulary size {vocab_size}: allowed [0, {vocab_size}]")
    if self.record_topk > vocab_size:
      raise ValueError(f"SamplingConfig.record_topk={self.record_topk} exceeds the vocabulary size {vocab_size}: allowed [0, {vocab_size}]")
    for name, ids in (("eos_ids", self.eos_ids), ("stop_ids", self.stop_ids),
                      ("stop_sequences", [i for seq in self.stop_sequences for i in seq])):
      bad = [i for i in ids if i >= vocab_size]
      if bad:
        raise ValueError(f"SamplingConfig.{name} holds {bad}, outside the vocabulary [0, {vocab_size})")
    if self.pad_id >= vocab_size:
      raise ValueError(f"SamplingConfig.pad_id={self.pad_id} is outside the vocabulary [0, {vocab_size})")

  def cache_slots(self, prompt_len: int) -> int:
    """The KV cache length S for prompts padded to prompt_len."""
    needed = prompt_len + self.max_new_tokens
    if self.cache_len is None:
      return needed
    if needed > self.cache_len:
      raise ValueError(
          f"prompt length {prompt_len} + max_new_tokens {self.max_new_tokens} = {needed} exceeds "
          f"SamplingConfig.cache_len={self.cache_len}: allowed prompt length <= {self.cache_len - self.max_new_tokens}")
    return self.cache_len


@dataclasses.dataclass(frozen=True)
class ServerConfig:
  """The run config's `rollout.server` section: engine 'openai' (sampling/openai_engine.py), an
  OpenAI-compatible completions server (llama.cpp's), and how it gets the weights (weight_sync.py).
  Each field is a key, `--config.rollout.server.<field>=...`; training/defaults.py builds the block
  from these defaults. The engine reads this dataclass as it is."""

  url: str = ""  # http://HOST:PORT of a running server; "": the engine starts llama.cpp's server itself
  model: str = ""  # model id the server must serve (GET /v1/models); "": the only one it serves
  command: str = "llama-server"  # llama.cpp server (and flags, e.g. "llama-server -t 2") that the engine starts
  export: str = "f32"  # f32 | f16 | q8_0 | q4_0: GGUF type of the weight matrices pushed at each sync
  # how the server gets the weights: restart (export GGUF, restart the started server) | sglang (a HF
  # directory + POST /update_weights_from_disk) | none (fixed weights)
  sync: str = "restart"
  sync_every: int = 1  # RL steps between weight pushes to the server (samples record the version they used)
  concurrency: int = 8  # requests in flight (the started server's slots, -np)
  timeout_s: float = 120.0  # seconds per request before it counts as failed
  retries: int = 3  # retries of a failed request, after backoff_s * 2^attempt seconds
  backoff_s: float = 0.5  # first back-off, seconds
  # a request that kept failing: resample (new seed, up to `retries` rounds) | drop (its sample masked out)
  on_failure: str = "resample"
  on_exit: str = "restart"  # the server gone mid-run: restart it (a started one) | wait (wait_s) | error
  wait_s: float = 120.0  # seconds to wait for a server to start or to come back
  # after every weight sync the server must report the version pushed and score a fixed probe like the
  # trainer, within sync_check_tol, or the step fails (sampling/sync_check.py); False: no check
  sync_check: bool = True
  sync_check_tol: float = 0.0  # max |delta log p| allowed on the probe; 0: the export type's measured one
  sync_timeout_s: float = 600.0  # seconds a sync may take after its export (the server loading, the check)

  def __post_init__(self):
    for name in ("url", "model", "command"):
      if not isinstance(getattr(self, name), str):
        raise bad(f"config.rollout.server.{name}", getattr(self, name), "a string")
    check_choice("config.rollout.server.export", self.export, GGUF_EXPORT_TYPES)
    check_choice("config.rollout.server.sync", self.sync, SERVER_SYNCS)
    check_int("config.rollout.server.sync_every", self.sync_every, 1)
    check_int("config.rollout.server.concurrency", self.concurrency, 1, 1024)
    check_int("config.rollout.server.retries", self.retries, 0, 100)
    check_choice("config.rollout.server.on_failure", self.on_failure, SERVER_ON_FAILURE)
    check_choice("config.rollout.server.on_exit", self.on_exit, SERVER_ON_EXIT)
    check_bool("config.rollout.server.sync_check", self.sync_check)
    # Seconds and tolerances as floats, so that equal settings compare (and hash) equal.
    for name, low_open, high in (("timeout_s", True, 86400.0), ("backoff_s", False, 3600.0),
                                 ("wait_s", True, 86400.0), ("sync_check_tol", False, 1000.0),
                                 ("sync_timeout_s", True, 86400.0)):
      value = check_float(f"config.rollout.server.{name}", getattr(self, name), 0.0, high, low_open=low_open)
      object.__setattr__(self, name, value)

  @property
  def managed(self) -> bool:
    """The engine starts llama.cpp's server itself and restarts it on each export (sync='restart')."""
    return self.sync == "restart"


# How the built-in sampler holds its weights on the mesh (sampling/engine.py, JaxSampler.sync).
SAMPLER_SHARDINGS = ("fsdp", "tensor")


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
  """The run config's `rollout` section (its own keys documented in jaxrl_llm/training/defaults.py;
  the `mismatch` and `server` sections by their dataclasses): how many samples a step draws, from
  which engine, with what settings and mismatch.

  The mismatch between the sampler mu and the trainer's pi_prox is dialled by
  `sampler_dtype`, `staleness` and, for the built-in engine, `mismatch`
  (quant, quant_group, noise, noise_seed: sampling/mismatch.py); all combine.
  """

  engine: str  # a rollout engine of sampling/engine.py's registry (checked against it by RunConfig)
  prompts_per_step: int
  group_size: int
  max_response_len: int
  temperature: float
  top_k: int
  top_p: float
  sampler_dtype: str
  sampler_sharding: str  # fsdp: the params as the trainer holds them | tensor: gathered over fsdp at each sync
  staleness: int
  overlap: bool  # generate the next batches in the background (training/async_rollout.py); needs staleness >= 1
  record_topk: int
  continuous_slots: int  # built-in engine: 0 one static batch per step; N > 0 N slots with continuous batching
  decode_chunk: int  # continuous batching: decode steps between two looks at which samples ended
  exact: bool  # log mu recorded by the trainer's row-wise program: == log pi_prox on-policy (sampling/exact.py)
  mismatch: SamplerMismatch = SamplerMismatch()  # the built-in sampler's weight mismatch (quantisation, noise)
  server: ServerConfig = ServerConfig()  # an external engine's server (engine 'openai')

  @property
  def batch_size(self) -> int:
    """B: samples per RL step."""
    return self.prompts_per_step * self.group_size

  def __post_init__(self):
    if not isinstance(self.engine, str) or not self.engine:
      raise bad("config.rollout.engine", self.engine, "the name of a registered rollout engine")
    check_int("config.rollout.prompts_per_step", self.prompts_per_step, 1)
    check_int("config.rollout.group_size", self.group_size, 1)
    check_int("config.rollout.max_response_len", self.max_response_len, 1)
    check_float("config.rollout.temperature", self.temperature, 0.0, 10.0, low_open=True)
    check_int("config.rollout.top_k", self.top_k, 0)
    check_float("config.rollout.top_p", self.top_p, 0.0, 1.0, low_open=True)
    check_choice("config.rollout.sampler_dtype", self.sampler_dtype, DTYPES)
    check_choice("config.rollout.sampler_sharding", self.sampler_sharding, SAMPLER_SHARDINGS)
    if self.sampler_sharding != "fsdp" and self.engine != "builtin":
      raise bad("config.rollout.sampler_sharding", self.sampler_sharding, "the built-in engine's layout: another "
                "engine holds its own weights, use 'fsdp'")
    check_int("config.rollout.staleness", self.staleness, 0, 64)
    check_int("config.rollout.record_topk", self.record_topk, 0)
    check_bool("config.rollout.overlap", self.overlap)
    check_int("config.rollout.continuous_slots", self.continuous_slots, 0)
    check_int("config.rollout.decode_chunk", self.decode_chunk, 1)
    if self.continuous_slots and self.engine != "builtin":
      raise bad("config.rollout.continuous_slots", self.continuous_slots, "0 for engine "
                f"{self.engine!r}: continuous batching is the built-in sampler's (the server batches on its own)")
    if self.overlap and self.staleness < 1:
      raise bad("config.rollout.staleness", self.staleness, "rollout.overlap=True samples step s+1's batch while "
                "step s updates, so with params at least one step old: use staleness >= 1 (it is the queue depth)")
    if not isinstance(self.mismatch, SamplerMismatch):
      raise bad("config.rollout.mismatch", self.mismatch, "a SamplerMismatch (sampling/mismatch.py)")
    if not isinstance(self.server, ServerConfig):
      raise bad("config.rollout.server", self.server, "a ServerConfig (sampling/config.py)")
    server = self.server
    if self.engine == "openai":
      if server.managed and server.url:
        raise bad("config.rollout.server.url", server.url, "server.sync='restart' starts its own llama.cpp "
                  "server: leave server.url empty, or choose server.sync 'sglang' or 'none' for a running server")
      if not server.managed and not server.url:
        raise bad("config.rollout.server.url", server.url, f"server.sync={server.sync!r} needs the "
                  "http://HOST:PORT of a running server")
      if server.on_exit == "restart" and not server.managed:
        raise bad("config.rollout.server.on_exit", server.on_exit, "only a server the engine started "
                  "(server.sync='restart') can be restarted: use 'wait' or 'error'")
      if self.sampler_dtype != "float32":
        raise bad("config.rollout.sampler_dtype", self.sampler_dtype, "engine 'openai' samples at the precision "
                  "of config.rollout.server.export: use 'float32'")
    check_bool("config.rollout.exact", self.exact)
    if self.exact:
      if self.engine != "builtin":
        raise bad("config.rollout.engine", self.engine, "rollout.exact records log mu with the trainer's own program "
                  "from the built-in sampler's weights: use engine 'builtin', or rollout.exact=False")
      for name, value, off in (("top_k", self.top_k, 0), ("top_p", self.top_p, 1.0),
                               ("record_topk", self.record_topk, 0)):
        if value != off:
          raise bad(f"config.rollout.{name}", value, f"{off} with rollout.exact=True (log mu is recomputed from the "
                    "untruncated softmax at the temperature, as the trainer's log pi), or rollout.exact=False")
    if self.mismatch.active and self.engine != "builtin":
      raise bad("config.rollout.engine", self.engine, "rollout.mismatch.quant and rollout.mismatch.noise are "
                "applied by the built-in sampler only: use engine 'builtin', or mismatch.quant='none' and "
                "mismatch.noise=0")

  @property
  def mismatched(self) -> bool:
    """Whether anything makes mu differ from pi_prox (dtype, staleness, quant, noise, an external engine)."""
    return (self.sampler_dtype != "float32" or self.staleness > 0 or self.mismatch.active
            or self.engine != "builtin")  # another engine's kernels (and an export type) are a mismatch too

  def sampling(self, tokenizer, *, greedy: bool = False) -> SamplingConfig:
    """The sampler's settings for this rollout config and tokenizer (greedy: the evaluation's)."""
    return SamplingConfig(
        temperature=0.0 if greedy else self.temperature, top_k=0 if greedy else self.top_k,
        top_p=1.0 if greedy else self.top_p, max_new_tokens=self.max_response_len,
        n_samples=1 if greedy else self.group_size, eos_ids=tuple(tokenizer.eos_ids), pad_id=tokenizer.pad_id,
        record_topk=0 if greedy else self.record_topk, vocab_limit=tokenizer.vocab_size,
        dtype=None if self.sampler_dtype == "float32" else self.sampler_dtype)
