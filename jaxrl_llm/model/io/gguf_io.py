"""GGUF file -> Hugging Face checkpoint directory, and `.gguf` paths in a run's config.

`gguf_to_hf(gguf, out)` (the `python -m jaxrl_llm.convert gguf_to_hf`
subcommand) writes config.json, safetensors of the dequantised weights
(float32 by default, in Hugging Face's names and layout, llama.cpp's
changes undone: model/io/gguf_arch.py), the tokenizer files built from the
metadata (model/io/gguf_tokenizer.py), the chat template, and
gguf_source.json (which file, its size and sha256). Everything is checked
first, and the directory appears whole or not at all (it is written beside
its final name and renamed).

`resolve_model_path(path)` is how `config.model.hf_path`, the teacher's
checkpoint paths and `init_checkpoint` accept a `.gguf` file: the file is
converted once into the model cache (model/io/pretrained.py's `models_dir()`,
under hf/<file stem>-<key>, the key from the file's absolute path, size and
mtime and CONVERTER_VERSION) and the run reads that directory like any other
Hugging Face checkpoint. Other paths pass through unchanged.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import ml_dtypes
import numpy as np
from absl import logging
from safetensors.numpy import save_file

from jaxrl_llm.checks import ConfigError, check_choice
from jaxrl_llm.model.io.gguf_arch import gguf_hf_config, gguf_tensor_moves
from jaxrl_llm.model.io.gguf_reader import GGUFFile
from jaxrl_llm.model.io.gguf_tokenizer import gguf_tokenizer_files
from jaxrl_llm.model.io.pretrained import models_dir

# Part of the cache key of converted files: bump it whenever what gguf_to_hf writes changes.
CONVERTER_VERSION = 1
SOURCE_FILE = "gguf_source.json"
_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
_PROBE = [{"role": "user", "content": "What is 2+3?"}]  # what the prompt pipeline renders


def check_chat_template(hf_dir: str, source: str) -> None:
  """The directory's chat template renders a user turn (as the prompt pipeline does), or a ConfigError
  naming `source` (the file the template came from)."""
  import jinja2

  from jaxrl_llm.model.tokenizer import load_tokenizer

  def failed(e):
    return ConfigError(f"{source}: the chat template (tokenizer.chat_template) does not render a user message "
                       f"({type(e).__name__}: {e})")

  try:
    tok = load_tokenizer(hf_dir)  # compiles the template
  except jinja2.TemplateError as e:
    raise failed(e) from None
  if tok.chat_template is None:
    raise ConfigError(f"{source}: has no chat template (tokenizer.chat_template); run with "
                      "--config.data.chat_template=False to feed prompts as plain text")
  try:
    text = tok.apply_chat_template(_PROBE, add_generation_prompt=True)
  except Exception as e:  # jinja2's TemplateError, UndefinedError, or the template's own TypeError...
    raise failed(e) from None
  if not isinstance(text, str) or _PROBE[0]["content"] not in text:
    raise ConfigError(f"{source}: the chat template (tokenizer.chat_template) renders {text!r} for a user message "
                      f"{_PROBE[0]['content']!r}; expected text containing it")


def _file_sha256(path: str) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    while block := f.read(1 << 20):
      digest.update(block)
  return digest.hexdigest()


def _write_tensors(gg: GGUFFile, moves, out: str, dtype, max_shard_bytes: int) -> None:
  """Dequantise one tensor at a time into shards of at most max_shard_bytes (one file when it fits)."""
  shards, current, current_bytes = [], {}, 0

  def flush():
    nonlocal current, current_bytes
    if current:
      name = f"shard-{len(shards):05d}.safetensors"
      save_file(current, os.path.join(out, name), metadata={"format": "pt"})
      shards.append((name, list(current)))
    current, current_bytes = {}, 0

  for m in moves:
    w = gg.tensor(m.gguf_name)
    if m.undo is not None:
      w = m.undo(w)
    w = np.ascontiguousarray(w.astype(dtype, copy=False))
    if current and current_bytes + w.nbytes > max_shard_bytes:
      flush()
    current[m.hf_name] = w
    current_bytes += w.nbytes
  flush()
  if len(shards) == 1:
    os.replace(os.path.join(out, shards[0][0]), os.path.join(out, "model.safetensors"))
    return
  weight_map = {}
  for i, (name, tensors) in enumerate(shards):
    final = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
    os.replace(os.path.join(out, name), os.path.join(out, final))
    weight_map.update({t: final for t in tensors})
  total = sum(int(np.prod(m.shape)) for m in moves) * np.dtype(dtype).itemsize
  with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def gguf_to_hf(gguf_file: str | GGUFFile, out: str, *, dtype: str = "float32", chat_template: bool = True,
               max_shard_bytes: int = 2 * 1024**3) -> str:
  """Write the model of `gguf_file` (a path, or a GGUFFile already open: reading the header of a large
  vocabulary takes seconds) as a Hugging Face directory `out` (new or empty); returns out.

  dtype: the tensors' dtype on disk (float32 holds every dequantised value exactly).
  chat_template: also check that the file's chat template, when it has one, renders a user message.
  """
  check_choice("--dtype", dtype, tuple(_DTYPES))
  gg = gguf_file if isinstance(gguf_file, GGUFFile) else GGUFFile(gguf_file)
  gguf_path = gg.path
  hf = gguf_hf_config(gg)
  hf["dtype"] = dtype
  moves = gguf_tensor_moves(gg, hf)
  files = gguf_tokenizer_files(gg, hf["vocab_size"], max_length=hf["max_position_embeddings"])
  out = os.path.abspath(out)
  if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
    raise ConfigError(f"--out={out!r} exists and is not an empty directory")
  os.makedirs(os.path.dirname(out), exist_ok=True)
  tmp = os.path.join(os.path.dirname(out), f".{os.path.basename(out)}.partial-{os.getpid()}")
  shutil.rmtree(tmp, ignore_errors=True)
  os.makedirs(tmp)
  try:
    for name, content in {**files, "config.json": json.dumps(hf, indent=2)}.items():
      with open(os.path.join(tmp, name), "w") as f:
        f.write(content)
    if chat_template and "chat_template.jinja" in files:
      check_chat_template(tmp, gguf_path)
    _write_tensors(gg, moves, tmp, _DTYPES[dtype], max_shard_bytes)
    source = {"gguf": os.path.abspath(gguf_path), "size": os.path.getsize(gguf_path),
              "sha256": _file_sha256(gguf_path), "architecture": gg.architecture,
              "converter_version": CONVERTER_VERSION}
    with open(os.path.join(tmp, SOURCE_FILE), "w") as f:
      json.dump(source, f, indent=2)
    if os.path.isdir(out):
      os.rmdir(out)  # empty, checked above
    os.replace(tmp, out)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  return out


def resolve_model_path(path: str, *, field: str, chat_template: bool = False) -> str:
  """`path` itself, or for a `.gguf` file the Hugging Face directory converted from it (cached).

  field: the config field naming `path`, for errors. chat_template: the run renders prompts with the
  model's chat template, so the file must have one that renders.
  """
  if not path or not path.endswith(".gguf"):
    return path
  if not os.path.isfile(path):
    raise ConfigError(f"{field}={path!r}: no such GGUF file")
  st = os.stat(path)
  key = hashlib.sha256(f"{os.path.realpath(path)}|{st.st_size}|{st.st_mtime_ns}|{CONVERTER_VERSION}"
                       .encode()).hexdigest()[:16]
  stem = os.path.basename(path)[:-len(".gguf")]
  out = os.path.join(models_dir(), "hf", f"{stem}-{key}")
  complete = lambda: os.path.isfile(os.path.join(out, SOURCE_FILE))  # written last  # noqa: E731
  if not complete():
    logging.info("converting %s -> %s", path, out)
    try:
      gguf_to_hf(path, out, chat_template=False)
    except (ConfigError, OSError) as e:
      if not complete():  # else another process finished the same conversion first
        if isinstance(e, ConfigError):
          raise ConfigError(f"{field}: {e}") from None
        raise
  if chat_template:
    try:
      check_chat_template(out, path)
    except ConfigError as e:
      raise ConfigError(f"{field}: {e}") from None
  return out
