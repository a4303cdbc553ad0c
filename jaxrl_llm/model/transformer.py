"""The decoder as Flax NNX modules: `Decoder` (embedding, the stack, final norm, output head) and
`DecoderLayers` (the L pre-norm blocks).

Local (sliding-window) and global layers share the one block: each layer's
kind only picks its RoPE table and attention mask, both built once per call
(see _pick), so a model that mixes them still runs its layers as one scan.

State. Every parameter is an `nnx.Param` (a LoRA factor an `nnx.LoRAParam`)
carrying its logical axes as `out_sharding` metadata (the MaxText / Tunix
convention; `nnx.get_partition_spec` reads them), and the modules' attribute
names are the names of params.py's table. So `nnx.state(decoder)`'s pure dict
*is* the params dict the rest of the package holds: optax, Orbax checkpoints
(old workdirs included), the Hugging Face / GGUF name tables and `jax.grad`
see exactly the arrays, and `nnx.merge(graphdef(cfg), params)` rebuilds the
module from them at no cost inside a jitted function (trace time only).

The functions at the bottom (`forward`, `forward_embeddings`, `embed`,
`lm_head`, `logits`) are that merge followed by the module's method: the form
every jitted program of a run uses (trainer, sampler, recomputes, teachers,
reward models), since a jitted step must be a pure function of a state pytree,
and the form for a user who holds only the state.

Layers. `DecoderLayers` holds all L blocks' weights stacked on a leading
layer axis (its names carry it: wq_LDNH), and its `__call__` runs one block
on one layer's slice. `Decoder` runs the stack either as a `lax.scan` over the
stacked state (one block in the program: quick to compile; training and
prefill), optionally under `jax.checkpoint` (cfg.remat), or, when built from
`unstack_layers`' form, as an `nnx.List` of per-layer slices run by a Python
loop over per-layer weights and cache buffers (the decode loop's form).
"""

from __future__ import annotations

import dataclasses

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_llm.model import layers as nn
from jaxrl_llm.model import lora
from jaxrl_llm.model import params as params_lib
from jaxrl_llm.model import splash as splash_lib
from jaxrl_llm.model.cache import KVCache
from jaxrl_llm.model.config import ModelConfig
from jaxrl_llm.model.sharding import constrain
from jaxrl_llm.model.visibility import Visibility, visibility

_ROWS = ("batch", None, None)  # the residual stream [B, T, D]: rows over data x fsdp (model/sharding.py)

_REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "save_dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def _keep(x, axes):
  return x


def _qkv(cfg: ModelConfig, x_BTD, p, cos_BTH, sin_BTH, constrain=_keep):
  """Attention inputs of one block: q_BTNH, and the T new k_BTKH, v_BTKH
  (after bias, QK-norm and RoPE, as the cache stores them)."""
  h_BTD = nn.rms_norm(x_BTD, p["attn_norm_D"], cfg.norm_eps, cfg.norm_plus_one)
  h_BTD = constrain(h_BTD, _ROWS)
  q_BTNH = constrain(lora.project(cfg, "BTD,DNH->BTNH", h_BTD, p, "wq_DNH"), ("batch", None, "heads", None))
  k_BTKH = constrain(lora.project(cfg, "BTD,DKH->BTKH", h_BTD, p, "wk_DKH"), ("batch", None, "kv_heads", None))
  v_BTKH = constrain(lora.project(cfg, "BTD,DKH->BTKH", h_BTD, p, "wv_DKH"), ("batch", None, "kv_heads", None))
  if cfg.qkv_bias:
    q_BTNH = q_BTNH + p["bq_NH"][None, None]
    k_BTKH = k_BTKH + p["bk_KH"][None, None]
    v_BTKH = v_BTKH + p["bv_KH"][None, None]
  if cfg.qk_norm:
    q_BTNH = nn.rms_norm(q_BTNH, p["q_norm_H"], cfg.norm_eps, cfg.norm_plus_one)
    k_BTKH = nn.rms_norm(k_BTKH, p["k_norm_H"], cfg.norm_eps, cfg.norm_plus_one)
  return (nn.apply_rope(q_BTNH, cos_BTH, sin_BTH), nn.apply_rope(k_BTKH, cos_BTH, sin_BTH),
          v_BTKH)


