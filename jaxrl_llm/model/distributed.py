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

from jaxrl_llm.checks import ConfigError

ENV_ADDRESS = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"
ENV_LOCAL_DEVICES = "JAX_LOCAL_DEVICE_IDS"
# Seconds without a heartbeat after which the coordination service declares a process dead and ends
# the others (with a line saying so): the bound on how long the survivors of a crash wait.
ENV_HEARTBEAT = "JAXRL_LLM_HEARTBEAT_TIMEOUT_S"
ENV_INIT_TIMEOUT = "JAXRL_LLM_INIT_TIMEOUT_S"  # seconds to wait for every process to join
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
  initialization_timeout_s: how long to wait for every process to join (a coordinator that never
    comes up fails after it).
  heartbeat_timeout_s: how long a process may be silent before the others are ended (a process
    killed mid-step: the survivors exit within about this time instead of hanging).
  """
  coordinator_address: str
  num_processes: int
  process_id: int
  local_device_ids: tuple[int, ...] | None = None
  cpu_collectives: str = "gloo"
  initialization_timeout_s: int = 300
  heartbeat_timeout_s: int = 100  # jax.distributed's default

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
    for name in ("initialization_timeout_s", "heartbeat_timeout_s"):
      if getattr(self, name) <= 0:
        raise ValueError(f"DistributedConfig.{name} must be > 0, got {getattr(self, name)!r}")


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
  timeouts = {field: as_int(name) for field, name in (("heartbeat_timeout_s", ENV_HEARTBEAT),
                                                      ("initialization_timeout_s", ENV_INIT_TIMEOUT))
              if env.get(name)}
  return DistributedConfig(env[ENV_ADDRESS], as_int(ENV_NUM_PROCESSES), as_int(ENV_PROCESS_ID),
                           local_device_ids=local_ids, **timeouts)


def _wait_for_coordinator(cfg: DistributedConfig) -> None:
  """Returns once the coordinator accepts connections; one error line after the init timeout (JAX's
  own client aborts the process with a stack dump when it cannot connect)."""
  import socket  # pylint: disable=import-outside-toplevel
  import time  # pylint: disable=import-outside-toplevel

  host, _, port = cfg.coordinator_address.rpartition(":")
  deadline = time.monotonic() + cfg.initialization_timeout_s
  while True:
    try:
      with socket.create_connection((host.strip("[]"), int(port)), timeout=5):
        return
    except OSError as e:
      if time.monotonic() >= deadline:
        raise ConfigError(f"process {cfg.process_id} of {cfg.num_processes} could not join the run: no coordinator "
                          f"answered at {cfg.coordinator_address} within {cfg.initialization_timeout_s} s "
                          f"({ENV_INIT_TIMEOUT}; {e.strerror or e}); start process 0 there, or fix "
                          f"{ENV_ADDRESS}") from None
      time.sleep(0.5)


def initialize(cfg: DistributedConfig | None = None) -> bool:
  """Join the multi-process run; returns True if jax.distributed was initialised.

  Must run before the first use of any device (jax.devices(), an array...). A run of several
  processes stops on SIGTERM through JAX's preemption service (learn/shell.py, AgreedStop): with
  it disabled, the run is refused here, before any work.
  """
  cfg = cfg if cfg is not None else config_from_env()
  if (cfg is not None or any(os.environ.get(m) for m in _CLUSTER_MARKERS)) \
      and not jax.config.jax_enable_preemption_service:
    raise ConfigError("jax_enable_preemption_service=False: a multi-process run stops on SIGTERM through JAX's "
                      "preemption service (all processes after the same step); leave it enabled")
  if cfg is None:
    if not any(os.environ.get(m) for m in _CLUSTER_MARKERS):
      return False  # single process
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize()
    return True
  if cfg.cpu_collectives != "none":
    jax.config.update("jax_cpu_collectives_implementation", cfg.cpu_collectives)
  if cfg.process_id != 0:  # process 0 hosts the coordinator; the others wait for it to listen
    _wait_for_coordinator(cfg)
  try:
    jax.distributed.initialize(
        coordinator_address=cfg.coordinator_address, num_processes=cfg.num_processes,
        process_id=cfg.process_id,
        local_device_ids=list(cfg.local_device_ids) if cfg.local_device_ids else None,
        initialization_timeout=cfg.initialization_timeout_s, heartbeat_timeout_seconds=cfg.heartbeat_timeout_s)
  except Exception as e:  # pylint: disable=broad-except
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise ConfigError(f"process {cfg.process_id} of {cfg.num_processes} could not join the run at "
                      f"{cfg.coordinator_address} within {cfg.initialization_timeout_s} s ({ENV_INIT_TIMEOUT}): "
                      f"{first[:300]}") from e
  return True


# ---- what the processes of a run share ------------------------------------------------------------
# Every process runs the same host code on the same global values (model/sharding.py's put and fetch),
# so they agree by construction; the files of a run (metrics, summary, manifests, dumps) are written by
# process 0 alone, and a barrier orders a write before another process reads it.


def is_primary() -> bool:
  """Whether this process writes the run's files (process 0; the only one of a single-process run)."""
  return jax.process_index() == 0


