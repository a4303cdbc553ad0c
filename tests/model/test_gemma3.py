"""Gemma 3 (text) against transformers' Gemma3ForCausalLM on a tiny random
checkpoint: logits, sliding-window locality in prefill and cached decode,
greedy generation, the Hugging Face round trip, config.json and refusals."""

import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from safetensors import safe_open

from jaxrl_llm.model import (ModelConfig, forward, init_cache, init_params, logits,
                             param_shapes, unstack_layers)
from jaxrl_llm.model.config import pattern_layer_types
from jaxrl_llm.model.io.hf_config import config_from_hf, config_to_hf
from jaxrl_llm.model.io.hf_io import load_hf, read_hf_config, save_hf
from jaxrl_llm.model.sharding import MeshConfig, cache_sharding, make_mesh
from jaxrl_llm.sampling.config import SamplingConfig
from jaxrl_llm.sampling.generate import generate

VOCAB, W = 256, 4  # vocabulary, sliding window
# Six layers, local-local-global twice: the first two layers are local, so a
# token's influence after them reaches 2 * (W - 1) = 6 positions ahead.
LAYER_TYPES = pattern_layer_types(6, 3)


def _hf_config():
  return transformers.Gemma3TextConfig(
      vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=6,
      num_attention_heads=4, num_key_value_heads=2, head_dim=32,  # head_dim != 64 / 4
      query_pre_attn_scalar=24,  # != head_dim: the scale is 24 ** -0.5, not 32 ** -0.5
      sliding_window=W, layer_types=list(LAYER_TYPES), max_position_embeddings=128,
      rms_norm_eps=1e-6,
      rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                       "full_attention": {"rope_type": "linear", "factor": 2.0,
                                          "rope_theta": 10000.0}})


def _build(path, seed=1):
  """A random Gemma3ForCausalLM with every tensor non-trivial, saved to path.

  Norm weights w act as 1 + w; the matrices' std 0.06 keeps greedy paths
  varied (at 0.15 they fall into one repeated token within a few steps) with
  top-1 margins of >= 0.02 along them, 2000x the two models' difference."""
  torch.manual_seed(seed)
  model = transformers.AutoModelForCausalLM.from_config(_hf_config(), attn_implementation="eager")
  with torch.no_grad():
    for name, p in model.named_parameters():
      p.copy_((0.2 if "norm" in name else 0.06) * torch.randn_like(p))
  model.eval().save_pretrained(path)
  return model


# The module-scoped fixtures run once: the module's tests go to one pytest-xdist worker.
pytestmark = pytest.mark.xdist_group("model.test_gemma3")


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory):
  """The tiny checkpoint's directory (config.json + model.safetensors, f32)."""
  path = tmp_path_factory.mktemp("gemma3")
  _build(path)
  return str(path)


def _torch_model(path):
  return transformers.AutoModelForCausalLM.from_pretrained(
      path, attn_implementation="eager", dtype=torch.float32).eval()


fwd = jax.jit(forward, static_argnums=1)


def _padded_batch(T=14, seed=1):
  """4 rows of T tokens: full, left-padded by 3 and 6, right-padded by 5;
  every row is longer than the window W = 4."""
  tokens = np.array(jax.random.randint(jax.random.key(seed), (4, T), 0, VOCAB), np.int32)
  mask = np.ones((4, T), bool)
  mask[1, :3] = False
  mask[2, :6] = False
  mask[3, T - 5:] = False
  positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int32)
  return tokens, mask, positions


def _torch_logits(model, tokens, mask, positions):
  with torch.no_grad():
    return model(input_ids=torch.from_numpy(tokens).long(),
                 attention_mask=torch.from_numpy(mask).long(),
                 position_ids=torch.from_numpy(positions).long()).logits.numpy()


