"""Bad GGUF input: each a one-line ConfigError naming the file and what was expected, before anything
is written (small synthetic files, gguf_fixtures.py)."""

import os
import subprocess
import sys

import gguf
import numpy as np
import pytest

from jaxrl_llm.checks import ConfigError
from jaxrl_llm.model.io.gguf_io import gguf_to_hf

from gguf_fixtures import gguf_tensors, random_blocks, tiny_hf_model, bpe_vocab, write_gguf


# The module-scoped fixtures run once: the module's tests go to one pytest-xdist worker.
pytestmark = pytest.mark.xdist_group("model.test_gguf_errors")


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
  """(tensors, config) of a tiny llama model and a good file of it."""
  model = tiny_hf_model("llama", len(bpe_vocab()[0]))
  tensors = gguf_tensors(model, "llama")
  good = write_gguf(tmp_path_factory.mktemp("good") / "good.gguf", "llama", tensors, model.config)
  return tensors, model.config, good


def _fails(path, out, pattern, **kwargs):
  with pytest.raises(ConfigError, match=pattern) as info:
    gguf_to_hf(str(path), str(out), **kwargs)
  message = str(info.value)
  assert "\n" not in message and str(path) in message, message
  assert not os.path.exists(out), "nothing is written for a bad file"
  return message


def test_not_gguf_and_truncated_files(llama, tmp_path):
  *_, good = llama
  (tmp_path / "text.gguf").write_bytes(b"not a model at all")
  _fails(tmp_path / "text.gguf", tmp_path / "o", r"not a GGUF file \(starts with b'not ', expected b'GGUF'\)")
  data = open(good, "rb").read()
  for cut in (len(data) - 1000, 300):  # in the last tensor's bytes; inside the metadata
    (tmp_path / "cut.gguf").write_bytes(data[:cut])
    message = _fails(tmp_path / "cut.gguf", tmp_path / "o", rf"truncated: reading it needs (\d+) bytes, the file "
                                                            rf"has {cut}$")
    assert cut < int(message.split("needs ")[1].split(" ")[0]) <= len(data)
  (tmp_path / "zeros.gguf").write_bytes(b"GGUF" + bytes(4) + bytes(16))  # version 0
  _fails(tmp_path / "zeros.gguf", tmp_path / "o", r"cannot read the GGUF header \(ValueError: .*version 0.*\); "
                                                  r"is the file truncated \(24 bytes\) or damaged\?")


def test_unsupported_architecture(llama, tmp_path):
  tensors, cfg, _ = llama
  path = write_gguf(tmp_path / "mamba.gguf", "mamba", tensors, cfg)
  _fails(path, tmp_path / "o", r"general.architecture='mamba' is not supported \(supported: llama, qwen2, qwen3, "
                               r"gemma3\)")


def test_unsupported_quantisation_type(llama, tmp_path):
  tensors, cfg, _ = llama
  tensors = dict(tensors)
  tensors.pop("blk.0.ffn_up.weight")  # [96, 64]: stored as Q2_K below, 64 weights is not a 256-block
  raw = {"blk.0.ffn_up.weight": (random_blocks("Q8_0", 96 * 2, seed=0).reshape(96, 68), "Q8_0")}
  ok = write_gguf(tmp_path / "ok.gguf", "llama", tensors, cfg, raw=raw)
  gguf_to_hf(ok, str(tmp_path / "ok"))  # the same file with a supported type converts
  q2k = np.zeros((96, 84), np.uint8)  # one Q2_K block (256 weights, 84 bytes) per row
  path = write_gguf(tmp_path / "q2k.gguf", "llama", tensors, cfg, raw={"blk.0.ffn_up.weight": (q2k, "Q2_K")})
  _fails(path, tmp_path / "o", r"tensor 'blk.0.ffn_up.weight' is stored as Q2_K \(1 tensors of unsupported types\); "
                               r"supported types: F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, BF16")


def test_tokenizer_that_does_not_match_the_checkpoint(llama, tmp_path):
  tensors, cfg, _ = llama
  tokens, types, _ = bpe_vocab()
  path = write_gguf(tmp_path / "short.gguf", "llama", tensors, cfg,
                    meta={"tokenizer.ggml.tokens": tokens[:-4], "tokenizer.ggml.token_type": types[:-4]})
  _fails(path, tmp_path / "o", rf"the tokenizer lists {len(tokens) - 4} tokens \(tokenizer.ggml.tokens\) but the "
                               rf"model's embedding has {len(tokens)} rows: expected one token per row")
  path = write_gguf(tmp_path / "eos.gguf", "llama", tensors, cfg, meta={"tokenizer.ggml.eos_token_id": 5000})
  _fails(path, tmp_path / "o", rf"tokenizer.ggml.eos_token_id=5000 is not a token id \(the vocabulary has "
                               rf"{len(tokens)} tokens\)")
  dup = list(tokens)
  dup[-1] = dup[-2]  # two ids with one spelling: the tokenizer would have one id fewer than the model rows
  path = write_gguf(tmp_path / "dup.gguf", "llama", tensors, cfg, meta={"tokenizer.ggml.tokens": dup})
  _fails(path, tmp_path / "o", rf"tokenizer.ggml.tokens holds a token twice \({len(tokens) - 1} distinct of "
                               rf"{len(tokens)}\); expected one id per token")
  path = write_gguf(tmp_path / "merge.gguf", "llama", tensors, cfg, meta={"tokenizer.ggml.merges": ["Ġ t", "x yz"]})
  _fails(path, tmp_path / "o", r"tokenizer.ggml.merges do not fit tokenizer.ggml.tokens \(.*yz")
  path = write_gguf(tmp_path / "pre.gguf", "llama", tensors, cfg, pre="klingon")
  _fails(path, tmp_path / "o", r"tokenizer.ggml.pre='klingon' is not supported \(supported: deepseek-r1-qwen, default, gpt2, ")
  path = write_gguf(tmp_path / "bert.gguf", "llama", tensors, cfg, meta={"tokenizer.ggml.model": "bert"})
  _fails(path, tmp_path / "o", r"tokenizer.ggml.model='bert' is not supported")


