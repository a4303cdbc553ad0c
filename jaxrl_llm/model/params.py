"""The parameter table: every tensor's shape, logical axes and initialiser.

Params are a plain nested dict of arrays:

    {"embed_VD", "final_norm_D", ["lm_head_DV"],
     "layers": {"attn_norm_LD", "wq_LDNH", "wk_LDKH", "wv_LDKH", "wo_LNHD",
                ["bq_LNH", "bk_LKH", "bv_LKH"], ["q_norm_LH", "k_norm_LH"],
                ["attn_post_norm_LD"], "mlp_norm_LD", "w_gate_LDF", "w_up_LDF",
                "w_down_LFD", ["mlp_post_norm_LD"]}}

attn_norm / mlp_norm are the norms before attention and the MLP;
attn_post_norm / mlp_post_norm (cfg.sandwich_norm, Gemma) those on their
outputs. With cfg.norm_plus_one a norm scales by 1 + w, so its w starts at 0.

With cfg.lora (model/lora.py) "layers" also holds each adapted projection's
factors (wq_lora_a_LDR, wq_lora_b_LRNH, ...) and, under QLoRA, the adapted
weights' quantisation scales (wq_scale_LDNH, ...); those weights are then
stored in the quantised dtype.

Layers are stacked along a leading L axis so the forward pass is one
`lax.scan` (compile time independent of depth). The same table drives
`init_params`, the sharding annotations (`param_axes`) and the Hugging Face
name mapping, so the three cannot drift apart.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxrl_llm.model import lora
from jaxrl_llm.model.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class ParamSpec:
  shape: tuple[int, ...]
  axes: tuple[str | None, ...]  # logical axis names, one per dim
  init: str  # "normal" | "ones" | "zeros" | "lora_a" (model/lora.py) | "scale" (QLoRA's, from quantisation)
  dtype: str | None = None  # None: cfg.param_dtype; a QLoRA weight's quantised storage


def param_specs(cfg: ModelConfig) -> dict:
  """Nested dict (same structure as the params) of ParamSpec."""
  L, D, N, K, H, F, V = (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads,
                         cfg.head_dim, cfg.d_ff, cfg.vocab_size)
  unit = "zeros" if cfg.norm_plus_one else "ones"  # the init that makes a norm's scale 1
  layers = {
      "attn_norm_LD": ParamSpec((L, D), ("layers", "norm"), unit),
      "wq_LDNH": ParamSpec((L, D, N, H), ("layers", "embed", "heads", "head_dim"), "normal"),
      "wk_LDKH": ParamSpec((L, D, K, H), ("layers", "embed", "kv_heads", "head_dim"), "normal"),
      "wv_LDKH": ParamSpec((L, D, K, H), ("layers", "embed", "kv_heads", "head_dim"), "normal"),
      "wo_LNHD": ParamSpec((L, N, H, D), ("layers", "heads", "head_dim", "embed"), "normal"),
      "mlp_norm_LD": ParamSpec((L, D), ("layers", "norm"), unit),
      "w_gate_LDF": ParamSpec((L, D, F), ("layers", "embed", "mlp"), "normal"),
      "w_up_LDF": ParamSpec((L, D, F), ("layers", "embed", "mlp"), "normal"),
      "w_down_LFD": ParamSpec((L, F, D), ("layers", "mlp", "embed"), "normal"),
  }
  if cfg.qkv_bias:
    layers["bq_LNH"] = ParamSpec((L, N, H), ("layers", "heads", "head_dim"), "zeros")
    layers["bk_LKH"] = ParamSpec((L, K, H), ("layers", "kv_heads", "head_dim"), "zeros")
    layers["bv_LKH"] = ParamSpec((L, K, H), ("layers", "kv_heads", "head_dim"), "zeros")
  if cfg.qk_norm:
    layers["q_norm_LH"] = ParamSpec((L, H), ("layers", "norm"), unit)
    layers["k_norm_LH"] = ParamSpec((L, H), ("layers", "norm"), unit)
  if cfg.sandwich_norm:
    layers["attn_post_norm_LD"] = ParamSpec((L, D), ("layers", "norm"), unit)
    layers["mlp_post_norm_LD"] = ParamSpec((L, D), ("layers", "norm"), unit)
  specs = {
      "embed_VD": ParamSpec((V, D), ("vocab", "embed"), "normal"),
      "layers": layers,
      "final_norm_D": ParamSpec((D,), ("norm",), unit),
  }
  if not cfg.tie_embeddings:
    specs["lm_head_DV"] = ParamSpec((D, V), ("embed", "vocab"), "normal")
  if cfg.lora is not None:
    dims = dict(L=L, D=D, N=N, K=K, H=H, F=F)
    for name, (shape, axes, init) in lora.adapter_specs(cfg, dims, {n: s.axes for n, s in layers.items()}).items():
      layers[name] = ParamSpec(shape, axes, init, "float32" if init == "scale" else None)
    for name in lora.quantised_weights(cfg):
      layers[name] = dataclasses.replace(layers[name], dtype=jnp.dtype(lora.quant_dtype(cfg)).name)
  return specs


def _is_spec(x) -> bool:
  return isinstance(x, ParamSpec)


def param_axes(cfg: ModelConfig) -> dict:
  """Same tree as the params, each leaf a tuple of logical axis names."""
  return jax.tree.map(lambda s: s.axes, param_specs(cfg), is_leaf=_is_spec)


def param_shapes(cfg: ModelConfig) -> dict:
  """Same tree as the params, each leaf a jax.ShapeDtypeStruct."""
  return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype or cfg.param_jnp_dtype),
                      param_specs(cfg), is_leaf=_is_spec)


def init_params(cfg: ModelConfig, key: jax.Array) -> dict:
  """Random params: N(0, init_std) matrices, unit norm scales (w = 1, or
  w = 0 under cfg.norm_plus_one), zero biases.

  With cfg.lora: the adapters at their init (model/lora.py: A uniform, B zero),
  the base quantised as cfg.lora.quant says.

  Pure and jittable (cfg static), so a sharded init is
  `jax.jit(init_params, static_argnums=0, out_shardings=...)`, see sharding.py.
  """
  if cfg.lora is not None:
    k_base, k_lora = jax.random.split(key)
    return lora.attach(init_params(lora.base_config(cfg), k_base), cfg, k_lora)
  specs = param_specs(cfg)
  leaves, treedef = jax.tree.flatten(specs, is_leaf=_is_spec)
  keys = jax.random.split(key, len(leaves))
  dtype = cfg.param_jnp_dtype

  def make(spec: ParamSpec, k):
    if spec.init == "ones":
      return jnp.ones(spec.shape, dtype)
    if spec.init == "zeros":
      return jnp.zeros(spec.shape, dtype)
    return (cfg.init_std * jax.random.normal(k, spec.shape, jnp.float32)).astype(dtype)

  return jax.tree.unflatten(treedef, [make(s, k) for s, k in zip(leaves, keys)])


def check_params(params: dict, cfg: ModelConfig) -> None:
  """Raise ValueError naming the first missing, unexpected or mis-shaped tensor."""
  expected = param_shapes(cfg)
  exp_flat = {jax.tree_util.keystr(p): s for p, s in
              jax.tree_util.tree_flatten_with_path(expected)[0]}
  got_flat = {jax.tree_util.keystr(p): x for p, x in
              jax.tree_util.tree_flatten_with_path(params)[0]}
  for name, spec in exp_flat.items():
    if name not in got_flat:
      raise ValueError(f"params: missing tensor {name} (expected shape {spec.shape})")
    shape = tuple(got_flat[name].shape)
    if shape != spec.shape:
      raise ValueError(f"params: tensor {name} has shape {shape}, expected {spec.shape}")
  extra = sorted(set(got_flat) - set(exp_flat))
  if extra:
    raise ValueError(f"params: unexpected tensors {extra} for this ModelConfig")
