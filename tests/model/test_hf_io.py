"""Hugging Face checkpoint import/export: bit-exact round trips, sharded
checkpoints, loading into a mesh, and errors before any compute."""

import functools
import json
import os
import shutil

import jax
import ml_dtypes
import numpy as np
import pytest
import torch
import transformers
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from jaxrl_llm.model.io.hf_io import load_hf, read_hf_config, save_hf
from jaxrl_llm.model.sharding import MeshConfig, make_mesh, param_shardings

from hf_fixtures import VOCAB, build_hf_model


def _tensors(path):
  """name -> raw numpy array over every safetensors file in path."""
  out = {}
  for fname in sorted(os.listdir(path)):
    if fname.endswith(".safetensors"):
      with safe_open(os.path.join(path, fname), framework="numpy") as f:
        out.update({k: f.get_tensor(k) for k in f.keys()})
  return out


def _assert_bit_exact(src, dst, skip=()):
  a, b = _tensors(src), _tensors(dst)
  assert set(a) - set(skip) == set(b)
  for name in b:
    assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
    assert a[name].tobytes() == b[name].tobytes(), f"{name} differs"


def _torch_logits(path, tokens):
  model = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager")
  with torch.no_grad():
    return model.eval()(input_ids=torch.tensor(tokens)).logits.float().numpy()


TOKENS = [[3, 17, 42, 5, 88, 1, 60]]


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama"])
def test_round_trip_is_bit_exact_and_loads_in_transformers(hf_dirs, tmp_path, family):
  src = hf_dirs[family]
  params, cfg = load_hf(src)
  save_hf(params, cfg, str(tmp_path), base_config=read_hf_config(src))
  _assert_bit_exact(src, tmp_path)
  np.testing.assert_array_equal(_torch_logits(str(tmp_path), TOKENS), _torch_logits(src, TOKENS))


def test_bf16_round_trip_with_bf16_and_f32_params(tmp_path):
  src = tmp_path / "src"
  build_hf_model("qwen2", seed=3).to(torch.bfloat16).save_pretrained(src)
  params, cfg = load_hf(str(src))
  assert cfg.param_dtype == "bfloat16" and params["embed_VD"].dtype == ml_dtypes.bfloat16
  save_hf(params, cfg, str(tmp_path / "out16"))
  _assert_bit_exact(src, tmp_path / "out16")
  # Widening to f32 for training and narrowing back on export loses nothing.
  params32, cfg32 = load_hf(str(src), param_dtype="float32")
  assert params32["embed_VD"].dtype == np.float32 and cfg32.compute_dtype == "float32"
  save_hf(params32, cfg32, str(tmp_path / "out32"), dtype="bfloat16")
  _assert_bit_exact(src, tmp_path / "out32")
  assert json.loads((tmp_path / "out32" / "config.json").read_text())["dtype"] == "bfloat16"


def test_sharded_checkpoints_in_and_out(hf_dirs, tmp_path):
  src = tmp_path / "sharded_src"
  build_hf_model("llama", seed=0).save_pretrained(src, max_shard_size="40KB")
  assert (src / "model.safetensors.index.json").exists()
  params, cfg = load_hf(str(src))
  single, _ = load_hf(hf_dirs["llama"])  # same seed, one file
  jax.tree.map(np.testing.assert_array_equal, params, single)
  out = tmp_path / "sharded_out"
  save_hf(params, cfg, str(out), max_shard_bytes=50_000)
  index = json.loads((out / "model.safetensors.index.json").read_text())
  assert len(set(index["weight_map"].values())) > 1
  _assert_bit_exact(src, out)
  np.testing.assert_array_equal(_torch_logits(str(out), TOKENS), _torch_logits(str(src), TOKENS))


def test_load_straight_into_mesh_shardings(hf_dirs):
  mesh = make_mesh(MeshConfig(2, 2, 2))
  params, cfg = load_hf(hf_dirs["qwen3"], shardings=functools.partial(param_shardings, mesh=mesh))
  plain, _ = load_hf(hf_dirs["qwen3"])
  shardings = param_shardings(cfg, mesh)
  for got, want, sharding in zip(jax.tree.leaves(params), jax.tree.leaves(plain),
                                 jax.tree.leaves(shardings)):
    assert got.sharding == sharding
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_tokenizer_files_are_copied(hf_dirs, tmp_path):
  tok_dir = tmp_path / "tok"
  tok_dir.mkdir()
  (tok_dir / "tokenizer.json").write_text('{"fake": 1}')
  (tok_dir / "tokenizer_config.json").write_text('{"chat_template": "x"}')
  params, cfg = load_hf(hf_dirs["qwen2"])
  save_hf(params, cfg, str(tmp_path / "out"), tokenizer_dir=str(tok_dir))
  assert (tmp_path / "out" / "tokenizer.json").read_text() == '{"fake": 1}'
  assert (tmp_path / "out" / "tokenizer_config.json").exists()


# -- errors before any compute ---------------------------------------------------


def _copy(src, dst):
  shutil.copytree(src, dst)
  return dst


def _edit_config(path, **changes):
  cfg = json.loads((path / "config.json").read_text())
  cfg.update(changes)
  (path / "config.json").write_text(json.dumps(cfg))


def _edit_tensors(path, fn):
  tensors = load_file(path / "model.safetensors")
  fn(tensors)
  save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})


