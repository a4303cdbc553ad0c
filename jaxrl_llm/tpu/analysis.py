"""What a compiled TPU program says of itself: its memory, its cost and its collectives.

- `memory(compiled)`: the buffer assignment's bytes per chip (arguments,
  outputs, temporaries, aliased, code) and the peak XLA reports.
- `cost(compiled)`: XLA's cost analysis of the per-chip program (FLOPs,
  exponentials, bytes accessed; the Pallas kernels' own `cost_estimate`s are
  in it), plus the collectives read from the optimised HLO.
- `collectives(hlo)`: every all-gather, all-reduce, reduce-scatter,
  all-to-all and collective-permute: its result bytes, its group size and the
  bytes a chip moves for it on a ring (all-gather and all-to-all (n-1)/n of
  the result, reduce-scatter (n-1) x the result, all-reduce 2 (n-1)/n of it,
  a permute all of it).

XLA's cost analysis counts a loop's body once, whatever its trip count (checked:
a 10-step `lax.scan` of a matmul reports the FLOPs of one), so the figures of a
program with loops are the probes' (tpu/forecast.py), whose programs have none.
"""

from __future__ import annotations

import re

import numpy as np

COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4,
                "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1,
                "s4": 0.5, "u4": 0.5}
_ARRAY = re.compile(r"\b(" + "|".join(_DTYPE_BYTES) + r")\[([0-9,]*)\]")
_OP = re.compile(r"=\s*(.*?)\s(" + "|".join(COLLECTIVES) + r")(-start)?\(")


def _array_bytes(text: str) -> list[float]:
  return [_DTYPE_BYTES[dt] * float(np.prod([int(d) for d in dims.split(",") if d] or [1]))
          for dt, dims in _ARRAY.findall(text)]


def _group_size(line: str, n_devices: int) -> int:
  m = re.search(r"replica_groups=\{(\{[0-9,]*\})", line)
  if m:
    return max(1, len([x for x in m.group(1).strip("{}").split(",") if x]))
  m = re.search(r"replica_groups=\[([0-9,]+)\]<=", line)  # iota form: [groups, size]<=[devices]
  if m:
    return int(m.group(1).split(",")[-1])
  m = re.search(r"source_target_pairs=", line)
  return 2 if m else n_devices


def collectives(hlo: str, n_devices: int) -> list[dict]:
  """The collectives of an optimised HLO module: kind, result bytes, group size, bytes moved per chip."""
  out, chains = [], set()
  for line in hlo.splitlines():
    m = _OP.search(line)
    if not m or "-done(" in line:
      continue
    kind = m.group(2)
    sizes = _array_bytes(m.group(1))  # an async start's tuple holds operand and result: the largest
    if not sizes:
      continue
    # XLA:TPU splits a collective it overlaps with compute into a chain of async collective fusions
    # (one chain_id), each link moving one piece but naming the whole result: the chain is one collective.
    chain = re.search(r'chain_id="(\d+)"', line)
    if chain:
      key = (kind, chain.group(1), max(sizes))
      if key in chains:
        continue
      chains.add(key)
    size, n = max(sizes), _group_size(line, n_devices)
    moved = {"all-gather": size * (n - 1) / n, "all-to-all": size * (n - 1) / n,
             "reduce-scatter": min(sizes) * (n - 1), "all-reduce": 2 * size * (n - 1) / n,
             "collective-permute": size}[kind]
    out.append({"kind": kind, "bytes": size, "group": n, "moved_bytes": moved})
  return out


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}  # XLA's HumanReadableNumBytes
_OUT_OF_HBM = (re.compile(r"HLO temporaries \(([\d.]+)([KMGT]?)\) exceeds available HBM \(([\d.]+)([KMGT]?)\)"),
               re.compile(r"Used ([\d.]+)([KMGT]?) of ([\d.]+)([KMGT]?) hbm"))


def out_of_hbm(message: str) -> tuple[int, int] | None:
  """(bytes needed, bytes there) from XLA:TPU's refusal of a program too large for the chip's HBM,
  or None for any other error."""
  for pattern in _OUT_OF_HBM:
    m = pattern.search(message)
    if m:
      need, unit, have, have_unit = m.groups()
      return int(float(need) * _UNITS[unit]), int(float(have) * _UNITS[have_unit])
  return None


def memory(compiled) -> dict:
  """Bytes per chip of the program's buffers (XLA's buffer assignment)."""
  m = compiled.memory_analysis()
  out = {k: int(getattr(m, f"{k}_size_in_bytes")) for k in ("argument", "output", "temp", "alias", "generated_code")}
  peak = int(getattr(m, "peak_memory_in_bytes", 0) or 0)
  # Live at once at worst: arguments and outputs (less the donated ones they share) and temporaries.
  out["peak"] = max(peak, out["argument"] + out["output"] - out["alias"] + out["temp"])
  return out


def cost(compiled, n_devices: int) -> dict:
  """{flops, transcendentals, bytes, collective_bytes, collectives (count), <kind>_bytes per kind}: one
  chip's share of one run of the program (loop bodies once: see the module's note)."""
  ca = compiled.cost_analysis()
  ca = ca[0] if isinstance(ca, (list, tuple)) else ca
  out = {"flops": float(ca.get("flops", 0.0)), "transcendentals": float(ca.get("transcendentals", 0.0)),
         "bytes": float(ca.get("bytes accessed", 0.0))}
  colls = collectives(compiled.as_text(), n_devices)
  out["collective_bytes"] = float(sum(c["moved_bytes"] for c in colls))
  out["collectives"] = float(len(colls))
  for kind in COLLECTIVES:
    out[f"{kind}_bytes"] = float(sum(c["moved_bytes"] for c in colls if c["kind"] == kind))
  return out


def combine(costs: dict[tuple[int, int], dict], layers: int, loop: int) -> dict:
  """A cost at `layers` layers and `loop` loop iterations from probes at (1, 1), (2, 1) (and (1, 2),
  (2, 2) when given): linear in each, c(L, m) = c11 + (L-1) dL + (m-1) dm + (L-1)(m-1) dLm. Exact when
  each layer and each iteration adds the same program, as they do (each layer is one block, each
  micro-batch one loss and gradient)."""
  c11, c21 = costs[(1, 1)], costs[(2, 1)]
  c12, c22 = costs.get((1, 2)), costs.get((2, 2))
  out = {}
  for k in c11:
    d_l = c21[k] - c11[k]
    value = c11[k] + (layers - 1) * d_l
    if c12 is not None:
      d_m = c12[k] - c11[k]
      value += (loop - 1) * d_m + (layers - 1) * (loop - 1) * (c22[k] - c21[k] - d_m)
    out[k] = value
  return out
