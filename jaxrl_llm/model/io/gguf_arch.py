"""What a GGUF file's architecture means in Hugging Face terms: config.json and tensor names.

llama.cpp's converter (convert_hf_to_gguf.py) renames every tensor
(`model.layers.3.self_attn.q_proj.weight` -> `blk.3.attn_q.weight`), keeps
the [out, in] layout, stores the config as `<arch>.*` metadata and changes
the values of a few tensors, which are undone here:

* llama: the rows of q_proj and k_proj are permuted per head from the
  rotate-half layout (row a * H/2 + i, a in {0, 1}) to the interleaved one
  (row 2 i + a) that its RoPE kernel reads; `unpermute_heads` inverts it
  (transformers' gguf loader does the same, modeling_gguf_pytorch_utils.py
  `LlamaTensorProcessor`). qwen2, qwen3 and gemma3 use the NeoX RoPE in
  llama.cpp and are stored unpermuted.
* gemma3: every RMSNorm weight w (input, post-attention, pre/post-feedforward,
  q/k norms, final) is stored as w + 1, because Gemma's norm computes
  x * (1 + w) and llama.cpp's computes x * w' (Gemma3Model.modify_tensors,
  `norm_shift`); transformers subtracts 1 again (`Gemma2TensorProcessor`,
  registered for gemma3), and so do we.
* llama 3.1+ RoPE: llama.cpp stores the per-frequency divisors as a tensor,
  `rope_freqs.weight`, instead of the rope_scaling fields; we recover the
  llama3 rule's parameters from it (and refuse factors that follow no rule).

What llama.cpp fixes in code rather than in the file is written out here:
Gemma 3's sliding-window layout (5 local layers then 1 global, window from
the metadata), its local RoPE base 10000, its query scale 1/sqrt(head_dim)
(1/sqrt(d_model / heads) for the 62-layer 27B) and its GELU-tanh MLP.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable

import numpy as np

from jaxrl_llm.checks import ConfigError
from jaxrl_llm.model.io.gguf_reader import GGUFFile

GGUF_ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3")
_HF_CLASSES = {"llama": ("LlamaForCausalLM", "llama"), "qwen2": ("Qwen2ForCausalLM", "qwen2"),
               "qwen3": ("Qwen3ForCausalLM", "qwen3"), "gemma3": ("Gemma3ForCausalLM", "gemma3_text")}
# llama.cpp's leaf names -> Hugging Face's, per layer (`blk.N.<leaf>.weight` -> `model.layers.N.<hf>.weight`).
_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj", "ffn_norm": "post_attention_layernorm",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
}
_GEMMA3_NAMES = {**_LAYER_NAMES, "post_attention_norm": "post_attention_layernorm",
                 "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}
_GEMMA3_SWA_PATTERN = 6  # every 6th layer global (llama.cpp: hparams.set_swa_pattern(6))
_GEMMA3_LOCAL_ROPE_BASE = 10000.0  # llama.cpp: rope_freq_base_train_swa


@dataclasses.dataclass(frozen=True)
class TensorMove:
  """One GGUF tensor -> one Hugging Face tensor."""
  gguf_name: str
  hf_name: str
  shape: tuple[int, ...]  # numpy order, the same in both files
  undo: Callable[[np.ndarray], np.ndarray] | None = None  # llama.cpp's value change, inverted


def unpermute_heads(w: np.ndarray, n_heads: int) -> np.ndarray:
  """Inverse of llama.cpp's `LlamaModel.permute`: rows (head, i, a) -> (head, a, i), i < H/2, a in {0, 1}."""
  rows = w.shape[0]
  half = rows // n_heads // 2
  return w.reshape(n_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _minus_one(w: np.ndarray) -> np.ndarray:
  return w - np.float32(1.0)


class _Meta:
  """`<arch>.<key>` metadata of one file, with errors naming the file and the key."""

  def __init__(self, gg: GGUFFile, arch: str):
    self.gg, self.arch = gg, arch

  def __call__(self, key: str, default=ConfigError):
    full = f"{self.arch}.{key}"
    if default is ConfigError:
      return self.gg.meta(full)
    return self.gg.meta(full, default)

  def uniform(self, key: str, default=ConfigError) -> int:
    """An int that llama.cpp may store per layer: all layers must agree."""
    value = self(key, default)
    if isinstance(value, list):
      if len(set(value)) != 1:
        raise ConfigError(f"{self.gg.path}: {self.arch}.{key}={value} differs between layers; "
                          "only one value for all layers is supported")
      value = value[0]
    return int(value)


def _token_ids(gg: GGUFFile) -> dict:
  ids = {}
  for hf_key, key in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                      ("pad_token_id", "padding_token_id")):
    if gg.has(f"tokenizer.ggml.{key}"):
      ids[hf_key] = int(gg.meta(f"tokenizer.ggml.{key}"))
  return ids


