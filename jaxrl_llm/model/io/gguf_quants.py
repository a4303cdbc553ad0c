"""Dequantisation of GGUF tensors (llama.cpp's ggml block formats) to float32.

Each quantised row is a run of blocks; a block packs `block_size` weights
into `type_size` bytes: one or two float16 scales and the packed integers.
Written from ggml's block layouts (ggml-common.h) and reference dequantisers
(ggml-quants.c), with the same order of float32 operations, so the output is
bit-identical to ggml's and to the `gguf` package's `gguf.quants.dequantize`
(the test oracle):

  Q8_0  32 weights: d, 32 x int8                      x = d * q
  Q4_0  32 weights: d, 16 bytes of 4-bit q            x = d * (q - 8)
  Q4_1  32 weights: d, m, 16 bytes of 4-bit q         x = d * q + m
  Q5_0  32 weights: d, 32 high bits, 4-bit q          x = d * (q - 16)
  Q5_1  32 weights: d, m, 32 high bits, 4-bit q       x = d * q + m
  Q4_K  256 weights: d, dmin, 8 x 6-bit (scale, min), 4-bit q
                                      x = (d * sc_j) * q - (dmin * m_j) per 32
  Q5_K  as Q4_K plus one high bit per weight
  Q6_K  256 weights: 4 + 2 bits per weight, 16 x int8 scales, d
                                      x = (d * sc_j) * (q - 32) per 16

In a block of 32 the low nibbles of the 16 bytes are weights 0..15 and the
high nibbles 16..31. In Q4_K / Q5_K each 32-byte chunk c holds sub-blocks
2c (low nibbles) and 2c + 1 (high nibbles). In Q6_K each half of 128
weights reads 64 bytes of low bits (ql) and 32 bytes of high bits (qh).
F32, F16 and BF16 are widened exactly.
"""

from __future__ import annotations

import numpy as np

# ggml type id -> (name, weights per block, bytes per block). The ids are
# ggml's (`enum ggml_type`), stable across llama.cpp versions.
GGML_TYPES = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    30: ("BF16", 1, 2),
}
GGML_TYPE_NAMES = tuple(name for name, _, _ in GGML_TYPES.values())

_CHUNK_BLOCKS = 1 << 16  # blocks dequantised at a time: bounds the temporaries


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
  """The float16 stored at byte `start` of every block, as float32 [n, 1]."""
  return np.ascontiguousarray(blocks[:, start:start + 2]).view(np.float16).astype(np.float32)


def _nibbles(packed: np.ndarray) -> np.ndarray:
  """[n, 16] bytes -> [n, 32] values: the low nibbles, then the high nibbles."""
  return np.concatenate([packed & 0x0F, packed >> 4], axis=1)


def _high_bits(blocks: np.ndarray, start: int) -> np.ndarray:
  """The 32 bits stored little-endian at byte `start`, one per weight, as [n, 32] uint8."""
  qh = np.ascontiguousarray(blocks[:, start:start + 4]).view("<u4")
  return ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)


def _q8_0(b):
  return b[:, 2:].view(np.int8).astype(np.float32) * _f16(b, 0)


def _q4_0(b):
  q = _nibbles(b[:, 2:]).astype(np.int8) - np.int8(8)
  return _f16(b, 0) * q.astype(np.float32)


def _q4_1(b):
  return _f16(b, 0) * _nibbles(b[:, 4:]).astype(np.float32) + _f16(b, 2)


def _q5_0(b):
  q = (_nibbles(b[:, 6:]) | (_high_bits(b, 2) << 4)).astype(np.int8) - np.int8(16)
  return _f16(b, 0) * q.astype(np.float32)


def _q5_1(b):
  q = _nibbles(b[:, 8:]) | (_high_bits(b, 4) << 4)
  return _f16(b, 0) * q.astype(np.float32) + _f16(b, 2)


def _k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Q4_K / Q5_K's 12 bytes -> the 8 sub-blocks' 6-bit scales and mins, [n, 8] each.

  Sub-block j < 4: scale = s[j] & 63, min = s[j + 4] & 63. j >= 4: the low
  four bits come from s[j + 4] (scale: low nibble, min: high nibble) and the
  top two from the spare bits 6-7 of s[j - 4] (scale) and s[j] (min).
  """
  lo, mid, top = s[:, 0:4], s[:, 4:8], s[:, 8:12]
  scale = np.concatenate([lo & 63, (top & 0x0F) | ((lo >> 6) << 4)], axis=1)
  mins = np.concatenate([mid & 63, (top >> 4) | ((mid >> 6) << 4)], axis=1)
  return scale.astype(np.float32), mins.astype(np.float32)


def _k_nibbles(qs: np.ndarray) -> np.ndarray:
  """[n, 128] bytes -> [n, 8, 32]: chunk c's low nibbles are sub-block 2c, its high ones 2c + 1."""
  chunks = qs.reshape(len(qs), 4, 1, 32)
  return np.concatenate([chunks & 0x0F, chunks >> 4], axis=2).reshape(len(qs), 8, 32)


