"""The vocabulary ops with the output head split over a mesh axis (tensor parallel).

With a mesh axis over the vocabulary, device s holds the columns
[s * V_s, (s + 1) * V_s) of ``w_DV``. Gathering the whole head on every device
is exactly the memory the streaming ops exist to save, so instead each op runs
per shard, inside ``shard_map``, on its own slice, and the shards' partial
results are combined exactly:

- log-sum-exp: lse = m + log sum_s exp(lse_s - m), with m = max_s lse_s
  (a stop-gradient stabiliser: the value and gradient do not depend on it);
- the target logit comes from the one shard that owns the target id
  (z_y = logp_s(y) + lse_s there, summed over shards with zeros elsewhere);
  an id no shard owns (outside [0, V)) gives NaN, as the unsharded op does
  under jit;
- expectations under p mix the shards' local expectations with the weights
  exp(lse_s - lse): E_p[z] = sum_s exp(lse_s - lse) E_{p_s}[z], which gives the
  entropy H = lse - E_p[z];
- top-k: each shard's top min(K, V_s) (as global ids and logits) are
  gathered and the K largest of the candidates kept (ties to the lower id, as
  unsharded);
- cross terms against q (``vocab_cross``): the same mixing on both sides, with
  q's per-shard log-normaliser; top-k cross terms (``vocab_cross_topk``) reduce
  to ``gather_logprobs`` and so to the rules above.

Everything is a differentiable function of the per-shard ops' outputs (whose
``custom_vjp`` recomputes logits tile by tile), so forward and backward are
exact: the gradient of ``w_DV`` stays on its shard, and the gradient of the
row inputs is summed over the vocabulary axis by ``shard_map``'s transpose.

Costs: ``token_logprobs`` and ``gather_logprobs`` stream each shard once, as
unsharded; ``vocab_topk`` streams twice (its top-k, then ``gather_logprobs``
at those ids for the shard's log-normaliser); ``vocab_cross`` streams three
times (the cross terms, then p's and q's log-normalisers), so on S shards it
costs 3 / S of the unsharded stream per device. Fusing the normalisers into
the ops' outputs would bring both to one pass.

Rows (tokens) are split over ``row_axes`` (data parallel) and must divide by
their size (``VocabOps`` pads them to a multiple, masked). The trainable head
``w_DV`` enters as P(embed_axis, vocab_axis) when ``embed_axis`` (fsdp) splits
its D rows, and is gathered along D inside the map, never along V: the
transpose of that gather is a reduce-scatter, so its gradient leaves split
along D as the param is. A head entering whole along D (P(None, vocab_axis),
as before embed_axis) is gathered by XLA before the map instead, and its
gradient is all-reduced whole over fsdp and then sliced: in the GSPO update
compiled for v5p (fsdp 2 x tensor 2, and fsdp 4 with the kernels per row
shard) one f32 all-reduce of the [D, V / tensor] gradient, now one
reduce-scatter (tests/kernels/test_tpu_compile.py; with the chunked XLA loop
XLA still emits it as an all-reduce over the 2 fsdp devices). q's head
(``vocab_cross``'s ``w_q_EV``, stop-gradient, often a sampler's head held
whole along E) enters as P(None, vocab_axis).

Without a vocabulary split (vocabulary axis of size 1), ``VocabOps`` runs the
plain op, except for the Pallas kernels on a mesh of more than one device: a
Mosaic (or Triton) kernel is one custom call that XLA cannot partition
("Mosaic kernels cannot be automatically partitioned"), so rows arriving
split over data / fsdp need the op run per row shard inside ``shard_map``
(``rows_sharded``), with the whole head on every device, as the plain op
would see it (the kernels stream whole (D, block_v) columns), gathered along
D inside as above.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh, PartitionSpec as P

from jaxrl_llm.kernels.config import VocabTiles, check_hidden_w, check_mask, check_temperature, resolve_impl
from jaxrl_llm.kernels.token_logprobs import TokenLogprobs, gather_logprobs, token_logprobs
from jaxrl_llm.kernels.vocab_cross import VocabCross, apply_mask, vocab_cross
from jaxrl_llm.kernels.vocab_cross_topk import check_cross_topk, cross_topk_terms, vocab_cross_topk
from jaxrl_llm.kernels.vocab_topk import VocabTopK, vocab_topk

_sg = lax.stop_gradient


@dataclasses.dataclass(frozen=True)
class VocabSharding:
  """Where the vocabulary and the rows live on a mesh (hashable: a static argument).

  mesh: the device mesh. vocab_axis: the mesh axis the head's V columns are
  split over. row_axes: the mesh axes the rows (tokens) are split over; the
  rest of the mesh holds copies of the rows. embed_axis: the mesh axis the
  trainable head's D rows are split over (the params' "embed" axis, fsdp),
  or None: the head then enters whole along D (module docstring).
  """

  mesh: Mesh
  vocab_axis: str = "tensor"
  row_axes: tuple[str, ...] = ("data", "fsdp")
  embed_axis: str | None = None

  def __post_init__(self):
    names = tuple(self.mesh.axis_names)
    for axis in (self.vocab_axis,) + tuple(self.row_axes) + ((self.embed_axis,) if self.embed_axis else ()):
      if axis not in names:
        raise ValueError(f"VocabSharding: mesh axis {axis!r} is not in the mesh's axes {names}")
    if self.vocab_axis in self.row_axes:
      raise ValueError(f"VocabSharding: vocab_axis {self.vocab_axis!r} cannot also be a row axis")

  @property
  def n_shards(self) -> int:
    return self.mesh.shape[self.vocab_axis]

  @property
  def n_row_shards(self) -> int:
    return math.prod(self.mesh.shape[a] for a in self.row_axes)

  def check(self, n: int, v: int) -> None:
    if v % self.n_shards:
      raise ValueError(f"vocabulary size V={v} is not divisible by the {self.vocab_axis!r} mesh axis "
                       f"of size {self.n_shards} (mesh {dict(self.mesh.shape)}): pad the head's columns to a "
                       f"multiple of {self.n_shards} (a model's vocab_multiple) or use a smaller "
                       f"{self.vocab_axis!r} axis")
    if n % self.n_row_shards:
      raise ValueError(f"rows N={n} are not divisible by the row mesh axes {self.row_axes} "
                       f"(size {self.n_row_shards}): pad them to a multiple, masked (VocabOps does)")

  @property
  def rows(self) -> P:
    return P(self.row_axes)

  @property
  def head(self) -> P:
    """q's head (stop-gradient): whole along its rows, columns over the vocabulary axis."""
    return P(None, self.vocab_axis)

  def d_axis(self, d: int) -> str | None:
    """The axis the trainable head's D rows enter split over: embed_axis when it has size > 1 and divides D."""
    a = self.embed_axis
    return a if a is not None and self.mesh.shape[a] > 1 and d % self.mesh.shape[a] == 0 else None

  def trainable_head(self, d: int) -> P:
    """in_spec of the trainable head w_DV (module docstring); ``whole_d`` gathers it inside."""
    return P(self.d_axis(d), self.vocab_axis)

  def whole_d(self, w_DV, d: int):
    """Inside the map: the trainable head with all D rows (gathered over ``d_axis(d)``, whose
    transpose reduce-scatters the gradient back to the param's split)."""
    a = self.d_axis(d)
    return w_DV if a is None else lax.all_gather(w_DV, a, axis=0, tiled=True)

  def map(self, fn, in_specs, out_specs, impl: str, interpret):
    """shard_map over the whole mesh. The Triton kernels in Pallas's generic
    interpreter mix varying and replicated values (README, "What ran
    where"), so their maps run unchecked (check_vma=False); every other path
    is checked. The tests compare both with the reference."""
    kernels_impl, interpret = resolve_impl(impl, interpret)
    return jax.shard_map(fn, mesh=self.mesh, in_specs=in_specs, out_specs=out_specs,
                         check_vma=not (kernels_impl == "pallas_triton" and interpret is True))


