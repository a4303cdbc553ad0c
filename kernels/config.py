"""Tile sizes, the implementation switch, and input validation for the vocab ops.

Every op in this package streams over the vocabulary in chunks and can run
through one of four implementations, chosen by ``impl``:

- ``"naive"``: the plain-jnp reference (full N x V logits, autodiff). The
  baseline the benchmark compares against, and the oracle of the tests.
- ``"xla_chunked"``: a hand-written ``custom_vjp`` whose forward and backward
  loop over vocabulary chunks in XLA, never holding more than N x chunk logits.
- ``"pallas"``: the same streaming maths as Pallas kernels, in the style of the
  backend: on GPU the Triton kernels (``_pallas_loop``: one program per row
  block, a loop over vocabulary blocks inside); on TPU the Mosaic kernels
  (``_mosaic_loop``: a (row blocks, vocabulary blocks) grid, ``w_DV`` streamed
  in (D, block_v) tiles, accumulators in VMEM scratch). On CPU only in an
  interpreter, chosen by ``interpret`` (see ``resolve_impl``).
- ``"auto"``: ``"pallas"`` on GPU and TPU, ``"xla_chunked"`` on CPU.

GPU, TPU or CPU is the platform the computation targets (``target``: the
devices of the mesh in context, else ``jax.default_backend()``), so a compile
for a TPU topology from a CPU machine picks the TPU kernels.

``resolve_impl`` turns (impl, interpret) into one of the concrete paths
``RESOLVED_IMPLS``, which is what the ops' ``custom_vjp`` dispatch on.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jax.experimental.pallas import tpu as pltpu

from jaxrl_llm.checks import bad, check_choice, check_int
from jaxrl_llm.kernels.target import MIB, target_platform

IMPLS = ("auto", "pallas", "xla_chunked", "naive")
# What resolve_impl returns: "pallas" becomes the kernels of one style.
RESOLVED_IMPLS = ("naive", "xla_chunked", "pallas_triton", "pallas_mosaic")


@dataclasses.dataclass(frozen=True)
class KernelsConfig:
  """The run config's `kernels` section: which implementation the trainer's vocabulary ops use."""

  impl: str

  def __post_init__(self):
    check_choice("config.kernels.impl", self.impl, IMPLS)

# Masked vocabulary columns get this logit instead of -inf, so that products
# like exp(z - m) * z stay 0 instead of becoming NaN.
MASK_VALUE = -1e30


def _is_power_of_two(x: int) -> bool:
  return x > 0 and (x & (x - 1)) == 0


@dataclasses.dataclass(frozen=True)
class VocabTiles:
  """Tile sizes of the streaming vocab ops.

  Attributes:
    block_n: rows (tokens) per Triton program. Power of two, >= 16 (Triton's
      dot needs every operand dim >= 16).
    block_v: vocabulary columns per Triton loop step. Power of two, >= 16.
    chunk_v: vocabulary columns per step of the chunked-XLA loop; the loop holds
      a few N x chunk_v f32 temporaries. Clipped to V at call time.
    tpu_block_n: rows per block of the TPU (Mosaic) kernels, a multiple of 8
      (the sublanes of a TPU tile), or None: chosen per kernel from
      ``tpu_vmem_bytes`` (``_mosaic_budget``). A value >= N means one block of
      all rows.
    tpu_block_v: vocabulary columns per block of the TPU kernels, a multiple
      of 128 (the lanes of a TPU tile), or None: chosen from the budget. A
      value >= V means one block of all columns.
    tpu_vmem_bytes: the VMEM budget (bytes) the TPU kernels' tiles must fit:
      double-buffered input and output blocks, scratch and f32 temporaries,
      by the formula in ``_mosaic_budget`` (kernels/README.md has a table).
      The Mosaic compiler gets a limit above it (``_mosaic_budget.
      budget_and_limit``: twice it on a TPU, at most the chip's VMEM per
      core; 25% more in the interpreter). None (the default): from the chip the computation targets
      (``target.vmem_budget``: three quarters of its VMEM per core, at most
      32 MiB; so 12 MiB on v4, 32 MiB on v5e, v5p, v6e and 7x, and 32 MiB in
      the TPU interpreter). A value given here overrides it on every chip.
  """

  block_n: int = 32
  block_v: int = 256
  chunk_v: int = 4096
  tpu_block_n: int | None = None
  tpu_block_v: int | None = None
  tpu_vmem_bytes: int | None = None

  def __post_init__(self):
    for name in ("block_n", "block_v"):
      value = getattr(self, name)
      if not isinstance(value, int) or not _is_power_of_two(value) or value < 16:
        raise ValueError(
            f"VocabTiles.{name}={value!r}: must be a power of two >= 16")
    if not isinstance(self.chunk_v, int) or self.chunk_v < 1:
      raise ValueError(
          f"VocabTiles.chunk_v={self.chunk_v!r}: must be a positive int")
    for name, multiple in (("tpu_block_n", 8), ("tpu_block_v", 128)):
      value = getattr(self, name)
      if value is None:
        continue
      check_int(f"VocabTiles.{name}", value, multiple)
      if value % multiple:
        raise bad(f"VocabTiles.{name}", value,
                  f"must be a multiple of {multiple} (TPU tiles are 8 x 128) "
                  "or None (chosen from tpu_vmem_bytes)")
    if self.tpu_vmem_bytes is not None:
      check_int("VocabTiles.tpu_vmem_bytes", self.tpu_vmem_bytes, MIB)


def resolve_impl(impl: str, interpret=None) -> tuple[str, object]:
  """Maps (impl, interpret) to the path the ops run: (resolved, interpret).

  Args:
    impl: one of ``IMPLS``. "auto" is "pallas" on GPU and TPU, "xla_chunked"
      on CPU (whatever ``interpret`` says), by the platform the computation
      targets: the devices of the mesh in context
      (``jax.sharding.use_abstract_mesh`` / ``jax.set_mesh``, and inside a
      ``shard_map`` its mesh), else ``jax.default_backend()``
      (``target.target_platform``).
    interpret: only read for impl "pallas":
      - None or False: compile the kernels of the target, Triton on GPU,
        Mosaic on TPU (an error on CPU);
      - True: the Triton kernels in Pallas's generic interpreter, on any
        backend (the GPU-style tests on CPU);
      - a ``jax.experimental.pallas.tpu.InterpretParams``: the Mosaic
        kernels in Pallas's TPU interpret mode, on any backend, with its
        checks as configured (e.g. ``detect_races=True``,
        ``uninitialized_memory="nan"``: the TPU tests on CPU).

  Returns:
    ``(resolved, interpret)`` with ``resolved`` one of ``RESOLVED_IMPLS``
    and ``interpret`` False (compiled), True or the ``InterpretParams``.
  """
  check_choice("impl", impl, IMPLS)
  if interpret is not None and not isinstance(
      interpret, (bool, pltpu.InterpretParams)):
    raise TypeError(
        f"interpret={interpret!r}: must be None, a bool (True: the Triton "
        "kernels interpreted) or a jax.experimental.pallas.tpu.InterpretParams"
        " (the Mosaic kernels in TPU interpret mode)")
  backend = target_platform()
  if impl == "auto":
    impl = "pallas" if backend in ("gpu", "tpu") else "xla_chunked"
  if impl != "pallas":
    return impl, False
  if isinstance(interpret, pltpu.InterpretParams):
    return "pallas_mosaic", interpret
  if interpret:
    return "pallas_triton", True
  if backend == "gpu":
    return "pallas_triton", False
  if backend == "tpu":
    return "pallas_mosaic", False
  raise ValueError(
      f"impl='pallas' on backend {backend!r}: the Pallas kernels compile for "
      "GPU (Triton) and TPU (Mosaic) only; pass interpret=True to run the "
      "Triton kernels in interpret mode, or interpret="
      "jax.experimental.pallas.tpu.InterpretParams() for the Mosaic kernels "
      "in TPU interpret mode, or use impl='xla_chunked'")


def check_temperature(temperature, name: str = "temperature") -> float:
  if isinstance(temperature, (bool, np.bool_)) or not isinstance(
      temperature, (int, float, np.floating, np.integer)):
    raise TypeError(f"{name}={temperature!r}: must be a Python float (static)")
  temperature = float(temperature)
  if not np.isfinite(temperature) or temperature <= 0.0:
    raise ValueError(f"{name}={temperature!r}: must be finite and > 0")
  return temperature


def check_hidden_w(hidden_ND, w_DV, hidden_name="hidden_ND", w_name="w_DV"):
  """Checks ranks, dtypes and the shared D; returns (N, D, V)."""
  for name, x in ((hidden_name, hidden_ND), (w_name, w_DV)):
    if getattr(x, "ndim", None) != 2:
      raise ValueError(
          f"{name} has shape {getattr(x, 'shape', None)}: must be 2-D")
    if not jnp.issubdtype(x.dtype, jnp.floating):
      raise TypeError(f"{name} has dtype {x.dtype}: must be floating")
  n, d = hidden_ND.shape
  if w_DV.shape[0] != d:
    raise ValueError(
        f"{w_name}.shape[0]={w_DV.shape[0]} must equal "
        f"{hidden_name}.shape[1]={d} (the model dim D)")
  return n, d, w_DV.shape[1]


def check_mask(mask_N, n: int):
  if mask_N is None:
    return None
  if getattr(mask_N, "shape", None) != (n,):
    raise ValueError(
        f"mask_N has shape {getattr(mask_N, 'shape', None)}: must be ({n},)")
  if mask_N.dtype != jnp.bool_:
    raise TypeError(f"mask_N has dtype {mask_N.dtype}: must be bool")
  return mask_N


def check_ids(ids, shape: tuple[int, ...], v: int, name: str, mask_N=None):
  """Checks an integer id array; range-checks its values when concrete.

  Under jit the values are tracers and cannot be checked without a host sync;
  callers then turn rows with out-of-range ids into NaN (documented per op).
  """
  if getattr(ids, "shape", None) != shape:
    raise ValueError(
        f"{name} has shape {getattr(ids, 'shape', None)}: must be {shape}")
  if not jnp.issubdtype(ids.dtype, jnp.integer):
    raise TypeError(f"{name} has dtype {ids.dtype}: must be an integer type")
  if isinstance(ids, jax.core.Tracer) or isinstance(mask_N, jax.core.Tracer):
    return
  ids_np = np.asarray(ids)
  bad = (ids_np < 0) | (ids_np >= v)
  if mask_N is not None:
    bad &= np.asarray(mask_N).reshape(mask_N.shape + (1,) * (ids_np.ndim - 1))
  if bad.any():
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    raise ValueError(
        f"{name}{list(first)}={int(ids_np[first])} is out of range: ids must "
        f"be in [0, {v}) (V = vocabulary size)")


def ids_out_of_range(ids, v: int):
  """Boolean, True where an id is outside [0, V) (the jit-time check)."""
  return (ids < 0) | (ids >= v)
