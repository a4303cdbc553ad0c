"""Hugging Face config.json <-> ModelConfig, for Llama 3, Qwen2/2.5, Qwen3 and
Gemma 3 (text: Gemma3ForCausalLM, model_type "gemma3_text").

Both the transformers-5 spelling (`rope_parameters`; for Gemma 3 one entry
per layer type) and the older one (`rope_theta` + `rope_scaling`, Gemma's
`rope_local_base_freq` and `sliding_window_pattern`) are read; both are
written, so the saved directory loads in old and new readers alike. Anything
our decoder does not implement (other activations, sliding windows outside
Gemma, output-projection biases, other RoPE types, final-logit soft-capping)
is refused with the offending field named; so is Gemma 3's
attn_logit_softcapping, which transformers' Gemma3 reads but never applies.
"""

from __future__ import annotations

from jaxrl_llm.model.config import ModelConfig, RopeScaling, pattern_layer_types

ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma3ForCausalLM": "gemma3",
}
_ARCH_OF = {family: arch for arch, family in ARCHITECTURES.items()}
# config.json's model_type of each family (Gemma 3's text model is "gemma3_text";
# "gemma3" is the multimodal Gemma3ForConditionalGeneration).
_MODEL_TYPE_OF = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3_text"}
_FAMILY_OF_TYPE = {model_type: family for family, model_type in _MODEL_TYPE_OF.items()}
_HF_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}
# The ModelConfig settings that make a decoder Gemma 3 (and that no other
# family has): GeGLU, (1 + w) norms with the sandwich pair, scaled embeddings,
# QK-norm.
_GEMMA3_FLAGS = dict(mlp_act="gelu_tanh", norm_plus_one=True, sandwich_norm=True, embed_scale=True,
                     qk_norm=True, qkv_bias=False)


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


def _family_from_hf(hf: dict) -> str:
  archs = hf.get("architectures") or []
  model_type = hf.get("model_type")
  family = None
  for arch in archs:
    family = ARCHITECTURES.get(arch, family)
  if family is None and model_type in _FAMILY_OF_TYPE:
    family = _FAMILY_OF_TYPE[model_type]
  if family is None and (model_type == "gemma3" or "Gemma3ForConditionalGeneration" in archs):
    raise ValueError(
        f"config.json: architectures={archs!r}, model_type={model_type!r} is the multimodal "
        "Gemma 3 (image + text); supported is the text-only Gemma3ForCausalLM (model_type "
        "'gemma3_text', e.g. gemma-3-270m, gemma-3-1b)")
  if family is None:
    raise ValueError(
        f"config.json: unsupported architecture (architectures={archs!r}, "
        f"model_type={model_type!r}); supported: {sorted(ARCHITECTURES)}")
  return family


def _gemma3_from_hf(hf: dict) -> dict:
  """The Gemma 3 fields of a ModelConfig from a gemma3_text config.json."""
  act = hf.get("hidden_activation") or hf.get("hidden_act") or "gelu_pytorch_tanh"
  if act != "gelu_pytorch_tanh":
    raise ValueError(f"config.json: hidden_activation={act!r} is not supported for gemma3 "
                     "(only 'gelu_pytorch_tanh')")
  if hf.get("attention_bias", False):
    raise ValueError("config.json: attention_bias=true is not supported for gemma3 (it adds an "
                     "output-projection bias this decoder does not have)")
  if hf.get("use_bidirectional_attention", False):
    raise ValueError("config.json: use_bidirectional_attention=true is not supported (the "
                     "decoder is causal)")
  if hf.get("final_logit_softcapping") is not None:
    raise ValueError(
        f"config.json: final_logit_softcapping={hf['final_logit_softcapping']!r} is not "
        "supported (allowed: null, as in Gemma 3): the trainer's vocabulary kernels take the "
        "log-softmax of hidden @ w_DV and would not see a cap")
  if hf.get("attn_logit_softcapping") is not None:
    raise ValueError(
        f"config.json: attn_logit_softcapping={hf['attn_logit_softcapping']!r} is not supported "
        "for gemma3 (allowed: null, as in Gemma 3): transformers' Gemma3 attention ignores the "
        "field, so a checkpoint that sets it has no one meaning")
  n_layers = int(_field(hf, "num_hidden_layers"))
  layer_types = hf.get("layer_types")
  if layer_types is None:
    pattern = hf.get("sliding_window_pattern", hf.get("_sliding_window_pattern", 6))
    layer_types = pattern_layer_types(n_layers, int(pattern))
  layer_types = tuple(layer_types)
  has_local = "sliding_attention" in layer_types
  # RoPE: transformers 5 nests one entry per layer type; older configs give
  # rope_theta (+ rope_scaling) for the global layers and rope_local_base_freq.
  rope = hf.get("rope_parameters")
  if isinstance(rope, dict) and ("full_attention" in rope or "sliding_attention" in rope):
    full = dict(rope.get("full_attention") or {})
    local = dict(rope.get("sliding_attention") or {})
  else:
    full = dict(rope or hf.get("rope_scaling") or {})
    local = {}
  full.setdefault("rope_theta", hf.get("rope_theta", 1e6))
  local.setdefault("rope_theta", hf.get("rope_local_base_freq", 1e4))
  theta, scaling = _rope_from_hf({"rope_parameters": full})
  local_kind = local.get("rope_type", local.get("type", "default"))
  if local_kind != "default":
    raise ValueError(f"config.json: rope_parameters.sliding_attention.rope_type={local_kind!r} is "
                     "not supported (the local layers' RoPE is unscaled: allowed 'default')")
  return dict(
      rope_theta=theta,
      rope_scaling=scaling,
      rope_local_theta=float(local["rope_theta"]) if has_local else None,
      layer_types=layer_types,
      sliding_window=int(_field(hf, "sliding_window")) if has_local else None,
      query_pre_attn_scalar=int(hf.get("query_pre_attn_scalar", 256)),
      **_GEMMA3_FLAGS,
  )


