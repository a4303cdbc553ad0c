"""Dequantisation of every supported GGML type against the gguf package's `gguf.quants.dequantize`,
bit for bit, on random blocks (every bit pattern of the packed integers), on gguf.quants.quantize's
output where the package can quantise, through a GGUF file written with GGUFWriter, and against
values worked out by hand."""

import gguf
import numpy as np
import pytest

from jaxrl_llm.checks import ConfigError
from jaxrl_llm.model.io.gguf_quants import GGML_TYPES, dequantize
from jaxrl_llm.model.io.gguf_reader import GGUFFile

from gguf_fixtures import BYTE_TYPES, random_blocks

BLOCK_TYPES = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]
QUANTIZABLE = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]  # gguf 0.19 quantises these in Python


def _bits(a):
  return np.ascontiguousarray(a, np.float32).view(np.uint32)


def reference(data, kind):
  return gguf.quants.dequantize(data, gguf.GGMLQuantizationType[kind])


@pytest.mark.parametrize("kind", BLOCK_TYPES)
def test_random_blocks_equal_gguf_bit_for_bit(kind):
  _, block, size = GGML_TYPES[BYTE_TYPES[kind]]
  rows, blocks_per_row = 6, 3
  data = random_blocks(kind, rows * blocks_per_row, seed=BYTE_TYPES[kind]).reshape(rows, blocks_per_row * size)
  ours = dequantize(data, BYTE_TYPES[kind], (rows, blocks_per_row * block))
  ref = reference(data, kind)
  assert ours.shape == ref.shape == (rows, blocks_per_row * block) and ours.dtype == np.float32
  np.testing.assert_array_equal(_bits(ours), _bits(ref))
  assert np.unique(ours).size > block  # not a degenerate block pattern


@pytest.mark.parametrize("kind", QUANTIZABLE)
def test_quantized_by_gguf_round_trips(kind):
  qtype = gguf.GGMLQuantizationType[kind]
  x = np.linspace(-1.5, 2.0, 4 * 64, dtype=np.float32).reshape(4, 64) ** 3
  data = gguf.quants.quantize(x, qtype)
  ours = dequantize(data, BYTE_TYPES[kind], x.shape)
  np.testing.assert_array_equal(_bits(ours), _bits(reference(data, kind)))
  # Within one quantisation step of each block of 32 (the float16 scale adds < 0.1% of the block's size):
  # symmetric types step by absmax / 127 (Q8_0), / 8 (Q4_0), / 16 (Q5_0); affine ones by range / 15, / 31.
  blocks = x.reshape(-1, 32)
  absmax, span = np.abs(blocks).max(1, keepdims=True), np.ptp(blocks, axis=1, keepdims=True)
  step = {"Q8_0": absmax / 127, "Q4_0": absmax / 8, "Q5_0": absmax / 16, "Q4_1": span / 15, "Q5_1": span / 31}[kind]
  assert np.all(np.abs(ours - x).reshape(-1, 32) <= step + 1e-3 * absmax)


@pytest.mark.parametrize("kind", ["F32", "F16", "BF16"])
def test_float_types(kind):
  x = np.array([[0.0, -1.5, 3.140625, 2.0 ** -10], [65504.0, -2.0 ** -14, 7.0, -0.0]], np.float32)
  if kind == "F32":
    data = x
  elif kind == "F16":
    data = x.astype(np.float16)
  else:
    data = gguf.quants.quantize(x, gguf.GGMLQuantizationType.BF16)
  ours = dequantize(data, BYTE_TYPES[kind], x.shape)
  np.testing.assert_array_equal(_bits(ours), _bits(reference(data, kind)))
  if kind != "BF16":
    np.testing.assert_array_equal(ours, x)  # every value above is exact in float16
  else:
    np.testing.assert_allclose(ours, x, rtol=2 ** -8)