def _llama3_rope(gg: GGUFFile, theta: float, head_dim: int) -> dict:
  """The llama3 rope_parameters whose per-frequency divisors equal `rope_freqs.weight`.

  llama.cpp writes factor 1 above the high-frequency cutoff, `factor` below
  the low one and 1 / ((1 - s) / factor + s) between, with s the smoothing
  of Llama 3.1's rule, low_freq_factor 1, high_freq_factor 4 and an original
  context of 8192 (its defaults, which every Llama 3.x release uses).
  """
  stored = gg.tensor("rope_freqs.weight").astype(np.float64)
  if stored.shape != (head_dim // 2,):
    raise ConfigError(f"{gg.path}: rope_freqs.weight has shape {stored.shape}, expected ({head_dim // 2},)")
  factor, low, high, original = float(stored.max()), 1.0, 4.0, 8192
  freqs = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
  wavelen = 2 * math.pi / freqs
  smooth = (original / wavelen - low) / (high - low)
  expected = np.where(wavelen < original / high, 1.0,
                      np.where(wavelen > original / low, factor, 1.0 / ((1 - smooth) / factor + smooth)))
  if not np.allclose(stored, expected, rtol=1e-4, atol=0.0):
    raise ConfigError(f"{gg.path}: rope_freqs.weight does not follow Llama 3's RoPE rule (factor={factor:g}, "
                      f"low_freq_factor=1, high_freq_factor=4, original context 8192); other stored RoPE factors "
                      "are not supported")
  return {"rope_type": "llama3", "rope_theta": theta, "factor": factor, "low_freq_factor": low,
          "high_freq_factor": high, "original_max_position_embeddings": original}


def _rope(gg: GGUFFile, key: _Meta, theta: float, head_dim: int) -> dict:
  kind = key("rope.scaling.type", "none")
  if "rope_freqs.weight" in gg.tensor_names:
    if gg.architecture != "llama" or kind not in ("none", "linear"):
      raise ConfigError(f"{gg.path}: rope_freqs.weight with architecture {gg.architecture!r} and "
                        f"rope.scaling.type={kind!r} is not supported")
    return _llama3_rope(gg, theta, head_dim)
  if kind == "none":
    return {"rope_type": "default", "rope_theta": theta}
  if kind == "linear":
    return {"rope_type": "linear", "rope_theta": theta, "factor": float(key("rope.scaling.factor"))}
  raise ConfigError(f"{gg.path}: {gg.architecture}.rope.scaling.type={kind!r} is not supported "
                    "(allowed: none, linear, and Llama 3's rope_freqs)")


def gguf_hf_config(gg: GGUFFile) -> dict:
  """config.json (transformers' spelling) for the model in `gg`, without `dtype`."""
  arch = gg.architecture
  if arch not in GGUF_ARCHITECTURES:
    raise ConfigError(f"{gg.path}: general.architecture={arch!r} is not supported (supported: "
                      f"{', '.join(GGUF_ARCHITECTURES)})")
  key = _Meta(gg, arch)
  if "token_embd.weight" not in gg.tensor_names:
    raise ConfigError(f"{gg.path}: no token_embd.weight tensor (the embedding table)")
  vocab, d_model = gg.shape("token_embd.weight")
  if int(key("embedding_length")) != d_model:
    raise ConfigError(f"{gg.path}: {arch}.embedding_length={key('embedding_length')} but token_embd.weight is "
                      f"[{vocab}, {d_model}]")
  if gg.has(f"{arch}.vocab_size") and int(key("vocab_size")) != vocab:
    raise ConfigError(f"{gg.path}: {arch}.vocab_size={key('vocab_size')} but token_embd.weight has {vocab} rows")
  n_heads = key.uniform("attention.head_count")
  n_kv = key.uniform("attention.head_count_kv", n_heads)
  head_dim = int(key("attention.key_length", d_model // n_heads))
  if int(key("attention.value_length", head_dim)) != head_dim:
    raise ConfigError(f"{gg.path}: {arch}.attention.value_length={key('attention.value_length')} differs from "
                      f"key_length={head_dim}; only equal key and value head sizes are supported")
  if int(key("rope.dimension_count", head_dim)) != head_dim:
    raise ConfigError(f"{gg.path}: {arch}.rope.dimension_count={key('rope.dimension_count')} but the head size is "
                      f"{head_dim}: partial RoPE is not supported")
  theta = float(key("rope.freq_base", 10000.0))
  architecture, model_type = _HF_CLASSES[arch]
  hf = dict(
      architectures=[architecture], model_type=model_type, vocab_size=vocab, hidden_size=d_model,
      intermediate_size=key.uniform("feed_forward_length"), num_hidden_layers=int(key("block_count")),
      num_attention_heads=n_heads, num_key_value_heads=n_kv, head_dim=head_dim,
      rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")),
      max_position_embeddings=int(key("context_length")),
      tie_word_embeddings="output.weight" not in gg.tensor_names, **_token_ids(gg))
  if arch != "qwen2":  # Qwen2 always has q/k/v biases and no such field
    hf["attention_bias"] = False
  if arch == "gemma3":
    hf.update(_gemma3_fields(gg, key, hf, theta))
  else:
    rope = _rope(gg, key, theta, head_dim)
    hf.update(hidden_act="silu", rope_theta=theta, rope_parameters=rope, mlp_bias=False)
    if rope["rope_type"] != "default":
      hf["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    if arch == "qwen2":
      hf["use_sliding_window"] = False
  return hf


def _gemma3_fields(gg: GGUFFile, key: _Meta, hf: dict, theta: float) -> dict:
  layers = hf["num_hidden_layers"]
  pattern = key("attention.sliding_window_pattern", _GEMMA3_SWA_PATTERN)
  if isinstance(pattern, list):  # one flag per layer, true = sliding
    if len(pattern) != layers:
      raise ConfigError(f"{gg.path}: gemma3.attention.sliding_window_pattern has {len(pattern)} entries for "
                        f"{layers} layers")
    sliding = [bool(p) for p in pattern]
  else:
    sliding = [(i + 1) % int(pattern) != 0 for i in range(layers)]
  global_rope = _rope(gg, key, theta, hf["head_dim"])
  local_theta = float(key("rope.freq_base_swa", _GEMMA3_LOCAL_ROPE_BASE))
  scalar = hf["hidden_size"] // hf["num_attention_heads"] if layers == 62 else hf["head_dim"]
  return dict(
      hidden_activation="gelu_pytorch_tanh", sliding_window=int(key("attention.sliding_window")),
      layer_types=["sliding_attention" if s else "full_attention" for s in sliding],
      query_pre_attn_scalar=scalar, final_logit_softcapping=None, attn_logit_softcapping=None,
      use_bidirectional_attention=False, rope_theta=theta, rope_local_base_freq=local_theta,
      rope_scaling=None if global_rope["rope_type"] == "default" else
      {k: v for k, v in global_rope.items() if k != "rope_theta"},
      rope_parameters={"full_attention": global_rope,
                       "sliding_attention": {"rope_type": "default", "rope_theta": local_theta}})


def gguf_tensor_moves(gg: GGUFFile, hf: dict) -> list[TensorMove]:
  """Every tensor of `gg` -> its Hugging Face name, after checking that each expected tensor is
  there with its shape and that none is left over."""
  arch = gg.architecture
  D, F, V = hf["hidden_size"], hf["intermediate_size"], hf["vocab_size"]
  N, K, H = hf["num_attention_heads"], hf["num_key_value_heads"], hf["head_dim"]
  norm_undo = _minus_one if arch == "gemma3" else None
  moves = [TensorMove("token_embd.weight", "model.embed_tokens.weight", (V, D)),
           TensorMove("output_norm.weight", "model.norm.weight", (D,), norm_undo)]
  if not hf["tie_word_embeddings"]:
    moves.append(TensorMove("output.weight", "lm_head.weight", (V, D)))
  leaves = {"attn_norm": (D,), "ffn_norm": (D,), "attn_q": (N * H, D), "attn_k": (K * H, D),
            "attn_v": (K * H, D), "attn_output": (D, N * H), "ffn_gate": (F, D), "ffn_up": (F, D),
            "ffn_down": (D, F)}
  if arch in ("qwen3", "gemma3"):
    leaves.update(attn_q_norm=(H,), attn_k_norm=(H,))
  if arch == "gemma3":
    leaves.update(post_attention_norm=(D,), post_ffw_norm=(D,))
  names = _GEMMA3_NAMES if arch == "gemma3" else _LAYER_NAMES
  for i in range(hf["num_hidden_layers"]):
    for leaf, shape in leaves.items():
      undo = norm_undo if leaf.endswith("norm") else None
      if arch == "llama" and leaf in ("attn_q", "attn_k"):
        undo = functools.partial(unpermute_heads, n_heads=N if leaf == "attn_q" else K)
      moves.append(TensorMove(f"blk.{i}.{leaf}.weight", f"model.layers.{i}.{names[leaf]}.weight", shape, undo))
    if arch == "qwen2":
      for leaf, rows in (("attn_q", N * H), ("attn_k", K * H), ("attn_v", K * H)):
        moves.append(TensorMove(f"blk.{i}.{leaf}.bias", f"model.layers.{i}.{names[leaf]}.bias", (rows,)))
  present = set(gg.tensor_names)
  for m in moves:
    if m.gguf_name not in present:
      raise ConfigError(f"{gg.path}: tensor {m.gguf_name!r} is missing (expected shape {list(m.shape)} for "
                        f"architecture {arch})")
    if gg.shape(m.gguf_name) != m.shape:
      raise ConfigError(f"{gg.path}: tensor {m.gguf_name!r} has shape {list(gg.shape(m.gguf_name))}, expected "
                        f"{list(m.shape)} from the metadata")
  consumed = {m.gguf_name for m in moves} | {"rope_freqs.weight"}  # rope_freqs went into the config
  extra = sorted(present - consumed)
  if extra:
    raise ConfigError(f"{gg.path}: unexpected tensors for architecture {arch}: {extra[:6]}"
                      + (f" (+{len(extra) - 6} more)" if len(extra) > 6 else ""))
  return moves
