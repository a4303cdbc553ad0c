"""The decoder and its heads as Flax NNX modules (model/transformer.py, model/heads.py).

The modules are checked against references that do not go through them: a float64 numpy llama
written from Hugging Face's modeling_llama (tests/sampling/numpy_llama.py, reading our HF export),
the value and reward heads' formulas written out here, and params.py's table for the state's
structure, logical axes and initial values.
"""

import dataclasses
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.model import (Decoder, DecoderLayers, ModelConfig, bind, forward, init_params, logits,
                             param_axes, param_shapes, unstack_layers)
from jaxrl_llm.model import heads, lora
from jaxrl_llm.model.config import LoraConfig
from jaxrl_llm.model.io.hf_io import name_table, save_hf

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "sampling"))
import numpy_llama  # noqa: E402

CFG = ModelConfig(vocab_size=61, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=48,
                  tie_embeddings=False)
LORA_CFG = dataclasses.replace(CFG, lora=LoraConfig(rank=4, alpha=8.0))


def _flat(tree) -> dict:
  return {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def test_state_is_the_params_table_with_its_axes_as_sharding_metadata():
  model = Decoder(LORA_CFG, rngs=nnx.Rngs(params=3))
  state = nnx.state(model)
  pure = nnx.to_pure_dict(state)
  want = _flat(param_shapes(LORA_CFG))
  got = _flat(pure)
  assert got.keys() == want.keys()
  assert all(got[k].shape == want[k].shape and got[k].dtype == want[k].dtype for k in want)
  # Initialised by params.init_params from the Rngs' params key.
  ref = _flat(init_params(LORA_CFG, nnx.Rngs(params=3).params()))
  assert all(np.array_equal(got[k], ref[k]) for k in ref)
  # Every parameter carries its logical axes (the sharding table's) as out_sharding metadata.
  variables = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_flatten_with_path(
      state, is_leaf=lambda x: isinstance(x, nnx.Variable))[0]}
  axes = {jax.tree_util.keystr(p): a for p, a in jax.tree_util.tree_flatten_with_path(
      param_axes(LORA_CFG), is_leaf=lambda x: isinstance(x, tuple))[0]}
  assert variables.keys() == axes.keys()
  for k, var in variables.items():
    assert tuple(var.get_metadata()["out_sharding"]) == axes[k], k
  # The LoRA factors are nnx.LoRAParam, exactly the entries the optimizer trains.
  lora_state = nnx.to_pure_dict(nnx.state(model, nnx.LoRAParam))
  assert _flat(lora_state).keys() == _flat(lora.trainable(pure)).keys()
  assert len(_flat(lora_state)) == 14  # A and B for q, k, v, o, gate, up, down
  # The Hugging Face name table addresses the state's paths.
  for entry in name_table(CFG):
    node = pure
    for key in entry.ours:
      node = node[key]


def test_module_call_matches_a_numpy_llama_from_transformers_modeling_code(tmp_path):
  params = init_params(CFG, jax.random.key(0))
  params = jax.tree.map(lambda a: a * 4.0 if a.ndim > 1 else a + 0.1 * jnp.arange(a.size).reshape(a.shape) / a.size,
                        params)  # weights large enough that attention is not uniform
  save_hf(params, CFG, str(tmp_path))
  ref_model = numpy_llama.from_hf(str(tmp_path))
  tokens = [3, 17, 5, 60, 2, 9]

  model = Decoder(CFG, params)  # the module itself, not the functional wrapper
  t_1T = jnp.asarray([tokens])
  hidden_1TD, _ = model(t_1T, jnp.arange(6)[None], jnp.ones((1, 6), bool))
  ours = np.asarray(model.logits(hidden_1TD)[0, -1], np.float64)
  ref = numpy_llama.llama_logits(ref_model, tokens)
  np.testing.assert_allclose(ours, ref, rtol=2e-4, atol=2e-4)
  assert np.std(ref) > 0.2  # a non-trivial reference


