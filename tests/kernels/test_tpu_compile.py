"""The Mosaic kernels and the RL update compiled by the real TPU compiler, on this CPU.

With ``libtpu`` installed (``pip install -e ".[tpu-aot]"``), the devices of a
TPU topology (``jax.experimental.topologies.get_topology_desc``) are real TPU
devices to compile for: ``jax.jit(f).lower(<ShapeDtypeStructs sharded over
them>).compile()`` runs XLA:TPU and Mosaic (layout assignment, VMEM
allocation) without a TPU. Nothing runs; what is checked is that every
program compiles, and what the compiled program holds: the kernels' custom
calls, their VMEM limit per generation, the collectives and the bytes per
chip. The mesh of the topology's devices is put in context
(``use_abstract_mesh``), as the trainer does, so ``impl="auto"`` picks the
Mosaic kernels although ``jax.default_backend()`` is "cpu".

Shapes: real vocabularies and widths, few rows. Compiles are shared: each
case compiles once per module. The whole file: 47 tests in 3 min 44 s on 2
shared cores at load 5-6 (the 36 kernel compiles 144 s, 1-7 s each; the six
updates 11-16 s each), hence ``slow``.
"""

import functools
import os
import re

# Before libtpu is loaded: the other xdist workers (and scripts) may hold it too.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import pytest  # noqa: E402

try:
  import libtpu  # noqa: F401,E402
except ImportError:
  pytest.skip('libtpu is not installed: pip install -e ".[tpu-aot]" (compile-only TPU checks)',
              allow_module_level=True)

pytestmark = pytest.mark.slow  # minutes of compiling on 2 cores (module docstring)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.experimental import topologies  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

from jaxrl_llm import kernels  # noqa: E402
from jaxrl_llm import model as model_lib  # noqa: E402
from jaxrl_llm.kernels import resolve_impl, target  # noqa: E402
from jaxrl_llm.model.logprobs import vocab_ops  # noqa: E402
from jaxrl_llm.model.sharding import MeshConfig, batch_sharding, make_mesh, param_shardings, replicated  # noqa: E402
from jaxrl_llm.objectives import get_preset  # noqa: E402
from jaxrl_llm.training.batch import TrainBatch  # noqa: E402
from jaxrl_llm.learn.optim import adamw  # noqa: E402
from jaxrl_llm.training.update import UpdateSpec, UpdateState, make_updater  # noqa: E402

MIB = 1 << 20
# generation -> (topology, device_kind, VMEM per core in MiB, the kernels' vmem_limit_bytes in MiB:
# twice the default budget min(32, 3/4 VMEM), at most the VMEM)
GENERATIONS = {
    "v4": ("v4:2x2x1", "TPU v4", 16, 16),
    "v5e": ("v5e:2x2", "TPU v5 lite", 128, 64),
    "v5p": ("v5p:2x2x1", "TPU v5", 64, 64),
    "v6e": ("v6e:2x2", "TPU v6 lite", 128, 64),
}


@functools.cache
def _devices(topology: str):
  return tuple(topologies.get_topology_desc(topology_name=topology, platform="tpu").devices)


def _one_chip(generation: str) -> Mesh:
  return Mesh(np.array(_devices(GENERATIONS[generation][0])[:1]), ("x",))


# ------------------------------------------------------------ kernel choice