@pytest.mark.slow
def test_logits_match_transformers(gemma_dir):
  tokens, mask, positions = _padded_batch()
  ref = _torch_logits(_torch_model(gemma_dir), tokens, mask, positions)
  params, cfg = load_hf(gemma_dir)
  assert cfg.family == "gemma3" and cfg.layer_types == LAYER_TYPES
  hidden, _ = fwd(params, cfg, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask))
  ours = np.asarray(logits(params, cfg, hidden))
  diff = np.abs(ours - ref)[mask]  # padded slots mean nothing in either model
  print(f"gemma3: max abs logit diff {diff.max():.3g}")
  assert diff.max() <= 1e-5, f"max abs logit diff {diff.max():.3g}"
  assert np.std(ref[mask]) > 0.3  # logits vary by O(1): the comparison is not vacuous
  # The batch exercises what a local layer does differently: with a window
  # as long as the rows, one RoPE base for all layers, or the default
  # 1 / sqrt(head_dim) scale, the logits move by far more than the tolerance.
  for change in (dict(sliding_window=14), dict(rope_local_theta=None),
                 dict(query_pre_attn_scalar=None)):
    h2, _ = fwd(params, cfg.replace(**change), jnp.asarray(tokens), jnp.asarray(positions),
                jnp.asarray(mask))
    off = np.abs(np.asarray(logits(params, cfg, h2)) - ref)[mask].max()
    assert off > 1e-2, f"{change} changes the logits by only {off:.3g}"


def _first_layers(params, n):
  """The model with layers n.. made identities: their attention output and
  MLP projections zero (the sandwich norm of 0 is 0), so the final hidden
  state is the n-th layer's output, final-normed; same shapes and config,
  hence one compiled program for every n."""
  layers = dict(params["layers"])
  for name in ("wo_LNHD", "w_down_LFD"):
    layers[name] = layers[name].at[n:].set(0.0)
  return {**params, "layers": layers}


def _decode_hidden(params, cfg, tokens, mask, positions, prefill):
  """hidden_BTD from a prefill of `prefill` slots (a scan over stacked layers)
  then one cached decode step per slot (the unrolled loop, as the sampler)."""
  T = tokens.shape[1]
  cache = init_cache(cfg, tokens.shape[0], T + 2)
  hidden, cache = fwd(params, cfg, tokens[:, :prefill], positions[:, :prefill], mask[:, :prefill],
                      cache)
  out = [hidden]
  unstacked = unstack_layers(params)
  for t in range(prefill, T):
    hidden, cache = fwd(unstacked, cfg, tokens[:, t:t + 1], positions[:, t:t + 1],
                        mask[:, t:t + 1], cache)
    out.append(hidden)
  return np.asarray(jnp.concatenate(out, axis=1)), cache


@pytest.mark.slow
def test_local_layers_ignore_tokens_outside_their_window(gemma_dir):
  """Changing the token at position 0 leaves the output of the local layers
  exactly unchanged wherever the token is outside their windows (after one
  local layer: positions >= W; after two: >= 2W - 1), with or without the
  cache; the global layer after them sees it everywhere."""
  params, cfg = load_hf(gemma_dir)
  tokens, mask, positions = (jnp.asarray(a) for a in _padded_batch(seed=4))
  pad = np.array([0, 3, 6, 0])  # the slot of position 0 in each row
  changed = tokens.at[jnp.arange(4), pad].set((tokens[jnp.arange(4), pad] + 1) % VOCAB)
  m = np.asarray(mask)
  pos = np.asarray(positions)
  for n, reach in ((1, W), (2, 2 * W - 1), (3, None)):
    p_n = _first_layers(params, n)
    for cached in (False, True):
      if cached:
        a, _ = _decode_hidden(p_n, cfg, tokens, mask, positions, prefill=5)
        b, _ = _decode_hidden(p_n, cfg, changed, mask, positions, prefill=5)
      else:
        a = np.asarray(fwd(p_n, cfg, tokens, positions, mask)[0])
        b = np.asarray(fwd(p_n, cfg, changed, positions, mask)[0])
      moved_BT = np.abs(a - b).max(-1) > 0
      if reach is None:  # through the global layer: every real token moves
        assert moved_BT[m].all(), f"{n} layers, cached={cached}"
      else:
        far_BT = m & (pos >= reach)
        near_BT = m & (pos < reach)
        assert not moved_BT[far_BT].any(), f"{n} local layers, cached={cached}: the window leaks"
        assert moved_BT[near_BT].all(), f"{n} local layers, cached={cached}: inside the window"
        # Exactly unchanged, not merely close: keys outside the window get probability 0.
        np.testing.assert_array_equal(a[far_BT], b[far_BT])