def _attend_and_mlp(cfg: ModelConfig, x_BTD, p, attn_BTNH, constrain=_keep):
  """The rest of one pre-norm block, given the attention's output (with cfg.sandwich_norm, each
  branch's output is normalised again before the residual add)."""
  plus_one = cfg.norm_plus_one
  out_BTD = lora.project(cfg, "BTNH,NHD->BTD", attn_BTNH, p, "wo_NHD")
  if cfg.sandwich_norm:
    out_BTD = nn.rms_norm(out_BTD, p["attn_post_norm_D"], cfg.norm_eps, plus_one)
  x_BTD = constrain(x_BTD + out_BTD, _ROWS)
  h_BTD = nn.rms_norm(x_BTD, p["mlp_norm_D"], cfg.norm_eps, plus_one)
  gate_BTF = lora.project(cfg, "BTD,DF->BTF", h_BTD, p, "w_gate_DF")
  up_BTF = lora.project(cfg, "BTD,DF->BTF", h_BTD, p, "w_up_DF")
  out_BTD = lora.project(cfg, "BTF,FD->BTD", nn.glu(gate_BTF, up_BTF, cfg.mlp_act), p, "w_down_FD")
  if cfg.sandwich_norm:
    out_BTD = nn.rms_norm(out_BTD, p["mlp_post_norm_D"], cfg.norm_eps, plus_one)
  return constrain(x_BTD + out_BTD, _ROWS)


def _splash(cfg: ModelConfig, q_BTNH, k_BTKH, v_BTKH, inputs: "_CallInputs", local):
  """The block's attention through the splash kernel (model/splash.py): the global or the local
  layer's kernel, chosen by `local` (see _pick; a traced flag runs one of the two by lax.cond)."""
  dt = cfg.compute_jnp_dtype

  def run(window):
    return splash_lib.splash_attention(q_BTNH, k_BTKH.astype(dt), v_BTKH.astype(dt), inputs.mask_BT,
                                       inputs.segments_BT, window=window, scale=cfg.attn_scale,
                                       softcap=cfg.attn_softcap)
  if not cfg.has_local_layers or (isinstance(local, bool) and not local):
    return run(None)
  if isinstance(local, bool):
    return run(cfg.sliding_window)
  return jax.lax.cond(local, lambda: run(cfg.sliding_window), lambda: run(None))


def _cast_layer(cfg: ModelConfig, layer_params: dict) -> dict:
  """One layer's params, axis-stripped names, in the compute dtype (a QLoRA base dequantised
  first, model/lora.py)."""
  dt = cfg.compute_jnp_dtype
  return jax.tree.map(lambda a: a.astype(dt), lora.dequantize_layer(cfg, _strip_layer_axis(layer_params)))


def _strip_layer_axis(layer_params: dict) -> dict:
  """Rename 'wq_LDNH' -> 'wq_DNH' for the per-layer slice inside the scan."""
  return {name.replace("_L", "_", 1): value for name, value in layer_params.items()}


def unstack_layers(params: dict) -> dict:
  """params with "layers" as a tuple of per-layer dicts instead of stacked
  [L, ...] arrays (same values, same names).

  `forward` takes either form, and the form picks how the layers run:
  stacked as a `lax.scan` (one block in the program: quick to compile, the
  form for training and prefill), unstacked as a Python loop (L blocks in
  the program: each layer's weights and cache are buffers of their own, the
  form for a decode loop, which unstacks once, outside the loop; a scan
  there would copy every weight and cache slice out of the stacked arrays at
  every step).
  """
  layers = params["layers"]
  if isinstance(layers, (tuple, list)):
    return params
  n_layers = next(iter(layers.values())).shape[0]
  return {**params, "layers": tuple({name: value[l] for name, value in layers.items()}
                                    for l in range(n_layers))}