def test_nnx_grad_of_the_module_equals_jax_grad_of_the_state_and_merge_round_trips():
  """A user of Flax's own transforms (nnx.jit, nnx.grad over LoRAParam) gets what the trainer's
  jax.grad over the params dict gets."""
  params = init_params(LORA_CFG, jax.random.key(1))
  params["layers"] = {n: (v + 0.05 if "lora_b" in n else v) for n, v in params["layers"].items()}  # B != 0
  t_BT = jax.random.randint(jax.random.key(2), (2, 5), 0, CFG.vocab_size)
  pos_BT, mask_BT = jnp.broadcast_to(jnp.arange(5), (2, 5)), jnp.ones((2, 5), bool)

  def loss_of_module(m):
    h, _ = m(t_BT, pos_BT, mask_BT)
    return jnp.mean(m.logits(h) ** 2)

  def loss_of_state(p):
    h, _ = forward(p, LORA_CFG, t_BT, pos_BT, mask_BT)
    return jnp.mean(logits(p, LORA_CFG, h) ** 2)

  model = Decoder(LORA_CFG, params)
  g_module = nnx.jit(nnx.grad(loss_of_module, argnums=nnx.DiffState(0, nnx.LoRAParam)))(model)
  train, frozen = lora.partition(params)
  g_state = jax.grad(lambda tr: loss_of_state(lora.join(tr, frozen)))(train)
  got, want = _flat(nnx.to_pure_dict(g_module)), _flat(g_state)
  assert got.keys() == want.keys()
  for k in want:
    np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-7, err_msg=k)
  assert all(float(jnp.abs(v).max()) > 0 for v in want.values())
  # split -> pure dict -> merge gives back the same arrays.
  graph, state = nnx.split(model)
  again = nnx.to_pure_dict(nnx.state(nnx.merge(graph, nnx.to_pure_dict(state))))
  assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(params)))


def test_unstacked_form_is_a_list_of_layer_slices():
  params = init_params(CFG, jax.random.key(4))
  model = bind(unstack_layers(params), CFG)
  assert isinstance(model.layers, nnx.List) and len(model.layers) == CFG.n_layers
  assert all(isinstance(layer, DecoderLayers) for layer in model.layers)
  assert model.layers[1].wq_LDNH[...].shape == (CFG.d_model, CFG.n_heads, CFG.head_dim)
  np.testing.assert_array_equal(model.layers[1].wq_LDNH[...], params["layers"]["wq_LDNH"][1])
  assert tuple(model.layers[1].wq_LDNH.get_metadata()["out_sharding"]) == ("embed", "heads", "head_dim")


def test_wrong_state_names_the_tensor():
  params = init_params(CFG, jax.random.key(0))
  with pytest.raises(ValueError, match="missing layer tensor wq_LDNH"):
    Decoder(CFG, {**params, "layers": {k: v for k, v in params["layers"].items() if k != "wq_LDNH"}})
  with pytest.raises(ValueError, match=r"unexpected tensors \['value_head'\]"):
    Decoder(CFG, {**params, "value_head": params["embed_VD"]})
  with pytest.raises(ValueError, match="give its params, or rngs"):
    Decoder(CFG)


def test_value_head_module_is_the_mlp_written_out_and_passes_no_gradient_to_the_trunk():
  D, F = 6, 5
  vparams = heads.init_value_head(D, jax.random.key(0), F)
  vparams = {**vparams, "w2_F": jnp.linspace(-1, 1, F), "b1_F": jnp.linspace(0, 0.3, F), "b2": jnp.float32(0.7)}
  h_BRD = jax.random.normal(jax.random.key(1), (2, 3, D))
  got = heads.value_head(vparams, h_BRD)
  p = {k: np.asarray(v, np.float64) for k, v in vparams.items()}
  want = np.maximum(np.asarray(h_BRD, np.float64) @ p["w1_DF"] + p["b1_F"], 0) @ p["w2_F"] + p["b2"]
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(heads.ValueHead(D, vparams)(h_BRD), want, rtol=1e-5, atol=1e-6)
  g = jax.grad(lambda h: heads.value_head(vparams, h).sum())(h_BRD)
  assert float(jnp.abs(g).max()) == 0.0
  # Init: V = 0 everywhere (w2 and b2 start at zero); rngs initialise a module of its own.
  assert float(jnp.abs(heads.ValueHead(D, rngs=nnx.Rngs(0))(h_BRD)).max()) == 0.0


def test_reward_head_module_is_a_dot_product_with_embed_axes():
  D = 8
  head = heads.init_reward_head(D, jax.random.key(3))
  h_BD = jax.random.normal(jax.random.key(4), (3, D))
  want = np.asarray(h_BD, np.float64) @ np.asarray(head["w_D"], np.float64)
  np.testing.assert_allclose(heads.reward_head(head, h_BD), want, rtol=1e-5, atol=1e-7)
  module = heads.RewardHead(D, head)
  assert tuple(module.w_D.get_metadata()["out_sharding"]) == ("embed",)
  with pytest.raises(ValueError, match=r"reward head: tensors \['b'\], expected \['w_D'\]"):
    heads.RewardHead(D, {"b": head["w_D"]})
