"""Load and save Hugging Face checkpoint directories (config.json +
safetensors, single file or sharded with model.safetensors.index.json).

Loading checks the whole directory first (architecture, every tensor's
presence and shape, no unexpected tensors) by reading only the safetensors
headers, and fails with the tensor or field named before any data is read or
any compute runs. Then each of our stacked tensors is assembled on the host
one at a time and placed straight into its sharding (when a mesh is given),
so peak host memory is about one stacked tensor.

Layout conversions are transposes and reshapes only, so HF -> ours -> HF is
bit-exact whenever param_dtype equals the checkpoint dtype (the default) or is
wider (bf16 -> f32 -> bf16 is exact too).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from typing import Callable

import jax
import ml_dtypes
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from jaxrl_llm.checks import ConfigError
from jaxrl_llm.model import lora
from jaxrl_llm.model import params as params_lib
from jaxrl_llm.model.config import ModelConfig
from jaxrl_llm.model.io.hf_config import config_from_hf, config_to_hf

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja", "chat_template.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "added_tokens.json", "generation_config.json")
_NP_DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


@dataclasses.dataclass(frozen=True)
class _Entry:
  """One HF tensor <-> one slice of our tensor (layer i of a stacked one)."""
  hf_name: str
  ours: tuple[str, ...]  # path in the params tree
  layer: int | None  # index into the stacked L axis, None for global tensors
  hf_shape: tuple[int, ...]
  to_ours: Callable[[np.ndarray], np.ndarray]
  to_hf: Callable[[np.ndarray], np.ndarray]


def name_table(cfg: ModelConfig) -> list[_Entry]:
  """Every HF tensor of `cfg`'s architecture and where it lives in our params."""
  D, N, K, H, F, V = (cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff,
                      cfg.vocab_size)
  ident = (lambda a: a, lambda a: a)
  transpose = (lambda w: w.T, lambda a: a.T)
  entries = [
      _Entry("model.embed_tokens.weight", ("embed_VD",), None, (V, D), *ident),
      _Entry("model.norm.weight", ("final_norm_D",), None, (D,), *ident),
  ]
  if not cfg.tie_embeddings:
    entries.append(_Entry("lm_head.weight", ("lm_head_DV",), None, (V, D), *transpose))
  for i in range(cfg.n_layers):
    pre = f"model.layers.{i}."

    def add(name, ours, hf_shape, to_ours, to_hf):
      entries.append(_Entry(pre + name, ("layers", ours), i, hf_shape, to_ours, to_hf))

    add("input_layernorm.weight", "attn_norm_LD", (D,), *ident)
    if cfg.sandwich_norm:
      # Gemma: post_attention_layernorm normalises the attention output;
      # pre_feedforward_layernorm is the norm before the MLP.
      add("post_attention_layernorm.weight", "attn_post_norm_LD", (D,), *ident)
      add("pre_feedforward_layernorm.weight", "mlp_norm_LD", (D,), *ident)
      add("post_feedforward_layernorm.weight", "mlp_post_norm_LD", (D,), *ident)
    else:
      # Llama / Qwen: post_attention_layernorm is the norm before the MLP.
      add("post_attention_layernorm.weight", "mlp_norm_LD", (D,), *ident)
    add("self_attn.q_proj.weight", "wq_LDNH", (N * H, D),
        lambda w: w.T.reshape(D, N, H), lambda a: a.reshape(D, N * H).T)
    add("self_attn.k_proj.weight", "wk_LDKH", (K * H, D),
        lambda w: w.T.reshape(D, K, H), lambda a: a.reshape(D, K * H).T)
    add("self_attn.v_proj.weight", "wv_LDKH", (K * H, D),
        lambda w: w.T.reshape(D, K, H), lambda a: a.reshape(D, K * H).T)
    add("self_attn.o_proj.weight", "wo_LNHD", (D, N * H),
        lambda w: w.T.reshape(N, H, D), lambda a: a.reshape(N * H, D).T)
    if cfg.qkv_bias:
      add("self_attn.q_proj.bias", "bq_LNH", (N * H,),
          lambda b: b.reshape(N, H), lambda a: a.reshape(N * H))
      add("self_attn.k_proj.bias", "bk_LKH", (K * H,),
          lambda b: b.reshape(K, H), lambda a: a.reshape(K * H))
      add("self_attn.v_proj.bias", "bv_LKH", (K * H,),
          lambda b: b.reshape(K, H), lambda a: a.reshape(K * H))
    if cfg.qk_norm:
      add("self_attn.q_norm.weight", "q_norm_LH", (H,), *ident)
      add("self_attn.k_norm.weight", "k_norm_LH", (H,), *ident)
    add("mlp.gate_proj.weight", "w_gate_LDF", (F, D), *transpose)
    add("mlp.up_proj.weight", "w_up_LDF", (F, D), *transpose)
    add("mlp.down_proj.weight", "w_down_LFD", (D, F), *transpose)
  return entries