def _pick(local, local_value, global_value):
  """The local or the global variant of a per-layer input (a RoPE table, the
  attention mask). `local` is a Python bool where the layer's kind is known
  when tracing (the unrolled loop, a model of one kind), else a traced bool
  scalar (a scan over mixed layers): then both variants are computed once
  outside the scan and this selects between them inside the body."""
  if local_value is global_value:
    return global_value
  if isinstance(local, bool):
    return local_value if local else global_value
  return jax.tree.map(lambda a, b: jnp.where(local, a, b), local_value, global_value)


def _bkth(x_BTKH: jax.Array) -> jax.Array:
  return jnp.transpose(x_BTKH, (0, 2, 1, 3))


def _bkht(x_BTKH: jax.Array) -> jax.Array:
  return jnp.transpose(x_BTKH, (0, 2, 3, 1))


def _layers_unstacked(cfg: ModelConfig, block, x_BTD, layers, cache: KVCache | None):
  """Unstacked layers (unstack_layers): a Python loop, one copy of the block per layer in the
  program, rematerialised as `cfg.remat` says when there is no cache. With a cache, each layer attends over its own cache buffers directly; this is the decode
  loop's form, where a scan would slice every layer's weights and cache out of stacked arrays (a copy
  of each at every step). -> (x_BTD, (k per layer, v per layer) or None)."""
  k_layers, v_layers = [], []
  if cache is None and cfg.remat != "none":  # the same rematerialisation as the scan's, per layer
    block = jax.checkpoint(block, policy=_REMAT_POLICIES[cfg.remat], static_argnums=(2,))
  for layer, layer_params in enumerate(layers):
    local = cfg.local_layers[layer]
    if cache is None:
      x_BTD, _, _ = block(x_BTD, layer_params, local)
    else:
      x_BTD, k_BKHS, v_BKSH = block(x_BTD, layer_params, local, cache.k_BKHS[layer], cache.v_BKSH[layer])
      k_layers.append(k_BKHS)
      v_layers.append(v_BKSH)
  return x_BTD, (None if cache is None else (tuple(k_layers), tuple(v_layers)))


def _layers_scanned(cfg: ModelConfig, block, x_BTD, layers, cache: KVCache | None):
  """Stacked layers: a scan, one copy of the block in the program (rematerialised in the backward
  pass as `cfg.remat` says). With a cache (a prefill) the per-layer cache buffers are stacked to ride
  through the scan as xs/ys and split again after it, one copy of the cache each way per call (fine
  once per prefill, not per decode step). -> (x_BTD, (k per layer, v per layer) or None)."""
  # Each layer's kind: static where all layers share it, else a per-layer
  # flag that rides through the scan with the weights (local_L).
  static_local = None if 0 < sum(cfg.local_layers) < cfg.n_layers else cfg.local_layers[0]
  local_L = None if static_local is not None else jnp.asarray(cfg.local_layers)
  if cache is None:
    def body(x_BTD, xs):
      layer_params, flag = xs
      return block(x_BTD, layer_params, static_local if flag is None else flag)[0], None
    if cfg.remat != "none":
      body = jax.checkpoint(body, policy=_REMAT_POLICIES[cfg.remat], prevent_cse=False)
    x_BTD, _ = jax.lax.scan(body, x_BTD, (layers, local_L))
    return x_BTD, None

  def cached_body(x_BTD, xs):
    layer_params, flag, k_BKHS, v_BKSH = xs
    x_BTD, k_BKHS, v_BKSH = block(x_BTD, layer_params, static_local if flag is None else flag, k_BKHS, v_BKSH)
    return x_BTD, (k_BKHS, v_BKSH)
  x_BTD, (k_LBKHS, v_LBKSH) = jax.lax.scan(
      cached_body, x_BTD, (layers, local_L, jnp.stack(cache.k_BKHS), jnp.stack(cache.v_BKSH)))
  return x_BTD, (tuple(k_LBKHS), tuple(v_LBKSH))