# ------------------------------------------------------------ the combines


def _lse(lse_s, axis: str):
  """log sum_s exp(lse_s) over the vocabulary shards."""
  m = lax.pmax(_sg(lse_s), axis)
  return m + jnp.log(lax.psum(jnp.exp(lse_s - m), axis))


def _local_ids(ids, axis: str, v_s: int):
  """(ids local to this shard, clipped to 0 where not owned; owned mask)."""
  local = ids - lax.axis_index(axis) * v_s
  owned = (local >= 0) & (local < v_s)
  return jnp.where(owned, local, 0), owned


def _combine_gather(out: TokenLogprobs, owned, axis: str):
  """Global (logp at the ids, entropy, lse) from one shard's local outputs."""
  lse = _lse(out.lse, axis)
  mix = jnp.exp(out.lse - lse)  # p's mass on this shard
  mean_z = lax.psum(mix * (out.lse - out.entropy), axis)  # E_p[z]
  lse_k = out.lse.reshape(out.lse.shape + (1,) * (out.logp.ndim - 1))
  z_ids = lax.psum(jnp.where(owned, out.logp + lse_k, 0.0), axis)
  n_owners = lax.psum(owned.astype(jnp.int32), axis)
  lse_b = lse.reshape(lse_k.shape)
  logp = jnp.where(n_owners == 1, z_ids - lse_b, jnp.nan)
  return TokenLogprobs(logp=logp, entropy=lse - mean_z, lse=lse)


