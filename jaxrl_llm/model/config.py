"""Model configuration: one frozen, validated dataclass plus named presets.

The config is hashable (it is a static argument of every jitted function), so
dtypes are stored as names ("float32", "bfloat16") and RoPE scaling as a small
frozen dataclass.
"""

from __future__ import annotations

import dataclasses
import jax.numpy as jnp

from jaxrl_llm.checks import DTYPES, bad, check_choice, check_float, check_int

REMAT_POLICIES = ("none", "full", "save_dots")
FAMILIES = ("llama", "qwen2", "qwen3", "gemma3")
ROPE_KINDS = ("linear", "llama3")
# Attention kinds of a layer, spelled as Hugging Face's `layer_types`: a
# global layer attends to every earlier token, a local (sliding-window) layer
# to the last `sliding_window` positions only.
LAYER_TYPES = ("full_attention", "sliding_attention")
# Activation of the gated MLP: SwiGLU (silu) or GeGLU with tanh-GELU
# (Hugging Face's "gelu_pytorch_tanh").
MLP_ACTS = ("silu", "gelu_tanh")
# The attention of a forward without a KV cache (model/splash.py): auto picks splash on a TPU target.
ATTENTION_IMPLS = ("auto", "xla", "splash")
# The projections LoRA can adapt (model/lora.py), by the names PEFT's target_modules use for Llama.
LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
# How LoRA's frozen base may be held (QLoRA): "none" as the params' dtype; int8 per output channel;
# int4 or nf4 (QLoRA's NormalFloat) in blocks of `quant_block` along each projection's input.
LORA_QUANTS = ("none", "int8", "int4", "nf4")
LORA_SCALINGS = ("standard", "rslora")


def pattern_layer_types(n_layers: int, pattern: int) -> tuple[str, ...]:
  """Every `pattern`-th layer global, the others local (Gemma 3: pattern 6,
  five local layers then one global), as Hugging Face expands the older
  `sliding_window_pattern` field: layer i is local iff (i + 1) % pattern != 0."""
  check_int("sliding_window_pattern", pattern, 1)
  return tuple("sliding_attention" if (i + 1) % pattern else "full_attention"
               for i in range(n_layers))


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """RoPE frequency scaling, as in Hugging Face's `rope_parameters`.

  kind="linear": every inverse frequency is divided by `factor` (position
  interpolation). kind="llama3": Llama 3.1's band-wise rule: wavelengths
  longer than original_max_position / low_freq_factor are divided by `factor`,
  shorter than original_max_position / high_freq_factor are kept, and the band
  in between is interpolated smoothly.
  """

  kind: str
  factor: float
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  original_max_position: int = 8192

  def __post_init__(self):
    check_choice("RopeScaling.kind", self.kind, ROPE_KINDS)
    check_float("RopeScaling.factor", self.factor, 0.0, low_open=True)
    check_float("RopeScaling.low_freq_factor", self.low_freq_factor, 0.0, low_open=True)
    check_float("RopeScaling.high_freq_factor", self.high_freq_factor, 0.0, low_open=True)
    check_int("RopeScaling.original_max_position", self.original_max_position, 1)
    if self.kind == "llama3" and not self.high_freq_factor > self.low_freq_factor:
      raise ValueError(
          "RopeScaling.high_freq_factor must be > low_freq_factor for kind='llama3', got "
          f"high={self.high_freq_factor!r}, low={self.low_freq_factor!r}")


