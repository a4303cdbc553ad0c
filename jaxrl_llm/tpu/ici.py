"""What a collective over a group of a mesh's devices costs on the ICI: its links' bandwidth and its hops.

A TPU chip reaches only its nearest neighbours, two links per torus axis
(scaling book, jax-ml.github.io/scaling-book/tpus). A collective over a group
of devices uses the links along the physical axes its group spans, and no
others: an all-gather over `fsdp` laid on one axis of a 2D slice has that
axis's links, half of what the chip has.

Per physical axis the group spans (`group_cost`), with the slice's wraparound
(scaling book, tpus: a v5e / v6e axis wraps when it holds 16 chips; a v4, v5p
or 7x slice of whole 4x4x4 cubes wraps every axis):

- a ring (the group covers the whole axis and the axis wraps): both links, 2
  x one direction of a link out of each device, and e // 2 hops to the
  farthest of e chips (a bidirectional ring);
- a line (no wraparound, or part of the axis): one link's worth, the edge
  chip's only neighbour on it, and e - 1 hops.

Several axes add their links (XLA's collectives over a 2D group use both) and
their hops (the farthest chip is the sum of the distances). Two devices of one
chip (7x's TensorCores) exchange through the chip, not the ICI: that is
counted as one more link of the chip's and one hop, **an assumption** (no
published figure of the die-to-die bandwidth). An all-reduce is a
reduce-scatter then an all-gather: twice the hops.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxrl_llm.tpu.chips import ICI_HOP_S, Chip

TPU_2D_WRAP = 16  # a v5e / v6e axis wraps when it holds this many chips
TPU_3D_CUBE = 4  # v4 / v5p / 7x: a slice of whole 4x4x4 cubes wraps every axis


@dataclasses.dataclass(frozen=True)
class Links:
  """The ICI seen by the devices of a mesh, in the mesh's device order (a replica group's ids)."""

  coords: np.ndarray  # [n, 3] int: each device's chip coordinates
  cores: np.ndarray  # [n] int: each device's core on its chip
  extents: tuple[int, ...]  # chips of the slice along each physical axis
  wraps: tuple[bool, ...]  # whether each physical axis is a ring
  link_bytes_per_s: float  # one direction of one link, per device
  hop_s: float  # latency per hop

  @classmethod
  def of(cls, devices, chip: Chip, hop_s: float = ICI_HOP_S) -> "Links":
    """`devices` in the mesh's order (`mesh.devices.flat`), the slice being all of them."""
    devices = list(devices)
    coords = np.array([tuple(d.coords) for d in devices], dtype=int).reshape(len(devices), -1)
    cores = np.array([getattr(d, "core_on_chip", 0) for d in devices], dtype=int)
    extents = tuple(int(x) for x in coords.max(0) - coords.min(0) + 1)
    if chip.torus_dims == 2:
      wraps = tuple(e == TPU_2D_WRAP for e in extents)
    else:
      whole_cubes = all(e % TPU_3D_CUBE == 0 for e in extents)
      wraps = tuple(whole_cubes for _ in extents)
    return cls(coords, cores, extents, wraps, chip.link_bytes_per_s, hop_s)

  @property
  def n(self) -> int:
    return len(self.cores)

  def group_cost(self, ids) -> tuple[float, int]:
    """(bytes per second out of each device, hops to the farthest member) of a group of device ids;
    ids None: the whole slice."""
    ids = range(self.n) if ids is None else [i for i in ids if 0 <= i < self.n]
    coords, cores = self.coords[list(ids)], self.cores[list(ids)]
    links, hops = 0, 0
    for axis, extent in enumerate(self.extents):
      e = len(np.unique(coords[:, axis]))
      if e < 2:
        continue
      ring = self.wraps[axis] and e == extent
      links += 2 if ring else 1
      hops += e // 2 if ring else e - 1
    if len(np.unique(cores)) > 1:  # the TensorCores of one chip: one link's worth, one hop (assumed)
      links, hops = links + 1, hops + 1
    return links * self.link_bytes_per_s, hops

  def seconds(self, kind: str, moved_bytes: float, ids) -> tuple[float, float]:
    """(bandwidth seconds, latency seconds) of one collective moving `moved_bytes` out of each device."""
    bandwidth, hops = self.group_cost(ids)
    if not hops:
      return 0.0, 0.0
    passes = 2 if kind == "all-reduce" else 1
    return moved_bytes / bandwidth, passes * hops * self.hop_s
