"""The TPU chips a plan forecasts for, per jax device, each figure with its public source; the latency constants.

Per chip, as the sources print them:

| generation | device_kind | devices per chip | peak bf16 FLOP/s | HBM | HBM bandwidth | ICI per chip (bidirectional) | torus |
|---|---|---|---|---|---|---|---|
| v4 | "TPU v4" | 1 (megacore) | 275e12 | 32 GiB | 1200 GB/s | 540 GB/s | 3D |
| v5e | "TPU v5 lite" | 1 | 197e12 | 16 GiB | 819 GB/s | 400 GB/s | 2D |
| v5p | "TPU v5" | 1 (megacore) | 459e12 | 95 GiB | 2765 GB/s | 1200 GB/s | 3D |
| v6e | "TPU v6 lite" | 1 | 918e12 | 32 GiB | 1638 GB/s | 800 GB/s | 2D |
| 7x | "TPU7x" | 2 (one per TensorCore) | 2307e12 | 192 GiB | 7380 GB/s | 1200 GB/s | 3D |

Sources: Google Cloud's TPU system-architecture pages (cloud.google.com/tpu/docs/v4, /v5e, /v5p,
/v6e, /tpu7x: "peak compute per chip (bf16)", "HBM capacity and bandwidth", "bidirectional
inter-chip interconnect (ICI) bandwidth per chip", "interconnect topology"); v4's page gives no ICI
figure, so v4's is the JAX scaling book's (jax-ml.github.io/scaling-book/tpus: 4.5e10 B/s one way
per link, 6 links). The pages print some capacities as "GB"; the compiler's own HBM figures (15.75
GiB available on a v5e, 31.25 on a v6e, 94.75 per 7x device) say they are GiB.

**Per device.** A jax device is what a program runs on and what the plan divides the work by.
libtpu makes one device of each v5e, v5p and v6e chip, but two of each 7x chip (one per
TensorCore: a 2x2x1 slice is 8 devices of 4 chips, `core_on_chip` 0 and 1), so every 7x figure of
the table (FLOP/s, HBM, HBM bandwidth, the chip's ICI links) is halved: 1153.5e12 FLOP/s, 96 GiB,
3690 GB/s, 600 GB/s per device. The fit check uses the compiler's own HBM size when it reports one
(`analysis.compiler_hbm`: 94.75 GiB per 7x device), else this table's. libtpu also makes two
devices of a v4 chip (one per TensorCore), where a v4 runs as one megacore device per chip: the
plan refuses a v4 topology (`topology.check_one_device_per_chip`), so v4's row is its megacore one.

What the plan takes from them (jaxrl_llm/tpu/forecast.py): compute time = FLOPs / peak bf16,
memory time = bytes accessed / HBM bandwidth, collective time = bytes moved per device / the
bandwidth of the ICI links along the axes its group spans (tpu/ici.py), latency = the constants
below. These are rooflines: a lower bound on time, not a measurement.

Latency constants (a program's floor, however few bytes and FLOPs it has):

- `ICI_HOP_S` = 1 us per ICI hop of a collective: the JAX scaling book's figure ("each hop over an
  ICI link has some intrinsic overhead regardless of the data volume. This is typically around
  1us", jax-ml.github.io/scaling-book/sharding, "A note on ICI latency"; ASTRA-sim's TPU validation
  models the link latency at 1 us too). The book measured a 3-hop, 32 kB all-gather on a v5e 4x4
  at about 8 us, so 1 us per hop is a floor.
- `PROGRAM_LAUNCH_S` = 7 us per program call: jax's dispatch of a small jitted function, 6.8 us
  measured on a laptop CPU (github.com/jax-ml/jax/issues/5485, 2021; jax's own benchmark measured
  28.9 us in 2020, jax-ml/jax#4128). A host measurement, taken as the floor of a TPU program's
  launch: the RL step waits on the host between its stages, so its programs' launches do not hide.
- `KERNEL_LAUNCH_S` = 0.5 us per kernel (an XLA fusion, a custom call, a copy, a collective start)
  run in sequence on a TensorCore: **an assumption**, no published figure found. It stands for the
  fixed cost of starting a TPU kernel (filling and draining its pipeline); replace it with a
  profile's per-kernel gap when one is measured.
"""

from __future__ import annotations

import dataclasses

from jaxrl_llm.kernels import target as kernel_target

GB, GIB = 10**9, 1 << 30

ICI_HOP_S = 1e-6  # per hop of a collective (scaling book, "A note on ICI latency")
PROGRAM_LAUNCH_S = 7e-6  # per program call (jax's dispatch, jax-ml/jax#5485)
KERNEL_LAUNCH_S = 0.5e-6  # per kernel in sequence: an assumption (module docstring)


@dataclasses.dataclass(frozen=True)
class Chip:
  """One generation's figures per jax device (the chip's divided by `devices_per_chip`)."""

  generation: str  # the topology name's prefix: "v5p" in "v5p:4x4x4"
  device_kinds: tuple[str, ...]  # what jax's devices of the chip report as device_kind
  devices_per_chip: int  # jax devices libtpu makes of one chip: 2 on 7x (one per TensorCore), else 1
  peak_bf16_flops: float  # FLOP/s per device, dense bf16
  hbm_bytes: int  # HBM per device (the compiler's figure once compile.plan has read it)
  hbm_bytes_per_s: float  # HBM bandwidth per device
  ici_bytes_per_s: float  # ICI per device: the chip's links, both directions summed, over its devices
  torus_dims: int  # 2 (a 2D torus: 4 links per chip) or 3 (6 links per chip)
  source: str

  @property
  def vmem_bytes(self) -> int | None:
    return kernel_target.vmem_capacity(self.device_kinds[0])

  @property
  def link_bytes_per_s(self) -> float:
    """One direction of one ICI link, per device: the chip's ICI over 2 directions x 2 links per axis."""
    return self.ici_bytes_per_s / (2 * 2 * self.torus_dims)


def _per_device(generation, device_kinds, devices_per_chip, flops, hbm, hbm_bw, ici, torus, source) -> Chip:
  """A row from the chip's published figures, divided among the devices libtpu makes of it."""
  n = devices_per_chip
  return Chip(generation, device_kinds, n, flops / n, hbm // n, hbm_bw / n, ici / n, torus, source)


_CLOUD = "cloud.google.com/tpu/docs/"
CHIPS: dict[str, Chip] = {c.generation: c for c in (
    _per_device("v4", ("TPU v4",), 1, 275e12, 32 * GIB, 1200 * GB, 540 * GB, 3,
                _CLOUD + "v4; ICI: jax-ml.github.io/scaling-book/tpus"),
    _per_device("v5e", ("TPU v5 lite", "TPU v5e"), 1, 197e12, 16 * GIB, 819 * GB, 400 * GB, 2, _CLOUD + "v5e"),
    _per_device("v5p", ("TPU v5", "TPU v5p"), 1, 459e12, 95 * GIB, 2765 * GB, 1200 * GB, 3, _CLOUD + "v5p"),
    _per_device("v6e", ("TPU v6 lite", "TPU v6e"), 1, 918e12, 32 * GIB, 1638 * GB, 800 * GB, 2, _CLOUD + "v6e"),
    _per_device("7x", ("TPU7x",), 2, 2307e12, 192 * GIB, 7380 * GB, 1200 * GB, 3, _CLOUD + "tpu7x"),
)}


def chip_for(device_kind: str) -> Chip | None:
  """The table's row of a device's `device_kind`, None for a chip it does not know."""
  for chip in CHIPS.values():
    if device_kind in chip.device_kinds:
      return chip
  return None