@dataclasses.dataclass(frozen=True)
class LoraConfig:
  """Low-rank adapters on the decoder's projections (model/lora.py); rank 0: none.

  Each adapted projection W computes x W + s (x A) B, A over W's input axes and
  the rank, B over the rank and W's output axes; only A and B train.
    rank: r (0: no adapters, the full model trains).
    alpha: the numerator of the scaling s.
    scaling: "standard": s = alpha / r (Hu et al. 2021; PEFT's default);
      "rslora": s = alpha / sqrt(r) (Kalajdzievski 2023, rank-stabilised).
    targets: a subset of LORA_TARGETS (a comma-separated string is accepted).
    quant: the frozen base of the adapted projections held quantised through
      qwix (QLoRA, Dettmers et al. 2023): "none" | "int8" (a scale per output
      channel) | "int4" | "nf4" (a scale per block of `quant_block` inputs).
    quant_block: the block length along a projection's input axis (int4, nf4).
  """

  rank: int = 0
  alpha: float = 16.0
  scaling: str = "standard"
  targets: tuple[str, ...] | str = ",".join(LORA_TARGETS)  # a tuple once constructed
  quant: str = "none"
  quant_block: int = 64

  def __post_init__(self):
    if isinstance(self.targets, str):
      object.__setattr__(self, "targets", tuple(t.strip() for t in self.targets.split(",") if t.strip()))
    elif isinstance(self.targets, list):
      object.__setattr__(self, "targets", tuple(self.targets))
    check_int("config.model.lora.rank", self.rank, 0)
    check_float("config.model.lora.alpha", self.alpha, 0.0, low_open=True)
    check_choice("config.model.lora.scaling", self.scaling, LORA_SCALINGS)
    check_choice("config.model.lora.quant", self.quant, LORA_QUANTS)
    check_int("config.model.lora.quant_block", self.quant_block, 1)
    if not self.targets:
      raise bad("config.model.lora.targets", self.targets, f"allowed a non-empty subset of {LORA_TARGETS}")
    for t in self.targets:
      check_choice("config.model.lora.targets (an entry)", t, LORA_TARGETS)
    if len(set(self.targets)) != len(self.targets):
      raise bad("config.model.lora.targets", self.targets, "each projection at most once")
    if self.quant != "none" and not self.rank:
      raise bad("config.model.lora.quant", self.quant, "a quantised base needs adapters: set model.lora.rank >= 1")

  @property
  def active(self) -> bool:
    return self.rank > 0

  @property
  def scale(self) -> float:
    """s, the factor on (x A) B."""
    return self.alpha / (self.rank if self.scaling == "standard" else self.rank ** 0.5)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shape and numerics of a decoder-only transformer (Llama 3 / Qwen2 /
  Qwen3 / Gemma 3), each family a setting of these fields, not a subclass.

  Fields:
    vocab_size: V, rows of the embedding table.
    d_model: D, residual width.
    n_layers: L.
    n_heads: N, query heads. n_kv_heads: K, key/value heads (N % K == 0; GQA).
    head_dim: H (not necessarily D / N: Qwen3 uses 128 everywhere).
    d_ff: F, SwiGLU hidden width.
    rope_theta: RoPE base. rope_scaling: None or a RopeScaling.
    qkv_bias: biases on q/k/v projections (Qwen2). qk_norm: RMSNorm over H on
      q and k before RoPE (Qwen3).
    tie_embeddings: the output head is the embedding table transposed.
    norm_eps: RMSNorm epsilon.
    param_dtype: storage dtype of the params. compute_dtype: dtype the matmuls
      run in (norms, RoPE tables and the attention softmax stay in float32).
    remat: "none", "full" (recompute each layer in the backward pass) or
      "save_dots" (keep matmul outputs without batch dims, recompute the rest).
    max_position: longest position the model is meant for (exported to HF as
      max_position_embeddings; positions are not clamped to it).
    family: which Hugging Face architecture the weights export to.
    init_std: standard deviation of the normal init of the matrices.
    layer_types: None (every layer global) or one LAYER_TYPES entry per
      layer; a "sliding_attention" (local) layer's query at position p
      attends only to keys at positions p - sliding_window < p' <= p.
    sliding_window: the local layers' window W in positions (the query's
      own included, as Hugging Face's mask `kv > q - W`); set iff some layer
      is local.
    rope_local_theta: RoPE base of the local layers (Gemma's
      rope_local_base_freq; no scaling there); None: the local layers use
      rope_theta and rope_scaling like the global ones.
    mlp_act: "silu" (SwiGLU) or "gelu_tanh" (GeGLU, Gemma).
    norm_plus_one: every RMSNorm scales by (1 + w), multiplied in float32
      before the cast back (Gemma), instead of by w after it.
    sandwich_norm: the attention and MLP outputs are RMS-normalised again
      before the residual add (Gemma's post_attention / post_feedforward
      norms).
    embed_scale: token embeddings are multiplied by sqrt(d_model), the
      factor rounded to the compute dtype first as Hugging Face does.
    query_pre_attn_scalar: attention scores are scaled by its ** -0.5 (an
      int, as Hugging Face's config has it); None: by head_dim ** -0.5.
    attn_softcap: None, or c > 0: scores become c * tanh(scores / c) before
      the mask and softmax (Gemma 2's attn_logit_softcapping; Gemma 3 sets
      none, and transformers' Gemma3 ignores the field, so gemma3 import and
      export refuse it).
    lora: None, or the low-rank adapters on the projections (LoraConfig with
      rank >= 1; model/lora.py): the params then hold them beside the frozen
      base, the forward adds them, and only they train.
    attention_impl: the attention of a forward without a KV cache (the
      trainer's passes): "xla" (the dense reference), "splash" (jax's Pallas
      TPU splash attention kernel, model/splash.py) or "auto" (splash on a TPU
      target, else xla). Decoding always runs the XLA path.
  """

  vocab_size: int
  d_model: int
  n_layers: int
  n_heads: int
  n_kv_heads: int
  head_dim: int
  d_ff: int
  rope_theta: float = 10000.0
  rope_scaling: RopeScaling | None = None
  qkv_bias: bool = False
  qk_norm: bool = False
  tie_embeddings: bool = False
  norm_eps: float = 1e-6
  param_dtype: str = "float32"
  compute_dtype: str = "float32"
  remat: str = "none"
  max_position: int = 4096
  family: str = "llama"
  init_std: float = 0.02
  layer_types: tuple[str, ...] | None = None
  sliding_window: int | None = None
  rope_local_theta: float | None = None
  mlp_act: str = "silu"
  norm_plus_one: bool = False
  sandwich_norm: bool = False
  embed_scale: bool = False
  query_pre_attn_scalar: int | None = None
  attn_softcap: float | None = None
  lora: LoraConfig | None = None
  attention_impl: str = "auto"

  def __post_init__(self):
    for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads",
                 "head_dim", "d_ff", "max_position"):
      check_int(f"ModelConfig.{name}", getattr(self, name), 1)
    if self.n_heads % self.n_kv_heads:
      raise ValueError(
          f"ModelConfig.n_heads ({self.n_heads}) must be a multiple of n_kv_heads "
          f"({self.n_kv_heads}) for grouped-query attention")
    if self.head_dim % 2:
      raise ValueError(f"ModelConfig.head_dim must be even for RoPE, got {self.head_dim}")
    check_float("ModelConfig.rope_theta", self.rope_theta, 0.0, low_open=True)
    check_float("ModelConfig.norm_eps", self.norm_eps, 0.0, low_open=True)
    check_float("ModelConfig.init_std", self.init_std, 0.0, low_open=True)
    if self.rope_scaling is not None and not isinstance(self.rope_scaling, RopeScaling):
      raise TypeError(
          f"ModelConfig.rope_scaling must be None or a RopeScaling, got {self.rope_scaling!r}")
    for name in ("qkv_bias", "qk_norm", "tie_embeddings", "norm_plus_one", "sandwich_norm",
                 "embed_scale"):
      if not isinstance(getattr(self, name), bool):
        raise TypeError(f"ModelConfig.{name} must be a bool, got {getattr(self, name)!r}")
    check_choice("ModelConfig.param_dtype", self.param_dtype, DTYPES)
    check_choice("ModelConfig.compute_dtype", self.compute_dtype, DTYPES)
    check_choice("ModelConfig.remat", self.remat, REMAT_POLICIES)
    check_choice("ModelConfig.family", self.family, FAMILIES)
    check_choice("ModelConfig.mlp_act", self.mlp_act, MLP_ACTS)
    check_choice("ModelConfig.attention_impl", self.attention_impl, ATTENTION_IMPLS)
    if self.query_pre_attn_scalar is not None:
      check_int("ModelConfig.query_pre_attn_scalar", self.query_pre_attn_scalar, 1)
    if self.attn_softcap is not None:
      check_float("ModelConfig.attn_softcap", self.attn_softcap, 0.0, low_open=True)
    self._check_layer_types()
    if self.lora is not None and not (isinstance(self.lora, LoraConfig) and self.lora.active):
      raise bad("ModelConfig.lora", self.lora, "allowed None or a LoraConfig with rank >= 1")

  def _check_layer_types(self):
    if self.layer_types is not None:
      if isinstance(self.layer_types, list):  # e.g. straight from JSON; the config must hash
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
      if not isinstance(self.layer_types, tuple) or len(self.layer_types) != self.n_layers:
        raise bad("ModelConfig.layer_types", self.layer_types,
                  f"allowed None or a tuple of n_layers={self.n_layers} entries from {LAYER_TYPES}")
      for i, kind in enumerate(self.layer_types):
        check_choice(f"ModelConfig.layer_types[{i}]", kind, LAYER_TYPES)
    if self.has_local_layers:
      if self.sliding_window is None:
        raise bad("ModelConfig.sliding_window", None,
                  "layer_types has sliding_attention layers: set their window (an int >= 1)")
      check_int("ModelConfig.sliding_window", self.sliding_window, 1)
      if self.rope_local_theta is not None:
        check_float("ModelConfig.rope_local_theta", self.rope_local_theta, 0.0, low_open=True)
    else:
      for name in ("sliding_window", "rope_local_theta"):
        if getattr(self, name) is not None:
          raise bad(f"ModelConfig.{name}", getattr(self, name),
                    "allowed only with sliding_attention layers in layer_types (there are none)")

  # -- derived ---------------------------------------------------------------

  @property
  def param_jnp_dtype(self):
    return jnp.dtype(self.param_dtype)

  @property
  def compute_jnp_dtype(self):
    return jnp.dtype(self.compute_dtype)

  @property
  def group_size(self) -> int:
    """G: query heads per key/value head."""
    return self.n_heads // self.n_kv_heads

  @property
  def local_layers(self) -> tuple[bool, ...]:
    """Per layer: True for a local (sliding-window) layer."""
    if self.layer_types is None:
      return (False,) * self.n_layers
    return tuple(kind == "sliding_attention" for kind in self.layer_types)

  @property
  def has_local_layers(self) -> bool:
    return any(self.local_layers)

  @property
  def local_rope_differs(self) -> bool:
    """The local layers rotate with their own RoPE table (rope_local_theta)."""
    return self.has_local_layers and self.rope_local_theta is not None

  @property
  def attn_scale(self) -> float:
    """The factor on q.k: query_pre_attn_scalar ** -0.5, else head_dim ** -0.5."""
    scalar = self.head_dim if self.query_pre_attn_scalar is None else self.query_pre_attn_scalar
    return scalar ** -0.5

  def replace(self, **changes) -> "ModelConfig":
    return dataclasses.replace(self, **changes)

  def to_dict(self) -> dict:
    """JSON-ready dict (rope_scaling as a nested dict or None)."""
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: dict) -> "ModelConfig":
    """Inverse of to_dict; unknown keys are an error naming them."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
      raise ValueError(f"ModelConfig.from_dict: unknown fields {unknown}")
    d = dict(d)
    if isinstance(d.get("rope_scaling"), dict):
      d["rope_scaling"] = RopeScaling(**d["rope_scaling"])
    if isinstance(d.get("layer_types"), list):
      d["layer_types"] = tuple(d["layer_types"])
    if isinstance(d.get("lora"), dict):
      d["lora"] = LoraConfig(**d["lora"])
    return cls(**d)

  def num_params(self) -> int:
    """Exact parameter count (embedding counted once when tied)."""
    d, n, k, h, f = self.d_model, self.n_heads, self.n_kv_heads, self.head_dim, self.d_ff
    per_layer = d * n * h + 2 * d * k * h + n * h * d + 3 * d * f + 2 * d
    if self.qkv_bias:
      per_layer += n * h + 2 * k * h
    if self.qk_norm:
      per_layer += 2 * h
    if self.sandwich_norm:
      per_layer += 2 * d
    total = self.n_layers * per_layer + self.vocab_size * d + d
    if not self.tie_embeddings:
      total += d * self.vocab_size
    return total

  # -- presets ---------------------------------------------------------------

  @classmethod
  def preset(cls, name: str, **overrides) -> "ModelConfig":
    """The shape named `name` in `MODEL_PRESETS`, any field overridden
    (`vocab_size` is required for "tiny", which has none of its own)."""
    check_choice("ModelConfig.preset", name, MODEL_PRESETS)
    fields = {**MODEL_PRESETS[name], **overrides}
    if "vocab_size" not in fields:
      raise bad("ModelConfig.preset", name, "this preset has no vocabulary of its own: pass vocab_size=")
    return cls(**fields)

  @classmethod
  def tiny(cls, vocab_size: int, **overrides) -> "ModelConfig":
    """`preset("tiny")` over a tokenizer's vocabulary: tests and the built-in task."""
    return cls.preset("tiny", vocab_size=vocab_size, **overrides)


# What each family's published checkpoints share. Qwen2 / 2.5: q/k/v biases,
# RoPE base 1e6, 32k context. Qwen3: QK-norm instead of the biases, 40k
# context. Llama 3.1 / 3.2: RoPE base 5e5 with llama3 scaling, 128k context.
# Gemma 3 (text): GeGLU, (1 + w) sandwich norms and QK-norm, scaled tied
# embeddings, 1/sqrt(256) attention scaling, RoPE bases 1e6 (global) and 1e4
# (local), 32k context.
_QWEN2 = dict(rope_theta=1e6, qkv_bias=True, norm_eps=1e-6, max_position=32768, family="qwen2")
_QWEN3 = dict(rope_theta=1e6, qk_norm=True, norm_eps=1e-6, max_position=40960, family="qwen3")
_LLAMA3 = dict(rope_theta=500000.0, norm_eps=1e-5, max_position=131072, family="llama")
_GEMMA3 = dict(rope_theta=1e6, rope_local_theta=1e4, qk_norm=True, tie_embeddings=True,
               norm_eps=1e-6, max_position=32768, family="gemma3", mlp_act="gelu_tanh",
               norm_plus_one=True, sandwich_norm=True, embed_scale=True,
               query_pre_attn_scalar=256)

# Named shapes: name -> ModelConfig fields (`ModelConfig.preset(name, **overrides)`).
# The real ones are the published checkpoints' config.json, field for field.
MODEL_PRESETS: dict[str, dict] = {
    # ~0.8M params (plus V x 128 embedding): tests and the built-in task; no vocabulary
    # of its own (`ModelConfig.tiny(vocab_size)`).
    "tiny": dict(d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=32, d_ff=384,
                 tie_embeddings=True, max_position=2048),
    # A ~10M-param Qwen2-style model (q/k/v bias, tied): the sampler benchmark.
    "qwen2_10m": {**_QWEN2, **dict(vocab_size=8192, d_model=256, n_layers=10, n_heads=8, n_kv_heads=2,
                                   head_dim=32, d_ff=768, tie_embeddings=True, max_position=4096)},
    "qwen2_5_0_5b": dict(vocab_size=151936, d_model=896, n_layers=24, n_heads=14, n_kv_heads=2,
                         head_dim=64, d_ff=4864, tie_embeddings=True, **_QWEN2),
    "qwen2_5_1_5b": dict(vocab_size=151936, d_model=1536, n_layers=28, n_heads=12, n_kv_heads=2,
                         head_dim=128, d_ff=8960, tie_embeddings=True, **_QWEN2),
    "qwen2_5_7b": dict(vocab_size=152064, d_model=3584, n_layers=28, n_heads=28, n_kv_heads=4,
                       head_dim=128, d_ff=18944, tie_embeddings=False, **_QWEN2),
    "qwen3_0_6b": dict(vocab_size=151936, d_model=1024, n_layers=28, n_heads=16, n_kv_heads=8,
                       head_dim=128, d_ff=3072, tie_embeddings=True, **_QWEN3),
    "qwen3_32b": dict(vocab_size=151936, d_model=5120, n_layers=64, n_heads=64, n_kv_heads=8,
                      head_dim=128, d_ff=25600, tie_embeddings=False, **_QWEN3),
    "qwen3_8b": dict(vocab_size=151936, d_model=4096, n_layers=36, n_heads=32, n_kv_heads=8,
                     head_dim=128, d_ff=12288, tie_embeddings=False, **_QWEN3),
    # SmolLM2-135M (HuggingFaceTB/SmolLM2-135M[-Instruct]): Llama-style, tied, RoPE base 1e5.
    "smollm2_135m": dict(vocab_size=49152, d_model=576, n_layers=30, n_heads=9, n_kv_heads=3, head_dim=64,
                         d_ff=1536, tie_embeddings=True, rope_theta=100000.0, norm_eps=1e-5, max_position=8192,
                         family="llama"),
    "llama3_2_1b": dict(vocab_size=128256, d_model=2048, n_layers=16, n_heads=32, n_kv_heads=8,
                        head_dim=64, d_ff=8192, rope_scaling=RopeScaling("llama3", 32.0, 1.0, 4.0, 8192),
                        tie_embeddings=True, **_LLAMA3),
    "llama3_1_8b": dict(vocab_size=128256, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8,
                        head_dim=128, d_ff=14336, rope_scaling=RopeScaling("llama3", 8.0, 1.0, 4.0, 8192),
                        tie_embeddings=False, **_LLAMA3),
    # Gemma 3 270M (google/gemma-3-270m): 268,098,176 params, 170M of them embedding.
    "gemma3_270m": dict(vocab_size=262144, d_model=640, n_layers=18, n_heads=4, n_kv_heads=1,
                        head_dim=256, d_ff=2048, sliding_window=512,
                        layer_types=pattern_layer_types(18, 6), **_GEMMA3),
    # Gemma 3 1B (google/gemma-3-1b-pt / -it), text only.
    "gemma3_1b": dict(vocab_size=262144, d_model=1152, n_layers=26, n_heads=4, n_kv_heads=1,
                      head_dim=256, d_ff=6912, sliding_window=512,
                      layer_types=pattern_layer_types(26, 6), **_GEMMA3),
}


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """The run config's `model` section: a Hugging Face checkpoint, or the shape
  of a fresh model of the built-in family (`build` derives its ModelConfig).

  With `hf_path` set the architecture comes from the checkpoint and only the
  numerics (dtypes, remat) apply; the shape fields are ignored.
  """

  hf_path: str
  d_model: int
  n_layers: int
  n_heads: int
  n_kv_heads: int
  d_ff: int
  param_dtype: str
  compute_dtype: str
  remat: str
  vocab_multiple: int
  attention_impl: str  # ModelConfig.attention_impl: auto | xla | splash (model/splash.py)
  lora: LoraConfig = LoraConfig()  # model/lora.py; rank 0: the full model trains

  def __post_init__(self):
    for f in ("d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "vocab_multiple"):
      check_int(f"config.model.{f}", getattr(self, f), 1)
    if self.d_model % self.n_heads:
      raise bad("config.model.d_model", self.d_model, f"must be a multiple of model.n_heads={self.n_heads}")
    if self.n_heads % self.n_kv_heads:
      raise bad("config.model.n_heads", self.n_heads, f"must be a multiple of model.n_kv_heads={self.n_kv_heads}")
    check_choice("config.model.param_dtype", self.param_dtype, DTYPES)
    check_choice("config.model.compute_dtype", self.compute_dtype, DTYPES)
    check_choice("config.model.remat", self.remat, REMAT_POLICIES + ("auto",))
    check_choice("config.model.attention_impl", self.attention_impl, ATTENTION_IMPLS)

  @property
  def remat_policy(self) -> str:
    """`remat`, with "auto" resolved: "full" for a checkpoint (real models' activations
    dominate memory), "none" for the tiny model (recompute would only cost time)."""
    if self.remat != "auto":
      return self.remat
    return "full" if self.hf_path else "none"

  def build(self, vocab_size: int) -> ModelConfig:
    """The ModelConfig of a fresh model of this shape (`ModelConfig.tiny`'s family),
    its vocabulary the tokenizer's `vocab_size` rounded up to `vocab_multiple`
    (as Megatron's make-vocab-size-divisible-by; the sampler never samples the
    padded ids, `SamplingConfig.vocab_limit`)."""
    vocab_size = -(-vocab_size // self.vocab_multiple) * self.vocab_multiple
    return ModelConfig.tiny(vocab_size, d_model=self.d_model, n_layers=self.n_layers, n_heads=self.n_heads,
                            n_kv_heads=self.n_kv_heads, head_dim=self.d_model // self.n_heads, d_ff=self.d_ff,
                            param_dtype=self.param_dtype, compute_dtype=self.compute_dtype, remat=self.remat_policy,
                            attention_impl=self.attention_impl)

