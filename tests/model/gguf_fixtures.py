"""Small GGUF files written with gguf.GGUFWriter as llama.cpp's converter writes them.

The tensors come from tiny random transformers models, renamed to llama.cpp's
names, with its value changes applied the forward way (written out here from
convert_hf_to_gguf.py, independently of the code under test): Llama's q/k
rows permuted per head, Gemma's norm weights stored as w + 1. The tokenizers
are small byte-level BPE and SentencePiece vocabularies.
"""

import gguf
import numpy as np
import torch
import transformers

from jaxrl_llm.model.io.gguf_quants import GGML_TYPES

BYTE_TYPES = {name: type_id for type_id, (name, _, _) in GGML_TYPES.items()}
# Byte offsets of each block type's float16 scales (random bytes there could be NaN or inf).
F16_FIELDS = {"Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q4_K": (0, 2),
              "Q5_K": (0, 2), "Q6_K": (208,)}

# -- a byte-level BPE vocabulary (gpt2 tokenizer model) -----------------------------------------

BPE_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BPE_MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ in", "Ġt o", "r e", "1 2", "Ġ Ġ", "ĠĠ ĠĠ"]
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def gpt2_alphabet():
  keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
  table, extra = {}, 0
  for b in range(256):
    table[b] = chr(b) if b in keep else chr(256 + extra)
    extra += b not in keep
  return [table[b] for b in range(256)]


def bpe_vocab():
  """(tokens, types, merges): 3 control tokens, the 256 byte characters, one token per merge."""
  tokens = BPE_SPECIAL + gpt2_alphabet() + [m.replace(" ", "") for m in BPE_MERGES]
  types = [3] * len(BPE_SPECIAL) + [1] * (len(tokens) - len(BPE_SPECIAL))
  return tokens, types, list(BPE_MERGES)


# -- a SentencePiece vocabulary (llama tokenizer model, as Gemma's) --------------------------------

def spm_vocab():
  """(tokens, types, scores) in Gemma's layout: controls, user-defined newline / double space / tag,
  the 256 byte tokens, then pieces in merge order."""
  tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>", "\n", "  ", "<b>"]
  types = [3, 3, 3, 3, 3, 3, 3, 4, 4, 4]
  tokens += [f"<0x{b:02X}>" for b in range(256)]
  types += [6] * 256
  pieces = ["▁", *"abcdefghijklmnopqrstuvwxyz", "▁t", "he", "▁the", "in", "▁a", "▁in", "er", "on", "▁on", "re"]
  tokens += pieces
  types += [1] * len(pieces)
  scores = [0.0] * (len(tokens) - len(pieces)) + [-float(i) for i in range(len(pieces))]
  return tokens, types, scores


# -- tiny models ----------------------------------------------------------------------------------

def tiny_hf_model(family: str, vocab: int, seed: int = 0):
  """A random transformers model of `family` with every tensor (norms, biases) non-trivial."""
  torch.manual_seed(seed)
  common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, max_position_embeddings=128)
  if family in ("llama", "llama3"):  # llama3: Llama 3.1's RoPE scaling (all three bands at head_dim 16)
    rope = {"rope_type": "default", "rope_theta": 10000.0} if family == "llama" else {
        "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    cfg = transformers.LlamaConfig(tie_word_embeddings=False, rope_parameters=rope, **common)
  elif family == "qwen2":
    cfg = transformers.Qwen2Config(tie_word_embeddings=True,
                                   rope_parameters={"rope_type": "default", "rope_theta": 1e6}, **common)
  elif family == "qwen3":
    cfg = transformers.Qwen3Config(head_dim=128, tie_word_embeddings=True,
                                   rope_parameters={"rope_type": "default", "rope_theta": 1e6}, **common)
  elif family == "gemma3":
    # 6 layers: five sliding-window layers (window 4) then a global one, as llama.cpp lays them out.
    cfg = transformers.Gemma3TextConfig(**{**common, "num_hidden_layers": 6, "num_key_value_heads": 1},
                                        head_dim=32, query_pre_attn_scalar=32, sliding_window=4,
                                        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                                         "sliding_attention": {"rope_type": "default",
                                                                               "rope_theta": 1e4}})
  else:
    raise ValueError(family)
  model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
  with torch.no_grad():
    for name, p in model.named_parameters():
      p.copy_((0.2 if "norm" in name else 0.15) * torch.randn_like(p) + (1.0 if "norm" in name and
                                                                        family != "gemma3" else 0.0))
  return model.eval()


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
  """convert_hf_to_gguf.py's LlamaModel.permute: rotate-half rows -> interleaved rows, per head."""
  return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_LEAVES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
           "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
           "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate",
           "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
