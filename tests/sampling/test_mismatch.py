"""The dialable sampler mismatch (sampling/mismatch.py): the quantisers equal a
numpy transcription of llama.cpp's Q8_0 / Q4_0 reference quantisers, the noise is
the stated relative perturbation, the engine samples with the derived weights,
and the logged statistics of log c are the formulas written out."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.checks import ConfigError
from jaxrl_llm.model import ModelConfig
from jaxrl_llm.model.params import init_params, param_specs
from jaxrl_llm.sampling import mismatch as mm


def _q8_0_block(x):
  """ggml-quants.c quantize_row_q8_0_ref + dequantize_row_q8_0 on one block (float32 arithmetic)."""
  x = np.asarray(x, np.float32)
  amax = np.float32(np.max(np.abs(x)))
  d = np.float32(amax / np.float32(127))
  idv = np.float32(1) / d if d != 0 else np.float32(0)
  x0 = (x * idv).astype(np.float32)
  # roundf: half away from zero, exact in float64 for float32 inputs
  q = np.sign(x0.astype(np.float64)) * np.floor(np.abs(x0.astype(np.float64)) + 0.5)
  assert np.all(np.abs(q) <= 127)
  d16 = np.float32(np.float16(d))  # y[i].d = GGML_FP32_TO_FP16(d)
  return (q.astype(np.float32) * d16).astype(np.float32)


def _q4_0_block(x):
  """ggml-quants.c quantize_row_q4_0_ref + dequantize_row_q4_0 on one block."""
  x = np.asarray(x, np.float32)
  amax, peak = np.float32(0), np.float32(0)
  for v in x:  # the first value of largest magnitude, with its sign
    if abs(v) > amax:
      amax, peak = np.float32(abs(v)), np.float32(v)
  d = np.float32(peak / np.float32(-8))
  idv = np.float32(1) / d if d != 0 else np.float32(0)
  x0 = (x * idv).astype(np.float32)
  q = np.minimum(15, np.trunc((x0 + np.float32(8.5)).astype(np.float32))).astype(np.int64)  # (int8_t)(x0 + 8.5f)
  assert q.min() >= 0
  d16 = np.float32(np.float16(d))
  return ((q - 8).astype(np.float32) * d16).astype(np.float32)


def _reference(w, bits, group, axes):
  """Blocks of `group` along the flattened `axes`, each through the C reference; last block may be short."""
  w = np.asarray(w, np.float32)
  rest = [a for a in range(w.ndim) if a not in axes]
  x = np.transpose(w, rest + list(axes))
  shape = x.shape
  x = x.reshape(-1, int(np.prod([w.shape[a] for a in axes])))
  out = np.empty_like(x)
  block = _q8_0_block if bits == 8 else _q4_0_block
  for r in range(x.shape[0]):
    for s in range(0, x.shape[1], group):
      out[r, s:s + group] = block(x[r, s:s + group])
  return np.transpose(out.reshape(shape), np.argsort(rest + list(axes)))


@pytest.mark.slow
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("shape,axes,group", [((6, 64), (1,), 32), ((40, 7), (0,), 16), ((2, 3, 5, 12), (1, 2), 32)])
def test_fake_quantize_equals_the_llama_cpp_reference(bits, shape, axes, group):
  # Blocks not dividing the axis ((40,) by 16, 3*5=15 by 32) and a block of zeros included.
  w = 0.02 * np.asarray(jax.random.normal(jax.random.key(3), shape, jnp.float32))
  w.reshape(-1)[:group] = 0.0
  got = np.asarray(mm.fake_quantize(jnp.asarray(w), bits=bits, group=group, axes=axes))
  want = _reference(w, bits, group, axes)
  np.testing.assert_array_equal(got, want)
  # int4 has 16 levels per block, int8 255: the error is what the step sizes allow
  err = np.abs(got - w).max()
  assert 0 < err <= (np.abs(w).max() / (7.5 if bits == 4 else 254)) * 1.01


def test_fake_quantize_hits_at_most_16_levels_per_int4_block():
  w = jax.random.normal(jax.random.key(0), (4, 32), jnp.float32)
  q = np.asarray(mm.fake_quantize(w, bits=4, group=32))
  for row in q:
    assert len(np.unique(row)) <= 16
  # the block's largest-magnitude weight is exactly level -8 (up to the float16 scale)
  i = np.argmax(np.abs(np.asarray(w[0])))
  np.testing.assert_allclose(q[0, i], float(w[0, i]), rtol=1e-3)


_jit_quantize = jax.jit(mm.fake_quantize, static_argnames=("bits", "group", "axes"))


def _tiny():
  return ModelConfig.tiny(vocab_size=50, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=64,
                          tie_embeddings=False)


@pytest.mark.slow
def test_mismatched_params_touch_exactly_the_weight_matrices():
  cfg = _tiny()
  params = init_params(cfg, jax.random.key(0))
  # every matrix of the model's table (normal init) is in MATRICES, nothing else is
  specs = jax.tree_util.tree_flatten_with_path(param_specs(cfg), is_leaf=lambda s: hasattr(s, "init"))[0]
  normal = {p[-1].key for p, s in specs if s.init == "normal"}
  assert normal == set(mm.MATRICES)
  for quant in ("int8", "int4"):
    out = mm.mismatched_params(params, mm.SamplerMismatch(quant=quant, quant_group=32))
    for path, leaf in jax.tree_util.tree_flatten_with_path(out)[0]:
      name = path[-1].key
      before = jax.tree_util.tree_flatten_with_path(params)[0]
      orig = dict((jax.tree_util.keystr(p), x) for p, x in before)[jax.tree_util.keystr(path)]
      if name in mm.MATRICES:
        want = _jit_quantize(orig, bits=8 if quant == "int8" else 4, group=32, axes=mm.MATRICES[name])
        np.testing.assert_array_equal(np.asarray(leaf), np.asarray(want))
        assert np.abs(np.asarray(leaf) - np.asarray(orig)).max() > 0
      else:
        np.testing.assert_array_equal(np.asarray(leaf), np.asarray(orig))


@pytest.mark.slow
def test_noise_is_the_seeded_relative_perturbation():
  cfg = _tiny()
  params = init_params(cfg, jax.random.key(0))
  a = mm.mismatched_params(params, mm.SamplerMismatch(noise=0.05, noise_seed=7))
  b = mm.mismatched_params(params, mm.SamplerMismatch(noise=0.05, noise_seed=7))
  c = mm.mismatched_params(params, mm.SamplerMismatch(noise=0.05, noise_seed=8))
  w, wa = np.asarray(params["layers"]["w_up_LDF"]), np.asarray(a["layers"]["w_up_LDF"])
  np.testing.assert_array_equal(wa, np.asarray(b["layers"]["w_up_LDF"]))  # same seed: same weights
  assert not np.array_equal(wa, np.asarray(c["layers"]["w_up_LDF"]))
  rel = (wa - w) / w
  assert abs(rel.std() - 0.05) < 0.005 and abs(rel.mean()) < 0.005  # eps ~ N(0, 1), std 0.05
  np.testing.assert_array_equal(np.asarray(a["final_norm_D"]), np.asarray(params["final_norm_D"]))
  # combined: noise first, then the quantiser
  both = mm.mismatched_params(params, mm.SamplerMismatch(quant="int8", noise=0.05, noise_seed=7))
  want = _jit_quantize(a["layers"]["w_up_LDF"], bits=8, group=32, axes=(1,))
  np.testing.assert_array_equal(np.asarray(both["layers"]["w_up_LDF"]), np.asarray(want))


def test_mismatch_metrics_are_the_formulas():
  prox = np.array([[-1.0, -2.0, -0.5, 0.0], [-0.1, -3.0, 0.0, 0.0]])
  behav = np.array([[-1.0, -1.0, -2.0, 0.0], [-0.2, -1.0, 0.0, 0.0]])
  mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], bool)
  m = mm.mismatch_metrics(prox, behav, mask)
  log_c = np.array([0.0, -1.0, 1.5, 0.1, -2.0])  # prox - behav on the 5 valid tokens
  np.testing.assert_allclose(m["mismatch/log_c_mean"], log_c.mean())
  np.testing.assert_allclose(m["mismatch/log_c_abs_mean"], np.abs(log_c).mean())
  np.testing.assert_allclose(m["mismatch/log_c_q50"], 0.0)
  np.testing.assert_allclose(m["mismatch/log_c_q99"], np.quantile(log_c, 0.99))
  # answers: |0 - 1 + 1.5| = 0.5 and |0.1 - 2| = 1.9
  np.testing.assert_allclose(m["mismatch/seq_abs_log_c_mean"], (0.5 + 1.9) / 2)
  np.testing.assert_allclose(m["mismatch/seq_abs_log_c_max"], 1.9)
  # c = e^-1 = 0.37, e^-2 = 0.14 are below 0.5; e^1.5 = 4.5 is above 2 but inside [0.5, 5]
  np.testing.assert_allclose(m["mismatch/c_out_0.5_2_frac"], 3 / 5)
  np.testing.assert_allclose(m["mismatch/c_out_0.5_5_frac"], 2 / 5)


def test_rollout_config_validates_the_mismatch_keys():
  from run_helpers import load_config, shrink

  from jaxrl_llm.sampling.config import RolloutConfig
  from jaxrl_llm.training.config import from_config_dict

  base = dict(engine="builtin", prompts_per_step=2, group_size=2, max_response_len=4, temperature=1.0, top_k=0,
              top_p=1.0, sampler_dtype="float32", sampler_sharding="fsdp", staleness=0, overlap=False,
              record_topk=0, continuous_slots=0, decode_chunk=16, exact=False)
  ok = RolloutConfig(**base, mismatch=mm.SamplerMismatch(quant="int4", quant_group=16, noise=0.01, noise_seed=3))
  assert ok.mismatch.active and ok.mismatched and not RolloutConfig(**base).mismatched
  assert RolloutConfig(**dict(base, staleness=1)).mismatched
  # The section read from a config (the path a run takes): the keys under rollout.mismatch, checked there.
  c = shrink(load_config("grpo"), **{"rollout.mismatch.quant": "int4", "rollout.mismatch.quant_group": 16,
                                     "rollout.mismatch.noise": 0.01, "rollout.mismatch.noise_seed": 3})
  assert from_config_dict(c).rollout.mismatch == ok.mismatch
  cases = [({"quant": "q4"}, r"config\.rollout\.mismatch\.quant='q4' is invalid: allowed \('none', 'int8', 'int4'\)"),
           ({"quant_group": 0}, r"config\.rollout\.mismatch\.quant_group=0 is out of range"),
           ({"noise": -0.1}, r"config\.rollout\.mismatch\.noise=-0\.1 is out of range: allowed \[0\.0, 1\.0\]"),
           ({"noise_seed": -1}, r"config\.rollout\.mismatch\.noise_seed=-1 is out of range")]
  for change, msg in cases:
    d = shrink(load_config("grpo")).to_dict()
    d["rollout"]["mismatch"].update(change)
    with pytest.raises(ConfigError, match=msg):
      from_config_dict(d)
  with pytest.raises(ConfigError, match=r"config\.rollout\.engine='other' is invalid: .*built-in"):
    RolloutConfig(**dict(base, engine="other"), mismatch=mm.SamplerMismatch(quant="int8"))


@pytest.mark.slow
def test_engine_samples_with_the_quantised_weights():
  from jaxrl_llm.model.tokenizer import CharTokenizer
  from jaxrl_llm.sampling.config import SamplingConfig
  from jaxrl_llm.sampling.engine import JaxSampler, sample_batch
  from jaxrl_llm.tasks.pipeline import PromptBatch

  tok = CharTokenizer()
  cfg = ModelConfig.tiny(vocab_size=tok.vocab_size, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64)
  params = init_params(cfg, jax.random.key(1))
  scfg = SamplingConfig(max_new_tokens=4, n_samples=2, eos_ids=(tok.eos_id,))
  prompts = PromptBatch(tokens_BP=np.array([[2, 10, 11], [2, 12, 13]], np.int32), mask_BP=np.ones((2, 3), bool),
                        prompts=("a", "b"), answers=("", ""), tags=("t", "t"))
  mis = mm.SamplerMismatch(quant="int4", quant_group=32)
  eng = JaxSampler(model_cfg=cfg, sampling_cfg=scfg, tokenizer=tok, mismatch=mis)
  eng.sync(params, 0)
  key = jax.random.key(5)
  got = eng.generate(prompts, key)
  want = sample_batch(mm.mismatched_params(params, mis), cfg, prompts, scfg, key, tok)
  np.testing.assert_array_equal(got.tokens_BR, want.tokens_BR)
  np.testing.assert_array_equal(np.asarray(got.behav_logp_BR), np.asarray(want.behav_logp_BR))
  plain = sample_batch(params, cfg, prompts, scfg, key, tok)
  assert not np.allclose(np.asarray(plain.behav_logp_BR), np.asarray(got.behav_logp_BR))


@pytest.mark.slow
def test_log_c_is_zero_without_mismatch_and_grows_from_int8_to_int4():
  # A small model of the built-in family (random init), its own sampler, the trainer's f32 recompute of
  # pi_prox. scripts/mismatch_levels.py measures the default model after its warm start.
  from jaxrl_llm.model.tokenizer import CharTokenizer
  from jaxrl_llm.sampling.config import SamplingConfig
  from jaxrl_llm.sampling.engine import JaxSampler
  from jaxrl_llm.tasks.pipeline import PromptBatch
  from jaxrl_llm.training.recompute import RecomputeSpec, policy_logprobs

  tok = CharTokenizer()
  cfg = ModelConfig.tiny(vocab_size=tok.vocab_size, d_model=64, n_layers=2, head_dim=16, d_ff=128, init_std=0.1)
  params = init_params(cfg, jax.random.key(2))
  scfg = SamplingConfig(max_new_tokens=8, n_samples=4, eos_ids=(tok.eos_id,))
  rows = [[tok.bos_id] + tok.encode(f"{a}+{b}=") for a, b in ((12, 7), (40, 3), (95, 6), (33, 8))]
  prompts = PromptBatch(tokens_BP=np.array(rows, np.int32), mask_BP=np.ones((4, 6), bool), prompts=("",) * 4,
                        answers=("",) * 4, tags=("",) * 4)
  stats = {}
  for quant in ("none", "int8", "int4"):
    eng = JaxSampler(model_cfg=cfg, sampling_cfg=scfg, tokenizer=tok, mismatch=mm.SamplerMismatch(quant=quant))
    eng.sync(params, 0)
    smp = eng.generate(prompts, jax.random.key(0))
    prox, _ = policy_logprobs(params, smp, RecomputeSpec(model_cfg=cfg, temperature=1.0, impl="auto", chunk=16))
    stats[quant] = mm.mismatch_metrics(prox, np.asarray(smp.behav_logp_BR), smp.mask_BR)
  print({q: round(s["mismatch/log_c_abs_mean"], 6) for q, s in stats.items()})
  assert abs(stats["none"]["mismatch/log_c_mean"]) < 1e-5 and stats["none"]["mismatch/log_c_abs_mean"] < 1e-5
  for key in ("mismatch/log_c_abs_mean", "mismatch/seq_abs_log_c_mean"):
    assert stats["none"][key] * 10 < stats["int8"][key] < stats["int4"][key] / 4, (key, stats)


def test_a_resume_with_another_mismatch_is_refused():
  # The mismatch keys are part of the run's saved config: changing one changes the result.
  from run_helpers import load_config, shrink
  from jaxrl_llm.training import provenance
  from jaxrl_llm.training.config import from_config_dict

  a = provenance.plain_config(from_config_dict(shrink(load_config("icepop"))))
  b = provenance.plain_config(from_config_dict(shrink(load_config("icepop"), **{"rollout.mismatch.quant": "int8"})))
  assert provenance.result_changes(a, b) == {"rollout.mismatch.quant": ("none", "int8")}


@pytest.mark.slow
def test_sampler_sharding_tensor_holds_a_gathered_copy_and_samples_the_same():
  """rollout.sampler_sharding='tensor' on an fsdp x tensor mesh of 8 CPU devices: the engine's copy is
  split over tensor only (each device holds 1/tensor of every weight), in the sampler's dtype, and it
  samples the tokens the trainer-layout sampler samples, log mu to f32 rounding."""
  from jaxrl_llm.model.sharding import MeshConfig, batch_sharding, init_sharded_params, make_mesh
  from jaxrl_llm.model.tokenizer import CharTokenizer
  from jaxrl_llm.sampling.config import SamplingConfig
  from jaxrl_llm.sampling.engine import JaxSampler
  from jaxrl_llm.tasks.pipeline import PromptBatch

  tok = CharTokenizer()
  mesh = make_mesh(MeshConfig(data=1, fsdp=4, tensor=2))
  cfg = ModelConfig.tiny(vocab_size=tok.vocab_size + (-tok.vocab_size) % 2, d_model=32, n_layers=2, n_heads=2,
                         n_kv_heads=2, d_ff=64)
  params = init_sharded_params(cfg, jax.random.key(1), mesh)
  scfg = SamplingConfig(max_new_tokens=5, n_samples=2, eos_ids=(tok.eos_id,))
  prompts = PromptBatch(tokens_BP=np.array([[2, 10, 11]] * 4, np.int32) + np.arange(4)[:, None],
                        mask_BP=np.ones((4, 3), bool), prompts=("a",) * 4, answers=("",) * 4, tags=("t",) * 4)
  rows = batch_sharding(mesh, 1)
  out = {}
  for layout in ("fsdp", "tensor"):
    eng = JaxSampler(model_cfg=cfg, sampling_cfg=scfg, tokenizer=tok, batch_sharding=rows, sharding=layout)
    eng.sync(params, 0)
    if layout == "tensor":
      w = eng.params["layers"]["w_up_LDF"]
      assert w.sharding.spec[1] is None  # D: no longer split over fsdp
      assert w.addressable_shards[0].data.size == w.size // 2  # F split over tensor = 2
    out[layout] = eng.generate(prompts, jax.random.key(3))
  np.testing.assert_array_equal(out["tensor"].tokens_BR, out["fsdp"].tokens_BR)
  np.testing.assert_allclose(np.asarray(out["tensor"].behav_logp_BR), np.asarray(out["fsdp"].behav_logp_BR),
                             atol=1e-5)
