"""What a compiled TPU program says of itself: its memory, its cost and its collectives.

- `memory(compiled)`: the buffer assignment's bytes per device (arguments,
  outputs, temporaries, aliased, code) and the peak XLA reports.
- `cost(compiled)`: XLA's cost analysis of the per-chip program (FLOPs,
  exponentials, bytes accessed; the Pallas kernels' own `cost_estimate`s are
  in it), plus the collectives read from the optimised HLO.
- `collectives(hlo)`: every all-gather, all-reduce, reduce-scatter,
  all-to-all and collective-permute: its result bytes, its group (the first
  replica group's device ids, in the mesh's order) and size, and the bytes a
  device moves for it on a ring (all-gather and all-to-all (n-1)/n of the
  result, reduce-scatter (n-1) x the result, all-reduce 2 (n-1)/n of it, a
  permute all of it). `cost` prices each on the links its group spans
  (tpu/ici.py): its bandwidth seconds and its hops' latency.
- `kernels(hlo)`: the kernels a TensorCore runs one after another (fusions,
  custom calls, copies, collective starts, unfused array ops) in the entry
  computation and the loop bodies it calls, each body once.
- `compiler_hbm(device)`: the HBM the compiler says a device has.

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


def _group(line: str) -> list[int] | None:
  """The first replica group's device ids (a permute's first pair); None: every device."""
  m = re.search(r"(?:replica_groups|source_target_pairs)=\{\{([0-9,]*)\}", line)
  if m:
    return [int(x) for x in m.group(1).split(",") if x]
  # iota form: [groups, size]<=[dims], optionally T(perm): arange(dims).transpose(perm).reshape(groups, size)
  m = re.search(r"replica_groups=\[([0-9,]+)\]<=\[([0-9,]+)\](?:T\(([0-9,]+)\))?", line)
  if m:
    shape, dims = [int(x) for x in m.group(1).split(",")], [int(x) for x in m.group(2).split(",")]
    ids = np.arange(int(np.prod(dims))).reshape(dims)
    if m.group(3):
      ids = ids.transpose([int(x) for x in m.group(3).split(",")])
    return [int(x) for x in ids.reshape(shape[0], -1)[0]]
  return None


def collectives(hlo: str, n_devices: int) -> list[dict]:
  """The collectives of an optimised HLO module: kind, result bytes, group size and the first group's
  device ids (None: every device), bytes moved per device."""
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
    ids = _group(line)
    size, n = max(sizes), len(ids) if ids else n_devices
    moved = {"all-gather": size * (n - 1) / n, "all-to-all": size * (n - 1) / n,
             "reduce-scatter": min(sizes) * (n - 1), "all-reduce": 2 * size * (n - 1) / n,
             "collective-permute": size}[kind]
    out.append({"kind": kind, "bytes": size, "group": n, "ids": ids, "moved_bytes": moved})
  return out


# Ops that start no kernel of their own (bookkeeping, control flow, the end of an async op).
_FREE_OPS = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all", "partition-id",
             "replica-id", "while", "conditional", "call", "opt-barrier", "add-dependency", "domain",
             "get-dimension-size"}
# Ops that are a kernel even with a scalar result (a scalar add in a loop's bookkeeping is not).
_KERNEL_OPS = {"fusion", "custom-call", "reduce", "dot", "convolution", "sort", "async-start", "copy-start",
               "send", "recv", *COLLECTIVES, *(c + "-start" for c in COLLECTIVES)}
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*\(.*\{\s*$")
_CALLED = re.compile(r"\b(?:body|condition|true_computation|false_computation)=%?([\w.\-]+)")


def _opcode(line: str) -> tuple[str, bool] | None:
  """(opcode, result is a scalar) of an instruction line, None for any other line."""
  if " = " not in line:
    return None
  rest = line.split(" = ", 1)[1].lstrip()
  if rest.startswith("("):  # a tuple shape: skip to its closing parenthesis
    depth = 0
    for i, ch in enumerate(rest):
      depth += {"(": 1, ")": -1}.get(ch, 0)
      if depth == 0:
        break
    shape, rest = rest[:i + 1], rest[i + 1:].lstrip()
  else:
    shape, _, rest = rest.partition(" ")
  m = re.match(r"([a-z][a-z0-9\-]*)\(", rest)
  return (m.group(1), bool(re.match(r"\w+\[\]", shape))) if m else None


def kernels(hlo: str) -> int:
  """Kernels the program runs in sequence: every instruction of the entry computation and of the
  loop bodies and branches it reaches that starts one (fusions, custom calls, copies, collective
  starts, unfused array ops; not bookkeeping or scalar arithmetic), each body counted once."""
  bodies: dict[str, list[str]] = {}
  entry, name = None, None
  for line in hlo.splitlines():
    m = _COMPUTATION.match(line)
    if m and not line.startswith(" "):
      name = m.group(1)
      bodies[name] = []
      if line.startswith("ENTRY"):
        entry = name
    elif line.startswith("}"):
      name = None
    elif name is not None:
      bodies[name].append(line)
  count, seen, todo = 0, set(), [entry] if entry else []
  while todo:
    comp = todo.pop()
    if comp in seen or comp not in bodies:
      continue
    seen.add(comp)
    for line in bodies[comp]:
      op = _opcode(line)
      if op is None:
        continue
      opcode, scalar = op
      todo += _CALLED.findall(line)
      branches = re.search(r"branch_computations=\{([^}]*)\}", line)
      if branches:
        todo += re.findall(r"%?([\w.\-]+)", branches.group(1))
      if opcode == "call":
        todo += re.findall(r"to_apply=%?([\w.\-]+)", line)
      if opcode in _FREE_OPS or opcode.endswith(("-done", "-update")):
        continue
      if opcode in _KERNEL_OPS or not scalar:
        count += 1
  return count


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
  """Bytes per device of the program's buffers (XLA's buffer assignment)."""
  m = compiled.memory_analysis()
  out = {k: int(getattr(m, f"{k}_size_in_bytes")) for k in ("argument", "output", "temp", "alias", "generated_code")}
  peak = int(getattr(m, "peak_memory_in_bytes", 0) or 0)
  # Live at once at worst: arguments and outputs (less the donated ones they share) and temporaries.
  out["peak"] = max(peak, out["argument"] + out["output"] - out["alias"] + out["temp"])
  return out


def cost(compiled, links) -> dict:
  """{flops, transcendentals, bytes, collective_bytes, collective_s, collective_latency_s, collectives
  (count), kernels (count), <kind>_bytes per kind}: one device's share of one run of the program (loop
  bodies once: see the module's note). `links`: the mesh's ICI (tpu/ici.py's Links), which prices each
  collective on the links its group spans."""
  ca = compiled.cost_analysis()
  ca = ca[0] if isinstance(ca, (list, tuple)) else ca
  out = {"flops": float(ca.get("flops", 0.0)), "transcendentals": float(ca.get("transcendentals", 0.0)),
         "bytes": float(ca.get("bytes accessed", 0.0))}
  hlo = compiled.as_text()
  colls = collectives(hlo, links.n)
  out["collective_bytes"] = float(sum(c["moved_bytes"] for c in colls))
  priced = [links.seconds(c["kind"], c["moved_bytes"], c["ids"]) for c in colls]
  out["collective_s"] = float(sum(bw for bw, _ in priced))
  out["collective_latency_s"] = float(sum(lat for _, lat in priced))
  out["collectives"] = float(len(colls))
  out["kernels"] = float(kernels(hlo))
  for kind in COLLECTIVES:
    out[f"{kind}_bytes"] = float(sum(c["moved_bytes"] for c in colls if c["kind"] == kind))
  return out


def compiler_hbm(device) -> int | None:
  """The HBM (bytes) the compiler gives a program on `device`: from its refusal of a program whose
  temporaries (1 TiB) exceed it, or None when it does not say."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from jax.sharding import Mesh, NamedSharding, PartitionSpec  # pylint: disable=import-outside-toplevel

  whole = NamedSharding(Mesh(np.array([device]), ("x",)), PartitionSpec())
  x = jax.ShapeDtypeStruct((1 << 20,), jnp.float32, sharding=whole)
  # A sort of a [2^18, 2^20] f32 broadcast: 1 TiB of temporaries the compiler cannot fuse away.
  big = jax.jit(lambda v: jnp.sort(jnp.broadcast_to(v, (1 << 18, 1 << 20)) * 3.0, axis=0)[::7].sum(),
                out_shardings=whole)
  try:
    big.lower(x).compile()
  except jax.errors.JaxRuntimeError as e:
    found = out_of_hbm(str(e))
    return found[1] if found else None
  return None


def combine(costs: dict[tuple[int, int], dict], layers: int, loop: int, loops: tuple[int, int] = (1, 2)) -> dict:
  """A cost at `layers` layers and `loop` loop iterations from probes at 1 and 2 layers and at `loops`
  = (m1, m2) iterations ((L, m1) alone where no (1, m2) is given): linear in each, c(L, m) = c(1, m1) +
  (L-1) dL + (m-m1) dm + (L-1)(m-m1) dLm, dm and dLm per iteration. Exact when each layer and each
  iteration adds the same program, as they do (each layer is one block, each micro-batch one loss and
  gradient). m1 > 1 where fewer iterations are no valid program (a packed update's buffers must split
  over the batch shards: Program.loop_unit)."""
  m1, m2 = loops
  c11, c21 = costs[(1, m1)], costs[(2, m1)]
  c12, c22 = costs.get((1, m2)), costs.get((2, m2))
  out = {}
  for k in c11:
    d_l = c21[k] - c11[k]
    value = c11[k] + (layers - 1) * d_l
    if c12 is not None:
      d_m = (c12[k] - c11[k]) / (m2 - m1)
      d_lm = (c22[k] - c21[k] - (c12[k] - c11[k])) / (m2 - m1)
      value += (loop - m1) * d_m + (layers - 1) * (loop - m1) * d_lm
    out[k] = value
  return out