def _llama_like_from_hf(hf: dict, family: str) -> dict:
  """The fields of a Llama 3 / Qwen2 / Qwen3 ModelConfig from config.json."""
  act = hf.get("hidden_act", "silu")
  if act != "silu":
    raise ValueError(f"config.json: hidden_act={act!r} is not supported (only 'silu')")
  if family in ("llama", "qwen3") and hf.get("attention_bias", False):
    raise ValueError(
        f"config.json: attention_bias=true is not supported for {family} (it adds an "
        "output-projection bias this decoder does not have)")
  if hf.get("use_sliding_window", False):
    raise ValueError("config.json: use_sliding_window=true is not supported")
  layer_types = hf.get("layer_types") or []
  if any(t != "full_attention" for t in layer_types):
    raise ValueError(f"config.json: layer_types={layer_types!r}: only full_attention is supported "
                     f"for {family}")
  theta, scaling = _rope_from_hf(hf)
  return dict(rope_theta=theta, rope_scaling=scaling, qkv_bias=family == "qwen2",
              qk_norm=family == "qwen3")


def config_from_hf(hf: dict, **overrides) -> ModelConfig:
  """A ModelConfig from a parsed config.json; `overrides` set e.g. dtypes/remat.

  param_dtype defaults to the checkpoint's dtype (so HF -> ours -> HF is
  bit-exact without casts); compute_dtype defaults to param_dtype.
  """
  family = _family_from_hf(hf)
  if hf.get("mlp_bias", False):
    raise ValueError("config.json: mlp_bias=true is not supported")
  if hf.get("pretraining_tp", 1) != 1:
    raise ValueError(f"config.json: pretraining_tp={hf['pretraining_tp']!r} is not supported")
  if family == "gemma3":
    family_fields = _gemma3_from_hf(hf)
  else:
    family_fields = _llama_like_from_hf(hf, family)
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
      tie_embeddings=bool(hf.get("tie_word_embeddings", family != "llama")),
      norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
      param_dtype=dtype,
      compute_dtype=dtype,
      max_position=int(hf.get("max_position_embeddings",
                              131072 if family == "gemma3" else 4096)),
      family=family,
      **family_fields,
  )
  kwargs.update(overrides)
  if "param_dtype" in overrides and "compute_dtype" not in overrides:
    kwargs["compute_dtype"] = overrides["param_dtype"]
  return ModelConfig(**kwargs)


def _check_exportable(cfg: ModelConfig) -> None:
  """The family's Hugging Face architecture expresses every setting of cfg."""
  if cfg.family == "gemma3":
    for name, value in _GEMMA3_FLAGS.items():
      if getattr(cfg, name) != value:
        raise ValueError(f"ModelConfig: family='gemma3' exports need {name}={value!r} (Gemma 3 "
                         f"always has it), got {getattr(cfg, name)!r}")
    if cfg.attn_softcap is not None:
      raise ValueError(f"ModelConfig: attn_softcap={cfg.attn_softcap!r} cannot be exported as "
                       "family='gemma3' (transformers' Gemma3 ignores attn_logit_softcapping)")
    return
  if cfg.family == "qwen2" and not cfg.qkv_bias:
    raise ValueError("ModelConfig: family='qwen2' exports need qkv_bias=True (Qwen2 always has it)")
  if cfg.family != "qwen2" and cfg.qkv_bias:
    raise ValueError(f"ModelConfig: qkv_bias=True cannot be exported as family={cfg.family!r}")
  if cfg.qk_norm != (cfg.family == "qwen3"):
    raise ValueError(
        f"ModelConfig: qk_norm={cfg.qk_norm} cannot be exported as family={cfg.family!r} "
        "(QK-norm exists exactly in qwen3 and gemma3)")
  gemma_only = dict(mlp_act=cfg.mlp_act != "silu", norm_plus_one=cfg.norm_plus_one,
                    sandwich_norm=cfg.sandwich_norm, embed_scale=cfg.embed_scale,
                    layer_types=cfg.has_local_layers, attn_softcap=cfg.attn_softcap is not None,
                    query_pre_attn_scalar=cfg.query_pre_attn_scalar not in (None, cfg.head_dim))
  for name, used in gemma_only.items():
    if used:
      raise ValueError(f"ModelConfig: {name}={getattr(cfg, name)!r} cannot be exported as "
                       f"family={cfg.family!r} (of the supported families only gemma3 has it)")


