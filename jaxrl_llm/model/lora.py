"""LoRA and QLoRA: low-rank adapters on the decoder's projections, held in the params dict.

With `cfg.lora` (a LoraConfig of rank r), each adapted projection W of a layer (q, k, v, o, gate,
up, down) gets two factors beside it in `params["layers"]`, stacked over layers like W:

    A over W's input axes and r     wq_LDNH -> wq_lora_a_LDR,   wo_LNHD -> wo_lora_a_LNHR
    B over r and W's output axes               wq_lora_b_LRNH,             wo_lora_b_LRD

and the projection computes  x W + s (x A) B  with s = alpha / r (or alpha / sqrt(r), rsLoRA):
Hu et al. 2021, eq. 3, never forming W + s A B. A starts as PEFT's default (Kaiming-uniform with
a = sqrt(5): U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in the product of W's input axes) and B at
zero, so the adapted model starts equal to the base, bit for bit.

QLoRA (`cfg.lora.quant`): each adapted W is held quantised by qwix (`qwix.quantize`): its values
under W's own name in int8 / int4 / uint4 (nf4), and its scales as `<name>_scale_...` (wq_LDNH ->
wq_scale_LDNH, a scale per output channel for int8, per block of `quant_block` inputs for int4 /
nf4). The forward dequantises one layer at a time (`dequantize_layer`, `qwix.dequantize`).

Why not qwix's LoRA provider: it adds adapters by intercepting the matmuls of Flax modules and
finding their weights among the module's params, and our layers are stacked arrays run by
`lax.scan`; qwix 0.1.8's `apply_lora_to_model` fails on an `nnx.scan` over stacked layers
(IndexError in the scan, measured) and works only on an unrolled list of layers. The adapters
here are entries of the same params dict, so the scan, the decode loop's unstacked layers, the
sharding table, checkpoints and `jax.grad` see them like any other weight; qwix does the
quantisation.

Training (`partition` / `join`): the update differentiates and optimises only the adapters
(the optimizer state holds only them); the frozen base, shared by reference, is what `base`
returns: the KL reference with no second copy of the weights. `merged` folds the adapters into
W (dequantised) for export and for engines that take plain weights.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import qwix

from jaxrl_llm.checks import ConfigError
from jaxrl_llm.model.config import LoraConfig, ModelConfig

# Target -> (the stacked weight's name, its per-layer einsum: input, weight -> output).
PROJECTIONS = {
    "q": ("wq_LDNH", "BTD,DNH->BTNH"),
    "k": ("wk_LDKH", "BTD,DKH->BTKH"),
    "v": ("wv_LDKH", "BTD,DKH->BTKH"),
    "o": ("wo_LNHD", "BTNH,NHD->BTD"),
    "gate": ("w_gate_LDF", "BTD,DF->BTF"),
    "up": ("w_up_LDF", "BTD,DF->BTF"),
    "down": ("w_down_LFD", "BTF,FD->BTD"),
}
_ADAPTER = "_lora_"  # in the name of every adapter factor
_SCALE = "_scale_"  # in the name of every quantisation scale
_QTYPES = {"int8": jnp.int8, "int4": jnp.int4, "nf4": "nf4"}


def _split(name: str) -> tuple[str, str]:
  """'wq_LDNH' -> ('wq', 'LDNH')."""
  stem, axes = name.rsplit("_", 1)
  return stem, axes


def _io_axes(einsum: str) -> tuple[str, str]:
  """The weight's input (contracted) and output axes of a per-layer einsum: 'BTD,DNH->BTNH' -> ('D', 'NH')."""
  lhs, rest = einsum.split(",")
  rhs = rest.split("->")[0]
  return "".join(a for a in rhs if a in lhs), "".join(a for a in rhs if a not in lhs)


def adapter_names(target: str) -> tuple[str, str]:
  """The stacked names of a target's A and B: 'q' -> ('wq_lora_a_LDR', 'wq_lora_b_LRNH')."""
  weight, einsum = PROJECTIONS[target]
  stem, _ = _split(weight)
  ins, outs = _io_axes(einsum)
  return f"{stem}_lora_a_L{ins}R", f"{stem}_lora_b_LR{outs}"


def scale_name(weight: str) -> str:
  """'wq_LDNH' -> 'wq_scale_LDNH'."""
  stem, axes = _split(weight)
  return f"{stem}{_SCALE}{axes}"


def is_adapter(name: str) -> bool:
  return _ADAPTER in name


