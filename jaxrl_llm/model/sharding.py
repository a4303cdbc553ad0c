"""Mesh and sharding rules: mesh axes declared once, one table from logical
axes to mesh axes (the maxtext pattern).

Mesh axes: "data" (pure data parallel: params replicated), "fsdp" (batch is
split over it too, and every large param is split along its model dim D),
"tensor" (heads, kv-heads, the MLP hidden dim and the vocabulary are split).
Any axis may be 1. The batch is split over data x fsdp.

State is built with eval_shape -> shardings -> jit(out_shardings), so no
param is ever materialised unsharded (`init_sharded_params`).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from jaxrl_llm.checks import ConfigError, check_int
from jaxrl_llm.model.config import ModelConfig
from jaxrl_llm.model.params import init_params, param_axes, param_shapes

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# Logical axis -> mesh axis (None: replicated). The one place sharding is decided.
LOGICAL_RULES: dict[str, str | tuple[str, ...] | None] = {
    "batch": BATCH_AXES,
    "embed": "fsdp",
    "vocab": "tensor",
    "heads": "tensor",
    "kv_heads": "tensor",
    "mlp": "tensor",
    "head_dim": None,
    "layers": None,
    "norm": None,
}


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """Mesh shape: data x fsdp x tensor devices (`config.mesh.*` of a run).

  data = -1 takes the devices the other axes leave (`resolve`); every other
  value is a positive int.
  """
  data: int
  fsdp: int
  tensor: int

  def __post_init__(self):
    for name in MESH_AXES:
      value = getattr(self, name)
      if not (name == "data" and value == -1):
        check_int(f"MeshConfig.{name}", value, 1)

  @property
  def shape(self) -> tuple[int, int, int]:
    return (self.data, self.fsdp, self.tensor)

  def resolve(self, n_devices: int) -> "MeshConfig":
    """This shape with data = -1 replaced by what the other axes leave of n_devices."""
    if self.data != -1:
      return self
    fixed = self.fsdp * self.tensor
    if n_devices % fixed:
      raise ConfigError(f"MeshConfig data=-1 x fsdp={self.fsdp} x tensor={self.tensor}: {n_devices} devices "
                        f"do not split into fsdp x tensor = {fixed}")
    return dataclasses.replace(self, data=n_devices // fixed)


def make_mesh(mesh_cfg: MeshConfig, devices=None) -> Mesh:
  """A (data, fsdp, tensor) mesh over all devices (all processes' devices)."""
  devices = jax.devices() if devices is None else list(devices)
  mesh_cfg = mesh_cfg.resolve(len(devices))
  size = math.prod(mesh_cfg.shape)
  if size != len(devices):
    raise ConfigError(
        f"MeshConfig data*fsdp*tensor = {mesh_cfg.data}*{mesh_cfg.fsdp}*{mesh_cfg.tensor} = "
        f"{size} must equal the number of devices ({len(devices)})")
  # jax.make_mesh orders devices for the physical topology (ICI rings on TPU). It maps each mesh axis
  # onto whole physical axes, which not every shape allows: on a v5p 4x4x4 slice tensor = 2 splits a
  # physical axis of 4 (found compiling for that topology, jaxrl_llm/compile.py); then the axes may
  # split physical ones, as MaxText's meshes do.
  axis_types = (AxisType.Auto,) * 3
  try:
    return jax.make_mesh(mesh_cfg.shape, MESH_AXES, axis_types=axis_types, devices=devices)
  except NotImplementedError:
    from jax.experimental import mesh_utils

    grid = mesh_utils.create_device_mesh(mesh_cfg.shape, devices, allow_split_physical_axes=True)
    return Mesh(grid, MESH_AXES, axis_types=axis_types)


def logical_to_spec(axes: tuple[str | None, ...]) -> P:
  """PartitionSpec for a tuple of logical axis names, via LOGICAL_RULES."""
  out = []
  for name in axes:
    if name is not None and name not in LOGICAL_RULES:
      raise ValueError(f"unknown logical axis {name!r}; known: {sorted(LOGICAL_RULES)}")
    out.append(None if name is None else LOGICAL_RULES[name])
  return P(*out)


def check_divisible(cfg: ModelConfig, mesh: Mesh) -> None:
  """Every sharded model dim must divide by its mesh axis; error names the field."""
  sizes = dict(mesh.shape)
  checks = (("n_heads", cfg.n_heads, "heads"), ("n_kv_heads", cfg.n_kv_heads, "kv_heads"),
            ("d_ff", cfg.d_ff, "mlp"), ("vocab_size", cfg.vocab_size, "vocab"),
            ("d_model", cfg.d_model, "embed"))
  for field, value, logical in checks:
    axis = LOGICAL_RULES[logical]
    n = sizes[axis] if axis is not None else 1
    if value % n:
      raise ConfigError(
          f"ModelConfig.{field}={value} is not divisible by the '{axis}' mesh axis of size {n} "
          f"(mesh {dict(sizes)})")


def partition_specs(cfg: ModelConfig) -> dict:
  """PartitionSpec tree matching the params."""
  return jax.tree.map(logical_to_spec, param_axes(cfg),
                      is_leaf=lambda x: isinstance(x, tuple))


def param_shardings(cfg: ModelConfig, mesh: Mesh) -> dict:
  """NamedSharding tree matching the params (raises if a dim does not divide)."""
  check_divisible(cfg, mesh)
  return jax.tree.map(lambda spec: NamedSharding(mesh, spec), partition_specs(cfg),
                      is_leaf=lambda x: isinstance(x, P))


def constrain(x: jax.Array, axes: tuple[str | None, ...]) -> jax.Array:
  """`x` laid out by its logical `axes` (LOGICAL_RULES) over the mesh in context; a dim whose logical
  axis is None, or whose mesh axes do not divide it, is left to the compiler. Without a mesh in
  context, or on one device, `x` as is.

  The activations need it: with the batch over data x fsdp and the weights split along D over fsdp,
  XLA's propagation alone can leave the rows whole and split D instead, reducing [rows, T, F]
  activations over fsdp at every matmul (compiled for Qwen3-8B on a v5p 4x4x4 slice, fsdp 32 x
  tensor 2: a 3.7 GB all-reduce per MLP matmul, jaxrl_llm/compile.py's plan). Keeping the rows
  split makes it gather each layer's weights instead, as FSDP means."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or math.prod(mesh.shape.values()) == 1:
    return x
  sizes = dict(mesh.shape)
  spec = []
  for dim, name in zip(x.shape, axes):
    rule = LOGICAL_RULES[name] if name is not None else None
    names = tuple(a for a in ((rule,) if isinstance(rule, str) else (rule or ())) if sizes.get(a, 1) > 1)
    if names and dim % math.prod(sizes[a] for a in names) == 0:
      spec.append(names if len(names) > 1 else names[0])
    else:
      spec.append(P.UNCONSTRAINED)
  if all(s is P.UNCONSTRAINED for s in spec):
    return x
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(*spec)))


def sampler_param_shardings(cfg: ModelConfig, mesh: Mesh) -> dict:
  """The built-in sampler's copy of the params under rollout.sampler_sharding='tensor': split over
  tensor as the trainer's, not over fsdp (each chip holds 1/tensor of every weight, so a decode step
  reads its weights from its own HBM instead of all-gathering them)."""
  check_divisible(cfg, mesh)
  rules = {**LOGICAL_RULES, "embed": None}
  spec = lambda axes: P(*(None if a is None else rules[a] for a in axes))  # noqa: E731
  return jax.tree.map(lambda axes: NamedSharding(mesh, spec(axes)), param_axes(cfg),
                      is_leaf=lambda x: isinstance(x, tuple))


def init_sharded_params(cfg: ModelConfig, key: jax.Array, mesh: Mesh) -> dict:
  """init_params placed straight into its shardings (never whole on one device)."""
  shardings = param_shardings(cfg, mesh)
  return jax.jit(functools.partial(init_params, cfg), out_shardings=shardings)(key)


def shard_params(params: dict, cfg: ModelConfig, mesh: Mesh) -> dict:
  """Move existing (e.g. single-device) params onto the mesh."""
  return put(params, param_shardings(cfg, mesh))


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
  """Leading axis over data x fsdp, the rest replicated (tokens_BT, mask_BT, ...)."""
  return NamedSharding(mesh, P(BATCH_AXES, *([None] * (ndim - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def head_sharding(mesh: Mesh) -> NamedSharding:
  """An output head w_DV outside the params (a sampler's, a teacher's): its V
  columns split like the policy's head, its D rows whole."""
  return NamedSharding(mesh, P(None, LOGICAL_RULES["vocab"]))


