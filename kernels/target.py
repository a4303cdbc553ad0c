"""What a computation being traced targets: the platform and chip of its devices.

``jax.default_backend()`` names the devices of this process, not those a
program is compiled for: on a laptop with ``libtpu`` installed,
``jax.jit(f).lower(<shapes sharded over TPU topology devices>).compile()``
runs the real TPU compiler while the default backend stays "cpu". So the
kernels ask for the mesh in context instead (``jax.sharding.use_abstract_mesh``
or ``jax.set_mesh``; the trainer sets it around its steps, and ``shard_map``
sets its own inside its body): an ``AbstractMesh`` built from real devices
carries an ``AbstractDevice`` with their ``platform`` and ``device_kind``.
Without a mesh (or with a hand-made abstract mesh that names no device) the
target is the default backend and its first device.

VMEM per TensorCore, by ``device.device_kind`` (the strings
``get_topology_desc`` devices and real chips report):

| device_kind | generation | VMEM per TensorCore |
|---|---|---|
| "TPU v4" | v4 | 16 MiB |
| "TPU v4 lite" | v4i | 16 MiB |
| "TPU v5 lite" | v5e | 128 MiB |
| "TPU v5" | v5p | 64 MiB |
| "TPU v6 lite" | v6e (Trillium) | 128 MiB |
| "TPU7x" | 7x (Ironwood) | 64 MiB |

Sources: jax's TPU hardware reference (docs.jax.dev/en/latest/pallas/tpu/
hardware.html, generated from ``pltpu.get_tpu_info_for_chip``, whose
``vmem_capacity_bytes`` ``tests/kernels/test_tpu_compile.py`` checks against
this table), and the TPU compiler itself: libtpu 0.0.42.1, compiling a kernel
with a too-large VMEM scratch for ``v4:2x2x1``, ``v5e:2x2``, ``v5p:2x2x1``,
``v6e:2x2`` and ``TPU7x:2x2x1`` topologies, refuses with "Allocation ...
would exceed memory (size=16777216 / 134217728 / 67108864 / 134217728 /
67108864)" (2026-12-04). v5p's 64 MiB is per TensorCore: its two cores act as
one device (``num_cores=2``), and a "parallel" grid axis splits a kernel's
blocks between them, each with its own VMEM.
"""

from __future__ import annotations

import jax

MIB = 1 << 20

TPU_VMEM_BYTES: dict[str, int] = {
    "TPU v4": 16 * MIB,
    "TPU v4 lite": 16 * MIB,
    "TPU v5 lite": 128 * MIB,
    "TPU v5e": 128 * MIB,  # the name some runtimes report for v5 lite
    "TPU v5": 64 * MIB,
    "TPU v5p": 64 * MIB,
    "TPU v6 lite": 128 * MIB,
    "TPU v6e": 128 * MIB,
    "TPU7": 64 * MIB,  # jax's table; no topology name of this libtpu compiles for it
    "TPU7x": 64 * MIB,
}

# The budget the kernels' tile search fills by default (``vmem_budget``): three
# quarters of the chip's VMEM per core, at most 32 MiB, so 12 MiB on v4 and
# 32 MiB on the others. The footprint formula (``_mosaic_budget``) is an
# estimate of what Mosaic allocates, off both ways, so the compiler may use
# twice the budget up to the whole VMEM (``_mosaic_budget.budget_and_limit``).
# Measured on v4 (libtpu 0.0.42.1, N = 2048 or 512, V = 151,936): at 12 MiB
# bf16 up to D = 4096 and f32 up to D = 2048 compile within the 16 MiB (one
# source and vocab_cross's two), while a 16 MiB budget lets an f32 d w kernel
# at D = 896 need 22.3 MiB, and at 8 MiB vocab_cross's d w kernel at D = 4096
# in bf16 no longer fits the formula. Not covered: f32 token_logprobs at
# D = 4096 fits the 12 MiB formula but needs 17.1 MiB (the formula does not
# count Mosaic's copies of f32 matmul operands at HIGHEST precision; 11 MiB
# still needs 16.5 MiB, and below 10.4 MiB its d w kernel fits no tiles). bf16
# and f32 at D = 8192 do not fit v4 at all (D is not tiled). 32 MiB, because larger
# budgets buy no larger tiles at the widths we run (kernels/README.md's table
# tops out at 512 x 2048 below it). Targets that are not a known TPU (the TPU
# interpreter on CPU, a generation this table does not know) get 32 MiB, the
# budget before budgets were per generation.
DEFAULT_VMEM_BUDGET = 32 * MIB


def _abstract_device():
  return jax.sharding.get_abstract_mesh().abstract_device


def target_platform() -> str:
  """"tpu", "gpu" or "cpu": the platform of the mesh in context's devices, else the default backend."""
  device = _abstract_device()
  return device.platform if device is not None else jax.default_backend()


def target_device_kind() -> str:
  """``device_kind`` of the mesh in context's devices (e.g. "TPU v5 lite"), else of the first default device."""
  device = _abstract_device()
  return device.device_kind if device is not None else jax.devices()[0].device_kind


def vmem_capacity(device_kind: str) -> int | None:
  """VMEM bytes per TensorCore of a TPU ``device_kind`` (module table), None if unknown."""
  return TPU_VMEM_BYTES.get(device_kind)


def vmem_budget(device_kind: str) -> int:
  """The default VMEM budget of the kernels' tiles on ``device_kind`` (``DEFAULT_VMEM_BUDGET``'s note)."""
  capacity = vmem_capacity(device_kind)
  return DEFAULT_VMEM_BUDGET if capacity is None else min(DEFAULT_VMEM_BUDGET, capacity * 3 // 4)