def _gather_columns(x_NK, axis: str):
  """(N, S * K): every shard's columns side by side, in shard (hence id) order.

  Written as a psum of each shard's block placed in zeros, so the result is
  the same on every shard (shard_map then knows it needs no further copy)."""
  n_shards = lax.psum(1, axis)
  k = x_NK.shape[1]
  out = jnp.zeros((x_NK.shape[0], n_shards * k), x_NK.dtype)
  return lax.psum(lax.dynamic_update_slice_in_dim(out, x_NK, lax.axis_index(axis) * k, axis=1), axis)


def _masked(out: TokenLogprobs, mask_N) -> TokenLogprobs:
  if mask_N is None:
    return out
  expand = lambda x: mask_N.reshape(mask_N.shape + (1,) * (x.ndim - 1))
  return jax.tree.map(lambda x: jnp.where(expand(x), x, 0.0), out)


def _mask_or_ones(mask_N, n: int):
  return jnp.ones((n,), jnp.bool_) if mask_N is None else mask_N


# ------------------------------------------------------------------ the ops


def gather_logprobs_sharded(hidden_ND, w_DV, ids_NK, *, sharding: VocabSharding, temperature=1.0,
                            mask_N=None, impl="auto", tiles: VocabTiles | None = None,
                            interpret=None) -> TokenLogprobs:
  """``gather_logprobs`` with ``w_DV``'s columns split over ``sharding.vocab_axis``."""
  n, d, v = check_hidden_w(hidden_ND, w_DV)
  temperature = check_temperature(temperature)
  mask_N = check_mask(mask_N, n)
  sharding.check(n, v)
  if getattr(ids_NK, "ndim", None) != 2 or ids_NK.shape[0] != n:
    raise ValueError(f"ids_NK has shape {getattr(ids_NK, 'shape', None)}: must be ({n}, K)")
  axis, v_s = sharding.vocab_axis, v // sharding.n_shards

  def body(h, w, ids, mask):
    local, owned = _local_ids(ids, axis, v_s)
    out = gather_logprobs(h, sharding.whole_d(w, d), local, temperature=temperature, mask_N=mask, impl=impl,
                          tiles=tiles, interpret=interpret)
    return _masked(_combine_gather(out, owned, axis), mask)

  rows = sharding.rows
  return sharding.map(body, (rows, sharding.trainable_head(d), rows, rows), rows, impl, interpret)(
      hidden_ND, w_DV, ids_NK, _mask_or_ones(mask_N, n))


def token_logprobs_sharded(hidden_ND, w_DV, targets_N, *, sharding: VocabSharding, temperature=1.0,
                           mask_N=None, impl="auto", tiles: VocabTiles | None = None,
                           interpret=None) -> TokenLogprobs:
  """``token_logprobs`` with ``w_DV``'s columns split over ``sharding.vocab_axis``."""
  if getattr(targets_N, "ndim", None) != 1:
    raise ValueError(f"targets_N has shape {getattr(targets_N, 'shape', None)}: must be 1-D")
  out = gather_logprobs_sharded(hidden_ND, w_DV, targets_N[:, None], sharding=sharding,
                                temperature=temperature, mask_N=mask_N, impl=impl, tiles=tiles,
                                interpret=interpret)
  return TokenLogprobs(logp=out.logp[:, 0], entropy=out.entropy, lse=out.lse)