@pytest.mark.parametrize("generation", list(GENERATIONS))
def test_topology_devices_are_the_table_s_chips(generation):
  """The device kinds the topologies report are target.TPU_VMEM_BYTES' keys, with jax's VMEM per core."""
  _, kind, vmem_mib, limit_mib = GENERATIONS[generation]
  device = _devices(GENERATIONS[generation][0])[0]
  assert (device.platform, device.device_kind) == ("tpu", kind)
  assert target.vmem_capacity(kind) == vmem_mib * MIB
  budget = target.vmem_budget(kind)
  assert budget == min(32, vmem_mib * 3 // 4) * MIB and min(2 * budget, vmem_mib * MIB) == limit_mib * MIB


def test_auto_resolves_by_the_mesh_in_context():
  """The target is the mesh's platform: Mosaic under a TPU mesh (abstract or concrete, and inside
  shard_map), the chunked XLA loop under the CPU mesh and without one (default backend "cpu")."""
  tpu = make_mesh(MeshConfig(data=4, fsdp=1, tensor=1), devices=_devices("v5p:2x2x1"))
  cpu = make_mesh(MeshConfig(data=8, fsdp=1, tensor=1))
  assert jax.default_backend() == "cpu"
  assert resolve_impl("auto") == ("xla_chunked", False)
  with jax.sharding.use_abstract_mesh(tpu.abstract_mesh):
    assert resolve_impl("auto") == ("pallas_mosaic", False)
    assert resolve_impl("pallas") == ("pallas_mosaic", False)
    assert resolve_impl("pallas", True) == ("pallas_triton", True)  # interpret= keeps its meaning
    assert resolve_impl("xla_chunked") == ("xla_chunked", False)
    ops = vocab_ops("pallas")
    assert ops.interpret is False and ops._mode() == "rows"  # pylint: disable=protected-access
  with jax.set_mesh(tpu):
    assert resolve_impl("auto") == ("pallas_mosaic", False)
  with jax.sharding.use_abstract_mesh(cpu.abstract_mesh):
    assert resolve_impl("auto") == ("xla_chunked", False)
    assert vocab_ops("auto")._mode() == "plain"  # pylint: disable=protected-access
    assert vocab_ops("pallas").interpret is True
  seen = []
  body = lambda x: (seen.append(resolve_impl("auto")), x)[1]  # noqa: E731
  f = jax.shard_map(body, mesh=tpu, in_specs=P("data"), out_specs=P("data"))
  jax.jit(f).lower(jax.ShapeDtypeStruct((8,), jnp.float32, sharding=NamedSharding(tpu, P("data"))))
  assert seen == [("pallas_mosaic", False)]


# ------------------------------------------------------------ every kernel, every generation


def _op_losses(n: int):
  """op -> a scalar of its outputs (through impl="auto"), of (h, w, hq, wq)."""
  t_N = jnp.zeros((n,), jnp.int32)
  ids_NK = jnp.zeros((n, 8), jnp.int32)
  lq_NK = jnp.full((n, 8), -3.0)

  def token_logprobs(h, w, hq, wq):
    out = kernels.token_logprobs(h, w, t_N, temperature=0.7)
    return jnp.sum(out.logp) + jnp.sum(out.entropy) + jnp.sum(out.lse)

  def vocab_topk(h, w, hq, wq):
    return jnp.sum(kernels.vocab_topk(h, w, k=8).logp)

  def vocab_cross(h, w, hq, wq):
    out = kernels.vocab_cross(h, w, hq, wq, temperature_q=1.3)
    return jnp.sum(out.cross) + jnp.sum(out.kl_pq) + jnp.sum(out.kl_qp)

  def vocab_cross_topk(h, w, hq, wq):
    out = kernels.vocab_cross_topk(h, w, ids_NK, lq_NK, tail="rescale")
    return jnp.sum(out.cross) + jnp.sum(out.kl_pq)

  return dict(token_logprobs=token_logprobs, vocab_topk=vocab_topk, vocab_cross=vocab_cross,
              vocab_cross_topk=vocab_cross_topk)


OPS = list(_op_losses(8))


@functools.cache
def _compile_op(generation: str, op: str, n: int, d: int, v: int, h_dtype: str, w_dtype: str) -> str:
  """The optimised HLO of op's value and gradient (of h and w) on one chip of the generation."""
  mesh = _one_chip(generation)
  whole = NamedSharding(mesh, P())
  sds = lambda shape, dtype: jax.ShapeDtypeStruct(shape, jnp.dtype(dtype), sharding=whole)  # noqa: E731
  args = sds((n, d), h_dtype), sds((d, v), w_dtype), sds((n, d), h_dtype), sds((d, v), w_dtype)
  with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
    fn = jax.jit(jax.value_and_grad(_op_losses(n)[op], argnums=(0, 1)))
    return fn.lower(*args).compile().as_text()


def _mosaic_calls(hlo: str) -> list[str]:
  return [line for line in hlo.splitlines() if 'custom_call_target="tpu_custom_call"' in line]


def _vmem_limits(hlo: str) -> list[int]:
  """Each Mosaic call's VMEM limit: the scoped VMEM (memory space 1) XLA grants it."""
  pattern = r'"scoped_memory_configs":\[\{"memory_space":"1",[^}]*"size":"(\d+)"'
  return [int(m) for line in _mosaic_calls(hlo) for m in re.findall(pattern, line)]


# SmolLM2-135M's head (D = 576, V = 49,152) in bf16 on every generation, 256 rows; then f32 (on v4, whose
# 16 MiB of VMEM is the tightest, and where Mosaic compiles fastest: 2 s against 16 s for f32 on v5e) and
# mixed (bf16 hidden, f32 head: bf16 compute over f32 params) at one generation each, and the widths and
# vocabularies of Qwen3-0.6B (1024 x 151,936), Gemma 3 270M (640 x 262,144) and Qwen3-8B / Llama-3.1-8B
# (4096 x 151,936): the last on v4, whose 16 MiB of VMEM is the tightest.
CASES = ([(g, 256, 576, 49_152, "bfloat16", "bfloat16") for g in GENERATIONS] +
         [("v4", 256, 576, 49_152, "float32", "float32"), ("v6e", 256, 576, 49_152, "bfloat16", "float32"),
          ("v5p", 256, 1024, 151_936, "bfloat16", "bfloat16"), ("v6e", 256, 640, 262_144, "bfloat16", "bfloat16"),
          ("v4", 256, 4096, 151_936, "bfloat16", "bfloat16")])


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-N{c[1]}-D{c[2]}-V{c[3]}-{c[4]}-{c[5]}")
def test_kernel_compiles_forward_and_backward(case, op):
  """Forward + backward compile with Mosaic: the forward, d hidden and d w kernels, each granted the
  generation's VMEM limit (v4: 16 MiB, all of it; the others 64 MiB, twice the 32 MiB budget; on v5p,
  where that is all its VMEM, XLA keeps 64 KiB of it: measured 67,043,328 bytes)."""
  generation = case[0]
  hlo = _compile_op(*case[:1], op, *case[1:])
  calls = _mosaic_calls(hlo)
  assert len(calls) == 3, calls
  limits, limit = _vmem_limits(hlo), GENERATIONS[generation][3] * MIB
  assert len(limits) == 3 and all(limit - 64 * 1024 <= x <= limit for x in limits), limits


# ------------------------------------------------------------ the RL update on a 4-chip topology


UPDATE_TOPOLOGY = "v5p:2x2x1"
# SmolLM2-135M's head (tied, D = 576, V = 49,152) and MLP at 2 layers, 8 heads / 4 kv heads (its 9 / 3
# do not split over tensor = 2), bf16 compute over f32 params. The XLA attention, so that the Mosaic
# calls counted below are the vocabulary kernels' (the splash kernels: tests/tpu/test_splash_compile.py).
MODEL = model_lib.ModelConfig(vocab_size=49_152, d_model=576, n_layers=2, n_heads=8, n_kv_heads=4, head_dim=64,
                              d_ff=1536, tie_embeddings=True, compute_dtype="bfloat16", attention_impl="xla")
B, P_LEN, R = 4, 16, 32  # 4 rows (one GSPO group) of 16 prompt + 32 response tokens: N = 128 rows through the head
MESHES = {"data": MeshConfig(data=4, fsdp=1, tensor=1), "fsdp": MeshConfig(data=1, fsdp=4, tensor=1),
          "fsdp_tensor": MeshConfig(data=1, fsdp=2, tensor=2)}


def _sds(tree, shardings):
  return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), tree, shardings)