_GEMMA_LEAVES = {**_LEAVES, "post_attention_layernorm": "post_attention_norm",
                 "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm"}


def gguf_tensors(model, family: str) -> dict:
  """GGUF name -> float32 array, as llama.cpp converts the model's state dict."""
  cfg = model.config
  leaves = _GEMMA_LEAVES if family == "gemma3" else _LEAVES
  out = {}
  for name, t in model.state_dict().items():
    w = t.detach().numpy().astype(np.float32)
    if name == "lm_head.weight":
      if cfg.tie_word_embeddings:
        continue
      gname = "output.weight"
    elif name == "model.embed_tokens.weight":
      gname = "token_embd.weight"
    elif name == "model.norm.weight":
      gname = "output_norm.weight"
    else:
      _, _, layer, rest = name.split(".", 3)
      module, kind = rest.rsplit(".", 1)
      gname = f"blk.{layer}.{leaves[module]}.{kind}"
    if family == "llama" and gname.endswith("attn_q.weight"):
      w = llama_cpp_permute(w, cfg.num_attention_heads)
    if family == "llama" and gname.endswith("attn_k.weight"):
      w = llama_cpp_permute(w, cfg.num_key_value_heads)
    if family == "gemma3" and gname.endswith("norm.weight"):
      w = w + np.float32(1.0)  # Gemma3Model.modify_tensors: norm_shift
    out[gname] = w
  return out


def llama3_rope_freqs(theta: float, head_dim: int, factor: float, low: float, high: float, original: int):
  """convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors: the rope_freqs.weight of Llama 3's RoPE."""
  out = []
  for i in range(0, head_dim, 2):
    wavelen = 2 * np.pi * theta ** (i / head_dim)
    if wavelen < original / high:
      out.append(1.0)
    elif wavelen > original / low:
      out.append(factor)
    else:
      smooth = (original / wavelen - low) / (high - low)
      out.append(1 / ((1 - smooth) / factor + smooth))
  return np.array(out, np.float32)


def write_gguf(path, family: str, tensors: dict, cfg, *, tokenizer: str = "bpe", pre: str = "gpt2",
               chat_template: str | None = CHATML, types: dict | None = None, meta: dict | None = None,
               raw: dict | None = None) -> str:
  """A GGUF file of `tensors` (name -> float32) with `cfg`'s metadata under llama.cpp's keys.

  types: tensor name -> GGML type name, quantised with gguf.quants.quantize (default F32).
  raw: tensor name -> (uint8 bytes [rows, row_bytes], type name), written as they are.
  meta: extra or replacing metadata, key -> value (None removes the key).
  """
  arch = family
  w = gguf.GGUFWriter(str(path), arch)
  kv = {f"{arch}.context_length": cfg.max_position_embeddings, f"{arch}.embedding_length": cfg.hidden_size,
        f"{arch}.block_count": cfg.num_hidden_layers, f"{arch}.feed_forward_length": cfg.intermediate_size,
        f"{arch}.attention.head_count": cfg.num_attention_heads,
        f"{arch}.attention.head_count_kv": cfg.num_key_value_heads,
        f"{arch}.attention.layer_norm_rms_epsilon": float(cfg.rms_norm_eps)}
  rope = cfg.rope_parameters.get("full_attention", cfg.rope_parameters)
  kv[f"{arch}.rope.freq_base"] = float(rope["rope_theta"])
  head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
  if family in ("qwen3", "gemma3"):
    kv[f"{arch}.attention.key_length"] = head_dim
    kv[f"{arch}.attention.value_length"] = head_dim
  if family == "llama":
    kv[f"{arch}.rope.dimension_count"] = head_dim
  if family == "gemma3":
    kv[f"{arch}.attention.sliding_window"] = cfg.sliding_window
  if tokenizer == "bpe":
    tokens, token_types, merges = bpe_vocab()
    kv.update({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.merges": merges,
               "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
               "tokenizer.ggml.padding_token_id": 0, "tokenizer.ggml.add_bos_token": False})
  else:
    tokens, token_types, scores = spm_vocab()
    kv.update({"tokenizer.ggml.model": "llama", "tokenizer.ggml.pre": "default", "tokenizer.ggml.scores": scores,
               "tokenizer.ggml.bos_token_id": 2, "tokenizer.ggml.eos_token_id": 1,
               "tokenizer.ggml.unknown_token_id": 3, "tokenizer.ggml.padding_token_id": 0,
               "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_space_prefix": False})
  kv.update({"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": token_types})
  if chat_template is not None:
    kv["tokenizer.chat_template"] = chat_template
  for key, value in (meta or {}).items():
    if value is None:
      kv.pop(key, None)
    else:
      kv[key] = value
  for key, value in kv.items():
    if key == "general.architecture":
      continue
    _add(w, key, value)
  for name, t in tensors.items():
    kind = (types or {}).get(name, "F32")
    if kind == "F32":
      w.add_tensor(name, np.ascontiguousarray(t, np.float32))
    elif kind == "F16":
      w.add_tensor(name, t.astype(np.float16))
    else:
      qtype = gguf.GGMLQuantizationType[kind]
      w.add_tensor(name, gguf.quants.quantize(t, qtype), raw_dtype=qtype)
  for name, (data, kind) in (raw or {}).items():
    w.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType[kind])
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return str(path)


