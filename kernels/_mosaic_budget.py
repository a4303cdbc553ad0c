"""VMEM budget of the TPU (Mosaic) vocabulary kernels, and their tile sizes.

Each of the three kernels (``_mosaic_loop``) holds, per grid step, these
buffers in VMEM (bytes; Pallas double-buffers every pipelined block):

    inputs   sum_s 2 (bn * D_s * b_h + D_s * bv * b_w)     hidden and w tiles
           + sum_r 2 bn * k_r * 4                          per-row inputs
    temps    4 S bn bv * 4                                 f32 logit-sized
    fwd      3 sum_c bn * k_c * 4                          carry: out x2, scratch
    dh       bn * D_0 * (4 + 2 b_o) + D_0 * bv * b_w       acc, out x2, masked w
    dw       D_0 * bv * (4 + 2 b_o) + bn * D_0 * b_h       acc, out x2, masked h

with S sources (one, or two for ``vocab_cross``) of widths D_s, itemsizes
b_h / b_w of hidden / w, b_o of the gradient's dtype, and each last dim
padded to the 128 lanes and each second-to-last to the 8 sublanes
(16 for 2-byte types) of a TPU tile, as VMEM stores them: a (bn, 1) f32
column takes bn * 128 * 4 bytes. "4 S" counts the f32 (bn, bv) arrays of one
step (logits, their exponential, a product, a select, per source); it is an
estimate (Mosaic's own allocation differs both ways, see ``budget_and_limit``),
so the compiler gets a limit above the budget.

The budget is ``VocabTiles.tpu_vmem_bytes`` if set, else the target chip's
default (``target.vmem_budget``: three quarters of its VMEM per core, at most
32 MiB, so 12 MiB on v4 and 32 MiB on v5e, v5p, v6e, 7x and in the
interpreter); the compiler's limit is twice the budget, at most the chip's
VMEM (``budget_and_limit``; 25% above it in the interpreter).

Tiles: the largest that fit the budget, in the order that serves each
kernel's reuse. The forward and d hidden kernels re-read
``w_DV`` once per row block (2 bn flops per element of w), so they take the
largest block_n in (512, ..., 8) first, then the largest block_v in
(2048, ..., 128); the d w kernel re-reads the hidden states once per
vocabulary block, so it takes block_v first. A block at least as long as
its axis is the whole axis (always a legal TPU block); otherwise block_n is
a multiple of 8 and block_v of 128. D is never tiled: at 32 MiB every op fits
D up to 8192 in bf16 and f32 (README table), and a shape that does not fit
raises an error naming the budget to raise.
"""

from __future__ import annotations

import dataclasses
import itertools

from jaxrl_llm.kernels import target
from jaxrl_llm.kernels.config import MIB, VocabTiles

BLOCK_N = (512, 256, 128, 64, 32, 16, 8)
BLOCK_V = (2048, 1024, 512, 256, 128)
KINDS = ("fwd", "dh", "dw")
_LANES, _SUBLANES = 128, 8
_TEMPS = 4  # f32 (bn, bv) temporaries per source in one step


@dataclasses.dataclass(frozen=True)
class Operands:
  """What the footprint depends on, besides the tiles.

  dims: D_s of each source (hidden_s is (N, D_s), w_s is (D_s, V)).
  h_bytes, w_bytes: itemsizes of each source's hidden and w.
  row_widths: the last dim of each per-row input (ids K, statistics 1).
  carry_widths: the last dim of each carry leaf (the forward's outputs).
  out_bytes: itemsize of the gradient the backward kernel writes.
  """

  dims: tuple[int, ...]
  h_bytes: tuple[int, ...]
  w_bytes: tuple[int, ...]
  row_widths: tuple[int, ...] = ()
  carry_widths: tuple[int, ...] = ()
  out_bytes: int = 4


@dataclasses.dataclass(frozen=True)
class KernelTiles:
  """One kernel's tiles and what they cost."""

  kind: str
  block_n: int
  block_v: int
  vmem_bytes: int  # the footprint formula at these tiles
  vmem_limit_bytes: int  # what the Mosaic compiler is allowed