def barrier(name: str) -> None:
  """Every process waits here until all have arrived (nothing with one process)."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel

    multihost_utils.sync_global_devices(name)


def check_same_everywhere(what: str, value: str) -> None:
  """Refuses a run whose processes differ in `value` (a config's or the code's fingerprint): every
  process must run the same program on the same config, or their collectives mismatch or hang."""
  if jax.process_count() == 1:
    return
  import hashlib  # pylint: disable=import-outside-toplevel

  import numpy as np  # pylint: disable=import-outside-toplevel
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel

  digest = np.frombuffer(hashlib.sha256(value.encode()).digest()[:8], np.int64)
  every = np.asarray(multihost_utils.process_allgather(digest)).reshape(-1)
  if len(set(every.tolist())) != 1:
    differ = [i for i, d in enumerate(every.tolist()) if d != every[0]]
    raise ConfigError(f"the processes of this run were started with different {what}: processes {differ} "
                      "differ from process 0; start every process with the same command and the same code")


def code_fingerprint() -> str:
  """The package's source files, hashed: processes that run other code are refused at start."""
  import hashlib  # pylint: disable=import-outside-toplevel

  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  h = hashlib.sha256()
  for dirpath, dirnames, files in sorted(os.walk(root)):
    dirnames.sort()
    for name in sorted(f for f in files if f.endswith(".py")):
      with open(os.path.join(dirpath, name), "rb") as f:
        h.update(name.encode() + f.read())
  return h.hexdigest()


def log_prefix() -> str:
  """'' for a single process, '[process i/n] ' in a multi-process run."""
  return f"[process {jax.process_index()}/{jax.process_count()}] " if jax.process_count() > 1 else ""


def _row_bounds(n_rows: int):
  """The processes' contiguous shares of n_rows rows: process p owns [bounds[p], bounds[p + 1])."""
  import numpy as np  # pylint: disable=import-outside-toplevel

  return np.linspace(0, n_rows, jax.process_count() + 1).astype(int)


def row_share(n_rows: int) -> tuple[int, int]:
  """[lo, hi): the contiguous rows of a host batch this process owns (all of them with one process)."""
  bounds = _row_bounds(n_rows)
  return int(bounds[jax.process_index()]), int(bounds[jax.process_index() + 1])


def gather_rows(local, n_rows: int):
  """The pytree of per-row host arrays each process computed for its `row_share(n_rows)`, all-gathered
  into the whole batch's in every process (a collective)."""
  if jax.process_count() == 1:
    return local
  import numpy as np  # pylint: disable=import-outside-toplevel
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel

  bounds = _row_bounds(n_rows)
  size = int(np.max(np.diff(bounds)))

  def one(x):
    x = np.asarray(x)
    padded = np.zeros((size,) + x.shape[1:], x.dtype)
    padded[:len(x)] = x
    every = np.asarray(multihost_utils.process_allgather(padded))  # [processes, size, ...]
    return np.concatenate([every[p, :bounds[p + 1] - bounds[p]] for p in range(len(bounds) - 1)]).astype(x.dtype)

  return jax.tree.map(one, local)


def gather_objects(local: list, n_rows: int) -> list:
  """The Python objects each process made for its `row_share(n_rows)` rows (picklable: an episode's
  tokens, its reward parts), all-gathered into the whole batch's list, in row order, in every process
  (a collective: every process calls it, with its own share)."""
  if jax.process_count() == 1:
    return list(local)
  import pickle  # pylint: disable=import-outside-toplevel

  import numpy as np  # pylint: disable=import-outside-toplevel
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel

  bounds = _row_bounds(n_rows)
  if len(local) != bounds[jax.process_index() + 1] - bounds[jax.process_index()]:
    raise ValueError(f"gather_objects: {len(local)} objects from process {jax.process_index()}, whose share "
                     f"of {n_rows} rows is [{bounds[jax.process_index()]}, {bounds[jax.process_index() + 1]})")
  blob = np.frombuffer(pickle.dumps(list(local)), np.uint8)
  sizes = np.asarray(multihost_utils.process_allgather(np.array([blob.size], np.int32))).reshape(-1)  # < 2 GiB
  padded = np.zeros(int(sizes.max()), np.uint8)
  padded[:blob.size] = blob
  every = np.asarray(multihost_utils.process_allgather(padded))  # [processes, largest]
  out = []
  for p, size in enumerate(sizes):
    out += pickle.loads(every[p, :int(size)].tobytes())
  return out



def broadcast_bytes(blob: bytes) -> bytes:
  """Process 0's `blob` in every process (a collective: every process calls it; the others' `blob` is
  ignored). The buffer is padded to a power of two (at least 1 KiB), so a run compiles a handful of
  broadcast programs, not one per size; at most 2 GiB. With one process, `blob` itself."""
  if jax.process_count() == 1:
    return blob
  import numpy as np  # pylint: disable=import-outside-toplevel
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel

  size = int(np.asarray(multihost_utils.broadcast_one_to_all(np.array(len(blob) if is_primary() else 0,
                                                                       np.int32))))
  buf = np.zeros(max(1024, 1 << (size - 1).bit_length()), np.uint8)
  if is_primary():
    buf[:size] = np.frombuffer(blob, np.uint8)
  return np.asarray(multihost_utils.broadcast_one_to_all(buf))[:size].tobytes()


def gather_to_host(tree):
  """Every leaf of `tree` as a whole numpy array in every process (a collective): a global array
  spread over the processes is all-gathered, a leaf this process holds whole is read as it is. With
  one process, `jax.device_get`."""
  if jax.process_count() == 1:
    return jax.device_get(tree)
  import numpy as np  # pylint: disable=import-outside-toplevel
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel

  def one(x):
    if not isinstance(x, jax.Array) or x.is_fully_addressable:
      return np.asarray(x)
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))

  return jax.tree.map(one, tree)
