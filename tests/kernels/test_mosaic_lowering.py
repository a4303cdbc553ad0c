"""The implementation switch, and the kernels lowered for a TPU and a GPU.

No TPU is needed to lower: ``jax.export(..., platforms=["tpu"])`` runs the
Pallas TPU lowering (BlockSpec rules such as the (8, 128) divisibility,
every primitive's Mosaic lowering rule) on this CPU and embeds the Mosaic
module in a ``tpu_custom_call``. What it does not run is the Mosaic compiler
itself (layout assignment, VMEM allocation), which only a TPU runtime has;
the kernels' numbers are tested in interpret mode (``test_mosaic_kernels.py``).

A fake backend (``jax.default_backend`` patched) makes ``impl="auto"`` and
``"pallas"`` resolve as on that machine; shapes are ShapeDtypeStructs, so the
real model sizes cost nothing.
"""

import base64
import re

import jax
import jax.numpy as jnp
import pytest
from jax.experimental.pallas import tpu as pltpu

from jaxrl_llm import kernels
from jaxrl_llm.kernels import resolve_impl


@pytest.fixture
def backend(monkeypatch):
  """backend(name): from now on jax.default_backend() says `name`."""
  return lambda name: monkeypatch.setattr(jax, "default_backend",
                                          lambda: name)


def test_resolve_impl_on_cpu():
  params = pltpu.InterpretParams()
  assert resolve_impl("auto", None) == ("xla_chunked", False)
  assert resolve_impl("auto", params) == ("xla_chunked", False)
  assert resolve_impl("naive", True) == ("naive", False)
  assert resolve_impl("pallas", True) == ("pallas_triton", True)
  assert resolve_impl("pallas", params) == ("pallas_mosaic", params)
  with pytest.raises(ValueError, match="impl='pallas' on backend 'cpu'"):
    resolve_impl("pallas", None)
  with pytest.raises(ValueError, match="InterpretParams"):
    resolve_impl("pallas", False)
  with pytest.raises(TypeError, match="interpret='tpu'"):
    resolve_impl("pallas", "tpu")
  with pytest.raises(ValueError, match="impl='mosaic' is invalid"):
    resolve_impl("mosaic", None)


def test_resolve_impl_on_tpu_and_gpu(backend):
  backend("tpu")
  assert resolve_impl("auto", None) == ("pallas_mosaic", False)
  assert resolve_impl("pallas", None) == ("pallas_mosaic", False)
  assert resolve_impl("pallas", True) == ("pallas_triton", True)
  backend("gpu")
  assert resolve_impl("auto", None) == ("pallas_triton", False)
  assert resolve_impl("pallas", False) == ("pallas_triton", False)


def test_resolve_impl_follows_the_mesh_in_context():
  """The target is the platform of the mesh in context's devices, not jax.default_backend(): an
  abstract mesh of TPU devices (as a topology's give, tests/kernels/test_tpu_compile.py) picks the
  Mosaic kernels on this CPU, one of GPU devices the Triton kernels; a mesh that names no device
  falls back to the default backend. interpret= keeps its meaning under any target."""
  from jax.sharding import AbstractDevice, AbstractMesh

  def mesh(platform, kind):
    return AbstractMesh((4,), ("data",), abstract_device=AbstractDevice(device_kind=kind, num_cores=1,
                                                                        platform=platform))

  params = pltpu.InterpretParams()
  with jax.sharding.use_abstract_mesh(mesh("tpu", "TPU v5 lite")):
    assert resolve_impl("auto", None) == ("pallas_mosaic", False)
    assert resolve_impl("pallas", True) == ("pallas_triton", True)
    assert resolve_impl("pallas", params) == ("pallas_mosaic", params)
  with jax.sharding.use_abstract_mesh(mesh("gpu", "NVIDIA H100")):
    assert resolve_impl("auto", None) == ("pallas_triton", False)
  with jax.sharding.use_abstract_mesh(mesh("cpu", "cpu")):
    assert resolve_impl("auto", None) == ("xla_chunked", False)
  with jax.sharding.use_abstract_mesh(AbstractMesh((4,), ("data",))):
    assert resolve_impl("auto", None) == ("xla_chunked", False)