def test_cached_decode_equals_full_forward(gemma_dir):
  """A prefill of 5 slots then 9 single cached steps (positions 5 .. 13, all
  beyond the window) == one forward of the whole rows; the cache keeps each
  slot's position; the scan and the unrolled loop agree."""
  params, cfg = load_hf(gemma_dir)
  tokens, mask, positions = (jnp.asarray(a) for a in _padded_batch())
  m = np.asarray(mask)
  full = np.asarray(fwd(params, cfg, tokens, positions, mask)[0])
  got, cache = _decode_hidden(params, cfg, tokens, mask, positions, prefill=5)
  np.testing.assert_allclose(got[m], full[m], atol=2e-5, rtol=0)
  np.testing.assert_array_equal(np.asarray(cache.positions_BS[:, :14]), np.asarray(positions))
  # The scan and the unrolled loop compile to different fusions: f32 rounding
  # of ~1e-6 relative on hidden values of O(1) after six layers.
  loop = np.asarray(fwd(unstack_layers(params), cfg, tokens, positions, mask)[0])
  np.testing.assert_allclose(loop[m], full[m], atol=1e-5, rtol=0)
  # The cache's sharding tree has the positions too (the sampler's rows split with them).
  mesh = make_mesh(MeshConfig(data=4, fsdp=1, tensor=2))
  assert jax.tree.structure(cache_sharding(cfg, mesh)) == jax.tree.structure(cache)


@pytest.mark.slow
def test_gradients_through_the_scan_equal_the_unrolled_loop(gemma_dir):
  """The trainer differentiates the scan (here under remat="full"), whose
  body selects each layer's mask and RoPE table from a traced flag; its
  gradients equal those of the unrolled loop, where each layer's kind is
  static."""
  params, cfg = load_hf(gemma_dir)
  tokens, mask, positions = (jnp.asarray(a) for a in _padded_batch())

  def loss(params, cfg):
    hidden, _ = forward(params, cfg, tokens, positions, mask)
    return jnp.mean(jnp.square(logits(params, cfg, hidden)))

  grad = jax.jit(jax.grad(loss), static_argnums=1)
  g_scan = grad(params, cfg.replace(remat="full"))
  g_loop = unstack_layers(grad(unstack_layers(params), cfg))
  g_loop = {**g_loop, "layers": jax.tree.map(lambda *xs: jnp.stack(xs), *g_loop["layers"])}
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), g_scan, g_loop)
  assert all(float(jnp.abs(x).max()) > 0 for x in jax.tree.leaves(g_scan))  # every tensor learns


def test_embedding_scale_is_rounded_like_transformers():
  """sqrt(640) = 25.298 is rounded to the compute dtype before the product
  (bf16: 25.25), as Gemma3TextScaledWordEmbedding does."""
  from jaxrl_llm.model import embed, param_shapes
  cfg = ModelConfig.preset("gemma3_270m", vocab_size=3, n_layers=1, layer_types=("sliding_attention",), param_dtype="bfloat16",
                           compute_dtype="bfloat16")
  table = np.array(jax.random.normal(jax.random.key(5), (3, 640)), np.float32)  # a writable copy
  params = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), param_shapes(cfg))  # the rest unused
  ours = embed({**params, "embed_VD": jnp.asarray(table, jnp.bfloat16)}, cfg, jnp.asarray([[2, 0, 1]]))
  ref_module = transformers.models.gemma3.modeling_gemma3.Gemma3TextScaledWordEmbedding(
      3, 640, padding_idx=0, embed_scale=640 ** 0.5)
  with torch.no_grad():
    ref_module.weight.copy_(torch.from_numpy(table))
    ref = ref_module.to(torch.bfloat16)(torch.tensor([[2, 0, 1]])).float().numpy()
  np.testing.assert_array_equal(np.asarray(ours, np.float32), ref)
  assert float(jnp.asarray(640 ** 0.5, jnp.bfloat16)) == 25.25


PROMPTS = [[5, 9, 2, 33, 17, 8, 40, 11, 3], [41, 3, 7, 200, 12], [77, 250], [7, 7, 19, 25, 1, 2]]
R = 10  # prompts of up to 9 tokens + 10 new ones: well past the window of 4