@pytest.mark.parametrize("template,pattern", [
    ("{% if messages %}{{ messages[0]['content'] ", r"does not render a user message \(TemplateSyntaxError: "),
    ("{{ raise_exception('no user turns here') }}", r"does not render a user message \(TemplateError: no user turns"),
    ("{% for m in messages %}{{ m['role'] }}{% endfor %}", r"renders 'user' for a user message 'What is 2\+3\?'; "
                                                          r"expected text containing it"),
])
def test_chat_template_that_fails_to_render(llama, tmp_path, template, pattern):
  tensors, cfg, _ = llama
  path = write_gguf(tmp_path / "t.gguf", "llama", tensors, cfg, chat_template=template)
  _fails(path, tmp_path / "o", r"the chat template \(tokenizer.chat_template\) " + pattern)
  gguf_to_hf(path, str(tmp_path / "unchecked"), chat_template=False)  # written as it is when asked


def test_missing_extra_and_misshapen_tensors(llama, tmp_path):
  tensors, cfg, _ = llama
  less = {k: v for k, v in tensors.items() if k != "blk.1.attn_v.weight"}
  path = write_gguf(tmp_path / "less.gguf", "llama", less, cfg)
  _fails(path, tmp_path / "o", r"tensor 'blk.1.attn_v.weight' is missing \(expected shape \[32, 64\] for "
                               r"architecture llama\)")
  more = {**tensors, "blk.0.ffn_gate_inp.weight": np.zeros((4, 64), np.float32)}
  path = write_gguf(tmp_path / "more.gguf", "llama", more, cfg)
  _fails(path, tmp_path / "o", r"unexpected tensors for architecture llama: \['blk.0.ffn_gate_inp.weight'\]")
  wrong = {**tensors, "blk.0.ffn_down.weight": np.zeros((64, 95), np.float32)}
  path = write_gguf(tmp_path / "wrong.gguf", "llama", wrong, cfg)
  _fails(path, tmp_path / "o", r"tensor 'blk.0.ffn_down.weight' has shape \[64, 95\], expected \[64, 96\] from "
                               r"the metadata")
  path = write_gguf(tmp_path / "meta.gguf", "llama", tensors, cfg, meta={"llama.block_count": None})
  _fails(path, tmp_path / "o", r"metadata 'llama.block_count' is missing")
  path = write_gguf(tmp_path / "rope.gguf", "llama", tensors, cfg, meta={"llama.rope.scaling.type": "yarn"})
  _fails(path, tmp_path / "o", r"llama.rope.scaling.type='yarn' is not supported \(allowed: none, linear, and "
                               r"Llama 3's rope_freqs\)")


def test_output_directory_must_be_new_or_empty(llama, tmp_path):
  *_, good = llama
  (tmp_path / "full").mkdir()
  (tmp_path / "full" / "x").write_text("keep")
  with pytest.raises(ConfigError, match=r"exists and is not an empty directory"):
    gguf_to_hf(good, str(tmp_path / "full"))
  assert (tmp_path / "full" / "x").read_text() == "keep"


@pytest.mark.slow
def test_convert_cli_reports_one_line(llama, tmp_path):
  *_, good = llama
  out = tmp_path / "cli"
  run = lambda *args: subprocess.run([sys.executable, "-m", "jaxrl_llm.convert", *args], capture_output=True,
                                     text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  done = run("gguf_to_hf", f"--gguf={good}", f"--out={out}")
  assert done.returncode == 0, done.stderr
  assert os.path.isfile(out / "model.safetensors") and str(out) in done.stdout
  (tmp_path / "bad.gguf").write_bytes(b"GGUF" + b"\3\0\0\0" + b"\0" * 10)
  done = run("gguf_to_hf", f"--gguf={tmp_path / 'bad.gguf'}", f"--out={tmp_path / 'o'}")
  assert done.returncode == 2
  assert done.stderr.splitlines()[0] == f"error: {tmp_path / 'bad.gguf'}: truncated: reading it needs 24 bytes, " \
                                        "the file has 18"
  assert "Traceback" not in done.stderr
