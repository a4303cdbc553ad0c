"""The trainer's full-sequence attention through jax's Pallas TPU splash attention kernel
(`jax.experimental.pallas.ops.tpu.splash_attention`, jax 0.10.2): block-sparse, never holding a
[T, T] score matrix, forward and backward in Mosaic kernels.

`model.attention_impl` (ModelConfig.attention_impl) picks the attention of a forward without a
KV cache (the update, the pi_prox / reference / teacher recomputes, SFT, reward models):

- "xla": `layers.attention` over the dense [B, T, S] mask (model/visibility.py): the reference.
- "splash": this module; on a TPU target the compiled kernels, elsewhere the same kernels in
  Pallas's interpreter (slow: for tests).
- "auto": "splash" when the platform the computation targets is a TPU (`kernels.target`: the
  devices of the mesh in context, as `kernels.impl` decides) and a row holds at least 128 tokens
  (one tile), else "xla", so CPU and GPU runs are unchanged.
A forward with a cache (prefill, the decode loop) always runs the XLA attention.

What splash expresses, and how (`splash_attention`):
- causal over slots: the static `CausalMask`; a sliding-window layer (Gemma 3's local layers, window
  W): `LocalMask` with window (W - 1, 0), q - W < k <= q in *slots*. The model's window is in
  *positions* (model/visibility.py); the two agree when each row's (document's) real tokens sit in
  consecutive slots with consecutive positions, as in the padded layout with a left-padded prompt
  and a response cut at its end, and a packed document of one part. A row whose attended tokens
  have holes (a masked token between real ones) sees fewer than W positions in its window on a
  local layer under splash: the XLA path stays exact there.
- padding and documents: `SegmentIds`, the same ids for queries and keys: a real token gets its
  segment (0 without segments), a padding token -1. A real query then sees only real keys of its
  own segment; a padding query sees earlier padding keys (so no row of the kernel is empty, which
  its softmax cannot take) and its output is zeroed afterwards; its cotangent is then zero, so it
  passes no gradient to any key or value. (The XLA path returns zeros for a query with no real key
  before it and lets a later padding query read the real keys before it: padding outputs differ,
  and weigh zero in every loss.)
- a shared prompt (segment parts, `visibility.segment_id(doc, part)` with parts > 0: part g sees
  part 0 and itself) is not an equality of segment ids: those forwards keep the XLA path.
  `model.forward(..., documents_only=True)` is the caller's word that every segment is part 0 of
  its document (the packing of single rows, `Packing.group == 1`); without it a forward with
  segments keeps the XLA path (the padded shared-prompt layout, packed groups).
- GQA (K < N kv heads): the MQA kernel once per KV head, its G = N / K query heads sharing that
  head's keys and values (no repeat of K or V); MHA is the case G = 1.
- the scale: q is multiplied by it before the kernel (splash does not scale); soft-capping (Gemma 2)
  is the kernel's `attn_logits_soft_cap`, c * tanh(s / c) on the scaled scores as in the XLA path.

Blocks. One rule on every generation (v4 .. 7x): T is padded to a multiple of 128 (a TPU tile's
lanes) and the block is the largest of 512, 256, 128 dividing it, for the forward, dq and dkv
kernels alike (`block_size`; 512 is MaxText's splash default on v5e / v5p / v6e; a 512 x 512 f32
score tile is 1 MiB, inside v4's 16 MiB of VMEM). Untuned: no TPU timing backs it yet. The padded
slots are padding tokens (segment -1) and are sliced off the output.

Sharding. A Mosaic kernel is one custom call that XLA cannot partition, so on a mesh of more than
one device the op runs per device inside `shard_map`, as the vocabulary kernels do
(kernels/sharded.py): rows over the batch axes (data, fsdp) when they divide B, heads over the
"heads" axis (tensor) when it divides both N and K; else whole on every device of those axes.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.tpu import splash_attention as sa
from jax.sharding import PartitionSpec as P

from jaxrl_llm.checks import check_choice
from jaxrl_llm.kernels.target import target_platform
from jaxrl_llm.model.config import ATTENTION_IMPLS

BLOCKS = (512, 256, 128)  # splash's block candidates, largest first (module docstring, "Blocks")
LANES = 128  # T is padded to a multiple of this


def resolve_attention(impl: str, T: int) -> str:
  """"xla" or "splash" for `model.attention_impl` = impl on T tokens per row, by the platform the
  computation targets. auto keeps XLA below T = 128: the kernel would pad the rows to one 128-lane
  tile, more work than the small [T, T] scores it saves."""
  check_choice("model.attention_impl", impl, ATTENTION_IMPLS)
  if impl == "auto":
    return "splash" if target_platform() == "tpu" and T >= LANES else "xla"
  return impl


def block_size(T: int) -> tuple[int, int]:
  """(block, padded T): T rounded up to a multiple of 128, and the largest of 512, 256, 128 dividing it."""
  padded = -(-T // LANES) * LANES
  return next(b for b in BLOCKS if padded % b == 0), padded


def _kernel(T: int, G: int, window: int | None, block: int, softcap: float | None, interpret: bool):
  """The MQA splash kernel over G query heads sharing one KV head, causal or local, T slots.

  Built afresh in each trace: its block tables become arrays of the trace (inside shard_map, of its
  manual mesh), so a kernel kept across traces would carry one mesh into another's program. The
  numpy work behind the tables is cached by splash itself (`_process_mask`)."""
  if window is None:
    mask = sa.CausalMask((T, T))
  else:
    mask = sa.LocalMask((T, T), window_size=(window - 1, 0), offset=0)
  blocks = sa.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                         block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
  return sa.make_splash_mqa_single_device(sa.MultiHeadMask([mask] * G), block_sizes=blocks,
                                          attn_logits_soft_cap=softcap, interpret=interpret)


def _per_device(q_BTNH, k_BTKH, v_BTKH, seg_BT, *, window, softcap, interpret):
  """The kernel on this device's rows and heads: one MQA call per (row, KV head)."""
  B, T, N, H = q_BTNH.shape
  K = k_BTKH.shape[2]
  G = N // K
  block, Tp = block_size(T)
  if Tp > T:  # padded slots are padding tokens (segment -1), sliced off below
    pad = ((0, 0), (0, Tp - T), (0, 0), (0, 0))
    q_BTNH, k_BTKH, v_BTKH = jnp.pad(q_BTNH, pad), jnp.pad(k_BTKH, pad), jnp.pad(v_BTKH, pad)
    seg_BT = jnp.pad(seg_BT, ((0, 0), (0, Tp - T)), constant_values=-1)
  kernel = _kernel(Tp, G, window, block, softcap, interpret)
  q_BKGTH = jnp.transpose(q_BTNH.reshape(B, Tp, K, G, H), (0, 2, 3, 1, 4))
  k_BKTH, v_BKTH = jnp.transpose(k_BTKH, (0, 2, 1, 3)), jnp.transpose(v_BTKH, (0, 2, 1, 3))

  def one(q_GTH, k_TH, v_TH, seg_T):
    return kernel(q_GTH, k_TH, v_TH, sa.SegmentIds(q=seg_T, kv=seg_T))

  out_BKGTH = jax.vmap(jax.vmap(one, in_axes=(0, 0, 0, None)))(q_BKGTH, k_BKTH, v_BKTH, seg_BT)
  return jnp.transpose(out_BKGTH, (0, 3, 1, 2, 4)).reshape(B, Tp, N, H)[:, :T]


