"""Hugging Face config.json <-> ModelConfig, for Llama 3, Qwen2/2.5 and Qwen3.

Both the transformers-5 spelling (`rope_parameters`) and the older one
(`rope_theta` + `rope_scaling`) are read; both are written, so the saved
directory loads in old and new readers alike. Anything our decoder does not
implement (other activations, sliding windows, output-projection biases,
other RoPE types) is refused with the offending field named.
"""

from __future__ import annotations

from jaxrl_llm.model.config import ModelConfig, RopeScaling

ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
_MODEL_TYPES = {family: arch for arch, family in ARCHITECTURES.items()}
_HF_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def _field(hf: dict, name: str):
  if name not in hf:
    raise ValueError(f"config.json: required field {name!r} is missing")
  return hf[name]


def _rope_from_hf(hf: dict) -> tuple[float, RopeScaling | None]:
  rope = hf.get("rope_parameters")
  if rope is None:
    rope = dict(hf.get("rope_scaling") or {})
    rope.setdefault("rope_theta", hf.get("rope_theta", 10000.0))
  if not isinstance(rope, dict):
    raise ValueError(f"config.json: rope_parameters must be an object, got {rope!r}")
  theta = float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))
  kind = rope.get("rope_type", rope.get("type", "default"))
  if kind == "default":
    return theta, None
  if kind == "linear":
    return theta, RopeScaling("linear", float(_field(rope, "factor")))
  if kind == "llama3":
    return theta, RopeScaling(
        "llama3", float(_field(rope, "factor")), float(_field(rope, "low_freq_factor")),
        float(_field(rope, "high_freq_factor")),
        int(_field(rope, "original_max_position_embeddings")))
  raise ValueError(
      f"config.json: rope type {kind!r} is not supported (allowed: default, linear, llama3)")


def config_from_hf(hf: dict, **overrides) -> ModelConfig:
  """A ModelConfig from a parsed config.json; `overrides` set e.g. dtypes/remat.

  param_dtype defaults to the checkpoint's dtype (so HF -> ours -> HF is
  bit-exact without casts); compute_dtype defaults to param_dtype.
  """
  archs = hf.get("architectures") or []
  model_type = hf.get("model_type")
  family = None
  for arch in archs:
    family = ARCHITECTURES.get(arch, family)
  if family is None and model_type in _MODEL_TYPES:
    family = model_type
  if family is None:
    raise ValueError(
        f"config.json: unsupported architecture (architectures={archs!r}, "
        f"model_type={model_type!r}); supported: {sorted(ARCHITECTURES)}")
  act = hf.get("hidden_act", "silu")
  if act != "silu":
    raise ValueError(f"config.json: hidden_act={act!r} is not supported (only 'silu')")
  if hf.get("mlp_bias", False):
    raise ValueError("config.json: mlp_bias=true is not supported")
  if family in ("llama", "qwen3") and hf.get("attention_bias", False):
    raise ValueError(
        f"config.json: attention_bias=true is not supported for {family} (it adds an "
        "output-projection bias this decoder does not have)")
  if hf.get("use_sliding_window", False):
    raise ValueError("config.json: use_sliding_window=true is not supported")
  layer_types = hf.get("layer_types") or []
  if any(t != "full_attention" for t in layer_types):
    raise ValueError(f"config.json: layer_types={layer_types!r}: only full_attention is supported")
  if hf.get("pretraining_tp", 1) != 1:
    raise ValueError(f"config.json: pretraining_tp={hf['pretraining_tp']!r} is not supported")
  theta, scaling = _rope_from_hf(hf)
  d_model = int(_field(hf, "hidden_size"))
  n_heads = int(_field(hf, "num_attention_heads"))
  head_dim = hf.get("head_dim") or d_model // n_heads
  dtype = _HF_DTYPES.get(str(hf.get("dtype", hf.get("torch_dtype", "float32"))), "float32")
  kwargs = dict(
      vocab_size=int(_field(hf, "vocab_size")),
      d_model=d_model,
      n_layers=int(_field(hf, "num_hidden_layers")),
      n_heads=n_heads,
      n_kv_heads=int(hf.get("num_key_value_heads") or n_heads),
      head_dim=int(head_dim),
      d_ff=int(_field(hf, "intermediate_size")),
      rope_theta=theta,
      rope_scaling=scaling,
      qkv_bias=family == "qwen2",
      qk_norm=family == "qwen3",
      tie_embeddings=bool(hf.get("tie_word_embeddings", family != "llama")),
      norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
      param_dtype=dtype,
      compute_dtype=dtype,
      max_position=int(hf.get("max_position_embeddings", 4096)),
      family=family,
  )
  kwargs.update(overrides)
  if "param_dtype" in overrides and "compute_dtype" not in overrides:
    kwargs["compute_dtype"] = overrides["param_dtype"]
  return ModelConfig(**kwargs)


def config_to_hf(cfg: ModelConfig, base: dict | None = None, dtype: str | None = None) -> dict:
  """config.json for `cfg`; fields of `base` (e.g. token ids) are kept."""
  if cfg.family == "qwen2" and not cfg.qkv_bias:
    raise ValueError("ModelConfig: family='qwen2' exports need qkv_bias=True (Qwen2 always has it)")
  if cfg.family != "qwen2" and cfg.qkv_bias:
    raise ValueError(f"ModelConfig: qkv_bias=True cannot be exported as family={cfg.family!r}")
  if cfg.qk_norm != (cfg.family == "qwen3"):
    raise ValueError(
        f"ModelConfig: qk_norm={cfg.qk_norm} cannot be exported as family={cfg.family!r} "
        "(QK-norm exists exactly in qwen3)")
  hf = dict(base or {})
  for stale in ("rope_scaling", "torch_dtype"):
    hf.pop(stale, None)
  rope = {"rope_theta": cfg.rope_theta, "rope_type": "default"}
  if cfg.rope_scaling is not None:
    rope["rope_type"] = cfg.rope_scaling.kind
    rope["factor"] = cfg.rope_scaling.factor
    if cfg.rope_scaling.kind == "llama3":
      rope["low_freq_factor"] = cfg.rope_scaling.low_freq_factor
      rope["high_freq_factor"] = cfg.rope_scaling.high_freq_factor
      rope["original_max_position_embeddings"] = cfg.rope_scaling.original_max_position
  hf.update(
      architectures=[_MODEL_TYPES[cfg.family]],
      model_type=cfg.family,
      vocab_size=cfg.vocab_size,
      hidden_size=cfg.d_model,
      num_hidden_layers=cfg.n_layers,
      num_attention_heads=cfg.n_heads,
      num_key_value_heads=cfg.n_kv_heads,
      head_dim=cfg.head_dim,
      intermediate_size=cfg.d_ff,
      hidden_act="silu",
      rms_norm_eps=cfg.norm_eps,
      tie_word_embeddings=cfg.tie_embeddings,
      max_position_embeddings=cfg.max_position,
      rope_theta=cfg.rope_theta,
      rope_parameters=rope,
      dtype=dtype or cfg.param_dtype,
  )
  if cfg.rope_scaling is not None:
    hf["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
  if cfg.family != "qwen2":
    hf["attention_bias"] = False
  if cfg.family == "llama":
    hf["mlp_bias"] = False
  return hf
