"""The device mesh and the shardings the jitted steps state explicitly.

Axis names are declared once here: 'data' (batch), 'fsdp' (params sharded,
batch too), 'tensor' (heads and MLP). Params follow the model's logical-axis
table when it provides one; batches are split over ('data', 'fsdp').
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxrl_llm.training.config import MeshConfig

AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")


def make_mesh(cfg: MeshConfig, devices=None) -> Mesh:
  devices = list(jax.devices() if devices is None else devices)
  n = len(devices)
  fixed = cfg.fsdp * cfg.tensor
  data = n // fixed if cfg.data == -1 else cfg.data
  if data < 1 or data * fixed != n:
    raise ValueError(f"config.mesh: data={cfg.data} x fsdp={cfg.fsdp} x tensor={cfg.tensor} does not "
                     f"match the {n} devices available (data=-1 takes what is left)")
  return Mesh(np.asarray(devices).reshape(data, cfg.fsdp, cfg.tensor), AXES)


def batch_shards(mesh: Mesh) -> int:
  return mesh.shape["data"] * mesh.shape["fsdp"]


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) axis split over data x fsdp, the rest replicated."""
  return NamedSharding(mesh, P(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def param_shardings(mesh: Mesh, model_cfg, params_shape):
  """Shardings for the params tree, from the model's logical-axis table."""
  from jaxrl_llm.model import sharding as model_sharding

  del params_shape  # the model's table knows every param's shape
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