def _specs(mesh, B: int, N: int, K: int):
  """(q / k / v / output spec, segment spec) of the per-device map (module docstring, "Sharding");
  rows that the batch axes do not divide are whole on every device."""
  from jaxrl_llm.model.sharding import BATCH_AXES, LOGICAL_RULES  # pylint: disable=import-outside-toplevel

  batch = tuple(a for a in BATCH_AXES if a in mesh.axis_names)
  if B % math.prod(mesh.shape[a] for a in batch):
    batch = None
  heads = LOGICAL_RULES["heads"]
  if heads not in mesh.axis_names or N % mesh.shape[heads] or K % mesh.shape[heads]:
    heads = None
  return P(batch, None, heads, None), P(batch, None)


def splash_attention(q_BTNH: jax.Array, k_BTKH: jax.Array, v_BTKH: jax.Array, mask_BT: jax.Array,
                     segments_BT: jax.Array | None = None, *, window: int | None = None,
                     scale: float | None = None, softcap: float | None = None,
                     interpret: bool | None = None) -> jax.Array:
  """Softmax(q k^T * scale) v, causal over slots, within each segment, over real tokens; GQA.

  mask_BT: the real tokens. segments_BT (int32, optional): a document id per slot; a query sees only
  keys of its own id (plain equality: no shared-prefix parts, module docstring). window: a local
  layer's W (q - W < k <= q in slots), None for a global layer. scale defaults to 1 / sqrt(H);
  softcap c: c * tanh(scores / c). interpret: None compiles the kernels on a TPU target and
  interprets them elsewhere. A padding query returns zeros. -> out_BTNH in q's dtype.
  """
  B, T, N, H = q_BTNH.shape
  K = k_BTKH.shape[2]
  if N % K:
    raise ValueError(f"splash_attention: {N} query heads are not a multiple of {K} KV heads")
  if interpret is None:
    interpret = target_platform() != "tpu"
  scale = H ** -0.5 if scale is None else scale
  q_BTNH = (q_BTNH.astype(jnp.float32) * scale).astype(q_BTNH.dtype)
  seg_BT = jnp.zeros((B, T), jnp.int32) if segments_BT is None else segments_BT.astype(jnp.int32)
  seg_BT = jnp.where(mask_BT, seg_BT, -1)
  fn = functools.partial(_per_device, window=window, softcap=softcap, interpret=bool(interpret))
  mesh = jax.sharding.get_abstract_mesh()
  if not mesh.empty and math.prod(mesh.shape.values()) > 1:
    spec, seg_spec = _specs(mesh, B, N, K)
    # Unchecked: splash's pallas_calls declare outputs without the varying axes check_vma needs.
    fn = jax.shard_map(fn, mesh=mesh, in_specs=(spec, spec, spec, seg_spec), out_specs=spec, check_vma=False)
  out_BTNH = fn(q_BTNH, k_BTKH, v_BTKH, seg_BT)
  return jnp.where(mask_BT[:, :, None, None], out_BTNH, 0).astype(q_BTNH.dtype)


