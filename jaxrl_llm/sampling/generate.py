"""The sampler's public entry point: validated inputs in, a Rollout out."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl_llm.model import sharding as sharding_lib
from jaxrl_llm.model.sharding import BATCH_AXES

from jaxrl_llm.model.config import ModelConfig
from jaxrl_llm.sampling.config import SamplingConfig
from jaxrl_llm.sampling.loop import decode, prefill, to_rollout
from jaxrl_llm.sampling.rollout import Rollout


def sampler_model_config(model_cfg: ModelConfig, cfg: SamplingConfig) -> ModelConfig:
  """The model config the sampler runs: cfg.dtype, when set, overrides both
  the param and the compute dtype (e.g. a bf16 sampler for an f32 trainer)."""
  if cfg.dtype is None:
    return model_cfg
  return model_cfg.replace(param_dtype=cfg.dtype, compute_dtype=cfg.dtype)


def check_prompt_tokens(prompt_tokens_BP, prompt_mask_BP, vocab_size: int) -> None:
  """Refuse prompts that are not [batch, prompt_len] token ids of the vocabulary with a boolean mask."""
  for name, x in (("prompt_tokens_BP", prompt_tokens_BP), ("prompt_mask_BP", prompt_mask_BP)):
    if getattr(x, "ndim", None) != 2:
      raise ValueError(f"generate: {name} must be a 2-D [batch, prompt_len] array, got shape {getattr(x, 'shape', None)}")
  if prompt_tokens_BP.shape != prompt_mask_BP.shape:
    raise ValueError(f"generate: prompt_tokens_BP {prompt_tokens_BP.shape} and prompt_mask_BP "
                     f"{prompt_mask_BP.shape} must have the same shape")
  if not jnp.issubdtype(prompt_tokens_BP.dtype, jnp.integer):
    raise TypeError(f"generate: prompt_tokens_BP must hold integer token ids, got dtype {prompt_tokens_BP.dtype}")
  if not (prompt_mask_BP.dtype == jnp.bool_ or jnp.issubdtype(prompt_mask_BP.dtype, jnp.integer)):
    raise TypeError(f"generate: prompt_mask_BP must be bool (or 0/1 integers), got dtype {prompt_mask_BP.dtype}")
  if 0 in prompt_tokens_BP.shape:
    raise ValueError(f"generate: empty prompt batch, shape {prompt_tokens_BP.shape}")
  # Value checks need the data on the host; skip them for arrays spread over
  # other processes (multi-host), whose callers validated their own shards.
  if all(getattr(x, "is_fully_addressable", True) for x in (prompt_tokens_BP, prompt_mask_BP)):
    tokens = np.asarray(prompt_tokens_BP)
    mask = np.asarray(prompt_mask_BP)
    if jnp.issubdtype(mask.dtype, jnp.integer) and not np.isin(mask, (0, 1)).all():
      raise ValueError("generate: prompt_mask_BP must hold only 0 and 1")
    mask = mask.astype(bool)
    empty = np.flatnonzero(~mask.any(axis=1))
    if empty.size:
      raise ValueError(f"generate: prompt rows {empty.tolist()} have no real token (prompt_mask_BP all False)")
    real = tokens[mask]
    if real.size and (real.min() < 0 or real.max() >= vocab_size):
      raise ValueError(f"generate: prompt token ids must be in [0, {vocab_size}), got "
                       f"[{int(real.min())}, {int(real.max())}]")


def resolve_data_axis(mesh: Mesh, data_axis) -> tuple[str, ...]:
  """data_axis as a tuple of mesh axis names; None: the model's batch axes
  (model.sharding.BATCH_AXES) that the mesh has."""
  if data_axis is None:
    return tuple(a for a in BATCH_AXES if a in mesh.axis_names)
  names = (data_axis,) if isinstance(data_axis, str) else tuple(data_axis)
  missing = [n for n in names if n not in mesh.axis_names]
  if missing or not names:
    raise ValueError(f"generate: data_axis={data_axis!r} must name axes of the mesh {mesh.axis_names}")
  return names


def generate(params: dict, model_cfg: ModelConfig, prompt_tokens_BP: jax.Array,
             prompt_mask_BP: jax.Array, cfg: SamplingConfig, key: jax.Array, *,
             mesh: Mesh | None = None, data_axis: str | tuple[str, ...] | None = None) -> Rollout:
  """Samples cfg.n_samples responses for each prompt.

  Args:
    params: the sampling model's params (any lag behind the trainer's is the
      caller's choice); cast to cfg.dtype when that is set. Sharded params
      stay in their sharding; batch-sharded prompts keep the rows sharded.
    model_cfg: the model's config.
    prompt_tokens_BP: [B0, P] token ids, padded on either side (or mixed):
      only prompt_mask_BP says which entries are real.
    prompt_mask_BP: [B0, P] bool, True on real prompt tokens; every row needs
      at least one.
    cfg: sampling and recording options.
    key: PRNG key; equal keys give equal rollouts. Row b samples with
      fold_in(key, b), so a row's draws do not depend on the rest of the batch.
    mesh, data_axis: when a mesh is given, the B rows (and the KV cache) are
      split over its `data_axis` (one name or a tuple; None: the model's
      batch axes, data x fsdp); B must divide evenly. The params are used in
      whatever sharding they arrive in (model.sharding.shard_params).

  Returns:
    A Rollout with B = B0 * n_samples rows (each prompt's samples consecutive)
    and R = cfg.max_new_tokens columns.
  """
  if not isinstance(cfg, SamplingConfig):
    raise TypeError(f"generate: cfg must be a SamplingConfig, got {type(cfg).__name__}")
  if not isinstance(model_cfg, ModelConfig):
    raise TypeError(f"generate: model_cfg must be a ModelConfig, got {type(model_cfg).__name__}")
  if not isinstance(key, jax.Array) or not (
      jnp.issubdtype(key.dtype, jax.dtypes.prng_key) or (key.dtype == jnp.uint32 and key.shape == (2,))):
    raise TypeError(f"generate: key must be a PRNG key (jax.random.key(seed)), got {key!r}")
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) and key.shape != ():
    raise ValueError(f"generate: key must be a single PRNG key, got shape {key.shape}")
  cfg.check_vocab(model_cfg.vocab_size)
  check_prompt_tokens(prompt_tokens_BP, prompt_mask_BP, model_cfg.vocab_size)
  cache_len = cfg.cache_slots(prompt_tokens_BP.shape[1])
  run_cfg = sampler_model_config(model_cfg, cfg)
  if mesh is not None:
    data_axis = resolve_data_axis(mesh, data_axis)
    shards = int(np.prod([mesh.shape[a] for a in data_axis]))
    B0 = prompt_tokens_BP.shape[0]
    if (B0 * cfg.n_samples) % shards:
      raise ValueError(f"generate: {B0} prompts x n_samples {cfg.n_samples} = {B0 * cfg.n_samples} rows do not "
                       f"split evenly over data_axis {data_axis!r} of size {shards}")
    # Prompts split by rows when they divide evenly, else replicated (the
    # prefill is then repeated per device and the rows split after it).
    spec = PartitionSpec(data_axis) if B0 % shards == 0 else PartitionSpec()
    prompt_tokens_BP, prompt_mask_BP = sharding_lib.put((prompt_tokens_BP, prompt_mask_BP), NamedSharding(mesh, spec))
  state = prefill(params, prompt_tokens_BP, prompt_mask_BP, key, model_cfg=run_cfg, cfg=cfg,
                  cache_len=cache_len, mesh=mesh, data_axis=data_axis or ())
  state = decode(params, state, model_cfg=run_cfg, cfg=cfg, prompt_len=prompt_tokens_BP.shape[1], mesh=mesh,
                 data_axis=data_axis or ())
  return to_rollout(state, cfg)
