"""GGUF -> Hugging Face directory on tiny models of every supported architecture, written the way
llama.cpp writes them (gguf_fixtures.py): the tensors are the original model's, and equal what
transformers' own gguf loader reads from the same file; the directory loads into our decoder and
into transformers with the original model's logits; the tokenizer matches transformers' gguf
tokenizer; `.gguf` paths in a run config resolve to a cached conversion."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file

from jaxrl_llm.checks import ConfigError
from jaxrl_llm.model import forward, logits
from jaxrl_llm.model.io.gguf_arch import unpermute_heads
from jaxrl_llm.model.io.gguf_io import SOURCE_FILE, gguf_to_hf, resolve_model_path
from jaxrl_llm.model.io.hf_io import load_hf
from jaxrl_llm.model.tokenizer import check_hf_dir, load_tokenizer

from gguf_fixtures import (CHATML, bpe_vocab, gguf_tensors, llama3_rope_freqs, llama_cpp_permute, model_gguf,
                           tiny_hf_model, write_gguf)

ARCHS = ["llama", "qwen2", "qwen3", "gemma3"]
TOL = 1e-4  # max abs logit difference, f32
TEXTS = ["the quick brown fox", "  in the  end, 12 + 3 = 15\n\nthe", "héllo wörld 😀 <|im_end|> tail",
         "<b>bold</b>\n\ttab  two  spaces", "", " ", "\n\n\n", "theretoin onre ererer"]


# The module-scoped fixtures run once: the module's tests go to one pytest-xdist worker.
pytestmark = pytest.mark.xdist_group("model.test_gguf_convert")


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
  """arch -> (gguf file, transformers model written into it, our HF directory)."""
  root = tmp_path_factory.mktemp("gguf")
  out = {}
  for arch in ARCHS:
    path, model = model_gguf(root / f"{arch}.gguf", arch, seed=ARCHS.index(arch))
    out[arch] = (path, model, gguf_to_hf(path, str(root / arch)))
  return out


def _state(model):
  return {k: v.detach().numpy() for k, v in model.state_dict().items()}


def test_unpermute_inverts_llama_cpp_permute():
  w = np.arange(2 * 8 * 3, dtype=np.float32).reshape(16, 3)  # 2 heads of 8 rows
  stored = llama_cpp_permute(w, 2)
  # Interleaved: head 0's rows (0, 4, 1, 5, 2, 6, 3, 7) — the halves' rows alternate.
  np.testing.assert_array_equal(stored[:8, 0], w[[0, 4, 1, 5, 2, 6, 3, 7], 0])
  np.testing.assert_array_equal(unpermute_heads(stored, 2), w)


@pytest.mark.parametrize("arch", ARCHS)
def test_tensors_are_the_written_model_and_transformers_gguf_reading(converted, arch, tmp_path):
  path, model, hf_dir = converted[arch]
  ours = load_file(os.path.join(hf_dir, "model.safetensors"))
  original = _state(model)
  tied = model.config.tie_word_embeddings
  assert set(ours) == set(original) - ({"lm_head.weight"} if tied else set())
  for name, w in ours.items():
    if arch == "gemma3" and name.endswith("norm.weight"):
      # Stored as w + 1 in float32, so (w + 1) - 1 is w up to the rounding of w + 1: half an ulp of 1.
      np.testing.assert_allclose(w, original[name], rtol=0, atol=2.0 ** -24, err_msg=name)
    else:
      np.testing.assert_array_equal(w, original[name], err_msg=name)
  # transformers' gguf loader (dequantise, its reverse permutation, minus one) reads the same tensors.
  ref = transformers.AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                          dtype=torch.float32)
  ref_state = _state(ref)
  for name, w in ours.items():
    np.testing.assert_array_equal(w, ref_state[name], err_msg=name)


def _padded_batch(vocab):
  T = 14
  tokens = np.array(jax.random.randint(jax.random.key(3), (3, T), 0, vocab), np.int32)
  mask = np.ones((3, T), bool)
  mask[1, :3] = False
  mask[2, :6] = False
  positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int32)
  return tokens, mask, positions


def _torch_logits(model, tokens, mask, positions):
  with torch.no_grad():
    return model(input_ids=torch.from_numpy(tokens).long(), attention_mask=torch.from_numpy(mask).long(),
                 position_ids=torch.from_numpy(positions).long()).logits.numpy()


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_directory_gives_the_written_models_logits(converted, arch):
  _, model, hf_dir = converted[arch]
  tokens, mask, positions = _padded_batch(model.config.vocab_size)
  ref = _torch_logits(model, tokens, mask, positions)
  assert np.std(ref[mask]) > 0.1  # logits vary: the comparison is not vacuous
  # transformers reads our config.json as the original's (Gemma 3: layer types, window, both RoPE bases).
  again = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32,
                                                            attn_implementation="eager").eval()
  np.testing.assert_allclose(_torch_logits(again, tokens, mask, positions)[mask], ref[mask], rtol=0, atol=TOL)
  params, cfg = load_hf(hf_dir)
  hidden, _ = jax.jit(forward, static_argnums=1)(params, cfg, jnp.asarray(tokens), jnp.asarray(positions),
                                                 jnp.asarray(mask))
  diff = np.abs(np.asarray(logits(params, cfg, hidden)) - ref)[mask]
  assert diff.max() <= TOL, f"{arch}: max abs logit diff {diff.max():.3g}"


@pytest.mark.slow
def test_llama3_rope_from_rope_freqs(tmp_path):
  """Llama 3.1's RoPE scaling reaches llama.cpp as the rope_freqs.weight tensor; the directory gets
  the rope_parameters back, and its logits are the original model's."""
  model = tiny_hf_model("llama3", len(bpe_vocab()[0]), seed=7)
  freqs = llama3_rope_freqs(10000.0, 16, 8.0, 1.0, 4.0, 8192)
  assert len(set(np.round(freqs, 4))) > 2  # 1, 8 and values between: all three bands
  tensors = {**gguf_tensors(model, "llama"), "rope_freqs.weight": freqs}
  hf_dir = gguf_to_hf(write_gguf(tmp_path / "l3.gguf", "llama", tensors, model.config), str(tmp_path / "l3"))
  rope = json.load(open(os.path.join(hf_dir, "config.json")))["rope_parameters"]
  assert rope == {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
  tokens, mask, positions = _padded_batch(model.config.vocab_size)
  params, cfg = load_hf(hf_dir)
  hidden, _ = forward(params, cfg, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask))
  diff = np.abs(np.asarray(logits(params, cfg, hidden)) - _torch_logits(model, tokens, mask, positions))[mask]
  assert diff.max() <= TOL
  other = {**tensors, "rope_freqs.weight": freqs ** 0.5}  # no rule gives these
  with pytest.raises(ConfigError, match=r"rope_freqs.weight does not follow Llama 3's RoPE rule \(factor=2\.82843, "):
    gguf_to_hf(write_gguf(tmp_path / "odd.gguf", "llama", other, model.config), str(tmp_path / "odd"))


