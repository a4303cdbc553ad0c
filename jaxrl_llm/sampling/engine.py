"""The rollout-engine contract: whatever samples the tokens (mu, docs/objectives.md section 1).

A rollout engine turns a batch of prompts into G samples per prompt and
returns them as a `RolloutBatch`, with the behaviour log-probs log mu of
the sampled tokens (and mu's top-k when `record_topk` asks for it):

    engine.sync(params, version)     # the weights to sample with from now on
    batch = engine.generate(prompts, key)
    engine.close()

The built-in engine (`JaxSampler`, name "builtin") is the jitted KV-cache
sampler of this package (`sampling.generate`), run on the trainer's mesh.
Engines are chosen by name (`config.rollout.engine`) from the registry at
the end of this file; a new engine is a class with the three methods above
and one `register_engine` line.

`Rollout` (sampling/rollout.py) is what one `generate` call returns on the
device, one row per sample with its prompt's row index. A `RolloutBatch` is
the trainer's record of a step's samples: the prompts repeated per sample,
the texts the verifier reads, and the sampled arrays. The arrays the host
needs (tokens, masks, lengths: decoding, rewards, filters) are numpy; the
log-probs only the update reads stay on the device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.model import sharding as sharding_lib
from jaxrl_llm.checks import ConfigError
from jaxrl_llm.model.config import ModelConfig
from jaxrl_llm.sampling import generate as generate_lib
from jaxrl_llm.sampling.continuous import generate_continuous
from jaxrl_llm.sampling.config import SamplingConfig
from jaxrl_llm.sampling.loop import cast_params
from jaxrl_llm.sampling.mismatch import NO_MISMATCH, SamplerMismatch, mismatched_params
from jaxrl_llm.sampling.primary_engine import PrimaryEngine
from jaxrl_llm.sampling.rollout import FINISH_LENGTH


@dataclasses.dataclass(frozen=True)
class RolloutBatch:
  """B = prompts x G samples, a prompt's samples consecutive.

  A sample is one response, or one multi-turn episode (training/episodes.py): then the response is
  everything after the opening prompt, the policy's turns and the environment's observations in
  order, and `mask_BR` marks the policy's tokens only (the loss's tokens), `context_BR` all of them
  (what the forward passes attend to), `turn_BR` each token's turn. A single-turn engine leaves the
  last four fields at their defaults (filled in `__post_init__`).
  """

  prompt_BP: np.ndarray  # int32 [B, P] left-padded prompt of each sample
  prompt_mask_BP: np.ndarray  # bool [B, P]
  tokens_BR: np.ndarray  # int32 [B, R] response tokens, pad after the finish
  mask_BR: np.ndarray  # bool [B, R] the sampled tokens (EOS included)
  behav_logp_BR: jax.Array  # f32 [B, R] log mu(y_t), on the device
  truncated_B: np.ndarray  # bool [B]: cut at max_response_len without EOS
  length_B: np.ndarray  # int32 [B]: response tokens (EOS included)
  topk_ids_BRK: jax.Array  # int32 [B, R, K] mu's K most likely ids, K = record_topk (0: empty), on the device
  topk_logp_BRK: jax.Array  # f32 [B, R, K] log mu at those ids, on the device
  prompts: tuple[str, ...]  # [B]
  answers: tuple[str, ...]  # [B]
  tags: tuple[str, ...]  # [B] task tags (Example.tag)
  responses: tuple[str, ...]  # [B] decoded text up to EOS
  version_B: np.ndarray  # int32 [B] policy version (the `version` of the engine's last sync) that sampled the row; -1: none
  context_BR: np.ndarray | None = None  # bool [B, R] the response's real tokens, sampled or an observation; None: mask_BR
  turn_BR: np.ndarray | None = None  # int32 [B, R] turn of each token (an observation: the turn it precedes); None: 0
  statuses: tuple[str, ...] = ()  # [B] why each episode ended (envs/base.py STATUSES); (): single-turn samples
  reward_parts: tuple[dict, ...] = ()  # [B] each episode's reward parts {name: float}; (): the verifier scores `responses`
  turn_reward_parts: tuple[tuple[dict, ...], ...] = ()  # [B] each episode's parts per turn, in order (per-turn rewards)

  def __post_init__(self):
    if self.context_BR is None:
      object.__setattr__(self, "context_BR", np.asarray(self.mask_BR, bool).copy())
    if self.turn_BR is None:
      object.__setattr__(self, "turn_BR", np.zeros(np.shape(self.mask_BR), np.int32))

  @property
  def episodic(self) -> bool:
    """The rows are multi-turn episodes (rewards from the environment, not the verifier)."""
    return bool(self.statuses)

  @property
  def sampled_B(self) -> np.ndarray:
    """bool [B]: the row holds a sample. False for a request the external engine dropped
    (rollout.server.on_failure=drop: no tokens); the built-in sampler always emits at least one token."""
    return self.length_B > 0

  @staticmethod
  def concat(parts: list["RolloutBatch"]) -> "RolloutBatch":
    """The rows of several batches, in order."""
    out = {}
    for f in dataclasses.fields(RolloutBatch):
      vals = [getattr(p, f.name) for p in parts]
      if isinstance(vals[0], tuple):
        out[f.name] = sum(vals, ())
      elif isinstance(vals[0], np.ndarray):
        out[f.name] = np.concatenate(vals, axis=0)
      else:
        out[f.name] = jnp.concatenate(vals, axis=0)
    return RolloutBatch(**out)

  def select(self, rows: np.ndarray) -> "RolloutBatch":
    """The given rows, in the given order."""
    out = {}
    for f in dataclasses.fields(RolloutBatch):
      v = getattr(self, f.name)
      if isinstance(v, tuple):
        out[f.name] = tuple(v[i] for i in rows) if v else v  # (): a field single-turn samples leave empty
      else:
        out[f.name] = v[rows]
    return RolloutBatch(**out)


class RolloutEngine(Protocol):
  """What samples the rollouts (the behaviour policy mu)."""

  def sync(self, params: Any, version: int) -> None:
    """From now on, sample with `params` (the policy of step `version`)."""

  def generate(self, prompts, key: jax.Array) -> RolloutBatch:
    """G samples for each prompt of a `tasks.pipeline.PromptBatch`; `key` fixes the draws."""

  def metrics(self) -> dict[str, float]:
    """The engine's own counters for the step's metrics (requests, retries, restarts, sync seconds);
    {} for an engine without any."""

  def turn_sampler(self, player, key: jax.Array) -> Callable[[list, list, int], Any]:
    """Episodes (training/episodes.py): either the function (contexts, budgets, round) -> that round's
    sampling.turns.SampledTurns, one turn per context under its token budget, sampled with this
    engine's weights and `player`'s turn settings (its `stop_strings`, `round_sampler`; round k draws
    with fold_in(key, k)), played in lock-step rounds; or an object that takes each turn as it comes
    (`submit`, `advance`, `release`, `busy`, `capacity`, `close`: sampling/episode_slots.py's
    `EpisodeSlots`, openai_turns.py's `OpenAISlots`), played by `play_slots`. An engine that cannot play
    episodes raises a ConfigError naming it."""

  def close(self) -> None:
    """Release what the engine holds (processes, connections)."""


def sampler_view(params, model_cfg: ModelConfig, scfg: SamplingConfig, mismatch: SamplerMismatch = NO_MISMATCH):
  """(params, model config) as the sampler runs them: the built-in engine's
  weight mismatch applied (sampling/mismatch.py), then cast to `scfg.dtype` when set.

  A recompute of mu (TRM's token KL) runs this view so that it sees the
  distribution the tokens were sampled from.
  """
  if mismatch.active:
    params = mismatched_params(params, mismatch)
  return cast_params(params, scfg.dtype), generate_lib.sampler_model_config(model_cfg, scfg)


def sample_batch(params, model_cfg: ModelConfig, prompts, scfg: SamplingConfig, key, tokenizer,
                 batch_sharding=None, version: int = -1, *, slots: int = 0, chunk: int = 16) -> RolloutBatch:
  """The built-in sampler on one PromptBatch (rows split over `batch_sharding`); `version` is recorded per row.
  slots > 0: continuous batching in that many slots, `chunk` decode steps between looks (same samples)."""
  # On the batch sharding's mesh the rows and the KV cache are split over its batch axes (and the
  # cache's kv heads over tensor); without the mesh the compiler may keep a whole cache per chip
  # (128 GB per chip for Qwen3-8B at 32 x 8 samples of 1,024 + 4,096 tokens on a v5p-128).
  mesh = batch_sharding.mesh if batch_sharding is not None else None
  if slots:
    ro = generate_continuous(params, model_cfg, prompts.tokens_BP, prompts.mask_BP, scfg, key, slots=slots,
                             chunk=chunk, mesh=mesh)
  else:
    ro = generate_lib.generate(params, model_cfg, prompts.tokens_BP, prompts.mask_BP, scfg, key, mesh=mesh)
  # The host needs the tokens (decoding, rewards) and the masks; log mu stays on the device.
  tokens_BR, mask_BR, finish_B, length_B, idx = sharding_lib.fetch(
      (ro.tokens_BR, ro.mask_BR, ro.finish_reason_B, ro.length_B, ro.prompt_index_B))
  G, K = scfg.n_samples, scfg.record_topk
  tokens_BR = np.asarray(tokens_BR, np.int32)
  B, R = tokens_BR.shape
  idx = np.asarray(idx)
  return RolloutBatch(
      prompt_BP=np.repeat(prompts.tokens_BP, G, axis=0), prompt_mask_BP=np.repeat(prompts.mask_BP, G, axis=0),
      tokens_BR=tokens_BR, mask_BR=np.asarray(mask_BR, bool), behav_logp_BR=ro.behav_logp_BR.astype(jnp.float32),
      truncated_B=np.asarray(finish_B) == FINISH_LENGTH, length_B=np.asarray(length_B, np.int32),
      topk_ids_BRK=ro.topk_ids_BRK.astype(jnp.int32) if K else jnp.zeros((B, R, 0), jnp.int32),
      topk_logp_BRK=ro.topk_logp_BRK.astype(jnp.float32) if K else jnp.zeros((B, R, 0), jnp.float32),
      prompts=tuple(prompts.prompts[i] for i in idx), answers=tuple(prompts.answers[i] for i in idx),
      tags=tuple(prompts.tags[i] for i in idx), responses=tuple(tokenizer.decode(row) for row in tokens_BR),
      version_B=np.full((B,), version, np.int32))


def sampler_gather(model_cfg: ModelConfig, scfg: SamplingConfig, mesh):
  """The jitted copy of the params the sampler holds under rollout.sampler_sharding='tensor': cast to
  the sampler's dtype and gathered over fsdp (model.sharding.sampler_param_shardings), one program
  per sync."""
  from jaxrl_llm.model.sharding import sampler_param_shardings

  return jax.jit(lambda params: cast_params(params, scfg.dtype),
                 out_shardings=sampler_param_shardings(model_cfg, mesh))


class JaxSampler:
  """The built-in engine: the jitted sampler on the trainer's devices.

  `sync` keeps a reference to the params (no copy): the trainer hands it the
  policy, or a snapshot k steps old under `rollout.staleness`. With a weight
  `mismatch` (rollout.mismatch: quant, noise) `sync` derives the sampler's own
  weights from them instead (`mismatch.mismatched_params`, one copy).
  """

  def __init__(self, *, model_cfg: ModelConfig, sampling_cfg: SamplingConfig, tokenizer, batch_sharding=None,
               mismatch: SamplerMismatch = NO_MISMATCH, sharding: str = "fsdp", slots: int = 0, chunk: int = 16):
    self.model_cfg, self.sampling_cfg, self.tokenizer = model_cfg, sampling_cfg, tokenizer
    self.slots, self.chunk = slots, chunk  # rollout.continuous_slots, rollout.decode_chunk
    if slots and batch_sharding is not None:
      mesh = batch_sharding.mesh
      shards = int(np.prod([mesh.shape[a] for a in generate_lib.resolve_data_axis(mesh, None)]))
      if slots % shards:
        raise ConfigError(f"config.rollout.continuous_slots={slots} is invalid: the slots split over the mesh's "
                          f"{shards} batch shards, so allowed a multiple of {shards}")
    self.batch_sharding, self.mismatch = batch_sharding, mismatch
    self.params, self.version = None, -1
    self._gather = None
    if sharding == "tensor" and batch_sharding is not None:  # rollout.sampler_sharding
      self._gather = sampler_gather(model_cfg, sampling_cfg, batch_sharding.mesh)

  def sync(self, params, version: int) -> None:
    params = mismatched_params(params, self.mismatch) if self.mismatch.active else params
    self.params = self._gather(params) if self._gather is not None else params
    self.version = version

  def generate(self, prompts, key) -> RolloutBatch:
    if self.params is None:
      raise RuntimeError("JaxSampler.generate before sync: the engine has no weights yet")
    return sample_batch(self.params, self.model_cfg, prompts, self.sampling_cfg, key, self.tokenizer,
                        self.batch_sharding, version=self.version, slots=self.slots, chunk=self.chunk)

  def metrics(self) -> dict[str, float]:
    return {}  # in-process sampling: no requests, retries or restarts to count

  def turn_sampler(self, player, key):
    """The episodes' turns sampled in this process with the synced weights: the player's
    `round_sampler` (sampling/turns.py, its cache kept across rounds where the player keeps it), or
    with rollout.continuous_slots its `slot_sampler` (sampling/episode_slots.py)."""
    if self.params is None:
      raise RuntimeError("JaxSampler.turn_sampler before sync: the engine has no weights yet")
    mesh = self.batch_sharding.mesh if self.batch_sharding is not None else None
    if self.slots:  # rollout.continuous_slots: the episodes on the continuous batcher
      return player.slot_sampler(self.params, self.model_cfg, self.sampling_cfg, key, mesh=mesh)
    return player.round_sampler(self.params, self.model_cfg, self.sampling_cfg, key, mesh=mesh)

  def close(self) -> None:
    self.params = None


# ---- the registry ------------------------------------------------------------------

# factory(model_cfg=, sampling_cfg=, tokenizer=, batch_sharding=, run_cfg=) -> RolloutEngine
EngineFactory = Callable[..., RolloutEngine]
_ENGINES: dict[str, EngineFactory] = {}
_ON_MESH: set[str] = set()  # engines whose programs run on the run's mesh: every process drives them


def register_engine(name: str, factory: EngineFactory, *, on_mesh: bool = False) -> None:
  """`on_mesh`: the engine runs JAX programs over the mesh (`batch_sharding`), so every process makes
  and drives its own, as the built-in sampler; otherwise (a server's client) process 0 alone drives
  it in a run of several processes (sampling/primary_engine.py)."""
  if name in _ENGINES:
    raise ValueError(f"rollout engine {name!r} is registered already")
  _ENGINES[name] = factory
  if on_mesh:
    _ON_MESH.add(name)


def engine_names() -> tuple[str, ...]:
  return tuple(_ENGINES)


def make_engine(name: str, **kwargs) -> RolloutEngine:
  """The registered engine `name`. In a run of several processes an engine not registered `on_mesh` is
  made and driven by process 0 (sampling/primary_engine.py)."""
  if name not in _ON_MESH and jax.process_count() > 1:
    return PrimaryEngine(lambda: _checked(name, _ENGINES[name](**kwargs)))
  return _checked(name, _ENGINES[name](**kwargs))


def _checked(name: str, engine) -> RolloutEngine:
  missing = [m for m in ("sync", "generate", "metrics", "close") if not callable(getattr(engine, m, None))]
  if missing:
    raise TypeError(f"rollout engine {name!r}: its {type(engine).__name__} has no {', '.join(missing)}; a rollout "
                    "engine has sync, generate, metrics and close (sampling/engine.py's RolloutEngine)")
  return engine


def _builtin(*, model_cfg, sampling_cfg, tokenizer, batch_sharding=None, run_cfg=None) -> JaxSampler:
  # The sampling config says how to sample; the run's rollout section adds the weight mismatch.
  mismatch = run_cfg.rollout.mismatch if run_cfg is not None else NO_MISMATCH
  sharding = run_cfg.rollout.sampler_sharding if run_cfg is not None else "fsdp"
  slots = run_cfg.rollout.continuous_slots if run_cfg is not None else 0
  chunk = run_cfg.rollout.decode_chunk if run_cfg is not None else 16
  return JaxSampler(model_cfg=model_cfg, sampling_cfg=sampling_cfg, tokenizer=tokenizer, slots=slots, chunk=chunk,
                    batch_sharding=batch_sharding, mismatch=mismatch, sharding=sharding)


register_engine("builtin", _builtin, on_mesh=True)
