"""The trainer's view of the device mesh.

Axis names, the logical-axis table and the shardings themselves live in
`jaxrl_llm.model.sharding`; this module only resolves the run config's
`mesh.data = -1` ("all devices not used by the other axes") and adds the two
helpers the loop needs (batch shard count, placing stray leaves).
"""

from __future__ import annotations

import jax
from jax.sharding import Mesh, NamedSharding

from jaxrl_llm.model import sharding as model_sharding
from jaxrl_llm.training.config import MeshConfig

AXES = model_sharding.MESH_AXES
BATCH_AXES = model_sharding.BATCH_AXES
replicated = model_sharding.replicated


def make_mesh(cfg: MeshConfig, devices=None) -> Mesh:
  devices = list(jax.devices() if devices is None else devices)
  n = len(devices)
  fixed = cfg.fsdp * cfg.tensor
  data = n // fixed if cfg.data == -1 else cfg.data
  if data < 1 or data * fixed != n:
    raise ValueError(f"config.mesh: data={cfg.data} x fsdp={cfg.fsdp} x tensor={cfg.tensor} does not "
                     f"match the {n} devices available (data=-1 takes what is left)")
  return model_sharding.make_mesh(model_sharding.MeshConfig(data, cfg.fsdp, cfg.tensor), devices)


def batch_shards(mesh: Mesh) -> int:
  return mesh.shape["data"] * mesh.shape["fsdp"]


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) axis split over data x fsdp, the rest replicated; fits any rank."""
  return model_sharding.batch_sharding(mesh, ndim=1)


def param_shardings(mesh: Mesh, model_cfg) -> dict:
  """Shardings for the params tree, from the model's logical-axis table."""
  return model_sharding.param_shardings(model_cfg, mesh)


def onto_mesh(tree, mesh: Mesh):
  """Replicates over the mesh every leaf not already placed on all its devices
  (optimizer counters and other scalars created outside a sharded jit)."""
  devices = set(mesh.devices.flat)

  def place(x):
    if getattr(x, "sharding", None) is not None and set(x.sharding.device_set) == devices:
      return x
    return jax.device_put(x, replicated(mesh))

  return jax.tree.map(place, tree)
