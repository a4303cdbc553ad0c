"""Pallas TPU (Mosaic) kernels that stream over the vocabulary, shared by the ops.

TPU layout, as in jax's TPU flash-attention kernels: a grid over blocks, the
reduction axis innermost and sequential ("arbitrary"), the other "parallel"
(split over the TensorCores of a chip), every operand brought into VMEM tile by
tile by its BlockSpec (double-buffered by the Pallas pipeline), accumulators
in VMEM scratch that persist across the sequential axis:

- forward: grid (row blocks, vocabulary blocks). Program (i, j) gets
  hidden_s[i] (block_n, D_s) and w_s[:, j] (D_s, block_v) for each source s,
  updates the op's carry (running max, normaliser, moments, target logits,
  top-k, ...: (block_n, k) f32 columns in scratch, set by the op's ``init_fn``
  at j = 0) with the op's ``step_fn``, and writes it to the outputs at the
  last j.
- d hidden: the same grid; recomputes each logit tile, forms the op's
  ``dz_fn`` and accumulates dz @ w_0[:, j]^T into a (block_n, D_0) f32
  scratch, written at the last j.
- d w: grid (vocabulary blocks, row blocks), rows sequential; accumulates
  hidden_0[i]^T @ dz into a (D_0, block_v) f32 scratch, written at the last i.

So no program writes another's output block, no N x V array exists, and only
(D, block_v) tiles of w are ever in VMEM. Tile sizes come from the VMEM budget
(``_mosaic_budget``); D is not tiled.

Ragged shapes are masked, not padded (no copy of w): the last row and column
blocks may reach past N and V, where the TPU (and the interpreter, with
``uninitialized_memory="nan"``) leaves garbage. Logits of columns >= V become
MASK_VALUE, and every operand whose garbage would reach a real output through
a matmul is zeroed first: w's columns >= V in d hidden (0 * NaN is NaN), the
hidden rows >= N and dz's rows >= N in d w. Rows >= N of the forward and d
hidden outputs are never stored.

Matmuls take the inputs in their own dtype with f32 accumulation (bf16 on the
MXU; f32 at Precision.HIGHEST); in the backward dz is cast to the dtype of
the matrix it multiplies. Per-row values are (rows, 1) columns, the layout of
the ops' step functions, and every block's last two dims are multiples of
(8, 128) or the whole axis, as Mosaic requires.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from jaxrl_llm.kernels import _mosaic_budget
from jaxrl_llm.kernels._xla_loop import (Tile, onehot_gather, out_struct,
                                        reduce_like)
from jaxrl_llm.kernels.config import MASK_VALUE, VocabTiles

_NN = (((1,), (0,)), ((), ()))  # a @ b
_NT = (((1,), (1,)), ((), ()))  # a @ b.T
_TN = (((0,), (0,)), ((), ()))  # a.T @ b


def _dot(a, b, dims):
  """f32-accumulated matmul of two same-dtype operands."""
  precision = lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
  return lax.dot_general(a, b, dims, precision=precision,
                         preferred_element_type=jnp.float32)


def _operands(sources, rows, carry_widths=(), out_bytes=4):
  return _mosaic_budget.Operands(
      dims=tuple(h.shape[1] for h, _, _ in sources),
      h_bytes=tuple(h.dtype.itemsize for h, _, _ in sources),
      w_bytes=tuple(w.dtype.itemsize for _, w, _ in sources),
      row_widths=tuple(r.shape[1] for r in rows),
      carry_widths=tuple(carry_widths), out_bytes=out_bytes)


def _check_rows(rows_flat, n: int):
  for r in rows_flat:
    if r.ndim != 2 or r.shape[0] != n:
      raise ValueError(f"per-row input of shape {r.shape}: the TPU kernels "
                       f"take (N, k) arrays with N={n}")


def _params(semantics, plan, interpret, cost=None):
  return dict(
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=semantics,
          vmem_limit_bytes=plan.vmem_limit_bytes),
      interpret=interpret if interpret else False,
      cost_estimate=cost)


def _cost(kind: str, sources, rows_flat, plan, out_bytes: int) -> pl.CostEstimate:
  """The kernel's own FLOPs, exponentials and HBM bytes, which XLA's cost analysis cannot see
  inside a custom call (jaxrl_llm/tpu reads them from the compiled program).

  Every kernel computes the logit tiles of every source (2 N D_s V FLOPs) and one exponential per
  logit and source; d hidden and d w add one matmul of the first source's size. Bytes: the operand
  that a block of the outer grid axis holds is read once, the other once per outer block (w once
  per row block in the forward and d hidden, hidden once per vocabulary block in d w), the per-row
  inputs once per outer block of d w, and the output written once.
  """
  n, v = sources[0][0].shape[0], sources[0][1].shape[1]
  flops = sum(2 * n * h.shape[1] * v for h, _, _ in sources)
  if kind != "fwd":
    flops += 2 * n * sources[0][0].shape[1] * v
  row_bytes = sum(r.size * r.dtype.itemsize for r in rows_flat)
  h_bytes = sum(h.size * h.dtype.itemsize for h, _, _ in sources)
  w_bytes = sum(w.size * w.dtype.itemsize for _, w, _ in sources)
  if kind == "dw":
    bytes_accessed = pl.cdiv(v, plan.block_v) * (h_bytes + row_bytes) + w_bytes
  else:
    bytes_accessed = h_bytes + pl.cdiv(n, plan.block_n) * w_bytes + row_bytes
  return pl.CostEstimate(flops=int(flops), transcendentals=int(n * v * len(sources)),
                         bytes_accessed=int(bytes_accessed + out_bytes))


def _tile(h_vals, w_vals, temps, j, bv: int, v: int) -> Tile:
  """Tempered f32 logits of vocabulary block j, one per source."""
  cols_1C = j * bv + lax.broadcasted_iota(jnp.int32, (1, bv), 1)
  valid_1C = cols_1C < v
  zs = tuple(
      jnp.where(valid_1C, _dot(h, w, _NN) * (1.0 / t), MASK_VALUE)
      for h, w, t in zip(h_vals, w_vals, temps))
  return Tile(zs, cols_1C, valid_1C, *onehot_gather(cols_1C, valid_1C))


def _specs(sources, rows_flat, bn: int, bv: int, row_block, col_block):
  """BlockSpecs of the hidden tiles, the w tiles and the per-row inputs;
  ``row_block`` / ``col_block`` map the grid indices to the row / column
  block index."""
  h_specs = [pl.BlockSpec((bn, h.shape[1]),
                          lambda *g: (row_block(*g), 0)) for h, _, _ in sources]
  w_specs = [pl.BlockSpec((w.shape[0], bv),
                          lambda *g: (0, col_block(*g))) for _, w, _ in sources]
  r_specs = [pl.BlockSpec((bn, r.shape[1]),
                          lambda *g: (row_block(*g), 0)) for r in rows_flat]
  return h_specs + w_specs + r_specs


def forward(sources, step_fn, init_fn, rows, *, tiles: VocabTiles,
            interpret):
  """Mosaic version of ``_xla_loop.forward``.

  Args:
    sources: tuple of (h_ND, w_DV, temperature), all with the same N and V.
    step_fn: (carry, tile, rows) -> carry, on (block_n, ...) values.
    init_fn: block_n -> the initial carry, a pytree of (block_n, k) arrays
      (built inside the kernel at the first vocabulary block).
    rows: pytree of (N, k) per-row inputs.
    tiles: ``VocabTiles`` (its tpu_* fields).
    interpret: False (compile for TPU) or a ``pltpu.InterpretParams``.

  Returns:
    The final carry, leaves of shape (N, k).
  """
  n, v = sources[0][0].shape[0], sources[0][1].shape[1]
  n_src = len(sources)
  temps = [t for _, _, t in sources]
  rows_flat, rows_tree = jax.tree.flatten(rows)
  _check_rows(rows_flat, n)
  carry_flat, carry_tree = jax.tree.flatten(jax.eval_shape(lambda: init_fn(8)))
  plan = _mosaic_budget.plan(
      "fwd", n, v, _operands(sources, rows_flat,
                             [c.shape[1] for c in carry_flat]), tiles)
  bn, bv = plan.block_n, plan.block_v
  n_v = pl.cdiv(v, bv)

  def kernel(*refs):
    h_refs, w_refs = refs[:n_src], refs[n_src:2 * n_src]
    row_refs = refs[2 * n_src:2 * n_src + len(rows_flat)]
    out_refs = refs[2 * n_src + len(rows_flat):][:len(carry_flat)]
    acc_refs = refs[2 * n_src + len(rows_flat) + len(carry_flat):]
    j = pl.program_id(1)

    @pl.when(j == 0)
    def _():
      for ref, leaf in zip(acc_refs, jax.tree.leaves(init_fn(bn))):
        ref[...] = leaf

    tile = _tile([r[...] for r in h_refs], [r[...] for r in w_refs], temps,
                 j, bv, v)
    carry = jax.tree.unflatten(carry_tree, [r[...] for r in acc_refs])
    row_vals = jax.tree.unflatten(rows_tree, [r[...] for r in row_refs])
    new = jax.tree.leaves(step_fn(carry, tile, row_vals))
    for ref, leaf in zip(acc_refs, new):
      ref[...] = leaf

    @pl.when(j == n_v - 1)
    def _():
      for ref, leaf in zip(out_refs, new):
        ref[...] = leaf.astype(ref.dtype)

  inputs = (*[h for h, _, _ in sources], *[w for _, w, _ in sources],
            *rows_flat)
  out = pl.pallas_call(
      kernel,
      grid_spec=pl.GridSpec(
          grid=(pl.cdiv(n, bn), n_v),
          in_specs=_specs(sources, rows_flat, bn, bv, lambda i, j: i,
                          lambda i, j: j),
          out_specs=[pl.BlockSpec((bn, c.shape[1]), lambda i, j: (i, 0))
                     for c in carry_flat],
          scratch_shapes=[pltpu.VMEM((bn, c.shape[1]), c.dtype)
                          for c in carry_flat]),
      out_shape=[out_struct((n, c.shape[1]), c.dtype, inputs)
                 for c in carry_flat],
      name="vocab_stream_fwd_tpu",
      **_params(("parallel", "arbitrary"), plan, interpret,
                _cost("fwd", sources, rows_flat, plan,
                      sum(n * c.shape[1] * c.dtype.itemsize for c in carry_flat))),
  )(*inputs)
  return jax.tree.unflatten(carry_tree, out)


def backward(sources, dz_fn, rows, *, tiles: VocabTiles, interpret):
  """Mosaic version of ``_xla_loop.backward``: (d h, d w) of the first source.

  ``dz_fn(tile, rows)`` is the cotangent of the first source's tempered
  logits on a (block_n, block_v) tile; rows: pytree of (N, k) arrays.
  """
  h0, w0, t0 = sources[0]
  n, v = h0.shape[0], w0.shape[1]
  n_src = len(sources)
  temps = [t for _, _, t in sources]
  rows_flat, rows_tree = jax.tree.flatten(rows)
  _check_rows(rows_flat, n)
  n_rows = len(rows_flat)
  inv_t0 = 1.0 / t0  # a Python float: kernels may not capture arrays
  inputs = (*[h for h, _, _ in sources], *[w for _, w, _ in sources],
            *rows_flat)

  def split(refs):
    h_refs, w_refs = refs[:n_src], refs[n_src:2 * n_src]
    row_vals = jax.tree.unflatten(
        rows_tree, [r[...] for r in refs[2 * n_src:2 * n_src + n_rows]])
    return h_refs, w_refs, row_vals, refs[2 * n_src + n_rows:]

  def tile_dz(h_vals, w_vals, j, bv, row_vals):
    tile = _tile(h_vals, w_vals, temps, j, bv, v)
    dz_bC = jnp.where(tile.valid_1C, dz_fn(tile, row_vals), 0.0) * inv_t0
    return tile, dz_bC

  # d hidden: rows parallel, vocabulary sequential.
  dh_plan = _mosaic_budget.plan(
      "dh", n, v, _operands(sources, rows_flat, out_bytes=h0.dtype.itemsize),
      tiles)
  bn, bv = dh_plan.block_n, dh_plan.block_v
  n_v = pl.cdiv(v, bv)

  def dh_kernel(*refs):
    h_refs, w_refs, row_vals, (dh_ref, acc_ref) = split(refs)
    j = pl.program_id(1)

    @pl.when(j == 0)
    def _():
      acc_ref[...] = jnp.zeros_like(acc_ref)

    w_vals = [r[...] for r in w_refs]
    tile, dz_bC = tile_dz([r[...] for r in h_refs], w_vals, j, bv, row_vals)
    w_DC = jnp.where(tile.valid_1C, w_vals[0], 0)  # columns >= V: garbage
    acc_ref[...] += _dot(dz_bC.astype(w_DC.dtype), w_DC, _NT)

    @pl.when(j == n_v - 1)
    def _():
      dh_ref[...] = acc_ref[...].astype(dh_ref.dtype)

  dh = pl.pallas_call(
      dh_kernel,
      grid_spec=pl.GridSpec(
          grid=(pl.cdiv(n, bn), n_v),
          in_specs=_specs(sources, rows_flat, bn, bv, lambda i, j: i,
                          lambda i, j: j),
          out_specs=pl.BlockSpec((bn, h0.shape[1]), lambda i, j: (i, 0)),
          scratch_shapes=[pltpu.VMEM((bn, h0.shape[1]), jnp.float32)]),
      out_shape=out_struct(h0.shape, h0.dtype, inputs),
      name="vocab_stream_bwd_dh_tpu",
      **_params(("parallel", "arbitrary"), dh_plan, interpret,
                _cost("dh", sources, rows_flat, dh_plan, h0.size * h0.dtype.itemsize)),
  )(*inputs)

  # d w: vocabulary parallel, rows sequential.
  dw_plan = _mosaic_budget.plan(
      "dw", n, v, _operands(sources, rows_flat, out_bytes=w0.dtype.itemsize),
      tiles)
  bn, bv = dw_plan.block_n, dw_plan.block_v
  n_r = pl.cdiv(n, bn)

  def dw_kernel(*refs):
    h_refs, w_refs, row_vals, (dw_ref, acc_ref) = split(refs)
    j, r = pl.program_id(0), pl.program_id(1)

    @pl.when(r == 0)
    def _():
      acc_ref[...] = jnp.zeros_like(acc_ref)

    h_vals = [ref[...] for ref in h_refs]
    _, dz_bC = tile_dz(h_vals, [ref[...] for ref in w_refs], j, bv, row_vals)
    valid_b1 = r * bn + lax.broadcasted_iota(jnp.int32, (bn, 1), 0) < n
    h_bD = jnp.where(valid_b1, h_vals[0], 0)  # rows >= N: garbage
    dz_bC = jnp.where(valid_b1, dz_bC, 0.0)
    acc_ref[...] += _dot(h_bD, dz_bC.astype(h_bD.dtype), _TN)

    @pl.when(r == n_r - 1)
    def _():
      dw_ref[...] = acc_ref[...].astype(dw_ref.dtype)

  dw = pl.pallas_call(
      dw_kernel,
      grid_spec=pl.GridSpec(
          grid=(pl.cdiv(v, bv), n_r),
          in_specs=_specs(sources, rows_flat, bn, bv, lambda j, r: r,
                          lambda j, r: j),
          out_specs=pl.BlockSpec((w0.shape[0], bv), lambda j, r: (0, j)),
          scratch_shapes=[pltpu.VMEM((w0.shape[0], bv), jnp.float32)]),
      out_shape=out_struct(w0.shape, w0.dtype, inputs),
      name="vocab_stream_bwd_dw_tpu",
      **_params(("parallel", "arbitrary"), dw_plan, interpret,
                _cost("dw", sources, rows_flat, dw_plan, w0.size * w0.dtype.itemsize)),
  )(*inputs)
  return reduce_like(dh, h0), reduce_like(dw, w0)
