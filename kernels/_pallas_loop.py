"""Pallas kernels that stream over the vocabulary, shared by the ops.

GPU (Triton) layout, as in jax's reference flash-attention kernel: one program
per block of ``block_n`` rows, a ``fori_loop`` over ``block_v`` vocabulary
columns inside it, and the whole ``w_DV`` visible to every program (only
(D, block_v) slices are loaded). The backward is two kernels: d hidden with one
program per row block (loop over vocabulary), d w with one program per
vocabulary block (loop over rows), so no program ever accumulates into another
program's output and no N x V array is written.

Triton needs power-of-two tile shapes: D is padded to the next power of two in
the block shape and masked on load/store (w is never copied); columns past V
are masked on load (MASK_VALUE logits, zero cotangent) and store; rows are
padded to a multiple of ``block_n`` in the wrapper (only N x D is copied).

An op supplies the same ``step_fn`` / ``dz_fn`` it gives the chunked-XLA loop
(see ``_xla_loop``); here they see (block_n, block_v) tiles, with the
compare-based gather/scatter (K passes over the tile per id column).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from jaxrl_llm.kernels._xla_loop import (Tile, onehot_gather, out_struct,
                                        reduce_like)
from jaxrl_llm.kernels.config import MASK_VALUE, VocabTiles

_HI = lax.Precision.HIGHEST
# Explicit: without it, jax 0.10's GPU lowering picks Mosaic GPU, which these
# Triton-style kernels (masked loads, whole-array w blocks) are not written for.
_TRITON = plgpu.CompilerParams()


def _pad_rows(x, n_pad: int):
  pad = n_pad - x.shape[0]
  if pad == 0:
    return x
  return jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1))


class _Layout(NamedTuple):
  """A call's operands, their rows padded to a multiple of block_n (forward and backward alike)."""

  n: int  # rows before padding
  v: int
  n_pad: int
  dims: list[int]  # each source's D
  dps: list[int]  # each D padded to a power of two (the block shape)
  hs: list  # each source's hidden, rows padded
  ws: list
  temps: list[float]
  rows_flat: list  # the row inputs' leaves, rows padded
  rows_tree: object