@pytest.mark.parametrize("changes,match", [
    (dict(architectures=["GPT2LMHeadModel"], model_type="gpt2"), "unsupported architecture"),
    (dict(hidden_act="gelu"), "hidden_act='gelu'"),
    (dict(use_sliding_window=True), "use_sliding_window"),
    (dict(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}),
     "rope type 'yarn'"),
    (dict(num_attention_heads=3), "n_kv_heads"),
])
def test_bad_config_is_refused(hf_dirs, tmp_path, changes, match):
  path = _copy(hf_dirs["qwen2"], tmp_path / "bad")
  _edit_config(path, **changes)
  with pytest.raises(ValueError, match=match):
    load_hf(str(path))


def test_missing_misshaped_and_unexpected_tensors_are_named(hf_dirs, tmp_path):
  missing = _copy(hf_dirs["qwen2"], tmp_path / "missing")
  _edit_tensors(missing, lambda t: t.pop("model.layers.1.self_attn.k_proj.bias"))
  with pytest.raises(ValueError, match=r"missing tensor 'model.layers.1.self_attn.k_proj.bias'"):
    load_hf(str(missing))

  shaped = _copy(hf_dirs["qwen2"], tmp_path / "shaped")
  _edit_tensors(shaped, lambda t: t.update({"model.layers.0.mlp.up_proj.weight":
                                            np.zeros((95, 64), np.float32)}))
  with pytest.raises(ValueError, match=r"'model.layers.0.mlp.up_proj.weight' has shape "
                                       r"\(95, 64\), expected \(96, 64\)"):
    load_hf(str(shaped))

  extra = _copy(hf_dirs["qwen2"], tmp_path / "extra")
  _edit_tensors(extra, lambda t: t.update({"model.layers.2.mlp.up_proj.weight":
                                           np.zeros((96, 64), np.float32)}))
  with pytest.raises(ValueError, match=r"unexpected tensors .*model.layers.2.mlp.up_proj"):
    load_hf(str(extra))

  with pytest.raises(FileNotFoundError, match="config.json"):
    load_hf(str(tmp_path))


@pytest.mark.parametrize("preset", ["qwen2_5_0_5b", "qwen2_5_7b", "qwen3_8b", "llama3_2_1b",
                                    "llama3_1_8b"])
def test_preset_configs_round_trip_through_config_json(preset):
  from jaxrl_llm.model.config import ModelConfig
  from jaxrl_llm.model.io.hf_config import config_from_hf, config_to_hf
  cfg = ModelConfig.preset(preset)
  hf = json.loads(json.dumps(config_to_hf(cfg)))
  assert config_from_hf(hf) == cfg
  assert ModelConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
  # transformers reads the written config.json with the same shapes.
  ref = transformers.AutoConfig.for_model(**hf)
  assert (ref.hidden_size, ref.num_key_value_heads, ref.intermediate_size) == (
      cfg.d_model, cfg.n_kv_heads, cfg.d_ff)
  assert ref.rope_parameters["rope_theta"] == cfg.rope_theta


def test_export_refuses_configs_the_family_cannot_express():
  from jaxrl_llm.model.config import ModelConfig
  from jaxrl_llm.model.io.hf_config import config_to_hf
  with pytest.raises(ValueError, match="qkv_bias=True cannot be exported as family='llama'"):
    config_to_hf(ModelConfig.tiny(64, qkv_bias=True))
  with pytest.raises(ValueError, match="qk_norm"):
    config_to_hf(ModelConfig.tiny(64, qk_norm=True, family="qwen2", qkv_bias=True))


# config.json of published checkpoints (older transformers spelling: rope_theta
# and rope_scaling at top level, torch_dtype), copied from their model pages.
LLAMA_3_2_1B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
    "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "use_cache": True, "vocab_size": 128256}
QWEN2_5_0_5B = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
    "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
    "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 32768, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "use_cache": True, "use_sliding_window": False, "vocab_size": 151936}


def test_published_config_json_matches_presets():
  from jaxrl_llm.model.config import ModelConfig
  from jaxrl_llm.model.io.hf_config import config_from_hf
  bf16 = dict(param_dtype="bfloat16", compute_dtype="bfloat16")
  assert config_from_hf(LLAMA_3_2_1B) == ModelConfig.preset("llama3_2_1b", **bf16)
  assert config_from_hf(QWEN2_5_0_5B) == ModelConfig.preset("qwen2_5_0_5b", **bf16)
  assert config_from_hf(QWEN2_5_0_5B, param_dtype="float32").compute_dtype == "float32"


def test_truncated_safetensors_names_the_file(hf_dirs, tmp_path):
  bad = tmp_path / "cut"
  shutil.copytree(hf_dirs["qwen2"], bad)
  weights = bad / "model.safetensors"
  weights.write_bytes(weights.read_bytes()[:100])  # a cut-off download
  with pytest.raises(ValueError, match=rf"{weights}: cannot read this safetensors file .*truncated"):
    load_hf(str(bad))


def test_a_folder_missing_pieces_lists_all_of_them(hf_dirs, tmp_path):
  from jaxrl_llm.model.tokenizer import check_hf_dir

  bare = tmp_path / "bare"
  bare.mkdir()
  shutil.copy(os.path.join(hf_dirs["llama"], "model.safetensors"), bare)  # weights only
  with pytest.raises(ValueError) as e:
    check_hf_dir(str(bare), chat_template=True)
  for piece in ("config.json", "tokenizer.json", "an eos_token", "a chat_template", "data.chat_template=False"):
    assert piece in str(e.value)
  assert "*.safetensors" not in str(e.value)  # present, so not listed