# -- reading ------------------------------------------------------------------


def read_hf_config(path: str) -> dict:
  cfg_path = os.path.join(path, "config.json")
  if not os.path.isfile(cfg_path):
    raise FileNotFoundError(f"{path}: no config.json")
  with open(cfg_path) as f:
    return json.load(f)


def _open(fname: str):
  """safe_open, with an error that names the file when it cannot be read (truncated, not safetensors)."""
  try:
    return safe_open(fname, framework="numpy")
  except Exception as e:  # safetensors raises its own SafetensorError
    raise ConfigError(f"{fname}: cannot read this safetensors file ({e}); is it truncated or "
                      "not a safetensors file?") from None


def _weight_files(path: str) -> dict[str, str]:
  """tensor name -> safetensors file, from the index or the single file."""
  index = os.path.join(path, "model.safetensors.index.json")
  if os.path.isfile(index):
    with open(index) as f:
      weight_map = json.load(f)["weight_map"]
    return {name: os.path.join(path, fname) for name, fname in weight_map.items()}
  single = os.path.join(path, "model.safetensors")
  if not os.path.isfile(single):
    raise FileNotFoundError(
        f"{path}: neither model.safetensors nor model.safetensors.index.json exists")
  with _open(single) as f:
    return {name: single for name in f.keys()}


# Tensors some checkpoints carry that hold no learned state of ours.
_IGNORABLE_SUFFIXES = ("rotary_emb.inv_freq",)


def _validate(cfg: ModelConfig, files: dict[str, str], table: list[_Entry]) -> None:
  shapes = {}
  for fname in sorted(set(files.values())):
    with _open(fname) as f:
      for name in f.keys():
        shapes[name] = tuple(f.get_slice(name).get_shape())
  for name in files:
    if name not in shapes:
      raise ValueError(f"checkpoint: index lists tensor {name!r} but its file lacks it")
  for entry in table:
    if entry.hf_name not in shapes:
      raise ValueError(f"checkpoint: missing tensor {entry.hf_name!r} "
                       f"(expected shape {entry.hf_shape})")
    if shapes[entry.hf_name] != entry.hf_shape:
      raise ValueError(f"checkpoint: tensor {entry.hf_name!r} has shape "
                       f"{shapes[entry.hf_name]}, expected {entry.hf_shape}")
  known = {e.hf_name for e in table}
  if cfg.tie_embeddings:
    known.add("lm_head.weight")  # some tied checkpoints store the copy too
  extra = sorted(n for n in shapes if n not in known and not n.endswith(_IGNORABLE_SUFFIXES))
  if extra:
    raise ValueError(f"checkpoint: unexpected tensors for {cfg.family}: {extra[:8]}"
                     + (f" (+{len(extra) - 8} more)" if len(extra) > 8 else ""))