def _k_affine(b, q):
  """(d * scale_j) * q - (dmin * min_j) over the 8 sub-blocks of 32."""
  scale, mins = _k_scales(b[:, 4:16])
  d = (_f16(b, 0) * scale)[:, :, None]
  m = (_f16(b, 2) * mins)[:, :, None]
  return (d * q.astype(np.float32) - m).reshape(len(b), 256)


def _q4_k(b):
  return _k_affine(b, _k_nibbles(b[:, 16:144]))


def _q5_k(b):
  # Sub-block j's fifth bit is bit j of each of the 32 bytes of qh.
  qh = b[:, 16:48].reshape(len(b), 1, 32) >> np.arange(8, dtype=np.uint8)[None, :, None]
  return _k_affine(b, _k_nibbles(b[:, 48:176]) | ((qh & 1) << 4))


def _q6_k(b):
  n = len(b)
  ql = b[:, 0:128].reshape(n, 2, 1, 64)
  qh = b[:, 128:192].reshape(n, 2, 1, 32)
  low = np.concatenate([ql & 0x0F, ql >> 4], axis=2).reshape(n, 2, 4, 32)  # groups of 32 per half
  high = (qh >> np.array([0, 2, 4, 6], np.uint8)[None, None, :, None]) & 3  # [n, 2, 4, 32]
  q = (low | (high << 4)).astype(np.int8) - np.int8(32)
  scales = b[:, 192:208].view(np.int8).astype(np.float32)  # one per 16 weights, in order
  d = (_f16(b, 208) * scales).reshape(n, 16, 1)
  return (d * q.reshape(n, 16, 16).astype(np.float32)).reshape(n, 256)


_BLOCK_FNS = {"Q8_0": _q8_0, "Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1,
              "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k}


def ggml_type_name(type_id: int) -> str:
  """"Q4_K" for 12: ggml's name of a type id (also of the types not supported here), else "type 99"."""
  if type_id in GGML_TYPES:
    return GGML_TYPES[type_id][0]
  import gguf

  try:
    return gguf.GGMLQuantizationType(type_id).name
  except ValueError:
    return f"type {type_id}"


def dequantize(data: np.ndarray, type_id: int, shape: tuple[int, ...]) -> np.ndarray:
  """A tensor's stored data -> float32 array of `shape` (numpy order, last axis contiguous).

  data: what gguf's reader maps for the tensor (float32 / float16 elements, or
  uint8 bytes for block types and BF16), any shape with the right size.
  type_id: the ggml type id (GGML_TYPES). Raises ValueError for other types
  or a size that does not match `shape`.
  """
  if type_id not in GGML_TYPES:
    raise ValueError(f"ggml {ggml_type_name(type_id)} is not supported (supported: {', '.join(GGML_TYPE_NAMES)})")
  name, block, type_size = GGML_TYPES[type_id]
  n = int(np.prod(shape, dtype=np.int64))
  if shape and shape[-1] % block:
    raise ValueError(f"{name}: a row of {shape[-1]} weights is not a whole number of {block}-weight blocks")
  raw = np.ascontiguousarray(data).reshape(-1)
  if name in ("F32", "F16"):
    values = raw.view(np.float32 if name == "F32" else np.float16)
    if values.size != n:
      raise ValueError(f"{name}: {values.size} values stored for shape {tuple(shape)} ({n} weights)")
    return values.astype(np.float32).reshape(shape)
  raw = raw.view(np.uint8)
  if raw.size != n // block * type_size:
    raise ValueError(f"{name}: {raw.size} bytes stored for shape {tuple(shape)}, expected {n // block * type_size}")
  if name == "BF16":  # the upper half of a float32
    return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
  blocks = raw.reshape(-1, type_size)
  out = np.empty((len(blocks), block), np.float32)
  fn = _BLOCK_FNS[name]
  for start in range(0, len(blocks), _CHUNK_BLOCKS):
    out[start:start + _CHUNK_BLOCKS] = fn(blocks[start:start + _CHUNK_BLOCKS])
  return out.reshape(shape)
