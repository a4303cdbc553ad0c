"""python -m jaxrl_llm.convert: HF -> Orbax -> HF is bit-exact, the Orbax side
is a trainer checkpoint, and tokenizer files follow."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file

from jaxrl_llm import convert
from jaxrl_llm.checkpointing.init_params import params_from_checkpoint as init_from_checkpoint
from jaxrl_llm.model import init_params
from jaxrl_llm.model.io.hf_io import load_hf


def _tiny_qwen2(path, dtype):
  torch.manual_seed(0)
  cfg = transformers.Qwen2Config(vocab_size=80, hidden_size=32, intermediate_size=48,
                                 num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, eos_token_id=7, bos_token_id=5)
  model = transformers.AutoModelForCausalLM.from_config(cfg).to(dtype)
  with torch.no_grad():
    for p in model.parameters():
      p.copy_(0.1 * torch.randn_like(p))
  model.save_pretrained(path)
  (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<e>"}))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_hf_to_orbax_to_hf_is_bit_exact(tmp_path, dtype):
  hf = tmp_path / "hf"
  _tiny_qwen2(hf, dtype)
  work = tmp_path / "work"
  assert convert.main(["hf_to_orbax", "--hf_dir", str(hf), "--out", str(work)]) == 0
  assert os.path.isdir(work / "checkpoints" / "0")
  out = tmp_path / "back"
  assert convert.main(["orbax_to_hf", "--checkpoint", str(work), "--out", str(out)]) == 0
  src, dst = load_file(hf / "model.safetensors"), load_file(out / "model.safetensors")
  assert src.keys() == dst.keys()
  for name in src:
    assert src[name].dtype == dst[name].dtype and src[name].tobytes() == dst[name].tobytes(), name
  # The source's config fields (token ids) and tokenizer files came along.
  config = json.loads((out / "config.json").read_text())
  assert (config["eos_token_id"], config["bos_token_id"]) == (7, 5)
  assert (out / "tokenizer_config.json").exists()
  transformers.AutoModelForCausalLM.from_pretrained(out)  # loads without complaint


def test_orbax_side_is_a_trainer_init_checkpoint(tmp_path):
  hf = tmp_path / "hf"
  _tiny_qwen2(hf, torch.float32)
  convert.hf_to_orbax(str(hf), str(tmp_path / "work"))
  want, cfg = load_hf(str(hf))
  target = jax.eval_shape(lambda k: init_params(cfg, k), jax.random.key(0))
  target = jax.tree.map(lambda s: jax.numpy.zeros(s.shape, s.dtype), target)
  params, _ = init_from_checkpoint(str(tmp_path / "work"), target, cfg)
  jax.tree.map(np.testing.assert_array_equal, params, want)


@pytest.mark.slow
def test_cli_errors(tmp_path):
  with pytest.raises(SystemExit):
    convert.main(["orbax_to_hf", "--out", str(tmp_path)])  # --checkpoint missing
  proc = subprocess.run([sys.executable, "-m", "jaxrl_llm.convert", "--help"],
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0 and "hf_to_orbax" in proc.stdout


@pytest.mark.slow
def test_the_character_model_exports_with_its_tokenizer(tmp_path):
  """orbax_to_hf of the built-in character model: transformers loads the folder, tokenizes like
  CharTokenizer and greedy-generates what our sampler generates, without reading this package."""
  from run_helpers import load_config, make_trainer, shrink
  from jaxrl_llm.model.tokenizer import CharTokenizer
  from jaxrl_llm.sampling.config import SamplingConfig
  from jaxrl_llm.sampling.engine import sample_batch
  from jaxrl_llm.tasks.base import Example
  from jaxrl_llm.tasks.pipeline import encode_prompts
  from jaxrl_llm.training.config import from_config_dict

  tr = make_trainer(from_config_dict(shrink(load_config("grpo"), **{"train.steps": 1})), tmp_path / "run",
                    lambda s: None)
  tr.run()
  out = convert.orbax_to_hf(str(tmp_path / "run"), str(tmp_path / "hf"))
  tok = transformers.AutoTokenizer.from_pretrained(out)
  char = CharTokenizer()
  for text in ("12+3=", "a b\nC!", "99*9="):
    assert tok(text)["input_ids"] == char.encode(text)
  assert (tok.eos_token_id, tok.pad_token_id, tok.bos_token_id) == (char.eos_id, char.pad_id, char.bos_id)
  model = transformers.AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32)
  prompt = [char.bos_id] + char.encode("12+3=")
  got = model.generate(torch.tensor([prompt]), max_new_tokens=5, do_sample=False)[0, len(prompt):].tolist()
  pb = encode_prompts(char, [Example(prompt="12+3=", answer="")], len(prompt))
  scfg = SamplingConfig(temperature=0.0, max_new_tokens=5, eos_ids=(char.eos_id,), pad_id=char.pad_id)
  ours = sample_batch(tr.final_state.params, tr.model_cfg, pb, scfg, jax.random.key(0), char)
  n = int(ours.length_B[0])
  assert got[:n] == ours.tokens_BR[0, :n].tolist()  # transformers stops at our eos too