def load_hf(path: str, *, shardings=None, **config_overrides) -> tuple[dict, ModelConfig]:
  """(params, cfg) from a local HF checkpoint directory.

  shardings: None (default device) or a callable cfg -> tree of Shardings
  matching the params (e.g. `functools.partial(sharding.param_shardings,
  mesh=mesh)`); each tensor is then built shard by shard with
  `jax.make_array_from_callback`, so every process only places its own shards.
  config_overrides: ModelConfig fields to set (param_dtype, remat, ...).
  """
  cfg = config_from_hf(read_hf_config(path), **config_overrides)
  files = _weight_files(path)
  table = name_table(cfg)
  _validate(cfg, files, table)
  target = shardings(cfg) if shardings is not None else None
  np_dtype = _NP_DTYPES[cfg.param_dtype]
  by_param: dict[tuple[str, ...], list[_Entry]] = {}
  for entry in table:
    by_param.setdefault(entry.ours, []).append(entry)
  handles = {}
  out: dict = {}
  try:
    for fname in sorted(set(files.values())):
      handles[fname] = _open(fname)
    for ours, entries in by_param.items():
      parts = [e.to_ours(handles[files[e.hf_name]].get_tensor(e.hf_name)) for e in entries]
      host = np.stack(parts) if entries[0].layer is not None else parts[0]
      host = np.ascontiguousarray(host.astype(np_dtype, copy=False))
      if target is None:
        value = jax.device_put(host)
      else:
        sharding = _get(target, ours)
        value = jax.make_array_from_callback(host.shape, sharding, lambda idx, h=host: h[idx])
      _set(out, ours, value)
  finally:
    for h in handles.values():
      h.__exit__(None, None, None)
  return out, cfg


def _get(tree: dict, path: tuple[str, ...]):
  for key in path:
    tree = tree[key]
  return tree


def _set(tree: dict, path: tuple[str, ...], value) -> None:
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


# -- writing ------------------------------------------------------------------


def _to_host(x) -> np.ndarray:
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    from jax.experimental import multihost_utils
    x = multihost_utils.process_allgather(x, tiled=True)
  return np.asarray(jax.device_get(x))


def save_hf(params: dict, cfg: ModelConfig, out_dir: str, *, dtype: str | None = None,
            base_config: dict | None = None, tokenizer_dir: str | None = None,
            max_shard_bytes: int = 4 * 1024**3) -> None:
  """Write `out_dir` as a HF checkpoint: config.json, safetensors (sharded with
  an index above max_shard_bytes), and tokenizer files copied from
  tokenizer_dir. dtype: tensor dtype on disk (default cfg.param_dtype).
  In a multi-process run every process gathers; only process 0 writes.
  A LoRA model (cfg.lora) is written merged: W + s A B (model/lora.py).
  """
  params, cfg = lora.merged(params, cfg)
  params_lib.check_params(params, cfg)
  dtype = dtype or cfg.param_dtype
  if dtype not in _NP_DTYPES:
    raise ValueError(f"save_hf: dtype must be one of {sorted(_NP_DTYPES)}, got {dtype!r}")
  hf_config = config_to_hf(cfg, base_config, dtype)
  np_dtype = _NP_DTYPES[dtype]
  tensors: dict[str, np.ndarray] = {}
  host_cache: dict[tuple[str, ...], np.ndarray] = {}
  for entry in name_table(cfg):
    if entry.ours not in host_cache:
      host_cache[entry.ours] = _to_host(_get(params, entry.ours))
    host = host_cache[entry.ours]
    part = host[entry.layer] if entry.layer is not None else host
    tensors[entry.hf_name] = np.ascontiguousarray(entry.to_hf(part).astype(np_dtype, copy=False))
  if jax.process_index() != 0:
    return
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, "config.json"), "w") as f:
    json.dump(hf_config, f, indent=2, sort_keys=True)
  shards: list[dict[str, np.ndarray]] = [{}]
  size = 0
  for name, arr in tensors.items():
    if shards[-1] and size + arr.nbytes > max_shard_bytes:
      shards.append({})
      size = 0
    shards[-1][name] = arr
    size += arr.nbytes
  if len(shards) == 1:
    save_file(shards[0], os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
  else:
    weight_map = {}
    for i, shard in enumerate(shards):
      fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
      save_file(shard, os.path.join(out_dir, fname), metadata={"format": "pt"})
      weight_map.update({name: fname for name in shard})
    total = sum(a.nbytes for a in tensors.values())
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
      json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
  if tokenizer_dir is not None:
    copy_tokenizer_files(tokenizer_dir, out_dir)


def copy_tokenizer_files(src_dir: str, out_dir: str) -> list[str]:
  """Copy the tokenizer files present in src_dir; returns their names."""
  copied = []
  for name in TOKENIZER_FILES:
    src = os.path.join(src_dir, name)
    if os.path.isfile(src):
      shutil.copyfile(src, os.path.join(out_dir, name))
      copied.append(name)
  return copied