def test_q4_0_and_q8_0_by_hand():
  # Q4_0: d = 0.5 (f16 0x3800), byte j holds weight j (low nibble) and j + 16 (high nibble); x = d (q - 8).
  q = np.arange(32) % 16  # weights 0..15 -> 0..15, weights 16..31 -> 0..15
  packed = (q[:16] | (q[16:] << 4)).astype(np.uint8)
  block = np.concatenate([np.array([0x00, 0x38], np.uint8), packed])
  expected = 0.5 * (q - 8)  # -4.0, -3.5, ..., 3.5, then again
  np.testing.assert_array_equal(dequantize(block, BYTE_TYPES["Q4_0"], (32,)), expected.astype(np.float32))
  # Q8_0: d = 0.25 (f16 0x3400), int8 weights -16..15: x = 0.25 q.
  q8 = np.arange(-16, 16, dtype=np.int8)
  block8 = np.concatenate([np.array([0x00, 0x34], np.uint8), q8.view(np.uint8)])
  np.testing.assert_array_equal(dequantize(block8, BYTE_TYPES["Q8_0"], (32,)), 0.25 * q8.astype(np.float32))


def test_q6_k_by_hand():
  # All low bits 1 (ql = 0x11), high bits 2 (qh = 0b10101010): q = 1 | 2 << 4 = 33, minus 32 -> 1;
  # scales[j] = j + 1, d = 2: weight i (scale block i // 16) is 2 * (i // 16 + 1) * 1.
  block = np.concatenate([np.full(128, 0x11, np.uint8), np.full(64, 0b10101010, np.uint8),
                          np.arange(1, 17, dtype=np.int8).view(np.uint8), np.array([0x00, 0x40], np.uint8)])
  expected = 2.0 * (np.arange(256) // 16 + 1)
  np.testing.assert_array_equal(dequantize(block, BYTE_TYPES["Q6_K"], (256,)), expected.astype(np.float32))


def test_through_a_gguf_file(tmp_path):
  """Every type written with GGUFWriter and read back through GGUFFile (shape in numpy order)."""
  w = gguf.GGUFWriter(str(tmp_path / "types.gguf"), "llama")
  stored = {}
  for kind in BLOCK_TYPES:
    _, block, size = GGML_TYPES[BYTE_TYPES[kind]]
    data = random_blocks(kind, 4, seed=100 + BYTE_TYPES[kind]).reshape(2, 2 * size)
    w.add_tensor(f"{kind}.weight", data, raw_dtype=gguf.GGMLQuantizationType[kind])
    stored[kind] = (data, (2, 2 * block))
  w.add_tensor("F16.weight", np.arange(12, dtype=np.float16).reshape(3, 4))
  w.add_tensor("F32.weight", np.arange(12, dtype=np.float32).reshape(3, 4))
  for header in (w.write_header_to_file, w.write_kv_data_to_file, w.write_tensors_to_file, w.close):
    header()
  gg = GGUFFile(str(tmp_path / "types.gguf"))
  for kind, (data, shape) in stored.items():
    assert gg.shape(f"{kind}.weight") == shape and gg.type_name(f"{kind}.weight") == kind
    np.testing.assert_array_equal(_bits(gg.tensor(f"{kind}.weight")), _bits(reference(data, kind)))
  np.testing.assert_array_equal(gg.tensor("F16.weight"), np.arange(12, dtype=np.float32).reshape(3, 4))
  np.testing.assert_array_equal(gg.tensor("F32.weight"), np.arange(12, dtype=np.float32).reshape(3, 4))


def test_bad_sizes_and_types_are_refused():
  with pytest.raises(ValueError, match=r"Q4_0: a row of 48 weights is not a whole number of 32-weight blocks"):
    dequantize(np.zeros(36, np.uint8), BYTE_TYPES["Q4_0"], (48,))
  with pytest.raises(ValueError, match=r"Q8_0: 33 bytes stored for shape \(32,\), expected 34"):
    dequantize(np.zeros(33, np.uint8), BYTE_TYPES["Q8_0"], (32,))
  with pytest.raises(ValueError, match=r"ggml Q2_K is not supported \(supported: F32, F16, Q4_0"):
    dequantize(np.zeros(84, np.uint8), 10, (256,))
  assert issubclass(ConfigError, ValueError)