def _lanes(x: int) -> int:
  return -(-x // _LANES) * _LANES


def _sublanes(x: int, itemsize: int) -> int:
  rows = _SUBLANES * max(1, 4 // itemsize)  # 2-byte types pack 16 rows
  return -(-x // rows) * rows


def vmem_bytes(kind: str, block_n: int, block_v: int, ops: Operands) -> int:
  """The module docstring's footprint of one kernel at (block_n, block_v)."""
  if kind not in KINDS:
    raise ValueError(f"kind={kind!r}: must be one of {KINDS}")
  bv = _lanes(block_v)
  total = 0
  for d, bh, bw in zip(ops.dims, ops.h_bytes, ops.w_bytes):
    total += 2 * _sublanes(block_n, bh) * _lanes(d) * bh
    total += 2 * _sublanes(d, bw) * bv * bw
  bn = _sublanes(block_n, 4)
  total += sum(2 * bn * _lanes(k) * 4 for k in ops.row_widths)
  total += _TEMPS * len(ops.dims) * bn * bv * 4
  d0, bh0, bw0, bo = ops.dims[0], ops.h_bytes[0], ops.w_bytes[0], ops.out_bytes
  if kind == "fwd":
    total += 3 * sum(bn * _lanes(k) * 4 for k in ops.carry_widths)
  elif kind == "dh":
    total += bn * _lanes(d0) * 4 + 2 * _sublanes(block_n, bo) * _lanes(d0) * bo
    total += _sublanes(d0, bw0) * bv * bw0
  else:
    total += _sublanes(d0, 4) * bv * 4 + 2 * _sublanes(d0, bo) * bv * bo
    total += _sublanes(block_n, bh0) * _lanes(d0) * bh0
  return total


def _whole_or(block: int, size: int) -> int:
  """A block at least as long as its axis is the whole axis."""
  return size if block >= size else block


def budget_and_limit(tiles: VocabTiles, device_kind: str) -> tuple[int, int]:
  """(the tiles' VMEM budget, the compiler's vmem_limit_bytes) on ``device_kind``.

  On a known TPU the compiler may use twice the budget, never more than the
  chip's VMEM per core: what Mosaic allocates differs from the formula both
  ways (measured with libtpu 0.0.42.1 at N = 2048, V = 151,936: an f32
  forward at D = 4096 with a 29.5 MiB formula allocated 59.75 MiB, the f32
  matmuls at HIGHEST precision splitting their operands; bf16 forwards
  allocate less than the formula). Elsewhere (the interpreter, an unknown
  chip) the limit is the budget plus 25%, as before.
  """
  budget = (target.vmem_budget(device_kind) if tiles.tpu_vmem_bytes is None
            else tiles.tpu_vmem_bytes)
  capacity = target.vmem_capacity(device_kind)
  if capacity is None:
    return budget, budget + budget // 4
  return budget, min(2 * budget, capacity)


def plan(kind: str, n: int, v: int, ops: Operands, tiles: VocabTiles,
         device_kind: str | None = None) -> KernelTiles:
  """The tiles of one kernel: ``tiles.tpu_block_*`` if set, else the largest
  that fit the VMEM budget of ``device_kind`` (default: the target's,
  ``target.target_device_kind``; module docstring). Raises ValueError naming
  the budget when nothing fits."""
  if device_kind is None:
    device_kind = target.target_device_kind()
  budget, limit = budget_and_limit(tiles, device_kind)
  ns = (tiles.tpu_block_n,) if tiles.tpu_block_n else BLOCK_N
  vs = (tiles.tpu_block_v,) if tiles.tpu_block_v else BLOCK_V
  pairs = (itertools.product(ns, vs) if kind != "dw" else
           ((bn, bv) for bv in vs for bn in ns))
  smallest = None
  for bn, bv in pairs:
    bn, bv = _whole_or(bn, n), _whole_or(bv, v)
    need = vmem_bytes(kind, bn, bv, ops)
    if need <= budget:
      return KernelTiles(kind, bn, bv, need, limit)
    smallest = need if smallest is None else min(smallest, need)
  given = ("" if tiles.tpu_block_n is None and tiles.tpu_block_v is None else
           f" at VocabTiles(tpu_block_n={tiles.tpu_block_n}, "
           f"tpu_block_v={tiles.tpu_block_v})")
  source = ("VocabTiles" if tiles.tpu_vmem_bytes is not None else
            f"the default for device kind {device_kind!r}:")
  capacity = target.vmem_capacity(device_kind)
  holds = ("what the chip's VMEM holds" if capacity is None else
           f"{capacity // MIB} MiB, this chip's VMEM per core")
  raise ValueError(
      f"the TPU {kind} kernel needs {smallest / MIB:.1f} MiB of VMEM{given} for "
      f"D={ops.dims} (hidden itemsizes {ops.h_bytes}, w {ops.w_bytes}), over "
      f"{source} tpu_vmem_bytes={budget} ({budget / MIB:.1f} MiB): raise "
      f"VocabTiles.tpu_vmem_bytes (up to {holds}) or choose smaller "
      "tpu_block_n / tpu_block_v")