def adapter_specs(cfg: ModelConfig, dims: dict[str, int], weight_axes: dict[str, tuple]) -> dict:
  """{name: (shape, logical axes, init)} of every adapter factor and quantisation scale of `cfg`
  (model/params.py adds them to the parameter table). dims: axis letter -> size."""
  lo = cfg.lora
  out = {}
  for target in lo.targets:
    weight, einsum = PROJECTIONS[target]
    ins, outs = _io_axes(einsum)
    axes = dict(zip(_split(weight)[1], weight_axes[weight]))  # letter -> logical axis
    a, b = adapter_names(target)
    out[a] = ((dims["L"], *(dims[c] for c in ins), lo.rank), ("layers", *(axes[c] for c in ins), None), "lora_a")
    out[b] = ((dims["L"], lo.rank, *(dims[c] for c in outs)), ("layers", None, *(axes[c] for c in outs)), "zeros")
    if lo.quant != "none":
      shape, scale_axes = [], []
      for c in _split(weight)[1]:
        if c in ins:  # one scale per block of inputs (int8: per output channel, the inputs' axes size 1)
          shape.append(1 if lo.quant == "int8" else dims[c] // _block(lo, c, dims[c]))
          scale_axes.append(None)
        else:
          shape.append(dims[c])
          scale_axes.append(axes[c])
      out[scale_name(weight)] = (tuple(shape), tuple(scale_axes), "scale")
  return out


def quantised_weights(cfg: ModelConfig) -> tuple[str, ...]:
  """The stacked names of the weights `cfg` holds quantised (none without QLoRA)."""
  if cfg.lora is None or cfg.lora.quant == "none":
    return ()
  return tuple(PROJECTIONS[t][0] for t in cfg.lora.targets)


def quant_dtype(cfg: ModelConfig):
  """The storage dtype of a quantised weight's values: nf4's 4-bit codes (qwix: uint4, 0..15) are
  stored as int4, code - 8, since checkpoints (tensorstore) hold int4 but not uint4."""
  return {"int8": jnp.int8, "int4": jnp.int4, "nf4": jnp.int4}[cfg.lora.quant]


def _stored(quant: str, qvalue: jax.Array) -> jax.Array:
  if quant != "nf4":
    return qvalue
  return (qvalue.astype(jnp.int8) - 8).astype(jnp.int4)


def _qarray(quant: str, values: jax.Array, scale: jax.Array):
  """The qwix QArray of a stored weight (values, scales)."""
  if quant == "nf4":
    values = (values.astype(jnp.int8) + 8).astype(jnp.uint4)
  return qwix.QArray(values, scale.astype(jnp.float32), qtype=_QTYPES[quant])


def _block(lo: LoraConfig, axis: str, size: int) -> int:
  """The block length along input axis `axis` of length `size` (int4 / nf4): min(quant_block, size)
  on the width axes (D, F, and H: a head's inputs to o); the o projection's N axis gets a scale per head."""
  if axis == "N":
    return 1
  block = min(lo.quant_block, size)
  if size % block:
    raise ConfigError(f"config.model.lora.quant_block={lo.quant_block} does not divide the {axis} axis "
                     f"({size}) of a projection's input: allowed a divisor of it")
  return block


def init_adapter(key: jax.Array, shape: tuple[int, ...], dtype) -> jax.Array:
  """A's init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = the product of the input axes
  (PEFT's kaiming_uniform_(a=sqrt(5)) on its lora_A)."""
  fan_in = math.prod(shape[1:-1])
  bound = 1.0 / math.sqrt(fan_in)
  return jax.random.uniform(key, shape, jnp.float32, -bound, bound).astype(dtype)


def quantise(cfg: ModelConfig, weight: str, w: jax.Array) -> tuple[jax.Array, jax.Array]:
  """-> (values, scales) of stacked weight `weight` held as cfg.lora.quant says (qwix)."""
  lo = cfg.lora
  _, einsum = PROJECTIONS[next(t for t in lo.targets if PROJECTIONS[t][0] == weight)]
  ins, _ = _io_axes(einsum)
  letters = _split(weight)[1]
  channel = tuple(i for i, c in enumerate(letters) if c not in ins)
  tiles = {}
  if lo.quant != "int8":
    for i, c in enumerate(letters):
      if c in ins:
        tiles[i] = _block(lo, c, w.shape[i])
  channel = channel + tuple(i for i, t in tiles.items() if t == 1)
  tiles = {i: t for i, t in tiles.items() if t > 1}
  q = qwix.quantize(w.astype(jnp.float32), _QTYPES[lo.quant], channelwise_axes=channel, tiled_axes=tiles or None)
  return _stored(lo.quant, q.qvalue), q.scale


def dequantize_layer(cfg: ModelConfig, p: dict) -> dict:
  """One layer's params (axis-stripped names) with every quantised weight dequantised to float32
  (qwix.dequantize) and its scale entry dropped; unchanged without QLoRA."""
  if cfg.lora is None or cfg.lora.quant == "none":
    return p
  out = {}
  for name, value in p.items():
    if _SCALE in name:
      continue
    scale = p.get(scale_name(name))
    if scale is not None:
      value = qwix.dequantize(_qarray(cfg.lora.quant, value, scale))
    out[name] = value
  return out


def project(cfg: ModelConfig, einsum: str, x: jax.Array, p: dict, weight: str) -> jax.Array:
  """x W (per-layer `weight`, e.g. 'wq_DNH', of the layer's params `p`), plus s (x A) B when `p`
  holds that projection's adapters."""
  y = jnp.einsum(einsum, x, p[weight])
  if cfg.lora is None:
    return y
  stem, _ = _split(weight)
  ins, outs = _io_axes(einsum)
  a = p.get(f"{stem}_lora_a_{ins}R")
  if a is None:
    return y
  b = p[f"{stem}_lora_b_R{outs}"]
  lhs, out = einsum.split(",")[0], einsum.split("->")[1]
  kept = "".join(c for c in lhs if c not in ins)
  xa = jnp.einsum(f"{lhs},{ins}R->{kept}R", x, a)
  delta = jnp.einsum(f"{kept}R,R{outs}->{out}", xa, b)
  return y + jnp.asarray(cfg.lora.scale, delta.dtype) * delta


# ---- the params dict: adapters, base, merge --------------------------------------------------

def has_adapters(params: dict) -> bool:
  layers = params.get("layers")
  return isinstance(layers, dict) and any(is_adapter(n) for n in layers)


def partition(params: dict) -> tuple[dict, dict | None]:
  """-> (trainable, frozen): the adapters and the rest, each a dict of the params' shape with the
  other's entries left out; (params, None) for a model without adapters (the whole model trains)."""
  if not has_adapters(params):
    return params, None
  layers = params["layers"]
  trainable = {"layers": {n: v for n, v in layers.items() if is_adapter(n)}}
  frozen = {**{k: v for k, v in params.items() if k != "layers"},
            "layers": {n: v for n, v in layers.items() if not is_adapter(n)}}
  return trainable, frozen


def join(trainable: dict, frozen: dict | None) -> dict:
  """The inverse of `partition`."""
  if frozen is None:
    return trainable
  return {**frozen, "layers": {**frozen["layers"], **trainable["layers"]}}


def trainable(params: dict) -> dict:
  """What the optimizer updates: the adapters, or the whole model without them."""
  return partition(params)[0]


def base(params: dict) -> dict:
  """The params without their adapters (the same arrays, no copy): the base model, the KL
  reference of a LoRA run."""
  _, frozen = partition(params)
  return params if frozen is None else frozen


def base_config(cfg: ModelConfig) -> ModelConfig:
  return cfg if cfg.lora is None else cfg.replace(lora=None)


def merged(params: dict, cfg: ModelConfig) -> tuple[dict, ModelConfig]:
  """-> (params, cfg) of the plain model the adapters make: W + s A B for each adapted W
  (dequantised first under QLoRA), in the params' dtype, with no adapter or scale entries. What
  export and engines that take plain weights see; the forward of the result equals the adapted
  forward up to rounding."""
  if cfg.lora is None:
    return params, cfg
  layers = dict(params["layers"])
  dtype = cfg.param_jnp_dtype
  for target in cfg.lora.targets:
    weight, einsum = PROJECTIONS[target]
    w = layers[weight]
    if scale_name(weight) in layers:
      w = qwix.dequantize(_qarray(cfg.lora.quant, w, layers.pop(scale_name(weight))))
    a_name, b_name = adapter_names(target)
    a, b = layers.pop(a_name), layers.pop(b_name)
    ins, outs = _io_axes(einsum)
    delta = jnp.einsum(f"L{ins}R,LR{outs}->L{ins}{outs}", a.astype(jnp.float32), b.astype(jnp.float32))
    # The weight's own axis order (wo_LNHD is L, ins, outs already; every projection here is).
    layers[weight] = (w.astype(jnp.float32) + cfg.lora.scale * delta).astype(dtype)
  return {**params, "layers": layers}, base_config(cfg)


def attach(params: dict, cfg: ModelConfig, key: jax.Array) -> dict:
  """The base `params` (of `base_config(cfg)`) with `cfg`'s adapters added (A at PEFT's init,
  B = 0) and, under QLoRA, the adapted weights quantised. Unplaced: the caller places the result
  (model.sharding.param_shardings(cfg, mesh))."""
  if cfg.lora is None:
    return params
  layers = dict(params["layers"])
  for weight in quantised_weights(cfg):
    layers[weight], layers[scale_name(weight)] = quantise(cfg, weight, layers[weight])
  keys = jax.random.split(key, len(cfg.lora.targets))
  for k, target in zip(keys, cfg.lora.targets):
    weight, einsum = PROJECTIONS[target]
    ins, _ = _io_axes(einsum)
    shape = params["layers"][weight].shape  # (L, inputs..., outputs...)
    a_name, b_name = adapter_names(target)
    layers[a_name] = init_adapter(k, (*shape[:1 + len(ins)], cfg.lora.rank), cfg.param_jnp_dtype)
    layers[b_name] = jnp.zeros((shape[0], cfg.lora.rank, *shape[1 + len(ins):]), cfg.param_jnp_dtype)
  return {**params, "layers": layers}
