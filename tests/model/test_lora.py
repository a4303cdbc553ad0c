"""LoRA and QLoRA (model/lora.py) against independent computations: the chain rule on the full
model's gradient, the base model at init, the merged weights, and the quantisation's own bound."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.checks import ConfigError
from jaxrl_llm.model import ModelConfig, forward, init_params, logits
from jaxrl_llm.model import lora
from jaxrl_llm.model.config import LORA_TARGETS, LoraConfig
from jaxrl_llm.model.params import check_params, param_shapes

V = 61
BASE = ModelConfig(vocab_size=V, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64,
                   qkv_bias=True, qk_norm=True, init_std=0.2)
B, T = 2, 7


def _lora_cfg(**kw):
  return BASE.replace(lora=LoraConfig(**{"rank": 4, "alpha": 8.0, **kw}))


def _batch():
  tokens = jax.random.randint(jax.random.key(3), (B, T), 0, V)
  mask = np.ones((B, T), bool)
  mask[1, :2] = False
  positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
  return tokens, jnp.asarray(mask), jnp.asarray(positions, jnp.int32)


def _logits(params, cfg):
  tokens, mask, positions = _batch()
  hidden, _ = forward(params, cfg, tokens, positions, mask)
  return logits(params, cfg, hidden)


def _randomise_b(params, cfg, seed=7):
  """B != 0, so that the adapters change the model (at init B = 0)."""
  layers = dict(params["layers"])
  for i, target in enumerate(cfg.lora.targets):
    b = lora.adapter_names(target)[1]
    layers[b] = 0.3 * jax.random.normal(jax.random.key(seed + i), layers[b].shape)
  return {**params, "layers": layers}


def test_adapters_are_in_the_parameter_table_with_their_shapes():
  cfg = _lora_cfg(targets="q,o,down")
  params = init_params(cfg, jax.random.key(0))
  check_params(params, cfg)  # the table and the params agree, adapters included
  layers = params["layers"]
  assert layers["wq_lora_a_LDR"].shape == (2, 32, 4) and layers["wq_lora_b_LRNH"].shape == (2, 4, 4, 8)
  assert layers["wo_lora_a_LNHR"].shape == (2, 4, 8, 4) and layers["wo_lora_b_LRD"].shape == (2, 4, 32)
  assert layers["w_down_lora_a_LFR"].shape == (2, 64, 4) and layers["w_down_lora_b_LRD"].shape == (2, 4, 32)
  assert "wk_lora_a_LDR" not in layers  # k is not a target here
  # PEFT's init: A ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)), B = 0.
  a = np.asarray(layers["wq_lora_a_LDR"])
  assert np.abs(a).max() <= 1 / np.sqrt(32) and np.abs(a).max() > 0.8 / np.sqrt(32)
  assert np.all(np.asarray(layers["wq_lora_b_LRNH"]) == 0)
  trainable, frozen = lora.partition(params)
  assert sorted(trainable["layers"]) == sorted(n for n in layers if "_lora_" in n)
  assert lora.join(trainable, frozen) == params


@pytest.mark.parametrize("qk_norm", [False, True])
def test_at_init_the_lora_model_equals_the_base(qk_norm):
  """B = 0 adds exact zeros: every adapted projection's output is the base's bit for bit, and so is
  the forward of a model without QK-norm (Llama, Qwen2, Gemma 3). With QK-norm (Qwen3) XLA fuses
  the norm's sum of squares differently when an add precedes it, so the logits differ in the last
  bits (measured: 1.4e-6 on logits of size ~2 in float32)."""
  base_cfg = BASE.replace(qk_norm=qk_norm)
  cfg = base_cfg.replace(lora=LoraConfig(rank=4, alpha=8.0))
  base = init_params(base_cfg, jax.random.key(0))
  params = lora.attach(base, cfg, jax.random.key(1))
  got, want = np.asarray(_logits(params, cfg)), np.asarray(_logits(base, base_cfg))
  if qk_norm:
    np.testing.assert_allclose(got, want, rtol=0, atol=4 * np.finfo(np.float32).eps * np.abs(want).max())
  else:
    np.testing.assert_array_equal(got, want)
  p = lora.dequantize_layer(cfg, jax.tree.map(lambda a: a[0], {k.replace("_L", "_", 1): v
                                                               for k, v in params["layers"].items()}))
  x = jax.random.normal(jax.random.key(5), (B, T, 32))
  for eq, w in (("BTD,DNH->BTNH", "wq_DNH"), ("BTD,DF->BTF", "w_up_DF")):
    np.testing.assert_array_equal(np.asarray(jax.jit(lora.project, static_argnums=(0, 1, 4))(cfg, eq, x, p, w)),
                                  np.asarray(jax.jit(jnp.einsum, static_argnums=0)(eq, x, p[w])))
  assert lora.base(params)["layers"]["wq_LDNH"] is base["layers"]["wq_LDNH"]  # the base, not a copy


@pytest.mark.parametrize("scaling", ["standard", "rslora"])
def test_gradients_of_a_and_b_are_the_chain_rule_on_the_full_models_gradient(scaling):
  """dL/dA = s G B^T and dL/dB = s A^T G, with G = dL/dW of the full model at W_eff = W + s A B,
  computed here from the base model's gradient, independently of lora.py's forward."""
  cfg = _lora_cfg(scaling=scaling)
  s = 8.0 / (4 if scaling == "standard" else 2.0)
  params = _randomise_b(lora.attach(init_params(BASE, jax.random.key(0)), cfg, jax.random.key(1)), cfg)
  tokens, mask, positions = _batch()
  w_out = jax.random.normal(jax.random.key(9), (B, T, V))

  def loss(p, c):
    hidden, _ = forward(p, c, tokens, positions, mask)
    return jnp.sum(logits(p, c, hidden) * w_out)

  g_lora = jax.grad(loss)(params, cfg)["layers"]
  # The full model at W_eff, written out: W + s * A B over (L, inputs, outputs).
  layers = dict(lora.base(params)["layers"])
  for target in cfg.lora.targets:
    weight, _ = lora.PROJECTIONS[target]
    a_name, b_name = lora.adapter_names(target)
    a, b = params["layers"][a_name], params["layers"][b_name]
    w = layers[weight]
    L, r = a.shape[0], a.shape[-1]
    n_in = int(np.prod(a.shape[1:-1]))
    layers[weight] = w + s * (a.reshape(L, n_in, r) @ b.reshape(L, r, -1)).reshape(w.shape)
  full = {**lora.base(params), "layers": layers}
  g_full = jax.grad(loss)(full, BASE)["layers"]
  for target in cfg.lora.targets:
    weight, _ = lora.PROJECTIONS[target]
    a_name, b_name = lora.adapter_names(target)
    a, b = np.asarray(params["layers"][a_name], np.float64), np.asarray(params["layers"][b_name], np.float64)
    L, r = a.shape[0], a.shape[-1]
    n_in = int(np.prod(a.shape[1:-1]))
    G = np.asarray(g_full[weight], np.float64).reshape(L, n_in, -1)
    A, Bm = a.reshape(L, n_in, r), b.reshape(L, r, -1)
    want_a = s * G @ Bm.transpose(0, 2, 1)
    want_b = s * A.transpose(0, 2, 1) @ G
    got_a = np.asarray(g_lora[a_name]).reshape(want_a.shape)
    got_b = np.asarray(g_lora[b_name]).reshape(want_b.shape)
    np.testing.assert_allclose(got_a, want_a, rtol=2e-4, atol=2e-5 * np.abs(want_a).max(), err_msg=a_name)
    np.testing.assert_allclose(got_b, want_b, rtol=2e-4, atol=2e-5 * np.abs(want_b).max(), err_msg=b_name)
    # And the base weight gets the full model's gradient (what a frozen base discards).
    np.testing.assert_allclose(np.asarray(g_lora[weight]), np.asarray(g_full[weight]), rtol=2e-4,
                               atol=2e-5 * np.abs(G).max())


def test_merged_model_equals_the_adapted_forward():
  cfg = _lora_cfg()
  params = _randomise_b(lora.attach(init_params(BASE, jax.random.key(0)), cfg, jax.random.key(1)), cfg)
  merged, mcfg = lora.merged(params, cfg)
  assert mcfg == BASE and not lora.has_adapters(merged)
  check_params(merged, BASE)
  want = np.asarray(_logits(params, cfg))
  assert np.abs(want - np.asarray(_logits(lora.base(params), BASE))).max() > 0.1  # the adapters matter
  np.testing.assert_allclose(np.asarray(_logits(merged, mcfg)), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("quant,levels", [("int8", 127), ("int4", 7)])
def test_qlora_base_is_within_half_a_quantisation_step(quant, levels):
  """Symmetric absmax rounding, dequantised here by hand (values x scale, each scale repeated over
  its block): |W - W_q| <= absmax / levels / 2 per output channel (int8) or per block of
  quant_block inputs (int4), and the QLoRA forward is the forward of the base with W_q."""
  cfg = _lora_cfg(quant=quant, quant_block=16)
  base = init_params(BASE, jax.random.key(0))
  params = lora.attach(base, cfg, jax.random.key(1))
  check_params(params, cfg)
  layers, by_hand = params["layers"], dict(base["layers"])
  for weight in lora.quantised_weights(cfg):
    assert layers[weight].dtype == lora.quant_dtype(cfg)
    w = np.asarray(base["layers"][weight])
    scale = np.asarray(layers[lora.scale_name(weight)])
    full_scale, absmax = scale, np.abs(w)
    for i in range(w.ndim):
      rep = w.shape[i] // scale.shape[i]
      full_scale = np.repeat(full_scale, rep, axis=i)
      if rep > 1:
        shape = absmax.shape[:i] + (absmax.shape[i] // rep, rep) + absmax.shape[i + 1:]
        absmax = np.repeat(absmax.reshape(shape).max(axis=i + 1), rep, axis=i)
    w_q = np.asarray(layers[weight]).astype(np.float32) * full_scale
    assert np.all(np.abs(w_q - w) <= absmax / levels / 2 * (1 + 1e-5) + 1e-7), weight
    assert np.abs(w_q - w).max() > 0  # it is quantised
    by_hand[weight] = jnp.asarray(w_q)
  np.testing.assert_allclose(np.asarray(_logits(params, cfg)), np.asarray(_logits({**base, "layers": by_hand}, BASE)),
                             rtol=1e-5, atol=1e-5)


def test_nf4_and_merge_of_a_quantised_base():
  cfg = _lora_cfg(quant="nf4", quant_block=16)
  params = _randomise_b(lora.attach(init_params(BASE, jax.random.key(0)), cfg, jax.random.key(1)), cfg)
  assert params["layers"]["wq_LDNH"].dtype == jnp.int4  # nf4's codes, stored as code - 8
  # NF4's levels (Dettmers et al. 2023, appendix E) are at most 0.2770 apart (0.7230 -> 1.0), so
  # each value is within 0.1385 x its block's absmax; bounded here by the whole weight's absmax.
  base = init_params(BASE, jax.random.key(0))
  for weight in lora.quantised_weights(cfg):
    p = {weight: params["layers"][weight], lora.scale_name(weight): params["layers"][lora.scale_name(weight)]}
    w = np.asarray(base["layers"][weight])
    err = np.abs(np.asarray(lora.dequantize_layer(cfg, p)[weight]) - w).max()
    assert 0 < err <= 0.1386 * np.abs(w).max(), (weight, err)
  merged, mcfg = lora.merged(params, cfg)
  assert all(v.dtype == jnp.float32 for v in jax.tree.leaves(merged))
  np.testing.assert_allclose(np.asarray(_logits(merged, mcfg)), np.asarray(_logits(params, cfg)),
                             rtol=1e-5, atol=1e-5)


def test_bad_lora_settings_name_the_field():
  with pytest.raises(ConfigError, match=r"config.model.lora.targets \(an entry\)='qq'"):
    LoraConfig(rank=4, targets="q,qq")
  with pytest.raises(ConfigError, match="config.model.lora.rank=-1"):
    LoraConfig(rank=-1)
  with pytest.raises(ConfigError, match="config.model.lora.quant='int3'"):
    LoraConfig(rank=4, quant="int3")
  with pytest.raises(ConfigError, match="needs adapters"):
    LoraConfig(rank=0, quant="int8")
  with pytest.raises(ConfigError, match="quant_block=24 does not divide the D axis"):
    param_shapes(_lora_cfg(quant="int4", quant_block=24))
  assert LoraConfig(rank=4).targets == LORA_TARGETS


@pytest.mark.slow
@pytest.mark.parametrize("quant", ["none", "int8"])
def test_merged_hf_export_loads_in_transformers_with_the_adapted_logits(hf_dirs, tmp_path, quant):
  """save_hf of a LoRA model writes W + s A B; transformers' model from it gives the logits of our
  unmerged adapted forward, at the real-model parity tolerance (test_hf_parity.TOL)."""
  import torch
  import transformers

  from jaxrl_llm.model.io.hf_io import load_hf, read_hf_config, save_hf
  from test_hf_parity import TOL, padded_batch

  base, base_cfg = load_hf(hf_dirs["qwen3"])
  cfg = base_cfg.replace(lora=LoraConfig(rank=4, alpha=8.0, quant=quant, quant_block=16))
  params = _randomise_b(lora.attach(base, cfg, jax.random.key(1)), cfg)
  save_hf(params, cfg, str(tmp_path), base_config=read_hf_config(hf_dirs["qwen3"]))
  tokens, mask, positions = padded_batch()
  hidden, _ = jax.jit(forward, static_argnums=1)(params, cfg, jnp.asarray(tokens), jnp.asarray(positions),
                                                 jnp.asarray(mask))
  ours = np.asarray(logits(params, cfg, hidden))
  ref_model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), attn_implementation="eager",
                                                                dtype=torch.float32).eval()
  with torch.no_grad():
    ref = ref_model(input_ids=torch.from_numpy(tokens).long(), attention_mask=torch.from_numpy(mask).long(),
                    position_ids=torch.from_numpy(positions).long()).logits.numpy()
  base_hidden, _ = jax.jit(forward, static_argnums=1)(base, base_cfg, jnp.asarray(tokens), jnp.asarray(positions),
                                                      jnp.asarray(mask))
  assert np.abs(np.asarray(logits(base, base_cfg, base_hidden)) - ours)[mask].max() > 10 * TOL  # adapters matter
  assert np.abs(ours - ref)[mask].max() <= TOL
