"""The sampler end to end on a tiny model, against a full-forward recompute."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.model.sharding import MeshConfig, make_mesh, shard_params
from jaxrl_llm.sampling import loop
from jaxrl_llm.sampling.config import SamplingConfig
from jaxrl_llm.sampling.generate import generate
from jaxrl_llm.sampling.rollout import FINISH_EOS, FINISH_LENGTH, FINISH_STOP
from sampling_helpers import VOCAB, pad_prompts, recompute_logits, tiny_model
from sampling_reference import processed_probs

PROMPTS = [[5, 9, 2, 33, 17, 8], [41, 3], [7, 7, 19, 25], [11]]
R = 7


# The module-scoped fixtures run once: the module's tests go to one pytest-xdist worker.
pytestmark = pytest.mark.xdist_group("sampling.test_sampling_generate")


@pytest.fixture(scope="module")
def model():
  return tiny_model()


@pytest.mark.slow
def test_greedy_is_argmax_of_full_recompute(model):
  cfg_m, params = model
  prompt_BP, pmask_BP = pad_prompts(PROMPTS, "left")
  r = generate(params, cfg_m, prompt_BP, pmask_BP, SamplingConfig(temperature=0.0, max_new_tokens=R,
                                                                   record_raw_logp=True), jax.random.key(0))
  assert r.mask_BR.all() and (np.asarray(r.finish_reason_B) == FINISH_LENGTH).all()
  np.testing.assert_array_equal(r.length_B, [R] * 4)
  np.testing.assert_array_equal(r.behav_logp_BR, 0.0)  # greedy: log 1
  logits_BRV = recompute_logits(params, cfg_m, prompt_BP, pmask_BP, r.tokens_BR, r.mask_BR)
  np.testing.assert_array_equal(r.tokens_BR, jnp.argmax(logits_BRV, axis=-1))
  # Not a degenerate path: the greedy tokens vary along the response.
  assert len(np.unique(np.asarray(r.tokens_BR))) > 4
  np.testing.assert_allclose(r.raw_logp_BR, jnp.take_along_axis(jax.nn.log_softmax(logits_BRV), r.tokens_BR[..., None], -1)[..., 0],
                             atol=2e-5)


@pytest.mark.slow
@pytest.mark.parametrize("side", ["right", "mixed"])
def test_padding_side_and_one_by_one_match(model, side):
  """Left-, right- and mixed-padded batches == each prompt alone, unpadded."""
  cfg_m, params = model
  cfg = SamplingConfig(temperature=0.0, max_new_tokens=R, record_raw_logp=True)
  batched = generate(params, cfg_m, *pad_prompts(PROMPTS, side, width=8), cfg, jax.random.key(0))
  for b in (0, 1):  # (one compile per prompt length: two rows are enough)
    p = PROMPTS[b]
    alone = generate(params, cfg_m, jnp.asarray([p], jnp.int32), jnp.ones((1, len(p)), bool), cfg, jax.random.key(0))
    np.testing.assert_array_equal(batched.tokens_BR[b], alone.tokens_BR[0])
    np.testing.assert_allclose(batched.raw_logp_BR[b], alone.raw_logp_BR[0], atol=2e-5)


@pytest.mark.slow
def test_sampled_logp_is_processed_distribution(model):
  """log mu == the naive reference mu (temperature, top-k, top-p) on logits
  recomputed by a full forward with the same params and dtype (f32: 2e-5)."""
  cfg_m, params = model
  prompt_BP, pmask_BP = pad_prompts(PROMPTS, "mixed")
  cfg = SamplingConfig(temperature=0.7, top_k=12, top_p=0.85, max_new_tokens=R, n_samples=3,
                       record_raw_logp=True, record_topk=5)
  r = generate(params, cfg_m, prompt_BP, pmask_BP, cfg, jax.random.key(1))
  assert r.sampling == cfg
  np.testing.assert_array_equal(r.prompt_index_B, np.repeat(np.arange(4), 3))
  rep = lambda x: jnp.repeat(x, 3, axis=0)
  logits_BRV = np.asarray(recompute_logits(params, cfg_m, rep(prompt_BP), rep(pmask_BP), r.tokens_BR, r.mask_BR))
  tokens = np.asarray(r.tokens_BR)
  for b in range(12):
    for t in range(R):
      mu_V = processed_probs(logits_BRV[b, t], 0.7, 12, 0.85)
      assert mu_V[tokens[b, t]] > 0, "sampled outside the kept set"
      np.testing.assert_allclose(r.behav_logp_BR[b, t], np.log(mu_V[tokens[b, t]]), atol=2e-5)
      top5 = np.argsort(-logits_BRV[b, t], kind="stable")[:5]
      np.testing.assert_array_equal(r.topk_ids_BRK[b, t], top5)
      with np.errstate(divide="ignore"):
        np.testing.assert_allclose(r.topk_logp_BRK[b, t], np.log(mu_V[top5]), atol=2e-5)
  raw_BR = jnp.take_along_axis(jax.nn.log_softmax(jnp.asarray(logits_BRV)), r.tokens_BR[..., None], -1)[..., 0]
  np.testing.assert_allclose(r.raw_logp_BR, raw_BR, atol=2e-5)
  # The truncation is visible: log mu > raw log-prob wherever mass was cut.
  assert (np.asarray(r.behav_logp_BR) > np.asarray(r.raw_logp_BR) + 1e-3).mean() > 0.5


@pytest.mark.slow
def test_bf16_sampler_matches_bf16_recompute(model):
  """cfg.dtype='bfloat16' samples with bf16 params and compute; a bf16 full
  forward recomputes its log mu to 0.03 (bf16 has 8 mantissa bits; the
  cached and uncached paths sum in different orders)."""
  cfg_m, params = model
  prompt_BP, pmask_BP = pad_prompts(PROMPTS, "left")
  cfg = SamplingConfig(temperature=1.0, max_new_tokens=R, dtype="bfloat16")
  r = generate(params, cfg_m, prompt_BP, pmask_BP, cfg, jax.random.key(2))
  bf_cfg = cfg_m.replace(param_dtype="bfloat16", compute_dtype="bfloat16")
  bf_params = loop.cast_params(params, "bfloat16")
  logits_BRV = recompute_logits(bf_params, bf_cfg, prompt_BP, pmask_BP, r.tokens_BR, r.mask_BR)
  want_BR = jnp.take_along_axis(jax.nn.log_softmax(logits_BRV), r.tokens_BR[..., None], -1)[..., 0]
  np.testing.assert_allclose(r.behav_logp_BR, want_BR, atol=3e-2)
  # ... and it is a different policy from the f32 one (c = pi_prox / mu != 1).
  f32_BRV = recompute_logits(params, cfg_m, prompt_BP, pmask_BP, r.tokens_BR, r.mask_BR)
  f32_BR = jnp.take_along_axis(jax.nn.log_softmax(f32_BRV), r.tokens_BR[..., None], -1)[..., 0]
  assert float(jnp.max(jnp.abs(f32_BR - r.behav_logp_BR))) > 1e-4


@pytest.mark.slow
def test_eos_and_stop_end_rows_and_pad_after(model):
  cfg_m, params = model
  prompt_BP, pmask_BP = pad_prompts(PROMPTS, "left")
  base = generate(params, cfg_m, prompt_BP, pmask_BP, SamplingConfig(temperature=0.0, max_new_tokens=R),
                  jax.random.key(0))
  tokens = np.asarray(base.tokens_BR)
  eos, stop = int(tokens[0, 2]), int(tokens[1, 1])
  assert eos != stop
  cfg = SamplingConfig(temperature=0.0, max_new_tokens=R, eos_ids=(eos,), stop_ids=(stop,), pad_id=47,
                       record_raw_logp=True)
  r = generate(params, cfg_m, prompt_BP, pmask_BP, cfg, jax.random.key(0))
  for b in range(4):
    hits = [t for t in range(R) if tokens[b, t] in (eos, stop)]
    n = hits[0] + 1 if hits else R
    want_reason = FINISH_LENGTH if not hits else (FINISH_EOS if tokens[b, hits[0]] == eos else FINISH_STOP)
    assert int(r.length_B[b]) == n and int(r.finish_reason_B[b]) == want_reason
    np.testing.assert_array_equal(r.tokens_BR[b, :n], tokens[b, :n])  # same greedy path up to the end
    np.testing.assert_array_equal(r.tokens_BR[b, n:], 47)
    np.testing.assert_array_equal(r.mask_BR[b], np.arange(R) < n)
    np.testing.assert_array_equal(r.raw_logp_BR[b, n:], 0.0)
  assert r.finish_names()[:2] == ["eos", "stop"]


@pytest.mark.slow
def test_early_exit_when_every_row_has_finished(model):
  """With every id an eos, all rows finish at token 0 and the loop runs no step."""
  cfg_m, params = model
  prompt_BP, pmask_BP = pad_prompts(PROMPTS, "left")
  cfg = SamplingConfig(temperature=1.0, max_new_tokens=R, eos_ids=tuple(range(VOCAB)))
  state = loop.prefill(params, prompt_BP, pmask_BP, jax.random.key(0), model_cfg=cfg_m, cfg=cfg, cache_len=6 + R)
  state = loop.decode(params, state, model_cfg=cfg_m, cfg=cfg)
  assert int(state.step) == 1 and int(state.cache.index) == 6
  np.testing.assert_array_equal(state.length_B, 1)
  np.testing.assert_array_equal(state.finish_reason_B, FINISH_EOS)


@pytest.mark.slow
def test_groups_seeds_and_jit_cache(model):
  cfg_m, params = model
  prompt_BP, pmask_BP = pad_prompts(PROMPTS, "left")
  cfg = SamplingConfig(temperature=1.0, max_new_tokens=R, n_samples=4)
  n_prefill, n_decode = loop.prefill._cache_size(), loop.decode._cache_size()
  a = generate(params, cfg_m, prompt_BP, pmask_BP, cfg, jax.random.key(5))
  b = generate(params, cfg_m, prompt_BP, pmask_BP, cfg, jax.random.key(5))
  c = generate(params, cfg_m, prompt_BP, pmask_BP, cfg, jax.random.key(6))
  # One compile for three calls of equal shapes and configs.
  assert loop.prefill._cache_size() == n_prefill + 1 and loop.decode._cache_size() == n_decode + 1
  np.testing.assert_array_equal(a.tokens_BR, b.tokens_BR)
  np.testing.assert_array_equal(a.behav_logp_BR, b.behav_logp_BR)
  assert (np.asarray(a.tokens_BR) != np.asarray(c.tokens_BR)).any()
  # The 4 samples of a prompt are distinct draws from the same prompt.
  groups = np.asarray(a.tokens_BR).reshape(4, 4, R)
  assert all(len({tuple(row) for row in g}) > 1 for g in groups)


@pytest.mark.slow
def test_greedy_groups_are_copies(model):
  cfg_m, params = model
  prompt_BP, pmask_BP = pad_prompts(PROMPTS, "right")
  one = generate(params, cfg_m, prompt_BP, pmask_BP, SamplingConfig(temperature=0.0, max_new_tokens=R), jax.random.key(0))
  three = generate(params, cfg_m, prompt_BP, pmask_BP, SamplingConfig(temperature=0.0, max_new_tokens=R, n_samples=3),
                   jax.random.key(0))
  np.testing.assert_array_equal(three.tokens_BR, np.repeat(np.asarray(one.tokens_BR), 3, axis=0))


def test_bad_key_is_a_type_error(model):
  cfg_m, params = model
  with pytest.raises(TypeError, match=r"key must be a PRNG key"):
    generate(params, cfg_m, *pad_prompts(PROMPTS, "left"), SamplingConfig(max_new_tokens=4), 0)


@pytest.mark.parametrize("change,match", [
    (dict(cfg=SamplingConfig(top_k=VOCAB + 1)), r"top_k=49 exceeds the vocabulary size 48"),
    (dict(cfg=SamplingConfig(max_new_tokens=4, cache_len=8)), r"prompt length 6 \+ max_new_tokens 4 = 10 exceeds"),
    (dict(mask=np.array([[1] * 6, [0] * 6, [1] * 6, [1] * 6], bool)), r"prompt rows \[1\] have no real token"),
    (dict(tokens=np.full((4, 6), VOCAB, np.int32)), r"prompt token ids must be in \[0, 48\)"),
    (dict(mask=np.ones((4, 5), bool)), r"same shape"),
])
def test_bad_input(model, change, match):
  cfg_m, params = model
  tokens, mask = pad_prompts(PROMPTS, "left")
  args = dict(tokens=tokens, mask=mask, cfg=SamplingConfig(max_new_tokens=4))
  args.update(change)
  with pytest.raises(ValueError, match=match):
    generate(params, cfg_m, jnp.asarray(args["tokens"]), jnp.asarray(args["mask"]), args["cfg"], jax.random.key(0))


@pytest.mark.slow
def test_sharded_over_data_axis_equals_unsharded(model):
  """On a (data 2, fsdp 2, tensor 2) mesh with params in the model's sharding,
  rows split over data x fsdp give the unsharded tokens and log mu."""
  cfg_m, params = model
  mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
  prompt_BP, pmask_BP = pad_prompts(PROMPTS, "mixed")
  cfg = SamplingConfig(temperature=0.9, top_p=0.9, max_new_tokens=R, n_samples=2, record_raw_logp=True)
  plain = generate(params, cfg_m, prompt_BP, pmask_BP, cfg, jax.random.key(3))
  sharded = generate(shard_params(params, cfg_m, mesh), cfg_m, prompt_BP, pmask_BP, cfg, jax.random.key(3), mesh=mesh)
  assert sharded.tokens_BR.sharding.spec[0] == ("data", "fsdp")
  assert len(sharded.tokens_BR.sharding.device_set) == 8
  np.testing.assert_array_equal(sharded.tokens_BR, plain.tokens_BR)
  np.testing.assert_allclose(sharded.behav_logp_BR, plain.behav_logp_BR, atol=1e-5)
  np.testing.assert_allclose(sharded.raw_logp_BR, plain.raw_logp_BR, atol=1e-5)
  with pytest.raises(ValueError, match=r"3 rows do not split evenly over data_axis \('data', 'fsdp'\) of size 4"):
    generate(params, cfg_m, prompt_BP[:3], pmask_BP[:3], SamplingConfig(max_new_tokens=R), jax.random.key(3), mesh=mesh)
  with pytest.raises(ValueError, match=r"data_axis='rows' must name axes of the mesh"):
    generate(params, cfg_m, prompt_BP, pmask_BP, cfg, jax.random.key(3), mesh=mesh, data_axis="rows")


@pytest.mark.slow
def test_vocab_limit_is_never_sampled(model):
  """Ids at or past vocab_limit (a vocabulary padded past the tokenizer's) are never
  sampled, even when the model puts nearly all its mass there."""
  cfg_m, params = model
  limit = 40
  embed = params["embed_VD"].at[limit:].multiply(50.0)  # tied head: those ids' logits dominate
  params = {**params, "embed_VD": embed}
  prompt_BP, pmask_BP = pad_prompts(PROMPTS, "left")
  free = generate(params, cfg_m, prompt_BP, pmask_BP, SamplingConfig(temperature=0.0, max_new_tokens=R),
                  jax.random.key(0))
  assert (np.asarray(free.tokens_BR) >= limit).any()  # without the limit they are picked
  for temperature in (0.0, 1.0):
    r = generate(params, cfg_m, prompt_BP, pmask_BP,
                 SamplingConfig(temperature=temperature, max_new_tokens=R, vocab_limit=limit), jax.random.key(1))
    assert (np.asarray(r.tokens_BR)[np.asarray(r.mask_BR)] < limit).all()
    assert np.isfinite(np.asarray(r.behav_logp_BR)).all()
