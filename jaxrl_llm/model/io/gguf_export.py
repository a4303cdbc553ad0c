"""Our params -> a GGUF file that llama.cpp serves: the weight sync of an external rollout engine.

`export_gguf(params, cfg, path, tokenizer=..., qtype=...)` writes the model
the way llama.cpp's own converter (convert_hf_to_gguf.py) would from the
Hugging Face checkpoint `hf_io.save_hf` writes: the Hugging Face tensors
(`hf_io.name_table`, the same layout conversions), renamed with the `gguf`
package's tensor-name map (`gguf.get_tensor_name_map`, which the converter
uses), llama's q/k rows permuted per head into the interleaved RoPE layout
(`permute_heads`, the inverse of `gguf_arch.unpermute_heads`), the config as
`<arch>.*` metadata and the tokenizer as `tokenizer.ggml.*`.

Tensor types (`qtype`): f32, f16, or llama.cpp's block quantisations q8_0 and
q4_0 (32 weights per block with one f16 scale; `gguf.quants.quantize`) for
the 2-D weight matrices; norms and biases stay f32 as llama.cpp keeps them.

Tokenizers: the character tokenizer becomes a byte-level BPE vocabulary
(`tokenizer.ggml.model = "gpt2"`) whose tokens are the characters in GPT-2's
byte alphabet and whose merge list is empty, so llama.cpp and
`gguf_tokenizer` both split text into exactly our character ids; the three
special tokens are control tokens. A checkpoint converted from a GGUF file
(`gguf_io.resolve_model_path`, which leaves gguf_source.json) gets that
file's `tokenizer.*` metadata copied unchanged. Other tokenizers are refused.

Families: llama, qwen2 and qwen3 without RoPE scaling (what the tiny model
and SmolLM2 are); Gemma 3 and scaled RoPE are refused with the reason.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time

import jax
import numpy as np

from jaxrl_llm.checks import ConfigError, check_choice
from jaxrl_llm.model import lora
from jaxrl_llm.model.config import ModelConfig
from jaxrl_llm.model.io.gguf_io import SOURCE_FILE
from jaxrl_llm.model.io.hf_io import name_table
from jaxrl_llm.model.tokenizer import BOS, EOS, PAD, CharTokenizer

GGUF_EXPORT_TYPES = ("f32", "f16", "q8_0", "q4_0")
_EXPORTABLE = ("llama", "qwen2", "qwen3")
_CONTROL, _NORMAL = 3, 1  # llama.cpp's token types


@dataclasses.dataclass(frozen=True)
class GGUFExport:
  """What one export wrote and what it cost."""
  path: str
  qtype: str
  bytes: int  # file size
  seconds: float  # gather to the host + convert + write


def permute_heads(w: np.ndarray, n_heads: int) -> np.ndarray:
  """llama.cpp's `LlamaModel.permute`: per head, rows (a, i) -> (i, a), a in {0, 1}, i < H/2 (rotate-half
  -> interleaved RoPE); `gguf_arch.unpermute_heads` is its inverse."""
  half = w.shape[0] // n_heads // 2
  return w.reshape(n_heads, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _check_exportable(cfg: ModelConfig) -> None:
  if cfg.family not in _EXPORTABLE:
    raise ConfigError(f"GGUF export: model family {cfg.family!r} is not supported (supported: "
                      f"{', '.join(_EXPORTABLE)})")
  if cfg.rope_scaling is not None:
    raise ConfigError(f"GGUF export: rope_scaling={cfg.rope_scaling!r} is not supported (llama.cpp stores it as "
                      "rope_freqs; export a model without RoPE scaling)")


def _hf_tensors(params, cfg: ModelConfig):
  """(Hugging Face name, float32 array) of every tensor, one host copy at a time."""
  host = {}
  for entry in name_table(cfg):
    if entry.ours not in host:
      leaf = params
      for key in entry.ours:
        leaf = leaf[key]
      host = {entry.ours: np.asarray(jax.device_get(leaf), np.float32)}
    value = host[entry.ours]
    if entry.layer is not None:
      value = value[entry.layer]
    yield entry.hf_name, np.ascontiguousarray(entry.to_hf(value), np.float32)


def _gpt2_alphabet() -> dict[str, str]:
  """GPT-2's byte -> character map (printable Latin-1 stands for itself, the other bytes for U+0100 on)."""
  printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
  table, extra = {}, 0
  for b in range(256):
    if b in printable:
      table[chr(b)] = chr(b)
    else:
      table[chr(b)] = chr(256 + extra)
      extra += 1
  return table


def _char_vocab(writer, tok: CharTokenizer, vocab_size: int) -> None:
  import gguf

  itos = [tok.decode([i]) if i not in (tok.pad_id, tok.eos_id, tok.bos_id) else None for i in range(tok.vocab_size)]
  names = {tok.pad_id: PAD, tok.eos_id: EOS, tok.bos_id: BOS}
  alphabet = _gpt2_alphabet()
  tokens, types = [], []
  for i in range(vocab_size):
    if i in names:
      tokens.append(names[i])
      types.append(_CONTROL)
    elif i < tok.vocab_size:
      tokens.append(alphabet[itos[i]])  # every character of the vocabulary is one byte (ASCII)
      types.append(_NORMAL)
    else:  # rows past the tokenizer's (a padded vocabulary): never sampled, never typed
      tokens.append(f"<unused{i}>")
      types.append(_CONTROL)
  writer.add_tokenizer_model("gpt2")
  writer.add_tokenizer_pre("default")
  writer.add_token_list(tokens)
  writer.add_token_types(types)
  writer.add_key_value(gguf.Keys.Tokenizer.MERGES, _EMPTY, gguf.GGUFValueType.ARRAY)
  writer.add_bos_token_id(tok.bos_id)
  writer.add_eos_token_id(tok.eos_id)
  writer.add_pad_token_id(tok.pad_id)
  writer.add_add_bos_token(False)  # our prompts carry their own <bos>
  writer.add_add_eos_token(False)


