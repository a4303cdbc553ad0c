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
from jaxrl_llm.checkpointing.init import params_from_checkpoint as init_from_checkpoint
from jaxrl_llm.model import init_params
from jaxrl_llm.model.hf_io import load_hf


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


def test_cli_errors(tmp_path):
  with pytest.raises(SystemExit):
    convert.main(["orbax_to_hf", "--out", str(tmp_path)])  # --checkpoint missing
  proc = subprocess.run([sys.executable, "-m", "jaxrl_llm.convert", "--help"],
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0 and "hf_to_orbax" in proc.stdout
