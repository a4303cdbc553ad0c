"""The vocabulary-sharded ops on the 8-device fake mesh equal the single-device ones.

The mesh is (data 2, fsdp 1, tensor 4): rows split in two, the head's
columns in four. Each op's value and its gradients (of hidden, w and, for
cross terms, that q gets none) are compared with the op's plain-jnp
reference on one device, for the chunked-XLA loop per shard and for the
Pallas kernels in interpret mode (the Triton ones, and the Mosaic ones in TPU
interpret mode). Targets, top-k winners and masked rows fall on every shard.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu
from kernel_testing import TOLERANCES, assert_close

from jaxrl_llm import kernels
from jaxrl_llm.kernels import VocabTiles
from jaxrl_llm.kernels.sharded import (VocabSharding, gather_logprobs_sharded, token_logprobs_sharded,
                                       vocab_cross_sharded, vocab_cross_topk_sharded, vocab_topk_sharded)
from jaxrl_llm.model.sharding import MeshConfig, make_mesh

N, D, E, V, K = 24, 16, 12, 4 * 72, 5  # 72 columns per shard: 2 chunks of 48 (the last overlapping)
TILES = VocabTiles(block_n=16, block_v=32, chunk_v=48, tpu_block_n=8, tpu_block_v=128)
IMPLS = [pytest.param(dict(impl="xla_chunked", tiles=TILES), id="xla_chunked"),
         pytest.param(dict(impl="pallas", interpret=True, tiles=TILES), id="triton_interpret"),
         pytest.param(dict(impl="pallas", interpret=pltpu.InterpretParams(uninitialized_memory="nan"), tiles=TILES),
                      id="mosaic_interpret")]
DTYPES = [pytest.param(jnp.float32, id="f32"), pytest.param(jnp.bfloat16, id="bf16")]


# The module-scoped fixtures run once: the module's tests go to one pytest-xdist worker.
pytestmark = pytest.mark.xdist_group("kernels.test_sharded")


@pytest.fixture(scope="module")
def sharding():
  return VocabSharding(make_mesh(MeshConfig(data=2, fsdp=1, tensor=4)))


def _inputs(dtype, seed=0):
  ks = jax.random.split(jax.random.key(seed), 6)
  h = jax.random.normal(ks[0], (N, D)).astype(dtype)
  w = (0.5 * jax.random.normal(ks[1], (D, V))).astype(dtype)
  hq = jax.random.normal(ks[2], (N, E)).astype(dtype)
  wq = (0.5 * jax.random.normal(ks[3], (E, V))).astype(dtype)
  targets = jax.random.randint(ks[4], (N,), 0, V)
  ids = jax.random.randint(ks[5], (N, 3), 0, V)
  mask = jnp.arange(N) % 7 != 3
  return h, w, hq, wq, targets, ids, mask


def _place(sharding, *xs):
  """Rows over the row axes, heads over the vocabulary axis (as the trainer holds them)."""
  put = lambda x, spec: jax.device_put(x, jax.sharding.NamedSharding(sharding.mesh, spec))
  return [put(x, sharding.head if x.shape[-1] == V and x.ndim == 2 and x.shape[0] in (D, E) else
              sharding.rows) for x in xs]


def _grads(fn, argnums, *args):
  """Value and gradient of a fixed random linear functional of every output."""
  def loss(*a):
    out = fn(*a)
    leaves = [x for x in jax.tree.leaves(out) if jnp.issubdtype(x.dtype, jnp.floating)]
    coefs = [jnp.cos(jnp.arange(x.size, dtype=jnp.float32)).reshape(x.shape) for x in leaves]
    return sum(jnp.sum(c * x) for c, x in zip(coefs, leaves)), out
  return jax.jit(jax.value_and_grad(loss, argnums=argnums, has_aux=True))(*args)


def _compare(got, want, dtype, what):
  (_, out_g), grads_g = got
  (_, out_w), grads_w = want
  tol = TOLERANCES[dtype]
  for name, a, b in zip(out_g.__dataclass_fields__, jax.tree.leaves(out_g), jax.tree.leaves(out_w)):
    if jnp.issubdtype(b.dtype, jnp.integer):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=f"{what}.{name}")
    else:
      assert_close(a, b, tol["fwd"], f"{what}.{name}")
  for i, (a, b) in enumerate(zip(jax.tree.leaves(grads_g), jax.tree.leaves(grads_w))):
    assert_close(a, b, tol["grad"], f"{what} grad[{i}]")


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kw", IMPLS)
def test_token_and_gather_logprobs(sharding, kw, dtype):
  h, w, _, _, targets, ids, mask = _inputs(dtype)
  hs, ws, ts, idss, ms = _place(sharding, h, w, targets, ids, mask)
  for name, sharded, ref, t, ts_ in (
      ("token_logprobs", token_logprobs_sharded, kernels.token_logprobs_reference, targets, ts),
      ("gather_logprobs", gather_logprobs_sharded, kernels.gather_logprobs_reference, ids, idss)):
    got = _grads(lambda a, b, tt, m: sharded(a, b, tt, sharding=sharding, temperature=0.7, mask_N=m, **kw),
                 (0, 1), hs, ws, ts_, ms)
    want = _grads(lambda a, b: ref(a, b, t, temperature=0.7, mask_N=mask), (0, 1), h, w)
    _compare(got, want, dtype, name)


@pytest.mark.slow
@pytest.mark.parametrize("kw", IMPLS)
def test_vocab_topk(sharding, kw):
  h, w, *_, mask = _inputs(jnp.float32, seed=1)
  hs, ws, ms = _place(sharding, h, w, mask)
  got = _grads(lambda a, b, m: vocab_topk_sharded(a, b, k=K, sharding=sharding, temperature=1.3, mask_N=m, **kw),
               (0, 1), hs, ws, ms)
  want = _grads(lambda a, b: kernels.vocab_topk_reference(a, b, k=K, temperature=1.3, mask_N=mask), (0, 1), h, w)
  _compare(got, want, jnp.float32, "vocab_topk")
  # The winners really come from several shards (else the merge is untested).
  owners = np.asarray(got[0][1].ids) // (V // sharding.n_shards)
  assert len(np.unique(owners[np.asarray(mask)])) == sharding.n_shards


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kw", IMPLS)
def test_vocab_cross(sharding, kw, dtype):
  h, w, hq, wq, _, _, mask = _inputs(dtype, seed=2)
  args = _place(sharding, h, w, hq, wq, mask)
  got = _grads(lambda a, b, c, d, m: vocab_cross_sharded(a, b, c, d, sharding=sharding, temperature=0.7,
                                                         temperature_q=1.2, mask_N=m, **kw),
               (0, 1, 2, 3), *args)
  want = _grads(lambda a, b, c, d: kernels.vocab_cross_reference(a, b, c, d, temperature=0.7, temperature_q=1.2,
                                                                 mask_N=mask), (0, 1, 2, 3), h, w, hq, wq)
  _compare(got, want, dtype, "vocab_cross")
  for g in got[1][2:]:  # q is stop-gradient
    assert not np.any(np.asarray(g, np.float32))


@pytest.mark.parametrize("tail", ["rescale", "renormalize"])
def test_vocab_cross_topk(sharding, tail):
  h, w, hq, wq, *_, mask = _inputs(jnp.float32, seed=3)
  q = kernels.vocab_topk_reference(hq, wq, k=K)  # q's own top-k: ids spread over shards
  hs, ws, ids, lq, ms = _place(sharding, h, w, q.ids, q.logp, mask)
  got = _grads(lambda a, b, i, l, m: vocab_cross_topk_sharded(a, b, i, l, tail=tail, sharding=sharding,
                                                              mask_N=m, impl="xla_chunked", tiles=TILES),
               (0, 1), hs, ws, ids, lq, ms)
  want = _grads(lambda a, b: kernels.vocab_cross_topk_reference(a, b, q.ids, q.logp, tail=tail, mask_N=mask),
                (0, 1), h, w)
  _compare(got, want, jnp.float32, f"vocab_cross_topk[{tail}]")


def test_out_of_range_id_is_nan_and_shapes_are_checked(sharding):
  h, w, *_, mask = _inputs(jnp.float32)
  bad = jnp.zeros((N,), jnp.int32).at[1].set(V)
  out = jax.jit(lambda t: token_logprobs_sharded(h, w, t, sharding=sharding, impl="xla_chunked"))(bad)
  logp = np.asarray(out.logp)
  assert np.isnan(logp[1]) and np.all(np.isfinite(np.delete(logp, 1)))
  with pytest.raises(ValueError, match="not divisible by the 'tensor' mesh axis"):
    token_logprobs_sharded(h, w[:, :V - 2], bad, sharding=sharding)
  with pytest.raises(ValueError, match="rows N=23"):
    token_logprobs_sharded(h[:23], w, bad[:23], sharding=sharding)
  with pytest.raises(ValueError, match=rf"k={V + 1}: must be an int in \[1, V = {V}\]"):
    vocab_topk_sharded(h, w, k=V + 1, sharding=sharding)


def test_vocab_topk_wider_than_a_shard(sharding):
  """k = 80 > V / 4 = 72 columns per shard: each shard proposes all its columns."""
  h, w, *_, mask = _inputs(jnp.float32, seed=5)
  k = V // sharding.n_shards + 8
  hs, ws, ms = _place(sharding, h, w, mask)
  got = _grads(lambda a, b, m: vocab_topk_sharded(a, b, k=k, sharding=sharding, mask_N=m, impl="xla_chunked",
                                                  tiles=TILES), (0, 1), hs, ws, ms)
  want = _grads(lambda a, b: kernels.vocab_topk_reference(a, b, k=k, mask_N=mask), (0, 1), h, w)
  _compare(got, want, jnp.float32, "vocab_topk k > V / shards")


@pytest.mark.slow
def test_vocab_ops_dispatch(sharding):
  """Every VocabOps method runs the split op, also on rows that do not divide over the row axes
  (padded, masked, cut off), with the plain op's values and gradients."""
  h, w, hq, wq, targets, ids, mask = _inputs(jnp.float32, seed=4)
  split, plain = (kernels.VocabOps(impl="xla_chunked", tiles=TILES, sharding=s) for s in (sharding, None))
  q = kernels.vocab_topk_reference(hq, wq, k=K)
  calls = {
      "token_logprobs": lambda ops, h, w, m: ops.token_logprobs(h, w, targets[:h.shape[0]], temperature=0.8,
                                                                mask_N=m),
      "gather_logprobs": lambda ops, h, w, m: ops.gather_logprobs(h, w, ids[:h.shape[0]], mask_N=m),
      "vocab_topk": lambda ops, h, w, m: ops.vocab_topk(h, w, k=K, mask_N=m),
      "vocab_cross": lambda ops, h, w, m: ops.vocab_cross(h, w, hq[:h.shape[0]], wq, mask_N=m),
      "vocab_cross_topk": lambda ops, h, w, m: ops.vocab_cross_topk(h, w, q.ids[:h.shape[0]], q.logp[:h.shape[0]],
                                                                    tail="rescale", mask_N=m),
  }
  for name, call in calls.items():
    for rows in (N, N - 1):  # N - 1 = 23 rows do not divide over data=2: padded to 24
      for m in (None, mask[:rows]):
        run = lambda ops: _grads(lambda a, b: call(ops, a, b, m), (0, 1), h[:rows], w)
        jaxpr = str(jax.make_jaxpr(lambda a: call(split, a, w, m))(h[:rows]))
        assert "shard_map" in jaxpr, f"{name} rows={rows}: the plain op ran"
        _compare(run(split), run(plain), jnp.float32, f"{name} rows={rows}")