def _rope_to_hf(theta: float, scaling: RopeScaling | None) -> dict:
  rope = {"rope_theta": theta, "rope_type": "default"}
  if scaling is not None:
    rope["rope_type"] = scaling.kind
    rope["factor"] = scaling.factor
    if scaling.kind == "llama3":
      rope["low_freq_factor"] = scaling.low_freq_factor
      rope["high_freq_factor"] = scaling.high_freq_factor
      rope["original_max_position_embeddings"] = scaling.original_max_position
  return rope


def config_to_hf(cfg: ModelConfig, base: dict | None = None, dtype: str | None = None) -> dict:
  """config.json for `cfg`; fields of `base` (e.g. token ids) are kept."""
  _check_exportable(cfg)
  hf = dict(base or {})
  for stale in ("rope_scaling", "torch_dtype", "sliding_window_pattern", "_sliding_window_pattern"):
    hf.pop(stale, None)
  rope = _rope_to_hf(cfg.rope_theta, cfg.rope_scaling)
  hf.update(
      architectures=[_ARCH_OF[cfg.family]],
      model_type=_MODEL_TYPE_OF[cfg.family],
      vocab_size=cfg.vocab_size,
      hidden_size=cfg.d_model,
      num_hidden_layers=cfg.n_layers,
      num_attention_heads=cfg.n_heads,
      num_key_value_heads=cfg.n_kv_heads,
      head_dim=cfg.head_dim,
      intermediate_size=cfg.d_ff,
      rms_norm_eps=cfg.norm_eps,
      tie_word_embeddings=cfg.tie_embeddings,
      max_position_embeddings=cfg.max_position,
      rope_theta=cfg.rope_theta,
      rope_parameters=rope,
      dtype=dtype or cfg.param_dtype,
  )
  if cfg.rope_scaling is not None:
    hf["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
  if cfg.family == "gemma3":
    _gemma3_to_hf(cfg, hf, rope)
    return hf
  hf["hidden_act"] = "silu"
  if cfg.family != "qwen2":
    hf["attention_bias"] = False
  if cfg.family == "llama":
    hf["mlp_bias"] = False
  return hf


def _gemma3_to_hf(cfg: ModelConfig, hf: dict, rope: dict) -> None:
  """The Gemma 3 fields of config.json, in both spellings (see the module doc)."""
  local_theta = cfg.rope_local_theta
  if local_theta is None:  # the local layers (if any) rotate like the global ones
    local_theta = cfg.rope_theta if cfg.has_local_layers else 10000.0
    if cfg.has_local_layers and cfg.rope_scaling is not None:
      raise ValueError("ModelConfig: gemma3 exports cannot give local layers rope_scaling; set "
                       "rope_local_theta (their unscaled base)")
  layer_types = cfg.layer_types or ("full_attention",) * cfg.n_layers
  hf.update(
      hidden_activation="gelu_pytorch_tanh",
      query_pre_attn_scalar=(cfg.head_dim if cfg.query_pre_attn_scalar is None
                             else cfg.query_pre_attn_scalar),
      sliding_window=cfg.sliding_window,
      layer_types=list(layer_types),
      rope_parameters={"full_attention": rope,
                       "sliding_attention": {"rope_type": "default", "rope_theta": local_theta}},
      rope_local_base_freq=local_theta,
      attn_logit_softcapping=None,
      final_logit_softcapping=None,
      attention_bias=False,
      use_bidirectional_attention=False,
  )
  hf.pop("hidden_act", None)
  # Readers older than `layer_types` expand this pattern instead.
  for pattern in range(1, cfg.n_layers + 1):
    if pattern_layer_types(cfg.n_layers, pattern) == tuple(layer_types):
      hf["sliding_window_pattern"] = pattern
      break