def test_quantised_tensors_match_transformers(tmp_path):
  """A llama file with its matrices in six block types: every converted tensor equals transformers'
  reading (gguf.quants.dequantize + its reverse permutation), bit for bit."""
  model = tiny_hf_model("llama", len(bpe_vocab()[0]), seed=5)
  tensors = gguf_tensors(model, "llama")
  kinds = {"token_embd.weight": "Q8_0", "output.weight": "F16", "blk.0.attn_q.weight": "Q4_0",
           "blk.0.attn_k.weight": "Q4_1", "blk.0.attn_v.weight": "Q5_0", "blk.1.attn_q.weight": "Q5_1",
           "blk.1.attn_k.weight": "Q8_0", "blk.1.ffn_up.weight": "BF16"}
  path = write_gguf(tmp_path / "q.gguf", "llama", tensors, model.config, types=kinds)
  ours = load_file(os.path.join(gguf_to_hf(path, str(tmp_path / "q")), "model.safetensors"))
  ref = _state(transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="q.gguf",
                                                                 dtype=torch.float32))
  for name, w in ours.items():
    np.testing.assert_array_equal(w, ref[name], err_msg=name)
  q = ours["model.layers.0.self_attn.q_proj.weight"]
  original = model.state_dict()["model.layers.0.self_attn.q_proj.weight"].numpy()
  assert 0 < np.abs(q - original).max() < 0.1  # quantised (not the original), but close to it


@pytest.mark.parametrize("arch,pre", [("llama", "gpt2"), ("qwen2", "qwen2"), ("llama", "llama-bpe"),
                                      ("gemma3", None)])
def test_tokenizer_matches_transformers_gguf_tokenizer(tmp_path, arch, pre):
  kwargs = {"pre": pre} if pre else {}
  path, _ = model_gguf(tmp_path / "t.gguf", arch, **kwargs)
  hf_dir = gguf_to_hf(path, str(tmp_path / "t"))
  ours = load_tokenizer(hf_dir)
  ref = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="t.gguf")
  for text in TEXTS:
    ids = ours.encode(text)
    assert ids == ref(text, add_special_tokens=False).input_ids, text
    assert ours.encode(text, add_special_tokens=True) == ref(text).input_ids, text
    assert ours.decode(ids, skip_special_tokens=False) == ref.decode(ids, skip_special_tokens=False) == text
  assert (ours.eos_token, ours.bos_token) == ((ref.eos_token, ref.bos_token))
  assert ours.vocab_size == len(ref)
  if arch == "gemma3":  # BOS is added by the post-processor, <b> is a whole user-defined token
    assert ours.encode("a", add_special_tokens=True)[0] == 2 and len(ours.encode("<b>")) == 1


