"""A GGUF file opened and checked: its metadata and its tensors, dequantised on demand.

`GGUFFile(path)` maps the file with the `gguf` package's reader and checks,
before anything is converted, what would otherwise fail half-way or
silently: the magic bytes, a header the reader cannot parse, tensor data
past the end of the file (a truncated download), a byte order other than
little-endian, and tensor types outside `gguf_quants.GGML_TYPES`. Every
problem is one ConfigError naming the file.

Shapes are in numpy order (the reader reverses ggml's `ne`), which for every
2-D weight is Hugging Face's [out_features, in_features]: token_embd is
[V, D], attn_q is [N * H, D].
"""

from __future__ import annotations

import functools
import os

import numpy as np

from jaxrl_llm.checks import ConfigError
from jaxrl_llm.model.io.gguf_quants import GGML_TYPE_NAMES, GGML_TYPES, dequantize, ggml_type_name

_MAGIC = b"GGUF"
_REQUIRED = object()


class _Truncated(Exception):
  def __init__(self, needed: int):
    super().__init__(needed)
    self.needed = needed


@functools.cache
def reader_class() -> type:
  """A subclass of gguf.GGUFReader, told to stop at the first read past the end of the file: its own reads would
  return a short array there and fail later on a reshape, with no word of the cause.

  Its reads also go through a plain ndarray view of the file's memory map (the same bytes, not a
  copy): the reader parses a vocabulary of 262,144 strings with four reads each, and every slice of
  an `np.memmap` runs the subclass's `__array_finalize__`. Gemma 3 270M's file opens in 4.4 s this
  way against 15.3 s through `gguf.GGUFReader` (scripts/bench_gguf_open.py, docs/benchmarks.md)."""
  import gguf

  class Reader(gguf.GGUFReader):
    _plain = None

    def _get(self, offset, dtype, count=1, override_order=None):
      count = int(count)
      dtype = np.dtype(dtype)
      end = int(offset) + dtype.itemsize * count
      if end > len(self.data):
        raise _Truncated(end)
      if self._plain is None or self._plain.base is not self.data:
        self._plain = self.data.view(np.ndarray)
      arr = self._plain[offset:end].view(dtype)[:count]
      return arr.view(arr.dtype.newbyteorder(self.byte_order if override_order is None else override_order))

  return Reader


class GGUFFile:
  """Metadata and tensors of one GGUF file (memory-mapped; tensors are read by `tensor`)."""

  def __init__(self, path: str):
    self.path = path
    if not os.path.isfile(path):
      raise ConfigError(f"{path}: no such GGUF file")
    size = os.path.getsize(path)
    with open(path, "rb") as f:
      magic = f.read(4)
    if magic != _MAGIC:
      raise ConfigError(f"{path}: not a GGUF file (starts with {magic!r}, expected {_MAGIC!r})")
    try:
      reader = reader_class()(path)
    except _Truncated as e:
      raise ConfigError(f"{path}: truncated: reading it needs {e.needed} bytes, the file has {size}") from None
    except Exception as e:  # the reader raises ValueError, IndexError, KeyError... on a damaged header
      raise ConfigError(f"{path}: cannot read the GGUF header ({type(e).__name__}: {e}); is the file "
                        f"truncated ({size} bytes) or damaged?") from None
    if reader.byte_order != "I":
      raise ConfigError(f"{path}: a byte-swapped (big-endian) GGUF file; only little-endian files are supported")
    self._reader = reader
    self._tensors = {t.name: t for t in reader.tensors}
    end = max((t.data_offset + t.n_bytes for t in reader.tensors), default=0)
    if end > size:
      raise ConfigError(f"{path}: truncated: its tensors need {end} bytes, the file has {size}")
    unsupported = {t.name: ggml_type_name(int(t.tensor_type)) for t in reader.tensors
                   if int(t.tensor_type) not in GGML_TYPES}
    if unsupported:
      name, kind = next(iter(unsupported.items()))
      raise ConfigError(f"{path}: tensor {name!r} is stored as {kind} ({len(unsupported)} tensors of unsupported "
                        f"types); supported types: {', '.join(GGML_TYPE_NAMES)}")

  # -- metadata ------------------------------------------------------------------

  @property
  def architecture(self) -> str:
    return self.meta("general.architecture")

  def has(self, key: str) -> bool:
    return key in self._reader.fields

  def meta(self, key: str, default=_REQUIRED):
    """The value of metadata `key` (str, int, float, bool or a list of them)."""
    field = self._reader.fields.get(key)
    if field is None:
      if default is _REQUIRED:
        raise ConfigError(f"{self.path}: metadata {key!r} is missing")
      return default
    return field.contents()

  # -- tensors -------------------------------------------------------------------

  @property
  def tensor_names(self) -> tuple[str, ...]:
    return tuple(self._tensors)

  def shape(self, name: str) -> tuple[int, ...]:
    """Numpy-order shape of tensor `name`."""
    return tuple(int(d) for d in reversed(self._tensors[name].shape.tolist()))

  def type_name(self, name: str) -> str:
    return ggml_type_name(int(self._tensors[name].tensor_type))

  def raw(self, name: str) -> np.ndarray:
    """The stored data of tensor `name` as the reader maps it (elements or block bytes)."""
    return self._tensors[name].data

  def tensor(self, name: str) -> np.ndarray:
    """Tensor `name` dequantised to float32, in numpy-order shape."""
    t = self._tensors[name]
    try:
      return dequantize(t.data, int(t.tensor_type), self.shape(name))
    except ValueError as e:
      raise ConfigError(f"{self.path}: tensor {name!r}: {e}") from None