@pytest.mark.slow
def test_greedy_generation_matches_transformers_generate(gemma_dir):
  params, cfg = load_hf(gemma_dir)
  P = max(len(p) for p in PROMPTS)
  tokens = np.zeros((len(PROMPTS), P), np.int64)
  mask = np.zeros((len(PROMPTS), P), np.int64)
  for b, p in enumerate(PROMPTS):  # left padding, as transformers' generate wants
    tokens[b, P - len(p):] = p
    mask[b, P - len(p):] = 1
  model = _torch_model(gemma_dir)
  with torch.no_grad():
    out = model.generate(input_ids=torch.from_numpy(tokens), attention_mask=torch.from_numpy(mask),
                         do_sample=False, max_new_tokens=R, min_new_tokens=R, eos_token_id=None,
                         pad_token_id=0, output_scores=True, return_dict_in_generate=True)
  ref = out.sequences.numpy()[:, P:]
  sampling = SamplingConfig(temperature=0.0, max_new_tokens=R)
  ours = generate(params, cfg, jnp.asarray(tokens, jnp.int32), jnp.asarray(mask, bool), sampling,
                  jax.random.key(0))
  np.testing.assert_array_equal(np.asarray(ours.tokens_BR), ref)
  assert len(np.unique(ref)) >= 16  # greedy paths that move, not one repeated token
  # No near-ties on the way, so the equality is not luck of rounding.
  top2_BRV = np.sort(torch.stack(out.scores, 1).numpy(), axis=-1)[..., -2:]
  assert (top2_BRV[..., 1] - top2_BRV[..., 0]).min() > 1e-3
  # Right-padded prompts leave a gap of padding slots between prompt and
  # response; the window counts positions, not slots, so the tokens are the same.
  right = np.zeros_like(tokens)
  right_mask = np.zeros_like(mask)
  for b, p in enumerate(PROMPTS):
    right[b, :len(p)] = p
    right_mask[b, :len(p)] = 1
  ours_right = generate(params, cfg, jnp.asarray(right, jnp.int32), jnp.asarray(right_mask, bool),
                        sampling, jax.random.key(0))
  np.testing.assert_array_equal(np.asarray(ours_right.tokens_BR), ref)


def _tensors(path):
  out = {}
  for fname in sorted(os.listdir(path)):
    if fname.endswith(".safetensors"):
      with safe_open(os.path.join(path, fname), framework="numpy") as f:
        out.update({k: f.get_tensor(k) for k in f.keys()})
  return out


@pytest.mark.slow
def test_round_trip_through_transformers(gemma_dir, tmp_path):
  """HF -> ours -> HF is bit-exact, transformers loads the export with the
  same logits, and loading the export back gives the same params and config."""
  src = gemma_dir
  params, cfg = load_hf(src)
  save_hf(params, cfg, str(tmp_path), base_config=read_hf_config(src))
  a, b = _tensors(src), _tensors(tmp_path)
  assert set(a) == set(b) and "lm_head.weight" not in b  # tied: the 256-row head is the embedding
  for name in a:
    assert a[name].dtype == b[name].dtype and a[name].tobytes() == b[name].tobytes(), name
  tokens, mask, positions = _padded_batch()
  np.testing.assert_array_equal(_torch_logits(_torch_model(str(tmp_path)), tokens, mask, positions),
                                _torch_logits(_torch_model(src), tokens, mask, positions))
  back, cfg_back = load_hf(str(tmp_path))
  assert cfg_back == cfg
  jax.tree.map(np.testing.assert_array_equal, back, params)
  # A fresh model of ours exports too: transformers' logits equal ours.
  @jax.jit
  def fresh_params(key):  # init sets the norms' w to 0 (scale 1): perturb every tensor
    params = init_params(cfg, key)
    keys = jax.random.split(jax.random.key(2), len(jax.tree.leaves(params)))
    noise = [0.1 * jax.random.normal(k, x.shape) for k, x in zip(keys, jax.tree.leaves(params))]
    return jax.tree.map(jnp.add, params, jax.tree.unflatten(jax.tree.structure(params), noise))

  fresh = fresh_params(jax.random.key(1))
  save_hf(fresh, cfg, str(tmp_path / "fresh"))
  hidden, _ = fwd(fresh, cfg, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask))
  ref = _torch_logits(_torch_model(str(tmp_path / "fresh")), tokens, mask, positions)
  assert np.abs(np.asarray(logits(fresh, cfg, hidden)) - ref)[mask].max() <= 1e-5