def _batch(mesh) -> TrainBatch:
  rows = batch_sharding(mesh)
  s = lambda shape, dtype=jnp.float32: jax.ShapeDtypeStruct(shape, dtype, sharding=rows)  # noqa: E731
  return TrainBatch(
      prompt_BP=s((B, P_LEN), jnp.int32), prompt_mask_BP=s((B, P_LEN), jnp.bool_), tokens_BR=s((B, R), jnp.int32),
      mask_BR=s((B, R), jnp.bool_), behav_logp_BR=s((B, R)), prox_logp_BR=s((B, R)), ref_logp_BR=s((B, R)),
      adv_BR=s((B, R)), returns_BR=s((B, R)), old_values_BR=s((B, R)), topk_ids_BRK=s((B, R, 0), jnp.int32),
      topk_logp_BRK=s((B, R, 0)), behav_hidden_BRD=s((B, R, 0)), extra_BR={})


def _bytes(tree) -> int:
  return sum(int(np.prod(x.shape)) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def _bytes_per_chip(tree) -> int:
  return sum(int(np.prod(x.sharding.shard_shape(x.shape))) * jnp.dtype(x.dtype).itemsize
             for x in jax.tree.leaves(tree))


@functools.cache
def _compile_update(mesh_name: str, impl: str):
  """(the compiled GSPO update, its state, its batch) as the trainer builds them: params in their
  shardings, AdamW state like them, the batch's rows over data x fsdp, the mesh in context."""
  mesh = make_mesh(MESHES[mesh_name], devices=_devices(UPDATE_TOPOLOGY))
  params = _sds(model_lib.param_shapes(MODEL), param_shardings(MODEL, mesh))
  tx = adamw(optax.constant_schedule(1e-6), b1=0.9, b2=0.999, weight_decay=0.0, clip_norm=1.0)
  opt_shapes = jax.eval_shape(tx.init, params)
  opt_state = _sds(opt_shapes, optax.tree_map_params(
      tx, lambda _, sh: sh, opt_shapes, param_shardings(MODEL, mesh),
      transform_non_params=lambda _: replicated(mesh)))
  state = UpdateState(params=params, opt_state=opt_state, value_params={}, value_opt_state=())
  spec = UpdateSpec(model_cfg=MODEL, objective=get_preset("gspo"), group_size=4, n_micro=1, temperature=1.0,
                    impl=impl, use_value=False)
  updater = make_updater(spec, tx, tx, state, batch_sharding(mesh), replicated(mesh))
  batch = _batch(mesh)
  with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
    compiled = updater.lower(state, batch, {}).compile()
  return compiled, state, batch


def _head_collectives(hlo: str, op: str, rows: int | None = None) -> list[str]:
  """The collectives `op` (all-gather, all-reduce, reduce-scatter) whose result holds a [rows, V] block
  of the head, rows = D if None (or [V, rows]); async starts have tuple results on TPU, so every shape
  left of the op is read."""
  d, v = MODEL.d_model, MODEL.vocab_size
  want = sorted((d if rows is None else rows, v))
  out = []
  for line in hlo.splitlines():
    m = re.search(rf"= (.*?) {op}(?:-start)?\(", line)
    if m and any(sorted(map(int, s)) == want for s in re.findall(r"\[(\d+),(\d+)\]", m.group(1))):
      out.append(line.strip()[:160])
  return out


# The Mosaic kernels on the meshes that split the head (their collectives differ by mesh); the XLA
# implementations, whose programs differ from the kernels' but not by mesh in what is checked here, once
# each, naive on the data mesh (its parameter bytes: the params whole on every chip). The Mosaic update on
# a data mesh, the head whole on every chip and no collective of it, is the default run's plan's
# (tests/tpu/test_compile_plan.py: its 3 kernels).
@pytest.mark.parametrize("mesh_name,impl", [("fsdp", "pallas"), ("fsdp_tensor", "pallas"),
                                            ("fsdp_tensor", "xla_chunked"), ("data", "naive")])
def test_update_compiles_on_every_mesh(mesh_name, impl):
  compiled, state, batch = _compile_update(mesh_name, impl)
  hlo = compiled.as_text()
  mesh_cfg = MESHES[mesh_name]
  # The kernels ran where asked: impl="pallas" is the Mosaic kernels (forward, d hidden, d w of
  # token_logprobs; GSPO needs nothing else), per row shard; xla_chunked has no custom call.
  assert len(_mosaic_calls(hlo)) == (3 if impl == "pallas" else 0)
  if mesh_cfg.tensor > 1:
    assert _head_collectives(hlo, "all-gather") == []  # each device streams its own columns of the head
  elif mesh_cfg.fsdp > 1 and impl == "pallas":
    # The kernels' shard_map gathers the head split along D (the regex sees TPU HLO), and the transpose
    # of that gather sends its gradient back split: a reduce-scatter, no all-reduce of the whole head.
    assert len(_head_collectives(hlo, "all-gather")) == 1
    assert len(_head_collectives(hlo, "reduce-scatter", MODEL.d_model // mesh_cfg.fsdp)) == 1
    assert _head_collectives(hlo, "all-reduce") == []
  # Parameter bytes per chip: params, AdamW's mu and nu split over fsdp x tensor. The shardings' shard
  # shapes give total / (fsdp x tensor) within 0.1% (the replicated norm scales, 5 x 576 floats per
  # copy, are 2.4e-4 of the bytes on the split meshes). The compiler's figure, the program's argument
  # bytes less the batch's share, is at least that and within 5% above: TPU tiles pad the minor dims
  # of the arrays to 128 lanes (measured +0.6% on data, +3.9% on fsdp, +1.7% on fsdp x tensor).
  per_chip = 3 * _bytes(state.params) / (mesh_cfg.fsdp * mesh_cfg.tensor)
  np.testing.assert_allclose(_bytes_per_chip(state), per_chip, rtol=1e-3)
  batch_per_chip = _bytes(batch) / (mesh_cfg.data * mesh_cfg.fsdp)
  params_per_chip = compiled.memory_analysis().argument_size_in_bytes - batch_per_chip
  assert per_chip <= params_per_chip <= 1.05 * per_chip, (params_per_chip, per_chip)


# ------------------------------------------------------------ the sampler's decode loop on every mesh


@functools.cache
def _compile_decode(mesh_name: str):
  """The sampler's prefill and decode loop (sampling/loop.py) as the built-in engine runs them on the
  trainer's mesh: B0 = 4 prompts x 2 samples, rows over data x fsdp, bf16 sampler over f32 params."""
  from jaxrl_llm.sampling import loop as sampler_loop
  from jaxrl_llm.sampling.config import SamplingConfig
  from jaxrl_llm.sampling.generate import sampler_model_config
  from jaxrl_llm.model.sharding import BATCH_AXES

  mesh = make_mesh(MESHES[mesh_name], devices=_devices(UPDATE_TOPOLOGY))
  params = _sds(model_lib.param_shapes(MODEL), param_shardings(MODEL, mesh))
  scfg = SamplingConfig(max_new_tokens=R, n_samples=2, eos_ids=(2,), dtype="bfloat16")
  run_cfg = sampler_model_config(MODEL, scfg)
  rows = batch_sharding(mesh, 2)
  tokens = jax.ShapeDtypeStruct((4, P_LEN), jnp.int32, sharding=rows)
  mask = jax.ShapeDtypeStruct((4, P_LEN), jnp.bool_, sharding=rows)
  key = jax.eval_shape(lambda: jax.random.key(0))
  key = jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=replicated(mesh))
  with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
    prefill = sampler_loop.prefill.lower(params, tokens, mask, key, model_cfg=run_cfg, cfg=scfg,
                                         cache_len=P_LEN + R, mesh=mesh, data_axis=BATCH_AXES).compile()
    state = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), prefill.out_info,
                         prefill.output_shardings)
    decode = sampler_loop.decode.lower(params, state, model_cfg=run_cfg, cfg=scfg, prompt_len=P_LEN, mesh=mesh,
                                       data_axis=BATCH_AXES).compile()
  return mesh, state, decode


@pytest.mark.parametrize("mesh_name", ["fsdp", "fsdp_tensor"])
def test_decode_loop_compiles_on_every_mesh(mesh_name):
  """The decode loop compiles for the fsdp and fsdp x tensor meshes, and each chip holds its share of
  the KV cache: rows split over fsdp, kv heads over tensor (exactly total / 4). Before the engine
  passed its mesh to the sampler, the compiler kept the whole cache on every chip (a Qwen3-8B plan on
  v5p:4x4x4 asked for 128 GB per chip). The data mesh's decode loop and its cache split over the rows
  (total / 4): the default run's plan (tests/tpu/test_compile_plan.py, its decode steps' kv_bytes)."""
  mesh, state, decode = _compile_decode(mesh_name)
  cache = state.cache
  kv = [x for x in jax.tree.leaves((cache.k_BKHS, cache.v_BKSH))]
  total = _bytes(kv)
  assert _bytes_per_chip(kv) == total // 4, (mesh_name, _bytes_per_chip(kv), total)