def test_vocab_ops_vocabulary_that_does_not_divide_is_an_error(sharding):
  h, w, _, _, targets, *_ = _inputs(jnp.float32)
  ops = kernels.VocabOps(impl="xla_chunked", tiles=TILES, sharding=sharding)
  with pytest.raises(ValueError, match=r"V=286 is not divisible by the 'tensor' mesh axis of size 4 "
                                       r"\(mesh .*\): pad the head's columns to a multiple of 4"):
    ops.token_logprobs(h, w[:, :V - 2], targets)


def test_vocab_ops_on_a_vocabulary_axis_of_one_run_the_plain_op():
  """tensor = 1: the head is whole on every device; the plain op is the same program, no shard_map."""
  h, w, _, _, targets, *_ = _inputs(jnp.float32)
  ops = kernels.VocabOps(impl="xla_chunked", tiles=TILES,
                         sharding=VocabSharding(make_mesh(MeshConfig(data=8, fsdp=1, tensor=1))))
  assert "shard_map" not in str(jax.make_jaxpr(lambda a: ops.token_logprobs(a, w, targets[:N - 1]))(h[:N - 1]))


KERNELS = [pytest.param(dict(impl="pallas", interpret=True, tiles=TILES), id="triton_interpret"),
           pytest.param(dict(impl="pallas", interpret=pltpu.InterpretParams(uninitialized_memory="nan"), tiles=TILES),
                        id="mosaic_interpret")]


