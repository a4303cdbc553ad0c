"""The update with `model.attention_impl=splash` through the real TPU compiler (libtpu, compile only):
the splash kernels (model/splash.py) replace the [T, T] f32 scores the XLA attention holds.

A 2-layer model (D = 512, 4 query heads over 2 KV heads of 128) at T = 192 + 192 = 384 tokens per
row, GSPO's update on v5e:2x2 meshes (data 4, and fsdp 2 x tensor 2: the kernel per device, rows
split, and heads split over tensor too), padded rows (no shared prompt, no packing: the layout the
kernel covers). The XLA attention's update holds f32[..., 384, 384] scores, softmax and their
gradients; the splash update holds none. And a Gemma 3-shaped model's local and global layers at
T = 2048 under auto. Needs libtpu (`pip install -e ".[tpu-aot]"`).

T = 384 is three 128-token tiles (splash blocks of 128, model/splash.py's block_size; the Gemma case
runs blocks of 512), a length no other buffer of the update has: at 256, the fsdp-split gradients of
the KV projections ([512, 256], held as f32[2, 256, 256]) read as scores. At 1024 the update took
1.8 times as long to compile, and found the same (no [T, T] f32 buffer under splash; 129 under XLA).
"""

import os
import re

os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import pytest  # noqa: E402

try:
  import libtpu  # noqa: F401,E402
except ImportError:
  pytest.skip('libtpu is not installed: pip install -e ".[tpu-aot]" (compile-only TPU checks)',
              allow_module_level=True)

pytestmark = [pytest.mark.slow]

import jax  # noqa: E402

from jaxrl_llm import compile as compile_lib  # noqa: E402
from jaxrl_llm.model.sharding import MeshConfig, make_mesh  # noqa: E402
from jaxrl_llm.model.splash import resolve_attention  # noqa: E402
from jaxrl_llm.tpu.programs import lower_update, param_sds  # noqa: E402
from jaxrl_llm.tpu.topology import topology_devices  # noqa: E402
from jaxrl_llm.training.config import from_config_dict  # noqa: E402
from jaxrl_llm.training.defaults import get_config  # noqa: E402

T = 384
GEMMA_T = 2048  # past the local layers' window of 512


def _update_hlo(attention_impl: str, mesh: tuple[int, int, int] = (4, 1, 1)) -> str:
  c = get_config("gspo")
  c.model.update(n_layers=2, d_model=512, n_heads=4, n_kv_heads=2, d_ff=512, vocab_multiple=2,
                 attention_impl=attention_impl)
  c.mesh.update(data=mesh[0], fsdp=mesh[1], tensor=mesh[2])
  c.data.max_prompt_len = T // 2
  c.rollout.max_response_len = T // 2
  c.rollout.prompts_per_step = 4
  c.rollout.group_size = 2
  c.train.share_prompt = "off"
  c.train.pack = "off"
  shapes = compile_lib.build_shapes(from_config_dict(c), "", tuple(topology_devices("v5e:2x2")[0]))
  params = param_sds(shapes.model_cfg, shapes.mesh)
  return lower_update(shapes, shapes.model_cfg, params, 1).compile().as_text()


def _tt_f32(hlo: str) -> list[str]:
  """Shapes f32[..., T, T] anywhere in the compiled program."""
  return re.findall(rf"f32\[(?:\d+,)*{T},{T}\]", hlo)


def test_auto_is_splash_on_a_tpu_mesh_from_one_tile_of_tokens():
  tpu = make_mesh(MeshConfig(data=4, fsdp=1, tensor=1), devices=tuple(topology_devices("v5e:2x2")[0]))
  with jax.sharding.use_abstract_mesh(tpu.abstract_mesh):
    assert [resolve_attention("auto", T) for T in (127, 128, 4096)] == ["xla", "splash", "splash"]
    assert resolve_attention("xla", 4096) == "xla"
  assert resolve_attention("auto", 4096) == "xla"  # no mesh: the default backend, CPU


def test_the_xla_update_holds_TxT_f32_buffers():
  assert _tt_f32(_update_hlo("xla"))  # so the check below can fail


@pytest.mark.parametrize("mesh", [(4, 1, 1), (1, 2, 2)])
def test_the_splash_update_holds_no_TxT_f32_buffer(mesh):
  splash = _update_hlo("splash", mesh)
  # the forward, dq and dkv kernels are there (the update's forward, its remat's, the backward's)
  assert {"splash_mqa_fwd", "splash_mqa_dq", "splash_mqa_dkv"} <= set(re.findall(r"%(splash_mqa_[a-z]+)", splash))
  assert _tt_f32(splash) == []


def test_gemma3_local_and_global_layers_compile_without_TxT_f32_scores():
  """Gemma 3's shape (270M's heads: 4 query heads over 1 KV head of 256, window 512) with two local
  layers and one global in one scan (the layer kind a traced flag, splash's LocalMask or CausalMask
  chosen by lax.cond), bf16, T = 2048, value and gradient under auto on a v5e:2x2 data mesh. d_ff is
  1536, not 2048, so that no MLP activation [B, T, F] reads as a [T, T] buffer."""
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=import-outside-toplevel

  from jaxrl_llm.model import ModelConfig, forward, param_shapes  # pylint: disable=import-outside-toplevel
  from jaxrl_llm.model.sharding import param_shardings  # pylint: disable=import-outside-toplevel

  cfg = ModelConfig.preset("gemma3_270m", vocab_size=1024, n_layers=3, d_ff=1536, compute_dtype="bfloat16",
                           layer_types=("sliding_attention", "sliding_attention", "full_attention"))
  mesh = make_mesh(MeshConfig(4, 1, 1), devices=tuple(topology_devices("v5e:2x2")[0]))
  params = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), param_shapes(cfg),
                        param_shardings(cfg, mesh))
  rows = NamedSharding(mesh, P(("data", "fsdp"), None))
  tokens = jax.ShapeDtypeStruct((4, GEMMA_T), jnp.int32, sharding=rows)  # a row per device
  mask = jax.ShapeDtypeStruct((4, GEMMA_T), jnp.bool_, sharding=rows)

  def loss(params, tokens_BT, positions_BT, mask_BT):
    hidden_BTD, _ = forward(params, cfg, tokens_BT, positions_BT, mask_BT)
    return jnp.sum(hidden_BTD.astype(jnp.float32))

  with jax.set_mesh(mesh):
    hlo = jax.jit(jax.grad(loss)).lower(params, tokens, tokens, mask).compile().as_text()
  assert {"splash_mqa_fwd", "splash_mqa_dq", "splash_mqa_dkv"} <= set(re.findall(r"%(splash_mqa_[a-z]+)", hlo))
  assert re.findall(rf"f32\[(?:\d+,)*{GEMMA_T},{GEMMA_T}\]", hlo) == []