def vocab_topk_sharded(hidden_ND, w_DV, *, k: int, sharding: VocabSharding, temperature=1.0,
                       mask_N=None, impl="auto", tiles: VocabTiles | None = None,
                       interpret=None) -> VocabTopK:
  """``vocab_topk`` with ``w_DV``'s columns split over ``sharding.vocab_axis``.

  Every shard proposes its own top min(k, V / n_shards): the global top k
  are among them."""
  n, d, v = check_hidden_w(hidden_ND, w_DV)
  temperature = check_temperature(temperature)
  mask_N = check_mask(mask_N, n)
  sharding.check(n, v)
  axis, v_s = sharding.vocab_axis, v // sharding.n_shards
  if not isinstance(k, int) or not 1 <= k <= v:
    raise ValueError(f"k={k!r}: must be an int in [1, V = {v}]")

  def body(h, w, mask):
    w = sharding.whole_d(w, d)
    opts = dict(temperature=temperature, mask_N=mask, impl=impl, tiles=tiles, interpret=interpret)
    local = vocab_topk(h, w, k=min(k, v_s), **opts)
    out = gather_logprobs(h, w, local.ids, **opts)  # the same log-probs, and this shard's lse
    z_NK = out.logp + out.lse[:, None]
    ids_NK = local.ids + lax.axis_index(axis) * v_s
    z_all, ids_all = _gather_columns(z_NK, axis), _gather_columns(ids_NK, axis)
    z_top, pos = lax.top_k(z_all, k)
    ids_top = jnp.take_along_axis(ids_all, pos, axis=1)
    logp = z_top - _lse(out.lse, axis)[:, None]
    return VocabTopK(ids=jnp.where(mask[:, None], ids_top, 0).astype(jnp.int32),
                     logp=jnp.where(mask[:, None], logp, 0.0))

  rows = sharding.rows
  return sharding.map(body, (rows, sharding.trainable_head(d), rows), rows, impl, interpret)(
      hidden_ND, w_DV, _mask_or_ones(mask_N, n))


def vocab_cross_sharded(hidden_ND, w_DV, hidden_q_NE, w_q_EV, *, sharding: VocabSharding,
                        temperature=1.0, temperature_q=1.0, mask_N=None, impl="auto",
                        tiles: VocabTiles | None = None, interpret=None) -> VocabCross:
  """``vocab_cross`` with both heads' columns split over ``sharding.vocab_axis``.

  Per shard s with local normalisers lse_s (p) and lq_s (q), the local op
  gives cross_s = E_{q_s}[z] - lse_s, kl_qp_s = E_{q_s}[y] - lq_s - cross_s and
  kl_pq_s = E_{p_s}[z - y] - lse_s + lq_s; mixing with exp(lse_s - lse) and
  exp(lq_s - lq) gives the full-vocabulary terms.
  """
  n, d, v = check_hidden_w(hidden_ND, w_DV)
  check_hidden_w(hidden_q_NE, w_q_EV, "hidden_q_NE", "w_q_EV")
  if hidden_q_NE.shape[0] != n or w_q_EV.shape[1] != v:
    raise ValueError(f"hidden_q_NE {hidden_q_NE.shape} / w_q_EV {w_q_EV.shape} must have N={n} rows "
                     f"and V={v} columns")
  temperature = check_temperature(temperature)
  temperature_q = check_temperature(temperature_q, "temperature_q")
  mask_N = check_mask(mask_N, n)
  sharding.check(n, v)
  axis = sharding.vocab_axis

  def body(h, w, hq, wq, mask):
    w = sharding.whole_d(w, d)
    opts = dict(mask_N=mask, impl=impl, tiles=tiles, interpret=interpret)
    c = vocab_cross(h, w, hq, wq, temperature=temperature, temperature_q=temperature_q, **opts)
    zeros = jnp.zeros((h.shape[0],), jnp.int32)
    lse_s = token_logprobs(h, w, zeros, temperature=temperature, **opts).lse
    lq_s = _sg(token_logprobs(_sg(hq), _sg(wq), zeros, temperature=temperature_q, **opts).lse)
    lse, lq = _lse(lse_s, axis), _lse(lq_s, axis)
    mix_p, mix_q = jnp.exp(lse_s - lse), jnp.exp(lq_s - lq)
    qz = c.cross + lse_s  # E_{q_s}[z]
    qy = c.kl_qp + lq_s + c.cross  # E_{q_s}[y] (z shifted by lse_s cancels: see the docstring)
    pzy = c.kl_pq + lse_s - lq_s  # E_{p_s}[z - y]
    cross = lax.psum(mix_q * qz, axis) - lse
    kl_qp = lax.psum(mix_q * qy, axis) - lq - cross
    kl_pq = lax.psum(mix_p * pzy, axis) - lse + lq
    return apply_mask(VocabCross(cross=cross, kl_pq=kl_pq, kl_qp=kl_qp), mask)

  rows = sharding.rows
  return sharding.map(body, (rows, sharding.trainable_head(d), rows, sharding.head, rows), rows, impl, interpret)(
      hidden_ND, w_DV, hidden_q_NE, w_q_EV, _mask_or_ones(mask_N, n))