def test_param_count_and_presets(gemma_dir):
  _, cfg = load_hf(gemma_dir)
  model = _torch_model(gemma_dir)
  assert cfg.num_params() == sum(p.numel() for p in model.parameters())
  # Gemma 3 270M: embed 262144 * 640 = 167,772,160; per layer q/o 2 * 640 * 1024,
  # k/v 2 * 640 * 256, MLP 3 * 640 * 2048, norms 4 * 640 + 2 * 256 = 5,573,632,
  # x 18 = 100,325,376; final norm 640: 268,098,176 (the published "268M").
  assert ModelConfig.preset("gemma3_270m").num_params() == 268_098_176
  g = ModelConfig.preset("gemma3_270m")
  assert g.local_layers == (True,) * 5 + (False,) + (True,) * 5 + (False,) + (True,) * 5 + (False,)
  assert g.attn_scale == 256 ** -0.5


@pytest.mark.parametrize("preset", ["gemma3_270m", "gemma3_1b"])
def test_preset_config_json_round_trips_and_loads_in_transformers(preset):
  cfg = ModelConfig.preset(preset)
  hf = json.loads(json.dumps(config_to_hf(cfg)))
  assert config_from_hf(hf) == cfg
  assert ModelConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
  ref = transformers.AutoConfig.for_model(**hf)
  assert type(ref).__name__ == "Gemma3TextConfig"
  assert tuple(ref.layer_types) == cfg.layer_types and ref.sliding_window == cfg.sliding_window
  assert ref.rope_parameters["full_attention"]["rope_theta"] == cfg.rope_theta
  assert ref.rope_parameters["sliding_attention"]["rope_theta"] == cfg.rope_local_theta


def test_older_config_spelling_reads_like_transformers():
  """The transformers 4.5x spelling (rope_theta, rope_local_base_freq,
  rope_scaling, sliding_window_pattern instead of layer_types) with the 1B's
  shapes gives the gemma3_1b preset; with linear scaling (as the 4B+ text
  models have) it reads the same layer types and RoPE as transformers does."""
  old = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
         "attention_bias": False, "attn_logit_softcapping": None, "final_logit_softcapping": None,
         "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152,
         "intermediate_size": 6912, "max_position_embeddings": 32768, "num_attention_heads": 4,
         "num_hidden_layers": 26, "num_key_value_heads": 1, "query_pre_attn_scalar": 256,
         "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000.0, "rope_scaling": None,
         "rope_theta": 1000000.0, "sliding_window": 512, "sliding_window_pattern": 6,
         "torch_dtype": "bfloat16", "vocab_size": 262144}
  assert config_from_hf(old) == ModelConfig.preset("gemma3_1b", param_dtype="bfloat16",
                                                   compute_dtype="bfloat16")
  scaled = {**old, "rope_scaling": {"rope_type": "linear", "factor": 8.0},
            "sliding_window_pattern": 4}
  ours = config_from_hf(scaled)
  ref = transformers.AutoConfig.for_model(**json.loads(json.dumps(scaled)))
  assert ours.layer_types == tuple(ref.layer_types)
  assert ours.layer_types[:4] == ("sliding_attention",) * 3 + ("full_attention",)
  full = ref.rope_parameters["full_attention"]
  assert (ours.rope_scaling.kind, ours.rope_scaling.factor, ours.rope_theta) == (
      full["rope_type"], full["factor"], full["rope_theta"])
  assert ours.rope_local_theta == ref.rope_parameters["sliding_attention"]["rope_theta"]