def _layout(sources, rows, tiles: VocabTiles) -> _Layout:
  n, v = sources[0][0].shape[0], sources[0][1].shape[1]
  n_pad = -(-n // tiles.block_n) * tiles.block_n
  dims = [h.shape[1] for h, _, _ in sources]
  rows_flat, rows_tree = jax.tree.flatten(rows)
  return _Layout(n=n, v=v, n_pad=n_pad, dims=dims, dps=[pl.next_power_of_2(d) for d in dims],
                 hs=[_pad_rows(h, n_pad) for h, _, _ in sources], ws=[w for _, w, _ in sources],
                 temps=[t for _, _, t in sources], rows_flat=[_pad_rows(r, n_pad) for r in rows_flat],
                 rows_tree=rows_tree)


def _split_refs(refs, n_src: int, n_rows: int):
  """A kernel's refs -> (hidden refs, w refs, row refs, output refs), in pallas_call's order."""
  return (refs[:n_src], refs[n_src:2 * n_src], refs[2 * n_src:2 * n_src + n_rows],
          refs[2 * n_src + n_rows:])


def _row_spec(shape, bn: int):
  return pl.BlockSpec((bn,) + tuple(shape[1:]),
                      lambda i: (i,) + (0,) * (len(shape) - 1))


def _d_mask(d: int, dp: int):
  return lax.broadcasted_iota(jnp.int32, (1, dp), 1) < d  # (1, Dp)


def _tile_logits(h_bD, w_ref, j, bv: int, v: int, d: int, temperature: float):
  """Loads the j-th (Dp, bv) tile of w (masked) and returns tempered logits."""
  dp = h_bD.shape[1]
  cols_1C = j * bv + lax.broadcasted_iota(jnp.int32, (1, bv), 1)
  valid_1C = cols_1C < v
  d_D1 = lax.broadcasted_iota(jnp.int32, (dp, 1), 0) < d
  w_DC = plgpu.load(w_ref.at[:, pl.ds(j * bv, bv)],
                    mask=jnp.logical_and(d_D1, valid_1C), other=0.0)
  z_bC = jnp.dot(h_bD, w_DC, precision=_HI, preferred_element_type=jnp.float32)
  z_bC = jnp.where(valid_1C, z_bC * jnp.float32(1.0 / temperature), MASK_VALUE)
  return z_bC, w_DC, cols_1C, valid_1C


def _load_h(h_ref, d: int):
  return plgpu.load(h_ref, mask=_d_mask(d, h_ref.shape[1]), other=0.0)


def forward(sources, step_fn, init_fn, rows, *, tiles: VocabTiles,
            interpret: bool):
  """Pallas version of ``_xla_loop.forward``.

  ``init_fn(block_n)`` builds the per-row-block carry inside the kernel; the
  final carry (leaves with leading dim N) is returned.
  """
  n, v, n_pad, dims, dps, hs, ws, temps, rows_flat, rows_tree = _layout(sources, rows, tiles)
  bn, bv = tiles.block_n, tiles.block_v
  n_src = len(sources)
  carry_shapes = jax.eval_shape(lambda: init_fn(bn))
  carry_flat_shapes, carry_tree = jax.tree.flatten(carry_shapes)

  def kernel(*refs):
    h_refs, w_refs, row_refs, out_refs = _split_refs(refs, n_src, len(rows_flat))
    h_tiles = [_load_h(r, d) for r, d in zip(h_refs, dims)]
    row_vals = jax.tree.unflatten(rows_tree, [r[...] for r in row_refs])

    def body(j, carry):
      outs = [_tile_logits(h, w_ref, j, bv, v, d, t)
              for h, w_ref, d, t in zip(h_tiles, w_refs, dims, temps)]
      zs = tuple(o[0] for o in outs)
      tile = Tile(zs, outs[0][2], outs[0][3],
                  *onehot_gather(outs[0][2], outs[0][3]))
      return step_fn(carry, tile, row_vals)

    carry = lax.fori_loop(0, pl.cdiv(v, bv), body, init_fn(bn))
    for ref, leaf in zip(out_refs, jax.tree.leaves(carry)):
      ref[...] = leaf.astype(ref.dtype)

  in_specs = ([pl.BlockSpec((bn, dp), lambda i: (i, 0)) for dp in dps]
              + [pl.BlockSpec((dp, v), lambda i: (0, 0)) for dp in dps]
              + [_row_spec(r.shape, bn) for r in rows_flat])
  out_shape = [out_struct((n_pad,) + s.shape[1:], s.dtype, hs + ws + rows_flat)
               for s in carry_flat_shapes]
  out = pl.pallas_call(
      kernel, grid=(n_pad // bn,), in_specs=in_specs,
      out_specs=[_row_spec(s.shape, bn) for s in out_shape],
      out_shape=out_shape, compiler_params=_TRITON, interpret=interpret,
      name="vocab_stream_fwd",
  )(*hs, *ws, *rows_flat)
  return jax.tree.unflatten(carry_tree, [o[:n] for o in out])


def backward(sources, dz_fn, rows, *, tiles: VocabTiles, interpret: bool):
  """Pallas version of ``_xla_loop.backward``: (d h, d w) of the first source."""
  h0, w0, t0 = sources[0]
  n, v, n_pad, dims, dps, hs, ws, temps, rows_flat, rows_tree = _layout(sources, rows, tiles)
  bn, bv = tiles.block_n, tiles.block_v
  n_src, n_rows = len(sources), len(rows_flat)
  inv_t0 = 1.0 / t0  # a Python float: kernels may not capture arrays

  def tile_dz(h_tiles, w_refs, j, row_vals):
    outs = [_tile_logits(h, w_ref, j, bv, v, d, t)
            for h, w_ref, d, t in zip(h_tiles, w_refs, dims, temps)]
    zs = tuple(o[0] for o in outs)
    _, w_DC, cols_1C, valid_1C = outs[0]
    tile = Tile(zs, cols_1C, valid_1C, *onehot_gather(cols_1C, valid_1C))
    dz_bC = jnp.where(valid_1C, dz_fn(tile, row_vals), 0.0)
    return dz_bC * inv_t0, w_DC.astype(jnp.float32)

  def dh_kernel(*refs):
    h_refs, w_refs, row_refs, (dh_ref,) = _split_refs(refs, n_src, n_rows)
    h_tiles = [_load_h(r, d) for r, d in zip(h_refs, dims)]
    row_vals = jax.tree.unflatten(rows_tree, [r[...] for r in row_refs])

    def body(j, dh_bD):
      dz_bC, w_DC = tile_dz(h_tiles, w_refs, j, row_vals)
      return dh_bD + jnp.dot(dz_bC, w_DC.T, precision=_HI)

    dh_bD = lax.fori_loop(0, pl.cdiv(v, bv), body,
                          jnp.zeros((bn, dps[0]), jnp.float32))
    plgpu.store(dh_ref, dh_bD.astype(dh_ref.dtype), mask=_d_mask(dims[0], dps[0]))

  dh = pl.pallas_call(
      dh_kernel, grid=(n_pad // bn,),
      in_specs=([pl.BlockSpec((bn, dp), lambda i: (i, 0)) for dp in dps]
                + [pl.BlockSpec((dp, v), lambda i: (0, 0)) for dp in dps]
                + [_row_spec(r.shape, bn) for r in rows_flat]),
      out_specs=pl.BlockSpec((bn, dps[0]), lambda i: (i, 0)),
      out_shape=out_struct((n_pad, dims[0]), h0.dtype, hs + ws + rows_flat),
      compiler_params=_TRITON, interpret=interpret, name="vocab_stream_bwd_dh",
  )(*hs, *ws, *rows_flat)

  def dw_kernel(*refs):
    h_refs, w_refs, row_refs, (dw_ref,) = _split_refs(refs, n_src, n_rows)
    j = pl.program_id(0)

    def body(r, dw_DC):
      rs = pl.ds(r * bn, bn)
      h_tiles = [plgpu.load(h_ref.at[rs, :], mask=_d_mask(d, h_ref.shape[1]),
                            other=0.0) for h_ref, d in zip(h_refs, dims)]
      row_vals = jax.tree.unflatten(rows_tree, [ref[rs] for ref in row_refs])
      dz_bC, _ = tile_dz(h_tiles, w_refs, j, row_vals)
      h_bD = h_tiles[0].astype(jnp.float32)
      return dw_DC + jnp.dot(h_bD.T, dz_bC, precision=_HI)

    dw_DC = lax.fori_loop(0, n_pad // bn, body,
                          jnp.zeros((dps[0], bv), jnp.float32))
    cols_1C = j * bv + lax.broadcasted_iota(jnp.int32, (1, bv), 1)
    d_D1 = lax.broadcasted_iota(jnp.int32, (dps[0], 1), 0) < dims[0]
    plgpu.store(dw_ref, dw_DC.astype(dw_ref.dtype),
                mask=jnp.logical_and(d_D1, cols_1C < v))

  # Every program reads all rows and the full w; the index maps ignore j for
  # the row inputs and pick nothing for w (the kernel slices column block j).
  dw = pl.pallas_call(
      dw_kernel, grid=(pl.cdiv(v, bv),),
      in_specs=([pl.BlockSpec((n_pad, dp), lambda j: (0, 0)) for dp in dps]
                + [pl.BlockSpec((dp, v), lambda j: (0, 0)) for dp in dps]
                + [pl.BlockSpec(r.shape, functools.partial(
                    lambda nd, j: (0,) * nd, r.ndim)) for r in rows_flat]),
      out_specs=pl.BlockSpec((dps[0], bv), lambda j: (0, j)),
      out_shape=out_struct(w0.shape, w0.dtype, hs + ws + rows_flat),
      compiler_params=_TRITON, interpret=interpret, name="vocab_stream_bwd_dw",
  )(*hs, *ws, *rows_flat)
  return reduce_like(dh[:n], h0), reduce_like(dw, w0)