@pytest.mark.slow  # 10-30 s: the kernels interpreted, 4 ops, forward and gradient
@pytest.mark.parametrize("mesh_cfg,kw", [
    pytest.param(MeshConfig(data=8, fsdp=1, tensor=1), KERNELS[0].values[0], id="data8-triton_interpret"),
    pytest.param(MeshConfig(data=2, fsdp=4, tensor=1), KERNELS[1].values[0], id="data2-fsdp4-mosaic_interpret")])
def test_vocab_ops_run_the_kernels_per_row_shard(mesh_cfg, kw):
  """tensor = 1 with a Pallas kernel: the plain op per row shard inside shard_map (a kernel is a custom
  call XLA cannot split), the head whole inside (split along D over fsdp outside, as the policy's is),
  rows that do not divide padded. Values and gradients are the plain op's on one device."""
  mesh = make_mesh(mesh_cfg)
  sharding = VocabSharding(mesh, embed_axis="fsdp")
  h, w, hq, wq, targets, ids, mask = _inputs(jnp.float32, seed=6)
  w_split = jax.device_put(w, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp", None)))
  rows_ops, plain = kernels.VocabOps(sharding=sharding, **kw), kernels.VocabOps(**kw)
  assert rows_ops._mode() == "rows"  # pylint: disable=protected-access
  q = kernels.vocab_topk_reference(hq, wq, k=K)
  calls = {
      "token_logprobs": lambda ops, h, w, m: ops.token_logprobs(h, w, targets[:h.shape[0]], temperature=0.8,
                                                                mask_N=m),
      "vocab_topk": lambda ops, h, w, m: ops.vocab_topk(h, w, k=K, mask_N=m),
      "vocab_cross": lambda ops, h, w, m: ops.vocab_cross(h, w, hq[:h.shape[0]], wq, mask_N=m),
      "vocab_cross_topk": lambda ops, h, w, m: ops.vocab_cross_topk(h, w, q.ids[:h.shape[0]], q.logp[:h.shape[0]],
                                                                    tail="rescale", mask_N=m),
  }
  for name, call in calls.items():
    # 21 rows do not divide over 8 row shards: padded to 24; the unpadded, unmasked call once.
    for rows, m in ((N, None), (N - 3, mask[:N - 3]))[0 if name == "token_logprobs" else 1:]:
      jaxpr = str(jax.make_jaxpr(lambda a, b: call(rows_ops, a, b, m))(h[:rows], w_split))
      assert "shard_map" in jaxpr and ("all_gather" in jaxpr) == (mesh_cfg.fsdp > 1), name
      got = _grads(lambda a, b: call(rows_ops, a, b, m), (0, 1), h[:rows], w_split)
      want = _grads(lambda a, b: call(plain, a, b, m), (0, 1), h[:rows], w)
      _compare(got, want, jnp.float32, f"{name} rows={rows}")


def test_vocab_ops_keep_the_plain_op_where_xla_partitions_it():
  """The XLA paths (and any op on one device) stay the plain op: XLA partitions them itself. This is
  the CPU default (impl auto -> xla_chunked on a data-only mesh): the same program as before."""
  h, w, _, _, targets, *_ = _inputs(jnp.float32)
  data8 = VocabSharding(make_mesh(MeshConfig(data=8, fsdp=1, tensor=1)), embed_axis="fsdp")
  one = VocabSharding(make_mesh(MeshConfig(data=1, fsdp=1, tensor=1), devices=jax.devices()[:1]))
  for ops in (kernels.VocabOps(impl="auto", sharding=data8), kernels.VocabOps(impl="xla_chunked", sharding=data8),
              kernels.VocabOps(impl="pallas", interpret=True, sharding=one)):
    assert ops._mode() == "plain"  # pylint: disable=protected-access
    assert "shard_map" not in str(jax.make_jaxpr(lambda a: ops.token_logprobs(a, w, targets))(h))


@pytest.mark.slow  # about 10 s with the Mosaic kernels interpreted
@pytest.mark.parametrize("kw", [pytest.param(dict(impl="xla_chunked", tiles=TILES), id="xla_chunked"),
                                KERNELS[1]])
def test_vocabulary_split_with_the_head_split_along_d(kw):
  """fsdp 2 x tensor 4 with embed_axis: the head enters P(fsdp, tensor) and is gathered along D inside
  (its gradient leaves reduce-scattered over fsdp); values and gradients are the reference's."""
  mesh = make_mesh(MeshConfig(data=1, fsdp=2, tensor=4))
  sharding = VocabSharding(mesh, embed_axis="fsdp")
  assert sharding.trainable_head(D) == jax.sharding.PartitionSpec("fsdp", "tensor")
  assert sharding.trainable_head(D + 1) == sharding.head  # D that fsdp does not divide: whole along D
  h, w, hq, wq, targets, _, mask = _inputs(jnp.float32, seed=7)
  ws = jax.device_put(w, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp", "tensor")))
  got = _grads(lambda a, b: token_logprobs_sharded(a, b, targets, sharding=sharding, temperature=0.7, mask_N=mask,
                                                   **kw), (0, 1), h, ws)
  want = _grads(lambda a, b: kernels.token_logprobs_reference(a, b, targets, temperature=0.7, mask_N=mask), (0, 1),
                h, w)
  _compare(got, want, jnp.float32, "token_logprobs")
  got = _grads(lambda a, b: vocab_cross_sharded(a, b, hq, wq, sharding=sharding, mask_N=mask, **kw), (0, 1), h, ws)
  want = _grads(lambda a, b: kernels.vocab_cross_reference(a, b, hq, wq, mask_N=mask), (0, 1), h, w)
  _compare(got, want, jnp.float32, "vocab_cross")
