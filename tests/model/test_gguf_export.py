"""GGUF export (model/io/gguf_export.py) read back by our GGUF reader (gguf_io.gguf_to_hf -> hf_io.load_hf).

f32 gives the params back bit for bit, f16 their float16 rounding, q8_0 /
q4_0 the `gguf` package's own quantise-then-dequantise of each matrix (the
independent reference); the character tokenizer comes back encoding and
decoding like ours. llama's q/k head permutation is checked against the
loop llama.cpp's converter runs, written out.
"""

import dataclasses

import gguf
import jax
import numpy as np
import pytest

from jaxrl_llm.checks import ConfigError
from jaxrl_llm.model.config import ModelConfig
from jaxrl_llm.model.io.gguf_arch import unpermute_heads
from jaxrl_llm.model.io.gguf_export import export_gguf, permute_heads
from jaxrl_llm.model.io.gguf_io import gguf_to_hf
from jaxrl_llm.model.io.gguf_reader import GGUFFile
from jaxrl_llm.model.io.hf_io import load_hf
from jaxrl_llm.model.params import init_params
from jaxrl_llm.model.tokenizer import CharTokenizer, load_tokenizer

TOK = CharTokenizer()


def _cfg(**kw) -> ModelConfig:
  return ModelConfig.tiny(TOK.vocab_size, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=96,
                          **kw)


def _round_trip(tmp_path, cfg, qtype):
  params = init_params(cfg, jax.random.key(0))
  info = export_gguf(params, cfg, str(tmp_path / f"m.{qtype}.gguf"), tokenizer=TOK, qtype=qtype)
  out = gguf_to_hf(info.path, str(tmp_path / f"hf-{qtype}"), chat_template=False)
  back, back_cfg = load_hf(out)
  return params, back, back_cfg, info


def _host(tree):
  return jax.tree.map(lambda a: np.asarray(a, np.float32), jax.device_get(tree))


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_f32_export_reads_back_bit_for_bit(tmp_path, family):
  cfg = _cfg(family=family, qkv_bias=family == "qwen2", qk_norm=family == "qwen3", rope_theta=1e5)
  params, back, back_cfg, info = _round_trip(tmp_path, cfg, "f32")
  for a, b in zip(jax.tree.leaves(_host(params)), jax.tree.leaves(_host(back))):
    np.testing.assert_array_equal(a, b)
  # the same model config, norm_eps stored as GGUF's float32
  assert back_cfg == dataclasses.replace(cfg, norm_eps=float(np.float32(cfg.norm_eps)))
  assert info.bytes > 4 * sum(x.size for x in jax.tree.leaves(params))  # f32 data plus metadata
  assert GGUFFile(info.path).meta("general.file_type") == int(gguf.LlamaFileType.ALL_F32)


def test_f16_export_is_the_float16_rounding(tmp_path):
  params, back, _, info = _round_trip(tmp_path, _cfg(), "f16")
  p, b = _host(params), _host(back)
  for path in (("embed_VD",), ("layers", "wq_LDNH"), ("layers", "w_down_LFD")):
    x, y = p, b
    for k in path:
      x, y = x[k], y[k]
    np.testing.assert_array_equal(y, x.astype(np.float16).astype(np.float32))
  np.testing.assert_array_equal(b["final_norm_D"], p["final_norm_D"])  # norms stay f32
  assert GGUFFile(info.path).type_name("blk.0.attn_q.weight") == "F16"
  assert GGUFFile(info.path).type_name("blk.0.attn_norm.weight") == "F32"


@pytest.mark.parametrize("qtype,ggml", [("q8_0", gguf.GGMLQuantizationType.Q8_0),
                                        ("q4_0", gguf.GGMLQuantizationType.Q4_0)])
def test_quantised_export_is_the_gguf_packages_quantisation(tmp_path, qtype, ggml):
  params, _, _, info = _round_trip(tmp_path, _cfg(), qtype)
  gg = GGUFFile(info.path)
  # the reference: gguf's quantise then dequantise of the Hugging Face tensor (rows = output features)
  w_hf = np.asarray(params["layers"]["w_down_LFD"][1], np.float32).T  # [D, F]
  ref = gguf.quants.dequantize(gguf.quants.quantize(w_hf, ggml), ggml)
  np.testing.assert_array_equal(gg.tensor("blk.1.ffn_down.weight"), ref)
  assert gg.type_name("blk.1.ffn_down.weight") == qtype.upper()
  err = np.abs(ref - w_hf).max() / np.abs(w_hf).max()
  assert err > 0 and err < (0.01 if qtype == "q8_0" else 0.15)  # lossy, by the format's step size
  assert gg.type_name("output_norm.weight") == "F32"