def rows_sharded(op, args: tuple, rows: tuple[int, ...], mask_N, *, sharding: VocabSharding, impl="auto",
                 tiles: VocabTiles | None = None, interpret=None, **kw):
  """``op(*args, mask_N=mask_N, **kw)`` (a plain op) per shard of the rows, every head whole inside.

  For a vocabulary axis of size 1 (``VocabOps``): a Pallas kernel is one custom
  call that XLA cannot partition, so the op runs per device. args: the op's
  positional arrays, ``args[1]`` the trainable head w_DV; rows: the positions
  of those with a row axis (split over ``sharding.row_axes``, which N must
  divide). The trainable head enters split along D over ``embed_axis`` and is
  gathered inside, so its gradient is reduce-scattered back to the param's
  split (module docstring); any other head (q's) enters whole, P().
  """
  n, d, _ = check_hidden_w(args[0], args[1])
  if n % sharding.n_row_shards:
    raise ValueError(f"rows N={n} are not divisible by the row mesh axes {sharding.row_axes} "
                     f"(size {sharding.n_row_shards}): pad them to a multiple, masked (VocabOps does)")
  # Not the vocabulary axis (size 1 here) in the heads' specs: what varies over it must be in out_specs.
  specs = tuple(sharding.rows if i in rows else P(sharding.d_axis(d)) if i == 1 else P()
                for i in range(len(args)))
  opts = dict(impl=impl, tiles=tiles, interpret=interpret, **kw)

  def body(*a):
    a = a[:1] + (sharding.whole_d(a[1], d),) + a[2:]
    if mask_N is None:
      return op(*a, **opts)
    return op(*a[:-1], mask_N=a[-1], **opts)

  if mask_N is not None:
    args, specs = args + (mask_N,), specs + (sharding.rows,)
  return sharding.map(body, specs, sharding.rows, impl, interpret)(*args)


def vocab_cross_topk_sharded(hidden_ND, w_DV, q_ids_NK, q_logp_NK, *, tail: str, sharding: VocabSharding,
                             temperature=1.0, tail_tol: float = 1e-6, mask_N=None, impl="auto",
                             tiles: VocabTiles | None = None, interpret=None) -> VocabCross:
  """``vocab_cross_topk`` with ``w_DV``'s columns split: its terms need only log p at
  the K ids and p's entropy, i.e. the sharded ``gather_logprobs``."""
  mask_N = check_cross_topk(hidden_ND, w_DV, q_ids_NK, q_logp_NK, tail, tail_tol, mask_N)
  out = gather_logprobs_sharded(hidden_ND, w_DV, q_ids_NK, sharding=sharding, temperature=temperature,
                                impl=impl, tiles=tiles, interpret=interpret)
  return cross_topk_terms(out, q_logp_NK, tail=tail, tail_tol=tail_tol, mask_N=mask_N)


# ------------------------------------------------------------ the dispatch