def _ops(n, d, v, dtype):
  """name -> (loss(h, w) through the op with impl="auto")."""
  t_N = jnp.zeros((n,), jnp.int32)
  ids_NK = jnp.zeros((n, 8), jnp.int32)
  lq_NK = jnp.full((n, 8), -3.0)
  hq_NE = jnp.zeros((n, d), dtype)

  def tl(h, w):
    out = kernels.token_logprobs(h, w, t_N, temperature=0.7)
    return jnp.sum(out.logp) + jnp.sum(out.entropy) + jnp.sum(out.lse)

  def cross(h, w):
    out = kernels.vocab_cross(h, w, hq_NE, w, temperature_q=1.3)
    return jnp.sum(out.cross) + jnp.sum(out.kl_pq) + jnp.sum(out.kl_qp)

  def cross_topk(h, w):
    out = kernels.vocab_cross_topk(h, w, ids_NK, lq_NK, tail="rescale")
    return jnp.sum(out.cross) + jnp.sum(out.kl_pq)

  return {
      "token_logprobs": tl,
      "gather_logprobs": lambda h, w: jnp.sum(
          kernels.gather_logprobs(h, w, ids_NK).logp),
      "vocab_topk": lambda h, w: jnp.sum(
          kernels.vocab_topk(h, w, k=20).logp),
      "vocab_cross": cross,
      "vocab_cross_topk": cross_topk,
  }


def _mosaic_bodies(text):
  """The decoded Mosaic modules of a lowered program's tpu_custom_calls."""
  bodies = re.findall(r"\\22body\\22: \\22([A-Za-z0-9+/=]+)\\22", text)
  return [base64.b64decode(b) for b in bodies]


# D and V of SmolLM2-135M, and the largest the VMEM budget is sized for.
SHAPES = [pytest.param(576, 49_152, id="D576-V49152"),
          pytest.param(8192, 262_144, id="D8192-V262144")]


@pytest.mark.slow
@pytest.mark.parametrize("d,v", SHAPES)
@pytest.mark.parametrize("op", list(_ops(8, 8, 8, jnp.float32)))
def test_every_op_lowers_to_three_mosaic_kernels(op, d, v, backend):
  """Forward + gradient at a real model's size: the forward, d hidden and
  d w kernels, rows and vocabulary as parallel and arbitrary grid axes, and
  the VMEM limit 25% over the default 32 MiB budget."""
  backend("tpu")
  n = 4096
  h = jax.ShapeDtypeStruct((n, d), jnp.bfloat16)
  w = jax.ShapeDtypeStruct((d, v), jnp.bfloat16)
  loss = _ops(n, d, v, jnp.bfloat16)[op]
  text = jax.export.export(jax.jit(jax.grad(loss, argnums=(0, 1))),
                           platforms=["tpu"])(h, w).mlir_module()
  assert text.count("stablehlo.custom_call @tpu_custom_call") == 3
  assert text.count("\\22size\\22: 41943040}") == 3  # 40 MiB = 32 MiB * 1.25
  bodies = _mosaic_bodies(text)
  assert len(bodies) == 3
  for body in bodies:
    assert b"dimension_semantics<parallel>" in body
    assert b"dimension_semantics<arbitrary>" in body
  names = b"".join(bodies)
  for kernel in (b"vocab_stream_fwd_tpu", b"vocab_stream_bwd_dh_tpu",
                 b"vocab_stream_bwd_dw_tpu"):
    assert kernel in names


def test_gpu_pallas_lowers_to_triton_not_mosaic_gpu(backend):
  """On GPU "pallas" is the Triton kernels: they ask for the Triton lowering
  explicitly (jax 0.10 would otherwise pick Mosaic GPU, which fails on them)."""
  backend("gpu")
  n, d, v = 64, 64, 1000
  h = jax.ShapeDtypeStruct((n, d), jnp.bfloat16)
  w = jax.ShapeDtypeStruct((d, v), jnp.bfloat16)
  loss = _ops(n, d, v, jnp.bfloat16)["token_logprobs"]
  triton = "__gpu$xla.gpu.triton"
  exported = jax.export.export(
      jax.jit(jax.grad(loss, argnums=(0, 1))), platforms=["cuda"],
      disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(triton)])
  text = exported(h, w).mlir_module()
  # The three kernels, and no other custom call (Mosaic GPU's would be one).
  assert text.count(f"stablehlo.custom_call @{triton}") == 3
  assert text.count("stablehlo.custom_call @") == 3


def test_lowering_rejects_a_misaligned_tile(backend):
  """The check the TPU lowering applies, on a hand-made misaligned tile: so
  the lowering tests above would catch one."""
  from jax.experimental import pallas as pl

  def copy(x_ref, o_ref):
    o_ref[...] = x_ref[...]

  f = pl.pallas_call(
      copy, grid=(2,), in_specs=[pl.BlockSpec((8, 100), lambda i: (0, i))],
      out_specs=pl.BlockSpec((8, 100), lambda i: (0, i)),
      out_shape=jax.ShapeDtypeStruct((8, 200), jnp.float32))
  with pytest.raises(ValueError, match="divisible by 8 and 128"):
    jax.export.export(jax.jit(f), platforms=["tpu"])(
        jax.ShapeDtypeStruct((8, 200), jnp.float32))