def fits(sharding: NamedSharding, shape: tuple[int, ...]) -> bool:
  """Whether every dim of `shape` divides by the mesh axes `sharding` splits it over."""
  sizes = dict(sharding.mesh.shape)
  for dim, axes in zip(shape, sharding.spec):
    axes = (axes,) if isinstance(axes, str) else (axes or ())
    if dim % math.prod(sizes[a] for a in axes):
      return False
  return True


def batch_shards(mesh: Mesh) -> int:
  """How many ways the batch is split (data x fsdp)."""
  return math.prod(mesh.shape[a] for a in BATCH_AXES)


# ---- the host boundary ---------------------------------------------------------------
# In a multi-controller run (a pod slice: one process per host, model/distributed.py) an array over
# the mesh is only partly addressable from each process: `jax.device_put` of a host value onto it
# and `jax.device_get` of it fail. Every host value that enters the mesh goes through `put`, and
# every value the host reads back through `fetch`; with one process they are device_put and
# device_get.


def put(tree, sharding):
  """Host values onto `sharding` (a leaf's own, or one for every leaf): each process builds its own
  shards from its copy, which every process holds whole (the host stages compute the same global
  value in every process, from the same seeds). A leaf already on the mesh is resharded."""

  def one(x, sh):
    if sh.is_fully_addressable or (isinstance(x, jax.Array) and not x.is_fully_addressable):
      return jax.device_put(x, sh)
    if jax.dtypes.issubdtype(getattr(x, "dtype", None), jax.dtypes.prng_key):  # a typed key: its bits
      return jax.random.wrap_key_data(one(jax.random.key_data(x), sh), impl=jax.random.key_impl(x))
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sh, lambda index: x[index])

  if isinstance(sharding, jax.sharding.Sharding):
    return jax.tree.map(lambda x: one(x, sharding), tree)
  return jax.tree.map(one, tree, sharding)


