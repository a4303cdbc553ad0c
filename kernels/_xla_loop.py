"""Chunked-XLA loops over the vocabulary, shared by the ops.

An op describes its maths per chunk of logits; these loops do the chunking:

- ``forward``: ``carry = step_fn(carry, tile, rows)`` for each chunk, where
  ``tile`` is a ``Tile``: ``zs`` holds one (N, C) f32 logit chunk per source
  (already divided by that source's temperature, invalid columns set to
  MASK_VALUE), plus column ids and gather/scatter helpers for id arrays.
- ``backward``: ``dz_NC = dz_fn(tile, rows)`` for each chunk, the cotangent of
  the first source's (tempered) logits; accumulates d hidden and d w of that
  source. Other sources are stop-gradient.

Every chunk has the same static size C = min(chunk_v, V): the last one starts
at V - C and masks the columns an earlier chunk already covered, so there is no
out-of-bounds slice and no remainder code path.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jaxrl_llm.kernels.config import MASK_VALUE

_HI = lax.Precision.HIGHEST


class Tile(NamedTuple):
  """One vocabulary tile as the ops' step/dz functions see it.

  zs: one (rows, C) f32 logit tile per source.
  cols_1C: global vocabulary ids of the tile's columns.
  valid_1C: columns this tile owns (inside V and not covered by another tile).
  gather: (x_rC, ids_rK) -> (rows, K): x at the ids that fall in this tile, 0
    for the others (so summing over tiles gathers each id exactly once).
  scatter: (vals_rK, ids_rK) -> (rows, C): vals placed at the ids' columns
    (summed over repeated ids), 0 elsewhere.
  """

  zs: tuple
  cols_1C: jax.Array
  valid_1C: jax.Array
  gather: Callable
  scatter: Callable


def onehot_gather(cols_1C, valid_1C):
  """Gather/scatter by comparing ids with the column ids: one pass over the
  tile per id column. Written with iota selects instead of slices and
  concatenation so that Triton can lower it."""

  def column(x_rK, k):
    iota_1K = lax.broadcasted_iota(jnp.int32, (1, x_rK.shape[1]), 1)
    return jnp.sum(jnp.where(iota_1K == k, x_rK, 0), axis=1, keepdims=True)

  def hits(ids_rK, k):
    return jnp.logical_and(cols_1C == column(ids_rK, k), valid_1C)

  def gather(x_rC, ids_rK):
    iota_1K = lax.broadcasted_iota(jnp.int32, (1, ids_rK.shape[1]), 1)

    def body(k, acc_rK):
      val_r1 = jnp.sum(jnp.where(hits(ids_rK, k), x_rC, 0.0), axis=1,
                       keepdims=True)
      return acc_rK + jnp.where(iota_1K == k, val_r1, 0.0)

    acc_rK = _vary_like(jnp.zeros(ids_rK.shape, jnp.float32), (x_rC, ids_rK))
    return lax.fori_loop(0, ids_rK.shape[1], body, acc_rK)

  def scatter(vals_rK, ids_rK):
    def body(k, out_rC):
      return out_rC + jnp.where(hits(ids_rK, k), column(vals_rK, k), 0.0)

    out_rC = jnp.zeros((ids_rK.shape[0], cols_1C.shape[1]), jnp.float32)
    out_rC = _vary_like(out_rC, (vals_rK, ids_rK, cols_1C))
    return lax.fori_loop(0, ids_rK.shape[1], body, out_rC)

  return gather, scatter


def _indexed_gather(start, lo, c: int):
  """Gather/scatter by indexing: O(rows * K) per chunk, for K > 1 in XLA."""

  def local(ids_rK):
    inside = jnp.logical_and(ids_rK >= lo, ids_rK < start + c)
    return inside, jnp.clip(ids_rK - start, 0, c - 1)

  def gather(x_rC, ids_rK):
    inside, idx_rK = local(ids_rK)
    return jnp.where(inside, jnp.take_along_axis(x_rC, idx_rK, axis=1), 0.0)

  def scatter(vals_rK, ids_rK):
    inside, idx_rK = local(ids_rK)
    rows_r1 = lax.broadcasted_iota(jnp.int32, (ids_rK.shape[0], 1), 0)
    rows_rK = jnp.broadcast_to(rows_r1, ids_rK.shape)
    out_rC = jnp.zeros((ids_rK.shape[0], c), jnp.float32)
    return out_rC.at[rows_rK, idx_rK].add(jnp.where(inside, vals_rK, 0.0))

  return gather, scatter


def _make_tile(zs, start, j, cols_1C, valid_1C, c: int, k: int):
  if k <= 1:
    gather, scatter = onehot_gather(cols_1C, valid_1C)
  else:
    gather, scatter = _indexed_gather(start, j * c, c)
  return Tile(zs, cols_1C, valid_1C, gather, scatter)


def _max_ids(rows) -> int:
  """Largest trailing dim among integer row inputs (the K of id arrays)."""
  ks = [x.shape[1] for x in jax.tree.leaves(rows)
        if x.ndim == 2 and jnp.issubdtype(x.dtype, jnp.integer)]
  return max(ks, default=1)


def _vma(x) -> frozenset:
  """Manual mesh axes x varies over (inside shard_map); empty elsewhere."""
  aval = jax.typeof(x)
  mat = getattr(aval, "manual_axis_type", None)
  if mat is not None:
    return frozenset(mat.varying)
  return frozenset(getattr(aval, "vma", None) or ())


def _vary_like(tree, refs):
  """Marks loop carries as varying over the axes the inputs vary over, so
  that the loops type-check inside shard_map; a no-op outside it."""
  axes = frozenset().union(*(_vma(r) for r in jax.tree.leaves(refs)))
  if not axes:
    return tree

  def vary(x):
    missing = tuple(sorted(axes - _vma(x)))
    return lax.pcast(x, missing, to="varying") if missing else x

  return jax.tree.map(vary, tree)


def out_struct(shape, dtype, inputs):
  """A pallas_call output's type. Inside shard_map (check_vma) it must say
  which mesh axes it varies over: those its inputs vary over. Outside, that
  set is empty."""
  mat = jax.typeof(inputs[0]).manual_axis_type
  if mat is not None:
    mat = type(mat)(varying=frozenset().union(*(_vma(x) for x in inputs)))
  return jax.ShapeDtypeStruct(shape, dtype, manual_axis_type=mat)


def reduce_like(ct, primal):
  """Sums a cotangent over the axes its primal is replicated on (shard_map):
  each device holds the contribution of its own rows."""
  extra = tuple(sorted(_vma(ct) - _vma(primal)))
  return lax.psum(ct, extra) if extra else ct


def _chunk_geometry(v: int, chunk_v: int):
  c = min(chunk_v, v)
  return c, -(-v // c)


def _chunk_cols(j, c: int, v: int):
  start = jnp.minimum(j * c, v - c)
  cols_1C = start + lax.broadcasted_iota(jnp.int32, (1, c), 1)
  valid_1C = cols_1C >= j * c
  return start, cols_1C, valid_1C


def _logits(h_ND, w_DC, temperature: float, valid_1C):
  z_NC = jnp.dot(h_ND, w_DC, precision=_HI, preferred_element_type=jnp.float32)
  z_NC = z_NC * jnp.float32(1.0 / temperature)
  return jnp.where(valid_1C, z_NC, MASK_VALUE)


def forward(sources, step_fn, init_carry, rows, *, chunk_v: int):
  """Streams ``step_fn`` over vocabulary chunks; returns the final carry.

  Args:
    sources: tuple of (h_ND, w_DV, temperature), all with the same N and V.
    step_fn: (carry, tile, rows) -> carry.
    init_carry: pytree of per-row arrays.
    rows: pytree of per-row inputs handed to ``step_fn`` unchanged.
  """
  v = sources[0][1].shape[1]
  c, n_chunks = _chunk_geometry(v, chunk_v)
  k = _max_ids(rows)

  def body(j, carry):
    start, cols_1C, valid_1C = _chunk_cols(j, c, v)
    zs = tuple(
        _logits(h, lax.dynamic_slice_in_dim(w, start, c, axis=1), t, valid_1C)
        for h, w, t in sources)
    tile = _make_tile(zs, start, j, cols_1C, valid_1C, c, k)
    return step_fn(carry, tile, rows)

  init_carry = _vary_like(init_carry, (sources, rows))
  return lax.fori_loop(0, n_chunks, body, init_carry)


def backward(sources, dz_fn, rows, *, chunk_v: int):
  """Returns (d h, d w) of the first source for the logit cotangent dz_fn."""
  h_ND, w_DV, temperature = sources[0]
  v = w_DV.shape[1]
  c, n_chunks = _chunk_geometry(v, chunk_v)
  k = _max_ids(rows)
  inv_t = jnp.float32(1.0 / temperature)

  def body(j, carry):
    dh_ND, dw_DV = carry
    start, cols_1C, valid_1C = _chunk_cols(j, c, v)
    w_chunks = tuple(lax.dynamic_slice_in_dim(w, start, c, axis=1)
                     for _, w, _ in sources)
    zs = tuple(_logits(h, w_c, t, valid_1C)
               for (h, _, t), w_c in zip(sources, w_chunks))
    tile = _make_tile(zs, start, j, cols_1C, valid_1C, c, k)
    dz_NC = jnp.where(valid_1C, dz_fn(tile, rows), 0.0)
    dz_NC = dz_NC * inv_t
    w_DC = w_chunks[0].astype(jnp.float32)
    dh_ND = dh_ND + jnp.dot(dz_NC, w_DC.T, precision=_HI)
    dw_DC = jnp.dot(h_ND.astype(jnp.float32).T, dz_NC, precision=_HI)
    # Read-add-write: the last chunk overlaps the previous one (masked to 0).
    old_DC = lax.dynamic_slice_in_dim(dw_DV, start, c, axis=1)
    dw_DV = lax.dynamic_update_slice_in_dim(dw_DV, old_DC + dw_DC, start, axis=1)
    return dh_ND, dw_DV

  init = (jnp.zeros(h_ND.shape, jnp.float32), jnp.zeros(w_DV.shape, jnp.float32))
  init = _vary_like(init, (sources, rows))
  dh_ND, dw_DV = lax.fori_loop(0, n_chunks, body, init)
  return (reduce_like(dh_ND, h_ND).astype(h_ND.dtype),
          reduce_like(dw_DV, w_DV).astype(w_DV.dtype))