def test_attention_soft_cap_is_the_formula():
  """scores -> c * tanh(scores / c) before the mask, against numpy float64."""
  from jaxrl_llm.model.layers import attention
  draws = np.asarray(jax.random.normal(jax.random.key(0), (3, 320)))  # one draw, three tensors
  q = draws[0].reshape(2, 5, 4, 8)  # B T N H
  k = draws[1, :160].reshape(2, 2, 8, 5)  # B K H S
  v = draws[2, :160].reshape(2, 2, 5, 8)  # B K S H
  allowed = np.tril(np.ones((5, 5), bool))[None].repeat(2, 0)
  attend = jax.jit(attention, static_argnames=("scale", "softcap"))
  got = np.asarray(attend(q, k, v, allowed, scale=0.7, softcap=1.5))
  want = np.zeros((2, 5, 4, 8))
  for b in range(2):
    for n in range(4):
      kv = n // 2  # two query heads per kv head
      s = 1.5 * np.tanh(q[b, :, n].astype(np.float64) @ k[b, kv] * 0.7 / 1.5)
      s = np.where(allowed[b], s, -np.inf)
      p = np.exp(s - s.max(-1, keepdims=True))
      want[b, :, n] = (p / p.sum(-1, keepdims=True)) @ v[b, kv]
  np.testing.assert_allclose(got, want, atol=1e-5)
  plain = np.asarray(attend(q, k, v, allowed, scale=0.7))
  assert np.abs(plain - got).max() > 1e-2  # the cap bites at these scores


@pytest.mark.parametrize("changes,match", [
    (dict(final_logit_softcapping=30.0), "final_logit_softcapping=30.0 is not supported"),
    (dict(attn_logit_softcapping=50.0), "attn_logit_softcapping=50.0 is not supported"),
    (dict(hidden_activation="gelu"), "hidden_activation='gelu'"),
    (dict(use_bidirectional_attention=True), "use_bidirectional_attention"),
    (dict(attention_bias=True), "attention_bias"),
    (dict(architectures=["Gemma3ForConditionalGeneration"], model_type="gemma3"),
     "multimodal Gemma 3"),
    (dict(rope_parameters={"sliding_attention": {"rope_type": "linear", "factor": 2.0},
                           "full_attention": {"rope_type": "default"}}),
     "sliding_attention.rope_type='linear'"),
])
def test_unsupported_gemma_config_json_is_refused(gemma_dir, changes, match):
  hf = {**read_hf_config(gemma_dir), **changes}
  with pytest.raises(ValueError, match=match):
    config_from_hf(hf)


def test_config_validation_and_export_refusals():
  g = ModelConfig.preset("gemma3_270m")
  with pytest.raises(ValueError, match=r"layer_types=.*n_layers=18"):
    g.replace(layer_types=g.layer_types[:5])
  with pytest.raises(ValueError, match=r"layer_types\[0\]='local'"):
    g.replace(layer_types=("local",) * 18)
  with pytest.raises(ValueError, match="sliding_window=None is invalid"):
    g.replace(sliding_window=None)
  with pytest.raises(ValueError, match="sliding_window=512 is invalid: allowed only with"):
    g.replace(layer_types=None, rope_local_theta=None)
  with pytest.raises(ValueError, match="mlp_act"):
    g.replace(mlp_act="relu")
  with pytest.raises(ValueError, match="query_pre_attn_scalar"):
    g.replace(query_pre_attn_scalar=0)
  with pytest.raises(ValueError, match="family='gemma3' exports need norm_plus_one=True"):
    config_to_hf(g.replace(norm_plus_one=False))
  with pytest.raises(ValueError, match="attn_softcap=50.0 cannot be exported as family='gemma3'"):
    config_to_hf(g.replace(attn_softcap=50.0))
  with pytest.raises(ValueError, match="sandwich_norm=True cannot be exported as family='llama'"):
    config_to_hf(ModelConfig.tiny(64, sandwich_norm=True))
  tiny = ModelConfig.tiny(VOCAB, n_layers=2, layer_types=("sliding_attention",) * 2,
                          sliding_window=W)
  no_positions = jax.eval_shape(
      functools.partial(init_cache, tiny.replace(layer_types=None, sliding_window=None), 1, 4))
  assert no_positions.positions_BS is None
  ids = jax.ShapeDtypeStruct((1, 2), jnp.int32)
  with pytest.raises(ValueError, match="needs a cache with positions_BS"):
    jax.eval_shape(functools.partial(forward, cfg=tiny), param_shapes(tiny), tokens_BT=ids,
                   positions_BT=ids, mask_BT=jax.ShapeDtypeStruct((1, 2), bool),
                   cache=no_positions)
