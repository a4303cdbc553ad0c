"""The TPU (Mosaic) kernels on CPU, in Pallas's TPU interpret mode, vs each
op's plain-jnp reference: forward and jax.grad, f32 and bf16.

``interpret=pltpu.InterpretParams(...)`` selects the Mosaic kernels
(``config.resolve_impl``). The interpreter runs their grid, BlockSpecs and
VMEM scratch as a TPU would, with its checks on: ``uninitialized_memory=
"nan"`` fills every buffer it allocates (scratch, output blocks, the part of
a partial block past N or V) with NaN, so a missing init or mask gives a
non-finite output, which ``assert_close`` rejects; ``detect_races=True``
records unordered accesses to one buffer, which can only happen between
cores: ``test_no_race_between_cores`` splits the parallel grid axis over two
simulated TensorCores and asserts none (the other tests run on one core,
where the grid is sequential, to keep the file short).

Shapes are ragged on purpose: N = 20 rows over tpu_block_n = 8 (the last row
block holds 4 real rows), V = 301 over tpu_block_v = 128 (the last vocabulary
block holds 45 real columns), the last 3 rows masked, temperatures 0.7 (p)
and 1.3 (q). The vocabularies of real models (49,152 SmolLM2, 151,936 Qwen2,
262,144 Gemma 3) run on 12 rows over tpu_block_n = 8 with tpu_block_v =
40,064 (a multiple of 128 that divides none of them) so that the interpreted
grid stays short.

Whether the kernels lower for a TPU at all is ``test_mosaic_lowering.py``.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu
from kernel_testing import assert_close, random_inputs, ragged_mask

from jaxrl_llm.kernels import (VocabTiles, gather_logprobs,
                               gather_logprobs_reference, token_logprobs,
                               token_logprobs_reference, vocab_cross,
                               vocab_cross_reference, vocab_cross_topk,
                               vocab_cross_topk_reference, vocab_topk,
                               vocab_topk_reference)

INTERPRET = pltpu.InterpretParams(uninitialized_memory="nan")
N, D, E, V = 20, 24, 20, 301
TILES = VocabTiles(tpu_block_n=8, tpu_block_v=128)

# Tolerances relative to max(1, max |reference|), elementwise.
# f32: f32 matmuls at Precision.HIGHEST on both sides, only the order of the
#   sums differs.
# bf16: the same bf16 inputs on both sides and f32 maths, so the forward
#   differs by summation order only; the backward feeds dz to the MXU rounded
#   to bf16 (relative 2^-9 ~ 2e-3 per term) and both sides round the
#   gradients to bf16 (2^-9 ~ 2e-3 of their size), so 1.6e-2 of the largest
#   entry (as for the other paths, kernel_testing.py) leaves room for both.
TOLERANCES = {
    jnp.float32: dict(fwd=2e-5, grad=2e-5),
    jnp.bfloat16: dict(fwd=2e-4, grad=1.6e-2),
}


def _problem(op, dtype, n=N, d=D, v=V, seed=0):
  """(args, call, q_args): the differentiable inputs, call(fn, *args, **kw)
  -> the op's outputs as a tuple, and which args are q's (no gradient)."""
  h, w = random_inputs(seed, dtype, n=n, d=d, v=v)
  mask = ragged_mask(n, keep=n - 3)
  key = jax.random.key(seed + 1)
  if op == "token_logprobs":
    t = jax.random.randint(key, (n,), 0, v)
    call = lambda f, h, w, **kw: tuple(jax.tree.leaves(f(  # noqa: E731
        h, w, t, temperature=0.7, mask_N=mask, **kw)))
    return (h, w), call, ()
  if op == "gather_logprobs":
    ids = jax.random.randint(key, (n, 3), 0, v)
    call = lambda f, h, w, **kw: tuple(jax.tree.leaves(f(  # noqa: E731
        h, w, ids, temperature=0.7, mask_N=mask, **kw)))
    return (h, w), call, ()
  if op == "vocab_topk":
    call = lambda f, h, w, **kw: tuple(jax.tree.leaves(f(  # noqa: E731
        h, w, k=5, temperature=0.7, mask_N=mask, **kw)))
    return (h, w), call, ()
  hq, wq = random_inputs(seed + 2, dtype, n=n, d=E, v=v)
  if op == "vocab_cross":
    call = lambda f, h, w, hq, wq, **kw: tuple(jax.tree.leaves(f(  # noqa: E731
        h, w, hq, wq, temperature=0.7, temperature_q=1.3, mask_N=mask,
        **kw)))
    return (h, w, hq, wq), call, (2, 3)
  tail = op.rsplit("-", 1)[1]  # vocab_cross_topk-<tail>
  q = vocab_topk_reference(hq, wq, k=6, temperature=1.3)
  call = lambda f, h, w, lq, **kw: tuple(jax.tree.leaves(f(  # noqa: E731
      h, w, q.ids, lq, tail=tail, temperature=0.7, mask_N=mask,
      **kw)))
  return (h, w, q.logp), call, (2,)


OPS = {
    "token_logprobs": (token_logprobs, token_logprobs_reference),
    "gather_logprobs": (gather_logprobs, gather_logprobs_reference),
    "vocab_topk": (vocab_topk, vocab_topk_reference),
    "vocab_cross": (vocab_cross, vocab_cross_reference),
    "vocab_cross_topk-rescale": (vocab_cross_topk, vocab_cross_topk_reference),
    "vocab_cross_topk-renormalize": (vocab_cross_topk,
                                     vocab_cross_topk_reference),
}


def _value_and_grad(fn, call, args, **kw):
  """Outputs and the gradient of a random weighting of every float output
  with respect to every arg."""

  def loss(*args):
    outs = call(fn, *args, **kw)
    total = sum(jnp.sum(x * jax.random.normal(jax.random.key(i), x.shape))
                for i, x in enumerate(outs)
                if jnp.issubdtype(x.dtype, jnp.floating))
    return total, outs

  grad = jax.value_and_grad(loss, argnums=tuple(range(len(args))),
                            has_aux=True)
  (_, outs), grads = jax.jit(grad)(*args)
  return outs, grads


@functools.cache
def _reference(op, dtype, n=N, d=D, v=V):
  args, call, _ = _problem(op, dtype, n, d, v)
  return _value_and_grad(OPS[op][1], call, args)


def _check(op, dtype, outs, grads, ref, q_args):
  ref_outs, ref_grads = ref
  tol = TOLERANCES[dtype]
  for i, (out, expected) in enumerate(zip(outs, ref_outs)):
    if jnp.issubdtype(expected.dtype, jnp.integer):  # top-k ids: exact
      np.testing.assert_array_equal(out, expected, err_msg=f"{op} ids")
    else:
      assert_close(out, expected, tol["fwd"], f"{op} output {i}")
  for i, (g, expected) in enumerate(zip(grads, ref_grads)):
    if i in q_args:  # q is stop-gradient
      assert not np.any(np.asarray(g, np.float32)), f"{op}: d q-arg {i} != 0"
    else:
      assert_close(g, expected, tol["grad"], f"{op} d arg {i}")
  assert grads[0].dtype == dtype and grads[1].dtype == dtype


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16],
                         ids=["f32", "bf16"])
@pytest.mark.slow
@pytest.mark.parametrize("op", list(OPS))
def test_forward_and_grad_match_reference(op, dtype):
  args, call, q_args = _problem(op, dtype)
  outs, grads = _value_and_grad(OPS[op][0], call, args, impl="pallas",
                                tiles=TILES, interpret=INTERPRET)
  _check(op, dtype, outs, grads, _reference(op, dtype), q_args)
  # Masked rows (the last 3, inside the partial row block): zero outputs and
  # zero d hidden.
  assert all(not np.any(np.asarray(o, np.float32)[-3:]) for o in outs)
  assert not np.any(np.asarray(grads[0], np.float32)[-3:])


def test_budget_tiles_take_whole_small_axes():
  """Without tpu_block_* the budget picks blocks >= N and >= V: one block of
  the whole array each (legal on a TPU although 20 and 301 are not multiples
  of 8 and 128)."""
  args, call, q_args = _problem("vocab_cross", jnp.float32)
  outs, grads = _value_and_grad(vocab_cross, call, args, impl="pallas",
                                interpret=INTERPRET)
  _check("vocab_cross", jnp.float32, outs, grads,
         _reference("vocab_cross", jnp.float32), q_args)


# A real model's vocabulary per op (each op once, to keep the file short).
REAL = [
    pytest.param("vocab_cross", 49_152, id="vocab_cross-49152"),
    pytest.param("vocab_topk", 151_936, id="vocab_topk-151936"),
    pytest.param("gather_logprobs", 262_144, id="gather_logprobs-262144"),
]


@pytest.mark.slow
@pytest.mark.parametrize("op,v", REAL)
def test_real_vocabulary_sizes(op, v):
  n, d = 12, 32
  args, call, q_args = _problem(op, jnp.bfloat16, n=n, d=d, v=v)
  tiles = VocabTiles(tpu_block_n=8, tpu_block_v=40_064)
  outs, grads = _value_and_grad(OPS[op][0], call, args, impl="pallas",
                                tiles=tiles, interpret=INTERPRET)
  _check(op, jnp.bfloat16, outs, grads, _reference(op, jnp.bfloat16, n, d, v),
         q_args)


@pytest.mark.slow
def test_per_device_inside_shard_map():
  """The kernels run per device: rows over two devices, w replicated (d w
  summed over the devices by the custom_vjp), same as one device."""
  from jax.sharding import Mesh, PartitionSpec as P
  n = 16
  args, _, _ = _problem("token_logprobs", jnp.float32, n=n)
  targets_N = jax.random.randint(jax.random.key(5), (n,), 0, V)
  mesh = Mesh(np.array(jax.devices()[:2]), ("x",))

  def per_device(h, w, t):
    return token_logprobs(h, w, t, temperature=0.7, impl="pallas",
                          tiles=TILES, interpret=INTERPRET).logp

  sharded = jax.shard_map(per_device, mesh=mesh,
                          in_specs=(P("x"), P(), P("x")), out_specs=P("x"))
  loss = lambda f: jax.jit(jax.value_and_grad(  # noqa: E731
      lambda h, w: jnp.sum(f(h, w, targets_N) ** 2), argnums=(0, 1)))
  val, grads = loss(sharded)(*args)
  ref_val, ref_grads = loss(per_device)(*args)
  assert_close(val, ref_val, 1e-5, "loss")
  assert_close(grads[0], ref_grads[0], 1e-5, "d hidden")
  assert_close(grads[1], ref_grads[1], 1e-5, "d w")


def _races():
  from jax._src.pallas.mosaic.interpret import interpret_pallas_call
  return interpret_pallas_call.races


@pytest.mark.slow
def test_no_race_between_cores(capsys):
  """Two simulated TensorCores share the parallel axis (rows in the forward
  and d hidden, vocabulary in d w), in a random order: no race, and the
  same numbers."""
  params = pltpu.InterpretParams(detect_races=True, uninitialized_memory="nan",
                                 num_cores_or_threads=2, random_seed=3)
  op, dtype = "token_logprobs", jnp.float32
  args, call, q_args = _problem(op, dtype)
  outs, grads = _value_and_grad(token_logprobs, call, args, impl="pallas",
                                tiles=TILES, interpret=params)
  _check(op, dtype, outs, grads, _reference(op, dtype), q_args)
  assert not _races().races_found  # the last kernel: d w
  # Every kernel prints what it finds (the control below shows it does).
  assert "RACE DETECTED" not in capsys.readouterr().out


def test_race_detector_catches_a_racy_kernel(capsys):
  """Control: two parallel programs writing one output block is a race the
  same InterpretParams report."""
  from jax.experimental import pallas as pl

  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]

  params = pltpu.InterpretParams(detect_races=True, num_cores_or_threads=2)
  racy = pl.pallas_call(
      kernel, grid=(2,), in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
      out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
      out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
      compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
      interpret=params)
  jax.block_until_ready(racy(jnp.ones((16, 128))))
  assert _races().races_found
  assert "RACE DETECTED" in capsys.readouterr().out