@dataclasses.dataclass(frozen=True)
class _CallInputs:
  """What every block of one forward call shares: the RoPE tables, the masks, the activations'
  layout (model.sharding.constrain, or none for a decode step), and which attention runs ("xla"
  over vis's dense masks, or "splash" over mask_BT and segments_BT, model/splash.py)."""

  rope_global: tuple
  rope_local: tuple
  vis: Visibility
  layout: object
  attention: str = "xla"
  mask_BT: jax.Array | None = None  # bool [B, T]: the real tokens (splash)
  segments_BT: jax.Array | None = None  # int32 [B, T]: whole documents (splash), or None


def _variable(name: str, spec: params_lib.ParamSpec, value, *, sliced: bool = False) -> nnx.Variable:
  """A parameter of the table as an NNX variable: an `nnx.LoRAParam` for a LoRA factor (the
  trainable part under cfg.lora), else an `nnx.Param`; its logical axes as `out_sharding`
  (without the leading layer axis for one layer's slice). Placement stays with the caller
  (model/sharding.py), so no eager sharding."""
  kind = nnx.LoRAParam if lora.is_adapter(name) else nnx.Param
  axes = spec.axes[1:] if sliced else spec.axes
  return kind(value, out_sharding=axes, eager_sharding=False)


class DecoderLayers(nnx.Module):
  """The decoder's pre-norm blocks, each attention (GQA, RoPE, optional QKV bias, QK-norm,
  sliding window) then a gated MLP, each branch optionally sandwich-normed.

  Holds the weights of all L layers stacked on a leading layer axis, one attribute per entry of
  params.py's table (wq_LDNH, w_gate_LDF, ...; LoRA factors and QLoRA scales included), or, with
  `sliced`, one layer's slice of them under the same names. `__call__` runs one block on one
  layer's slice: `Decoder` calls it inside a scan over the stacked state, or once per element of
  an unstacked `nnx.List`.
  """

  def __init__(self, cfg: ModelConfig, arrays: dict, *, sliced: bool = False):
    self.cfg = cfg
    specs = params_lib.param_specs(cfg)["layers"]
    extra = sorted(set(arrays) - set(specs))
    if extra:
      raise ValueError(f"params: unexpected layer tensors {extra} for this ModelConfig")
    for name, spec in specs.items():
      if name not in arrays:
        raise ValueError(f"params: missing layer tensor {name} (expected shape {spec.shape})")
      setattr(self, name, _variable(name, spec, arrays[name], sliced=sliced))

  def weights(self) -> dict:
    """This layer's arrays by name (wq_LDNH, ...)."""
    return nnx.to_pure_dict(nnx.state(self))

  def __call__(self, x_BTD: jax.Array, inputs: _CallInputs, local, k_BKHS=None, v_BKSH=None):
    """One block on x_BTD -> (x_BTD, k_BKHS, v_BKSH). `local` is the layer's kind (see _pick).
    With a cache layer (k_BKHS, v_BKSH) the T new slots are written first (in place in a
    donated or loop-carried buffer); without one the block's own keys and values come back."""
    cfg = self.cfg
    dt = cfg.compute_jnp_dtype
    p = _cast_layer(cfg, self.weights())
    cos_BTH, sin_BTH = _pick(local, inputs.rope_local, inputs.rope_global)
    q_BTNH, k_BTKH, v_BTKH = _qkv(cfg, x_BTD, p, cos_BTH, sin_BTH, inputs.layout)
    if inputs.attention == "splash":  # no cache (Decoder.hidden decides)
      attn_BTNH = _splash(cfg, q_BTNH, k_BTKH, v_BTKH, inputs, local)
      return _attend_and_mlp(cfg, x_BTD, p, attn_BTNH, inputs.layout), None, None
    allowed_BTS = _pick(local, inputs.vis.allowed_local_BTS, inputs.vis.allowed_global_BTS)
    if k_BKHS is None:
      k_BKHS, v_BKSH = _bkht(k_BTKH), _bkth(v_BTKH)
    else:
      index = inputs.vis.index
      k_BKHS = jax.lax.dynamic_update_slice(k_BKHS, _bkht(k_BTKH).astype(k_BKHS.dtype), (0, 0, 0, index))
      v_BKSH = jax.lax.dynamic_update_slice(v_BKSH, _bkth(v_BTKH).astype(v_BKSH.dtype), (0, 0, index, 0))
    attn_BTNH = nn.attention(q_BTNH, k_BKHS.astype(dt), v_BKSH.astype(dt), allowed_BTS,
                             scale=cfg.attn_scale, softcap=cfg.attn_softcap)
    x_BTD = _attend_and_mlp(cfg, x_BTD, p, attn_BTNH, inputs.layout)
    return x_BTD, k_BKHS, v_BKSH


