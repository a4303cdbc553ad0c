"""The TPU chips a plan forecasts for: one row per generation, each figure with its public source.

| generation | device_kind | peak bf16 FLOP/s | HBM | HBM bandwidth | ICI per chip (bidirectional) |
|---|---|---|---|---|---|
| v4 | "TPU v4" | 275e12 | 32 GiB | 1200 GB/s | 540 GB/s |
| v5e | "TPU v5 lite" | 197e12 | 16 GB | 819 GB/s | 400 GB/s |
| v5p | "TPU v5" | 459e12 | 95 GiB | 2765 GB/s | 1200 GB/s |
| v6e | "TPU v6 lite" | 918e12 | 32 GB | 1638 GB/s | 800 GB/s |
| 7x | "TPU7x" | 2307e12 | 192 GB | 7380 GB/s | 1200 GB/s |

Sources: Google Cloud's TPU system-architecture pages (cloud.google.com/tpu/docs/v4, /v5e, /v5p,
/v6e, /tpu7x: "peak compute per chip (bf16)", "HBM capacity and bandwidth", "bidirectional
inter-chip interconnect (ICI) bandwidth per chip"); v4's page gives no ICI figure, so v4's is the
JAX scaling book's (jax-ml.github.io/scaling-book/tpus: 4.5e10 B/s one way per link, 6 links).
HBM capacities are as the pages print them (GiB for v4 and v5p, GB for the others); the fit check
uses the compiler's own HBM size where it reports one, else this table. VMEM per core is
kernels/target.py's table.

What the plan takes from them (jaxrl_llm/tpu/forecast.py): compute time = FLOPs / peak bf16,
memory time = bytes accessed / HBM bandwidth, collective time = bytes moved per chip / (ICI per
chip / 2), one direction of the links. These are rooflines: a forecast, not a measurement.
"""

from __future__ import annotations

import dataclasses

from jaxrl_llm.kernels import target as kernel_target

GB, GIB = 10**9, 1 << 30


@dataclasses.dataclass(frozen=True)
class Chip:
  generation: str  # the topology name's prefix: "v5p" in "v5p:4x4x4"
  device_kinds: tuple[str, ...]  # what jax's devices of the chip report as device_kind
  peak_bf16_flops: float  # FLOP/s per chip, dense bf16
  hbm_bytes: int  # HBM per chip
  hbm_bytes_per_s: float  # HBM bandwidth per chip
  ici_bytes_per_s: float  # inter-chip interconnect per chip, both directions summed
  source: str

  @property
  def vmem_bytes(self) -> int | None:
    return kernel_target.vmem_capacity(self.device_kinds[0])


_CLOUD = "cloud.google.com/tpu/docs/"
CHIPS: dict[str, Chip] = {c.generation: c for c in (
    Chip("v4", ("TPU v4",), 275e12, 32 * GIB, 1200 * GB, 540 * GB,
         _CLOUD + "v4; ICI: jax-ml.github.io/scaling-book/tpus"),
    Chip("v5e", ("TPU v5 lite", "TPU v5e"), 197e12, 16 * GB, 819 * GB, 400 * GB, _CLOUD + "v5e"),
    Chip("v5p", ("TPU v5", "TPU v5p"), 459e12, 95 * GIB, 2765 * GB, 1200 * GB, _CLOUD + "v5p"),
    Chip("v6e", ("TPU v6 lite", "TPU v6e"), 918e12, 32 * GB, 1638 * GB, 800 * GB, _CLOUD + "v6e"),
    Chip("7x", ("TPU7x",), 2307e12, 192 * GB, 7380 * GB, 1200 * GB, _CLOUD + "tpu7x"),
)}


def chip_for(device_kind: str) -> Chip | None:
  """The table's row of a device's `device_kind`, None for a chip it does not know."""
  for chip in CHIPS.values():
    if device_kind in chip.device_kinds:
      return chip
  return None