def splash_attention_reference(q_BTNH: jax.Array, k_BTKH: jax.Array, v_BTKH: jax.Array, mask_BT: jax.Array,
                               segments_BT: jax.Array | None = None, *, window: int | None = None,
                               scale: float | None = None, softcap: float | None = None,
                               interpret: bool | None = None) -> jax.Array:
  """`splash_attention` in plain jnp (the dense mask and `layers.attention`): the test oracle.
  interpret is unused."""
  from jaxrl_llm.model import layers  # pylint: disable=import-outside-toplevel

  del interpret
  T = q_BTNH.shape[1]
  slots_T = np.arange(T)
  allowed_BTS = mask_BT[:, None, :] & mask_BT[:, :, None] & (slots_T[None, :] <= slots_T[:, None])[None]
  if window is not None:
    allowed_BTS = allowed_BTS & (slots_T[:, None] - slots_T[None, :] < window)[None]
  if segments_BT is not None:
    allowed_BTS = allowed_BTS & (segments_BT[:, :, None] == segments_BT[:, None, :])
  return layers.attention(q_BTNH, jnp.transpose(k_BTKH, (0, 2, 3, 1)), jnp.transpose(v_BTKH, (0, 2, 1, 3)),
                          allowed_BTS, scale=scale, softcap=softcap)