class Decoder(nnx.Module):
  """A decoder-only language model (Llama 3 / Qwen2 / Qwen3 / Gemma 3 families, model/config.py).

  `Decoder(cfg, rngs=nnx.Rngs(0))` initialises it (params.init_params, from `rngs.params()`);
  `Decoder(cfg, params)` wraps existing arrays (a checkpoint, a Hugging Face or GGUF import),
  stacked, or in `unstack_layers`' form for a decode loop. `nnx.state(decoder).to_pure_dict()`
  gives the params dict back.
  """

  def __init__(self, cfg: ModelConfig, params: dict | None = None, *, rngs: nnx.Rngs | None = None):
    if params is None:
      if rngs is None:
        raise ValueError("Decoder: give its params, or rngs to initialise them")
      params = params_lib.init_params(cfg, rngs.params())
    self.cfg = cfg
    specs = params_lib.param_specs(cfg)
    extra = sorted(set(params) - set(specs))
    if extra:
      raise ValueError(f"params: unexpected tensors {extra} for this ModelConfig")
    for name in ("embed_VD", "final_norm_D", "lm_head_DV"):
      if name in specs:
        if name not in params:
          raise ValueError(f"params: missing tensor {name} (expected shape {specs[name].shape})")
        setattr(self, name, _variable(name, specs[name], params[name]))
    layers = params["layers"]
    if isinstance(layers, (tuple, list)):
      if len(layers) != cfg.n_layers:
        raise ValueError(f"params: {len(layers)} unstacked layers, expected n_layers = {cfg.n_layers}")
      self.layers = nnx.List([DecoderLayers(cfg, l, sliced=True) for l in layers])
    else:
      self.layers = DecoderLayers(cfg, layers)

  def embed(self, tokens_BT: jax.Array) -> jax.Array:
    """Token embeddings in the compute dtype; times sqrt(D) with cfg.embed_scale."""
    cfg = self.cfg
    dt = cfg.compute_jnp_dtype
    x_BTD = jnp.take(self.embed_VD[...], tokens_BT, axis=0).astype(dt)
    if cfg.embed_scale:
      # The factor is rounded to the compute dtype first, as Hugging Face's Gemma
      # does (bf16: sqrt(640) = 25.298 becomes 25.25).
      x_BTD = x_BTD * jnp.asarray(cfg.d_model ** 0.5, dt)
    return x_BTD

  def lm_head(self) -> jax.Array:
    """w_DV, the output projection (the embedding transposed when tied)."""
    if self.cfg.tie_embeddings:
      return self.embed_VD[...].T
    return self.lm_head_DV[...]

  def logits(self, hidden_BTD: jax.Array) -> jax.Array:
    """Full logits_BTV in float32 (tests and small vocabularies; the trainer's
    kernels fuse this product with the log-softmax instead)."""
    w_DV = self.lm_head().astype(hidden_BTD.dtype)
    return jnp.einsum("BTD,DV->BTV", hidden_BTD, w_DV, preferred_element_type=jnp.float32)

  def hidden(self, x_BTD: jax.Array, positions_BT: jax.Array, mask_BT: jax.Array,
             cache: KVCache | None = None, segments_BT: jax.Array | None = None, *,
             documents_only: bool = False) -> tuple[jax.Array, KVCache | None]:
    """The decoder stack from input embeddings (see `__call__`)."""
    cfg = self.cfg
    B, T, _ = x_BTD.shape
    if positions_BT.shape != (B, T) or mask_BT.shape != (B, T):
      raise ValueError(
          f"forward: positions_BT {positions_BT.shape} and mask_BT {mask_BT.shape} must both "
          f"have the tokens' shape {(B, T)}")
    mask_BT = mask_BT.astype(jnp.bool_)
    # The activations' layout (model.sharding.constrain): rows over data x fsdp, so that the compiler
    # gathers each layer's fsdp-split weights. Not for a decode step (T = 1): there a few rows meet all
    # the weights, and the compiler's own choice, weights in place and the rows' partial sums reduced,
    # moves far less (Qwen3-8B, v5p 4x4x4, fsdp 32 x tensor 2, 256 rows, one layer and the head: 0.15 GB
    # per chip per step left to the compiler, 0.74 GB constrained; docs/tpu.md).
    layout = constrain if T > 1 else _keep
    x_BTD = layout(x_BTD, _ROWS)
    rope_global = nn.rope_tables(positions_BT, cfg)
    rope_local = nn.rope_tables(positions_BT, cfg, local=True) if cfg.local_rope_differs else rope_global
    vis = visibility(cfg, positions_BT, mask_BT, cache, segments_BT)
    # The splash kernel (cfg.attention_impl) runs forwards without a cache whose segments, if any,
    # are whole documents (model/splash.py); the rest keeps the XLA attention over vis's masks.
    attention = "xla"
    if cache is None and (segments_BT is None or documents_only):
      attention = splash_lib.resolve_attention(cfg.attention_impl, T)
    inputs = _CallInputs(rope_global=rope_global, rope_local=rope_local, vis=vis, layout=layout,
                         attention=attention, mask_BT=mask_BT, segments_BT=segments_BT)

    # The loops run a pure function of one layer's state (nnx.merge inside), so that the scan
    # and jax.checkpoint see plain arrays.
    if isinstance(self.layers, DecoderLayers):
      layer_def = nnx.graphdef(self.layers)
      layers = self.layers.weights()
      run_layers = _layers_scanned
    else:
      layer_def = nnx.graphdef(self.layers[0])
      layers = tuple(layer.weights() for layer in self.layers)
      run_layers = _layers_unstacked

    def block(x_BTD, layer_state, local, k_BKHS=None, v_BKSH=None):
      return nnx.merge(layer_def, layer_state)(x_BTD, inputs, local, k_BKHS, v_BKSH)

    x_BTD, kv = run_layers(cfg, block, x_BTD, layers, cache)
    new_cache = None
    if kv is not None:
      new_cache = KVCache(k_BKHS=kv[0], v_BKSH=kv[1], mask_BS=vis.kv_mask_BS, index=vis.index + T,
                          positions_BS=vis.kv_positions_BS)
    hidden_BTD = nn.rms_norm(x_BTD, self.final_norm_D[...].astype(x_BTD.dtype), cfg.norm_eps,
                             cfg.norm_plus_one)
    return hidden_BTD, new_cache

  def __call__(self, tokens_BT: jax.Array, positions_BT: jax.Array, mask_BT: jax.Array,
               cache: KVCache | None = None, segments_BT: jax.Array | None = None, *,
               documents_only: bool = False) -> tuple[jax.Array, KVCache | None]:
    """Final-norm hidden states hidden_BTD (compute dtype), and the updated cache.

    Without a cache, token t attends to valid tokens t' <= t of the same row; with segments_BT
    (int32, no cache; model/visibility.segment_id), only those of its own document in its own part or in part 0,
    a prefix the document's parts share (logprobs.response_hidden's shared prompt: the prompt is
    part 0 and each response a part of its own, so G responses attend to one copy of the prompt;
    model/packing.py: several such documents in one row). documents_only: the caller's promise
    that every segment is part 0 of its document (packed single rows), so that the splash kernel
    (cfg.attention_impl, model/splash.py) can run them; shared-prefix parts keep the XLA attention.
    With a cache, the T tokens go to slots [cache.index, cache.index + T) and
    attend to valid slots <= their own (prefill and decode are the same call).
    The caller sizes the cache: index + T must not exceed its length (checked
    statically only for T; a traced index cannot be checked).
    """
    return self.hidden(self.embed(tokens_BT), positions_BT, mask_BT, cache, segments_BT,
                       documents_only=documents_only)