@dataclasses.dataclass(frozen=True)
class VocabOps:
  """The five ops with one implementation choice and, optionally, a mesh to run them on.

  Each method takes the op's own arguments (less ``impl`` / ``interpret`` /
  ``tiles``). With ``sharding`` set and its vocabulary axis larger than 1,
  every call runs the sharded op above, so no device gathers the whole head;
  a vocabulary that does not divide over the vocabulary axis is an error
  naming both. With a vocabulary axis of size 1 (the head is then whole on
  every device anyway) and ``impl`` resolving to a Pallas kernel
  (``resolve_impl``: "pallas_mosaic" or "pallas_triton") on a mesh of more
  than one device, every call runs the plain op per row shard
  (``rows_sharded``): a kernel is a custom call XLA cannot split. In both
  cases rows that do not divide over the row axes are padded to a multiple
  (copies of the last row, masked: their outputs are 0 and cut off, so the
  values and gradients are those of the given rows). Otherwise (no sharding,
  one device, or the XLA paths, which XLA partitions itself) the plain op
  runs.
  """

  impl: str = "auto"
  interpret: bool | None = None
  tiles: VocabTiles | None = None
  sharding: VocabSharding | None = None

  def _opts(self) -> dict:
    return dict(impl=self.impl, interpret=self.interpret, tiles=self.tiles)

  def _mode(self) -> str:
    """The path: "vocab" (the sharded ops), "rows" (the plain op per row shard) or "plain" (class docstring)."""
    if self.sharding is None:
      return "plain"
    if self.sharding.n_shards > 1:
      return "vocab"
    kernel = resolve_impl(self.impl, self.interpret)[0] in ("pallas_mosaic", "pallas_triton")
    return "rows" if kernel and self.sharding.mesh.size > 1 else "plain"

  def _run(self, plain, sharded, args: tuple, rows: tuple[int, ...], kw: dict):
    """``plain(*args, **kw)``, or ``sharded`` / ``rows_sharded(plain)`` on the rows padded
    to a multiple of the row shards (``_mode``). args: the op's positional arrays
    (hidden_ND, w_DV, ...); rows: the positions in args of those with a row axis."""
    path = self._mode()
    if path == "plain":
      return plain(*args, **kw, **self._opts())
    n, _, _ = check_hidden_w(args[0], args[1])
    mask_N = check_mask(kw.get("mask_N"), n)
    n_pad = -(-n // self.sharding.n_row_shards) * self.sharding.n_row_shards
    if n_pad != n:
      # Copies of the last row: the padded rows' terms stay finite, so their zero
      # cotangent (they are cut off below) adds exact zeros to every gradient.
      pad = lambda x, **mode: jnp.pad(x, [(0, n_pad - n)] + [(0, 0)] * (x.ndim - 1), **mode)
      args = tuple(pad(x, mode="edge") if i in rows else x for i, x in enumerate(args))
      kw = {**kw, "mask_N": pad(_mask_or_ones(mask_N, n), constant_values=False)}
    if path == "vocab":
      out = sharded(*args, sharding=self.sharding, **kw, **self._opts())
    else:
      kw = dict(kw)
      out = rows_sharded(plain, args, rows, kw.pop("mask_N", None), sharding=self.sharding, **kw,
                         **self._opts())
    return out if n_pad == n else jax.tree.map(lambda x: x[:n], out)

  def token_logprobs(self, hidden_ND, w_DV, targets_N, **kw) -> TokenLogprobs:
    return self._run(token_logprobs, token_logprobs_sharded, (hidden_ND, w_DV, targets_N), (0, 2), kw)

  def gather_logprobs(self, hidden_ND, w_DV, ids_NK, **kw) -> TokenLogprobs:
    return self._run(gather_logprobs, gather_logprobs_sharded, (hidden_ND, w_DV, ids_NK), (0, 2), kw)

  def vocab_topk(self, hidden_ND, w_DV, *, k: int, **kw) -> VocabTopK:
    return self._run(vocab_topk, vocab_topk_sharded, (hidden_ND, w_DV), (0,), {**kw, "k": k})

  def vocab_cross(self, hidden_ND, w_DV, hidden_q_NE, w_q_EV, **kw) -> VocabCross:
    return self._run(vocab_cross, vocab_cross_sharded, (hidden_ND, w_DV, hidden_q_NE, w_q_EV), (0, 2), kw)

  def vocab_cross_topk(self, hidden_ND, w_DV, q_ids_NK, q_logp_NK, **kw) -> VocabCross:
    return self._run(vocab_cross_topk, vocab_cross_topk_sharded, (hidden_ND, w_DV, q_ids_NK, q_logp_NK),
                     (0, 2, 3), kw)
