"""Multi-process (multi-host) start-up on JAX's own runtime: no Pathways, no Ray.

Every process calls `initialize()` once, before anything touches a device.
The coordinates come from, in order:
  1. an explicit DistributedConfig;
  2. the environment: JAX_COORDINATOR_ADDRESS ("host:port" of process 0),
     JAX_NUM_PROCESSES, JAX_PROCESS_ID (and optionally JAX_LOCAL_DEVICE_IDS);
  3. a cluster JAX detects itself (SLURM, Open MPI, Kubernetes, TPU pods):
     `jax.distributed.initialize()` without arguments;
  4. otherwise nothing: a single-process run.
After it, jax.devices() lists every process's devices and a mesh over them
(sharding.make_mesh) spans the hosts; each process feeds its own shards
(jax.make_array_from_callback / make_array_from_process_local_data).
On CPU, cross-process collectives go through gloo.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

import jax

ENV_ADDRESS = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"
ENV_LOCAL_DEVICES = "JAX_LOCAL_DEVICE_IDS"
# Variables by which jax.distributed recognises a cluster it can configure itself.
_CLUSTER_MARKERS = ("SLURM_JOB_ID", "OMPI_COMM_WORLD_SIZE", "TPU_WORKER_HOSTNAMES",
                    "MEGASCALE_COORDINATOR_ADDRESS", "JOBSET_NAME")
CPU_COLLECTIVES = ("gloo", "mpi", "none")


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
  """Where this process sits in a multi-process run.

  coordinator_address: "host:port" that process 0 listens on.
  num_processes: total processes (>= 1). process_id: this one, in [0, num_processes).
  local_device_ids: restrict this process to these local devices (None: all).
  cpu_collectives: implementation of CPU cross-process collectives.
  initialization_timeout_s: how long to wait for every process to join.
  """
  coordinator_address: str
  num_processes: int
  process_id: int
  local_device_ids: tuple[int, ...] | None = None
  cpu_collectives: str = "gloo"
  initialization_timeout_s: int = 300

  def __post_init__(self):
    host, _, port = self.coordinator_address.rpartition(":")
    if not host or not port.isdigit():
      raise ValueError(f"DistributedConfig.coordinator_address must be 'host:port', got "
                       f"{self.coordinator_address!r}")
    if isinstance(self.num_processes, bool) or not isinstance(self.num_processes, int) \
        or self.num_processes < 1:
      raise ValueError(f"DistributedConfig.num_processes must be an int >= 1, got "
                       f"{self.num_processes!r}")
    if isinstance(self.process_id, bool) or not isinstance(self.process_id, int) \
        or not 0 <= self.process_id < self.num_processes:
      raise ValueError(f"DistributedConfig.process_id must be in [0, {self.num_processes}), got "
                       f"{self.process_id!r}")
    if self.cpu_collectives not in CPU_COLLECTIVES:
      raise ValueError(f"DistributedConfig.cpu_collectives must be one of {CPU_COLLECTIVES}, "
                       f"got {self.cpu_collectives!r}")
    if self.initialization_timeout_s <= 0:
      raise ValueError(f"DistributedConfig.initialization_timeout_s must be > 0, got "
                       f"{self.initialization_timeout_s!r}")


def config_from_env(environ: Mapping[str, str] | None = None) -> DistributedConfig | None:
  """DistributedConfig from JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES /
  JAX_PROCESS_ID; None when none of them is set; an error when only some are."""
  env = os.environ if environ is None else environ
  names = (ENV_ADDRESS, ENV_NUM_PROCESSES, ENV_PROCESS_ID)
  present = [n for n in names if env.get(n)]
  if not present:
    return None
  missing = [n for n in names if n not in present]
  if missing:
    raise ValueError(f"multi-process environment incomplete: {present} set but {missing} missing")

  def as_int(name):
    try:
      return int(env[name])
    except ValueError:
      raise ValueError(f"{name} must be an integer, got {env[name]!r}") from None

  local = env.get(ENV_LOCAL_DEVICES)
  local_ids = tuple(int(x) for x in local.split(",")) if local else None
  return DistributedConfig(env[ENV_ADDRESS], as_int(ENV_NUM_PROCESSES), as_int(ENV_PROCESS_ID),
                           local_device_ids=local_ids)


def initialize(cfg: DistributedConfig | None = None) -> bool:
  """Join the multi-process run; returns True if jax.distributed was initialised.

  Must run before the first use of any device (jax.devices(), an array...).
  """
  cfg = cfg if cfg is not None else config_from_env()
  if cfg is None:
    if not any(os.environ.get(m) for m in _CLUSTER_MARKERS):
      return False  # single process
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize()
    return True
  if cfg.cpu_collectives != "none":
    jax.config.update("jax_cpu_collectives_implementation", cfg.cpu_collectives)
  jax.distributed.initialize(
      coordinator_address=cfg.coordinator_address, num_processes=cfg.num_processes,
      process_id=cfg.process_id,
      local_device_ids=list(cfg.local_device_ids) if cfg.local_device_ids else None,
      initialization_timeout=cfg.initialization_timeout_s)
  return True