def test_character_tokenizer_comes_back(tmp_path):
  _, _, _, info = _round_trip(tmp_path, _cfg(), "f32")
  tok = load_tokenizer(str(tmp_path / "hf-f32"))
  text = "What is 12+30?\n Answer: 42 ~`{}|\\\"'"
  assert tok.encode(text) == TOK.encode(text)
  assert tok.decode(TOK.encode(text)) == text
  assert tok.vocab_size == TOK.vocab_size and tok.eos_id == TOK.eos_id and tok.pad_id == TOK.pad_id
  gg = GGUFFile(info.path)
  assert gg.meta("tokenizer.ggml.model") == "gpt2" and gg.meta("tokenizer.ggml.merges") == []
  assert gg.meta("tokenizer.ggml.add_bos_token") is False


def test_permute_heads_is_llama_cpps_permute():
  # convert_hf_to_gguf.py's LlamaModel.permute, written out row by row: new row h*H + 2i + a is old row
  # h*H + a*H/2 + i
  n_heads, H, D = 3, 8, 5
  w = np.arange(n_heads * H * D, dtype=np.float32).reshape(n_heads * H, D)
  expected = np.empty_like(w)
  for h in range(n_heads):
    for i in range(H // 2):
      for a in range(2):
        expected[h * H + 2 * i + a] = w[h * H + a * H // 2 + i]
  np.testing.assert_array_equal(permute_heads(w, n_heads), expected)
  np.testing.assert_array_equal(unpermute_heads(permute_heads(w, n_heads), n_heads), w)


def test_unsupported_exports_are_refused(tmp_path):
  cfg = _cfg()
  params = init_params(cfg, jax.random.key(0))
  with pytest.raises(ConfigError, match="qtype='q5_k' is invalid"):
    export_gguf(params, cfg, str(tmp_path / "x.gguf"), tokenizer=TOK, qtype="q5_k")

  class OtherTokenizer:
    vocab_size = TOK.vocab_size

  with pytest.raises(ConfigError, match="cannot be written as GGUF metadata"):
    export_gguf(params, cfg, str(tmp_path / "x.gguf"), tokenizer=OtherTokenizer(), hf_path="/some/hf/dir")
  assert not list(tmp_path.iterdir())  # nothing half-written


@pytest.mark.slow
def test_a_gguf_checkpoints_tokenizer_is_copied(tmp_path, pretrained_gguf):
  # SmolLM2's checkpoint as the run loads it (model.hf_path = the .gguf, converted once into the model cache):
  # the export carries its tokenizer.* metadata over, so the served vocabulary is the trainer's.
  from jaxrl_llm.model.io.gguf_io import resolve_model_path

  hf_path = resolve_model_path(pretrained_gguf("smollm2-135m"), field="model.hf_path")
  tok = load_tokenizer(hf_path)
  cfg = ModelConfig.tiny(tok.vocab_size, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=64)
  info = export_gguf(init_params(cfg, jax.random.key(0)), cfg, str(tmp_path / "s.gguf"), tokenizer=tok,
                     hf_path=hf_path)
  back = load_tokenizer(gguf_to_hf(info.path, str(tmp_path / "hf"), chat_template=True))
  text = "What is 2+3?\n  Answer: 5, naïve ½ <|im_end|>"
  assert back.encode(text) == tok.encode(text) and back.eos_ids == tok.eos_ids
  assert back.chat_template == tok.chat_template


def test_a_lora_model_exports_merged(tmp_path):
  """The GGUF of a LoRA model (what the llama.cpp engine loads at each sync) holds W + s A B: read
  back, it equals lora.merged's params bit for bit (f32)."""
  from jaxrl_llm.model import lora
  from jaxrl_llm.model.config import LoraConfig

  base_cfg = _cfg(family="llama", rope_theta=1e5)
  cfg = base_cfg.replace(lora=LoraConfig(rank=4, alpha=8.0, targets="q,v,down"))
  params = lora.attach(init_params(base_cfg, jax.random.key(0)), cfg, jax.random.key(1))
  layers = dict(params["layers"])
  for t in cfg.lora.targets:  # B != 0: the adapters change the weights
    b = lora.adapter_names(t)[1]
    layers[b] = 0.1 * jax.random.normal(jax.random.key(2), layers[b].shape)
  params = {**params, "layers": layers}
  info = export_gguf(params, cfg, str(tmp_path / "m.gguf"), tokenizer=TOK, qtype="f32")
  back, back_cfg = load_hf(gguf_to_hf(info.path, str(tmp_path / "hf"), chat_template=False))
  merged, merged_cfg = lora.merged(params, cfg)
  assert back_cfg.lora is None and merged_cfg == base_cfg
  assert np.abs(_host(merged)["layers"]["wq_LDNH"] - _host(params)["layers"]["wq_LDNH"]).max() > 1e-3
  for a, b in zip(jax.tree.leaves(_host(merged)), jax.tree.leaves(_host(back))):
    np.testing.assert_array_equal(a, b)
