"""Tile sizes, the implementation switch, and input validation for the vocab ops.

Every op in this package streams over the vocabulary in chunks and can run
through one of four implementations, chosen by ``impl``:

- ``"naive"``: the plain-jnp reference (full N x V logits, autodiff). The
  baseline the benchmark compares against, and the oracle of the tests.
- ``"xla_chunked"``: a hand-written ``custom_vjp`` whose forward and backward
  loop over vocabulary chunks in XLA, never holding more than N x chunk logits.
- ``"pallas"``: the same streaming maths as Pallas kernels (GPU/Triton style:
  one program per row block, a loop over vocabulary blocks inside). Runs
  compiled on a GPU backend, or on any backend with ``interpret=True``.
- ``"auto"``: ``"pallas"`` on GPU, ``"xla_chunked"`` elsewhere (CPU, and TPU,
  where these GPU-style kernels would have to hold ``w_DV`` in VMEM).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.checks import check_choice

IMPLS = ("auto", "pallas", "xla_chunked", "naive")


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
    block_n: rows (tokens) per Pallas program. Power of two, >= 16 (Triton's
      dot needs every operand dim >= 16).
    block_v: vocabulary columns per Pallas loop step. Power of two, >= 16.
    chunk_v: vocabulary columns per step of the chunked-XLA loop; the loop holds
      a few N x chunk_v f32 temporaries. Clipped to V at call time.
  """

  block_n: int = 32
  block_v: int = 256
  chunk_v: int = 4096

  def __post_init__(self):
    for name in ("block_n", "block_v"):
      value = getattr(self, name)
      if not isinstance(value, int) or not _is_power_of_two(value) or value < 16:
        raise ValueError(
            f"VocabTiles.{name}={value!r}: must be a power of two >= 16")
    if not isinstance(self.chunk_v, int) or self.chunk_v < 1:
      raise ValueError(
          f"VocabTiles.chunk_v={self.chunk_v!r}: must be a positive int")


def resolve_impl(impl: str, interpret: bool | None) -> tuple[str, bool]:
  """Maps (impl, interpret) to a concrete implementation and interpret flag."""
  if impl not in IMPLS:
    raise ValueError(f"impl={impl!r}: must be one of {IMPLS}")
  if interpret is not None and not isinstance(interpret, bool):
    raise TypeError(f"interpret={interpret!r}: must be a bool or None")
  backend = jax.default_backend()
  if impl == "auto":
    impl = "pallas" if backend == "gpu" else "xla_chunked"
  interpret = bool(interpret)
  if impl == "pallas" and backend != "gpu" and not interpret:
    raise ValueError(
        f"impl='pallas' on backend {backend!r}: the kernels compile for GPU "
        "only; pass interpret=True to run them in interpret mode, or use "
        "impl='xla_chunked'")
  return impl, interpret


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