@functools.lru_cache(maxsize=64)
def graphdef(cfg: ModelConfig, unstacked: bool = False) -> nnx.GraphDef:
  """The Decoder's structure for `cfg` (stacked layers, or unstack_layers' form), without its arrays."""
  shapes = params_lib.param_shapes(cfg)
  if unstacked:
    layer = {name: jax.ShapeDtypeStruct(s.shape[1:], s.dtype) for name, s in shapes["layers"].items()}
    shapes = {**shapes, "layers": (layer,) * cfg.n_layers}
  return nnx.graphdef(Decoder(cfg, shapes))


def bind(params: dict, cfg: ModelConfig) -> Decoder:
  """The Decoder holding `params` (stacked, or unstack_layers' form): `nnx.merge` of its structure
  and the state. Inside a jitted function this costs nothing at run time."""
  layers = params["layers"]
  if isinstance(layers, (tuple, list)):
    return nnx.merge(graphdef(cfg, unstacked=True), {**params, "layers": dict(enumerate(layers))})
  return nnx.merge(graphdef(cfg), params)


def embed(params: dict, cfg: ModelConfig, tokens_BT: jax.Array) -> jax.Array:
  """Decoder.embed of the model holding `params`."""
  return bind(params, cfg).embed(tokens_BT)


def lm_head(params: dict, cfg: ModelConfig) -> jax.Array:
  """Decoder.lm_head of the model holding `params`: w_DV."""
  return bind(params, cfg).lm_head()