def fetch(tree):
  """Device values as host numpy, whole in every process: an array split over processes is
  all-gathered (a collective: every process fetches the same arrays in the same order)."""

  def one(x):
    if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated:
      return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return jax.device_get(x)

  return jax.tree.map(one, tree)


def pace(tree):
  """Waits until `tree` is computed when the run's CPU devices are several, and returns it; elsewhere
  returns it at once. For a loop that launches a program per step and reads nothing back (the warm
  start: the RL step and reward-model training read their metrics every step).

  Why: XLA:CPU (jaxlib 0.10.2) launches each device's share of a program from a thread pool, in no
  fixed order. With several programs queued, a device can start a later step's launch first; that
  launch takes the device's in-flight slot and waits for the earlier step's result, while the earlier
  step's all-reduce waits for that device forever. Thread dumps of hung runs show exactly this, with
  2 devices in one process and with 2 x 2 over gloo (docs/scaling.md). One step in flight at a time
  cannot deadlock so; a TPU or GPU runtime launches in order and keeps its pipelining."""
  if jax.local_device_count() > 1 and jax.default_backend() == "cpu":
    jax.block_until_ready(tree)
  return tree


def onto_mesh(tree, mesh: Mesh):
  """Replicates over the mesh every leaf not already placed on all its devices
  (optimizer counters and other scalars created outside a sharded jit)."""
  devices = set(mesh.devices.flat)

  def place(x):
    # An uncommitted array (jnp.zeros outside jit, e.g. optax's step count) is placed too: the
    # update's outputs are committed, and a jitted function seeing the two kinds compiles twice.
    if (getattr(x, "sharding", None) is not None and set(x.sharding.device_set) == devices
        and getattr(x, "committed", True)):
      return x
    return put(x, replicated(mesh))

  return jax.tree.map(place, tree)


def cache_sharding(cfg: ModelConfig, mesh: Mesh):
  """Shardings for a KVCache: batch over data x fsdp, kv-heads over tensor."""
  from jaxrl_llm.model.cache import KVCache
  check_divisible(cfg, mesh)
  kv = (NamedSharding(mesh, P(BATCH_AXES, LOGICAL_RULES["kv_heads"], None, None)),) * cfg.n_layers
  return KVCache(k_BKHS=kv, v_BKSH=kv, mask_BS=batch_sharding(mesh, 2),
                 index=replicated(mesh),
                 positions_BS=batch_sharding(mesh, 2) if cfg.has_local_layers else None)


def unsharded_params(cfg: ModelConfig, mesh: Mesh, min_size: int = 1) -> list[str]:
  """Names of params of >= min_size elements that no mesh axis of size > 1 splits."""
  sizes = dict(mesh.shape)
  out = []
  shapes = param_shapes(cfg)
  specs = partition_specs(cfg)
  flat_specs = dict(jax.tree_util.tree_flatten_with_path(
      specs, is_leaf=lambda x: isinstance(x, P))[0])
  for path, shape in jax.tree_util.tree_flatten_with_path(shapes)[0]:
    spec = flat_specs[path]
    axes = [a for entry in spec if entry is not None
            for a in (entry if isinstance(entry, tuple) else (entry,))]
    if np.prod(shape.shape) >= min_size and all(sizes[a] == 1 for a in axes):
      out.append(jax.tree_util.keystr(path))
  return out