def _add(w, key, value):
  if isinstance(value, bool):
    w.add_bool(key, value)
  elif isinstance(value, int):
    w.add_uint32(key, value)
  elif isinstance(value, float):
    w.add_float32(key, value)
  elif isinstance(value, str):
    w.add_string(key, value)
  elif isinstance(value, (list, tuple)):
    if value and isinstance(value[0], str):
      w.add_array(key, list(value))
    elif value and isinstance(value[0], float):
      w.add_array(key, [float(v) for v in value])
    else:
      w.add_key_value(key, [int(v) for v in value], gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.INT32)
  else:
    raise TypeError(f"{key}: {value!r}")


def random_blocks(kind: str, n_blocks: int, seed: int) -> np.ndarray:
  """[n_blocks, type_size] random block bytes of a GGML type, its float16 scales finite, in [-2, 2]."""
  _, block, size = GGML_TYPES[BYTE_TYPES[kind]]
  rng = np.random.default_rng(seed)
  data = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
  for start in F16_FIELDS.get(kind, ()):
    scales = rng.uniform(-2.0, 2.0, size=(n_blocks, 1)).astype(np.float16)
    data[:, start:start + 2] = scales.view(np.uint8)
  return data


def model_gguf(path, family: str, *, seed: int = 0, **kwargs):
  """(GGUF path, the transformers model it holds) for a tiny `family` model."""
  vocab = len((spm_vocab() if family == "gemma3" else bpe_vocab())[0])
  model = tiny_hf_model(family, vocab, seed)
  tensors = gguf_tensors(model, family)
  kwargs.setdefault("tokenizer", "spm" if family == "gemma3" else "bpe")
  if family == "gemma3":
    kwargs.setdefault("chat_template", None)
  return write_gguf(path, family, tensors, model.config, **kwargs), model


# -- text for tokenizer comparisons ---------------------------------------------------------------

_VARIED = [
    "Hello, world!", "The quick brown fox jumps over the lazy dog.", "I'm sure we'll see; don't you think? DON'T",
    "12345", "3.14159265", "1,000,000 and 2+3=5", "Call 555-0123 at 10:30pm", "x²³ and ½ and ⅓", "0123456789" * 3,
    "a  b", "   leading spaces", "trailing spaces   ", "\t\ttabs\tinside", "\n\n\nnewlines\n", " \n \n  \n",
    "mixed \t \n\r\n end", "héllo naïve café", "日本語のテキストです。", "中文字符测试", "한국어 문장", "emoji 😀👍🏽🎉",
    "Ελληνικά κείμενα", "русский текст", "עברית", "العربية", "e\u0301 combining", "zero\u200bwidth",
    "ＡＢＣ fullwidth", "∑∫√∞≠≤", "Ünïcödé ÀÉÎÕÜ ß", "def f(x):\n    return x ** 2\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }", '{"key": [1, 2, 3], "nested": {"a": null}}',
    "<table><tr><td>cell</td></tr></table>", "# Title\n\n- item 1\n- item 2\n\n```python\nprint('hi')\n```",
    "<|im_start|>user\nhi<|im_end|>", "<bos><start_of_turn>user\nhello<end_of_turn>", "<eos> <pad> <unk>",
    "", " ", "  ", "a", "\n", "   \n\t  ", "supercalifragilisticexpialidocious", "https://example.com/p?q=1&r=2#f",
    "email@example.org", "C:\\Windows\\System32", "$100.00 €50 £20 ¥1000", "snake_case camelCase kebab-case",
]
_POOL = (list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,;:!?'\"()[]{}<>-_=+*/\\|@#$%^&~`\n\t")
         + list("éüñçø日本中文한😀€²½") + ["  ", "   ", "\n\n", "<td>", "<b>", "'s", "'ll", "123", "The", " the"])


def varied_strings(n: int = 200, seed: int = 0) -> list[str]:
  """Hand-picked strings (unicode, digits, whitespace runs, code, special tokens), then random mixes of
  characters and fragments up to n."""
  import random

  rng = random.Random(seed)
  out = list(_VARIED)
  while len(out) < n:
    out.append("".join(rng.choice(_POOL) for _ in range(rng.randint(1, 40))))
  return out[:n]