class _EmptyArray(list):
  """A zero-length string array: llama.cpp's BPE loader needs tokenizer.ggml.merges present, and a
  character vocabulary has no merge; the gguf package's writer refuses empty lists (see `_Writer`)."""


_EMPTY = _EmptyArray()


def _copy_tokenizer(writer, source: str) -> None:
  """Every `tokenizer.*` key of the GGUF file `source`, with its stored type."""
  import gguf

  reader = gguf.GGUFReader(source)
  for name, field in reader.fields.items():
    if not name.startswith("tokenizer."):
      continue
    vtype = field.types[0]
    sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY and len(field.types) > 1 else None
    writer.add_key_value(name, field.contents(), vtype, sub_type=sub)


def tokenizer_source(hf_path: str) -> str | None:
  """The GGUF file a checkpoint directory was converted from (gguf_source.json), or None."""
  meta = os.path.join(hf_path, SOURCE_FILE) if hf_path else ""
  if not meta or not os.path.isfile(meta):
    return None
  with open(meta) as f:
    path = json.load(f).get("gguf", "")
  return path if os.path.isfile(path) else None


def check_tokenizer_exportable(tokenizer, hf_path: str = "") -> None:
  """The GGUF export can write `tokenizer` (a ConfigError before any training otherwise)."""
  if isinstance(tokenizer, CharTokenizer) or tokenizer_source(hf_path):
    return
  raise ConfigError(f"GGUF export: the tokenizer of model.hf_path={hf_path!r} cannot be written as GGUF metadata: "
                    "supported are the character tokenizer and checkpoints converted from a .gguf file")


def _writer_class():
  import gguf

  class Writer(gguf.GGUFWriter):
    def _pack_val(self, val, vtype, add_vtype, sub_type=None):
      if isinstance(val, _EmptyArray):  # GGUF allows empty arrays: type, element type, count 0
        return (self._pack("I", vtype) if add_vtype else b"") + self._pack("I", gguf.GGUFValueType.STRING) \
            + self._pack("Q", 0)
      return super()._pack_val(val, vtype, add_vtype, sub_type)

  return Writer


def export_gguf(params, cfg: ModelConfig, path: str, *, tokenizer, qtype: str = "f32", hf_path: str = "",
                name: str = "jaxrl_llm policy") -> GGUFExport:
  """Write `params` (a model of `cfg`) to the GGUF file `path` (written beside it, then renamed); a
  LoRA model (cfg.lora) merged: W + s A B (model/lora.py)."""
  import gguf

  params, cfg = lora.merged(params, cfg)
  t0 = time.perf_counter()
  check_choice("GGUF export qtype", qtype, GGUF_EXPORT_TYPES)
  _check_exportable(cfg)
  check_tokenizer_exportable(tokenizer, hf_path)
  arch = gguf.MODEL_ARCH[cfg.family.upper()]
  names = gguf.get_tensor_name_map(arch, cfg.n_layers)
  matrix_type = {"f32": gguf.GGMLQuantizationType.F32, "f16": gguf.GGMLQuantizationType.F16,
                 "q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0}[qtype]
  file_type = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
               "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0, "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0}[qtype]
  tmp = f"{path}.partial-{os.getpid()}"
  writer = _writer_class()(tmp, gguf.MODEL_ARCH_NAMES[arch])
  try:
    writer.add_name(name)
    writer.add_file_type(int(file_type))
    writer.add_context_length(cfg.max_position)
    writer.add_embedding_length(cfg.d_model)
    writer.add_block_count(cfg.n_layers)
    writer.add_feed_forward_length(cfg.d_ff)
    writer.add_head_count(cfg.n_heads)
    writer.add_head_count_kv(cfg.n_kv_heads)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    writer.add_rope_dimension_count(cfg.head_dim)
    writer.add_rope_freq_base(float(cfg.rope_theta))
    writer.add_layer_norm_rms_eps(float(cfg.norm_eps))
    writer.add_vocab_size(cfg.vocab_size)
    if isinstance(tokenizer, CharTokenizer):
      _char_vocab(writer, tokenizer, cfg.vocab_size)
    else:
      _copy_tokenizer(writer, tokenizer_source(hf_path))
    for hf_name, w in _hf_tensors(params, cfg):
      gg_name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
      if gg_name is None:
        raise ConfigError(f"GGUF export: no llama.cpp name for tensor {hf_name!r} of family {cfg.family}")
      if cfg.family == "llama" and hf_name.endswith(("q_proj.weight", "k_proj.weight")):
        w = permute_heads(w, cfg.n_heads if "q_proj" in hf_name else cfg.n_kv_heads)
      if w.ndim == 2 and qtype != "f32":
        if qtype == "f16":
          writer.add_tensor(gg_name, w.astype(np.float16))
        else:
          writer.add_tensor(gg_name, gguf.quants.quantize(w, matrix_type), raw_dtype=matrix_type)
      else:
        writer.add_tensor(gg_name, w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()  # flushes the rest: a full disk can fail here too
  except BaseException:
    with contextlib.suppress(OSError):  # the flush of a full disk fails again; the file is closed regardless
      writer.close()
    if os.path.exists(tmp):
      os.remove(tmp)
    raise
  os.replace(tmp, path)
  return GGUFExport(path=path, qtype=qtype, bytes=os.path.getsize(path), seconds=time.perf_counter() - t0)