def logits(params: dict, cfg: ModelConfig, hidden_BTD: jax.Array) -> jax.Array:
  """Decoder.logits of the model holding `params`: logits_BTV in float32."""
  return bind(params, cfg).logits(hidden_BTD)


def forward_embeddings(params: dict, cfg: ModelConfig, x_BTD: jax.Array,
                       positions_BT: jax.Array, mask_BT: jax.Array,
                       cache: KVCache | None = None, segments_BT: jax.Array | None = None, *,
                       documents_only: bool = False) -> tuple[jax.Array, KVCache | None]:
  """Decoder.hidden of the model holding `params`: the stack from input embeddings. The form of
  `params["layers"]` picks the layer loop: a tuple of per-layer dicts runs unrolled, stacked
  [L, ...] arrays as a scan."""
  return bind(params, cfg).hidden(x_BTD, positions_BT, mask_BT, cache, segments_BT,
                                  documents_only=documents_only)


def forward(params: dict, cfg: ModelConfig, tokens_BT: jax.Array, positions_BT: jax.Array,
            mask_BT: jax.Array, cache: KVCache | None = None, segments_BT: jax.Array | None = None, *,
            documents_only: bool = False) -> tuple[jax.Array, KVCache | None]:
  """The model holding `params` called on tokens (Decoder.__call__): final-norm hidden states
  hidden_BTD (compute dtype) and the updated cache."""
  return bind(params, cfg)(tokens_BT, positions_BT, mask_BT, cache, segments_BT,
                           documents_only=documents_only)