def test_tokenizer_files_and_chat_template(converted):
  _, _, hf_dir = converted["qwen2"]
  config = json.load(open(os.path.join(hf_dir, "tokenizer_config.json")))
  assert (config["eos_token"], config["bos_token"], config["pad_token"]) == ("<|im_end|>", "<|im_start|>",
                                                                            "<|endoftext|>")
  assert json.load(open(os.path.join(hf_dir, "generation_config.json")))["eos_token_id"] == 2
  assert open(os.path.join(hf_dir, "chat_template.jinja")).read() == CHATML
  check_hf_dir(hf_dir, chat_template=True)  # what a run checks first
  tok = load_tokenizer(hf_dir)
  text = tok.apply_chat_template([{"role": "user", "content": "the fox"}])
  assert text == "<|im_start|>user\nthe fox<|im_end|>\n<|im_start|>assistant\n"
  assert tok.encode(text)[0] == 1 and (tok.eos_id, tok.pad_id, tok.bos_id) == (2, 0, 1)
  source = json.load(open(os.path.join(hf_dir, SOURCE_FILE)))
  assert source["architecture"] == "qwen2" and source["size"] == os.path.getsize(converted["qwen2"][0])


def test_resolve_converts_once_into_the_cache(converted, tmp_path, monkeypatch):
  monkeypatch.setenv("JAXRL_LLM_MODELS", str(tmp_path / "cache"))
  path = converted["llama"][0]
  assert resolve_model_path("", field="f") == ""
  assert resolve_model_path(str(tmp_path), field="f") == str(tmp_path)  # a directory passes through
  first = resolve_model_path(path, field="config.model.hf_path", chat_template=True)
  assert first.startswith(str(tmp_path / "cache" / "hf" / "llama-"))
  stamp = os.stat(os.path.join(first, "model.safetensors")).st_mtime_ns
  assert resolve_model_path(path, field="config.model.hf_path") == first
  assert os.stat(os.path.join(first, "model.safetensors")).st_mtime_ns == stamp  # not converted again
  np.testing.assert_array_equal(load_file(os.path.join(first, "model.safetensors"))["lm_head.weight"],
                                _state(converted["llama"][1])["lm_head.weight"])
  with pytest.raises(ConfigError, match=r"config.model.hf_path='/nonexistent.gguf': no such GGUF file"):
    resolve_model_path("/nonexistent.gguf", field="config.model.hf_path")


def test_run_config_paths_accept_gguf(converted, tmp_path, monkeypatch):
  from jaxrl_llm.training.config import from_config_dict
  from jaxrl_llm.training.defaults import get_config

  monkeypatch.setenv("JAXRL_LLM_MODELS", str(tmp_path / "cache"))
  student, teacher = converted["qwen2"][0], converted["qwen3"][0]
  c = get_config("grpo")
  c.model.hf_path = student
  c.data.chat_template = True
  c.teacher.source = "checkpoint"
  c.teacher.route_by_tag = f"arithmetic={teacher}, countdown={student}"
  c.init_checkpoint = student
  cfg = from_config_dict(c)
  hf_dir = resolve_model_path(student, field="x")
  assert cfg.model.hf_path == hf_dir == cfg.init_checkpoint
  assert dict(cfg.teacher.routes) == {"arithmetic": resolve_model_path(teacher, field="x"), "countdown": hf_dir}
  check_hf_dir(cfg.model.hf_path, chat_template=cfg.data.chat_template)
  c.teacher.route_by_tag = ""
  c.teacher.checkpoint = teacher
  assert from_config_dict(c).teacher.checkpoint == resolve_model_path(teacher, field="x")
  # The student's template is needed with data.chat_template (Gemma's test file has none).
  c.model.hf_path = converted["gemma3"][0]
  c.data.chat_template = True
  with pytest.raises(ConfigError, match=r"^config.model.hf_path: .*gemma3.gguf: has no chat template .*"
                                        r"--config.data.chat_template=False"):
    from_config_dict(c)
  c.data.chat_template = False
  assert from_config_dict(c).model.hf_path.startswith(str(tmp_path / "cache" / "hf" / "gemma3-"))


def test_sharded_and_bfloat16_directories(converted, tmp_path):
  path, model, _ = converted["qwen3"]
  original = _state(model)
  sharded = gguf_to_hf(path, str(tmp_path / "sharded"), max_shard_bytes=200_000)
  index = json.load(open(os.path.join(sharded, "model.safetensors.index.json")))
  files = sorted(set(index["weight_map"].values()))
  assert len(files) > 2 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
  assert not os.path.exists(os.path.join(sharded, "model.safetensors"))
  params, cfg = load_hf(sharded)  # reads the index
  np.testing.assert_array_equal(np.asarray(params["embed_VD"]), original["model.embed_tokens.weight"])
  assert index["metadata"]["total_size"] == sum(v.nbytes for k, v in original.items() if k != "lm_head.weight")
  bf16 = gguf_to_hf(path, str(tmp_path / "bf16"), dtype="bfloat16")
  assert json.load(open(os.path.join(bf16, "config.json")))["dtype"] == "bfloat16"
  params, cfg = load_hf(bf16)
  assert cfg.param_dtype == "bfloat16"
  w = original["model.layers.1.mlp.down_proj.weight"]
  np.testing.assert_array_equal(np.asarray(params["layers"]["w_down_LFD"][1], np.float32),
                                w.T.astype(jnp.bfloat16).astype(np.float32))
