"""The exported sequence-classification folder scores as our reward model does, in transformers
(f32, CPU), on right-padded inputs; a tokenizer that pads with EOS is refused."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.checks import ConfigError
from jaxrl_llm.model.config import ModelConfig
from jaxrl_llm.model.params import init_params
from jaxrl_llm.reward_model.export import check_last_token, save_reward_hf
from jaxrl_llm.reward_model.scorer import last_index, reward_scores

TOL = 1e-4  # max abs difference: the logits parity tolerance of tests/model/test_hf_parity.py
V, PAD = 96, 0
FAMILIES = {
    "llama": dict(family="llama", tie_embeddings=False),  # an output head the export drops
    "qwen2": dict(family="qwen2", qkv_bias=True, tie_embeddings=True),
    "qwen3": dict(family="qwen3", qk_norm=True, head_dim=32, tie_embeddings=True),
    "gemma3": dict(family="gemma3", mlp_act="gelu_tanh", norm_plus_one=True, sandwich_norm=True, embed_scale=True,
                   qk_norm=True, tie_embeddings=True, query_pre_attn_scalar=16, sliding_window=4,
                   layer_types=("sliding_attention", "full_attention"), rope_local_theta=10000.0),
}


def model(family):
  fields = {"head_dim": 16, **FAMILIES[family]}
  cfg = ModelConfig(vocab_size=V, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=96, max_position=128,
                    init_std=0.15, **fields)
  params = init_params(cfg, jax.random.key(0))
  # Every tensor non-trivial: norm scales around 1, biases non-zero.
  keys = iter(jax.random.split(jax.random.key(1), 64))
  params = jax.tree_util.tree_map_with_path(
      lambda path, x: x + 0.2 * jax.random.normal(next(keys), x.shape, x.dtype)
      if any(s in jax.tree_util.keystr(path) for s in ("norm", "bq", "bk", "bv")) else x, params)
  head = {"w_D": jax.random.normal(jax.random.key(2), (cfg.d_model,), jnp.float32)}
  return cfg, params, head


def right_padded():
  """4 rows of up to 14 tokens (ids 1..V-1: never the pad id), lengths 14, 11, 8, 1."""
  T = 14
  tokens = np.asarray(jax.random.randint(jax.random.key(3), (4, T), 1, V), np.int32)
  mask = np.arange(T)[None, :] < np.array([14, 11, 8, 1])[:, None]
  return np.where(mask, tokens, PAD), mask


def test_last_index_reads_the_last_real_token():
  mask = jnp.asarray([[1, 1, 1, 0], [1, 0, 0, 0], [0, 1, 1, 1], [1, 1, 1, 1]], bool)
  np.testing.assert_array_equal(np.asarray(last_index(mask)), [2, 0, 3, 3])


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_exported_scores_match_transformers(tmp_path, family):
  import torch
  import transformers

  cfg, params, head = model(family)
  tokens, mask = right_padded()
  ours = np.asarray(jax.jit(reward_scores, static_argnums=2)(params, head, cfg, jnp.asarray(tokens),
                                                             jnp.asarray(mask)))
  out = str(tmp_path / "rm")
  save_reward_hf(params, head, cfg, out, pad_id=PAD)
  with open(os.path.join(out, "config.json")) as f:
    config = json.load(f)
  assert config["pad_token_id"] == PAD and config["architectures"][0].endswith("ForSequenceClassification")
  ref_model, info = transformers.AutoModelForSequenceClassification.from_pretrained(
      out, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"], info  # score.weight in, lm_head.weight out
  assert ref_model.config.num_labels == 1
  with torch.no_grad():
    ref = ref_model.eval()(input_ids=torch.from_numpy(tokens).long(),
                           attention_mask=torch.from_numpy(mask).long()).logits.numpy()
  assert ref.shape == (4, 1)
  diff = np.abs(ours - ref[:, 0])
  print(f"{family}: max abs score diff {diff.max():.3g}")
  assert diff.max() <= TOL, (family, ours, ref[:, 0])
  assert np.std(ref) > 0.1  # not vacuous: the scores differ by O(1) between rows


def test_sequences_that_end_with_the_pad_id_are_refused():
  tokens, mask = right_padded()
  tokens_N2T, mask_N2T = tokens.reshape(2, 2, 14), mask.reshape(2, 2, 14)
  check_last_token(PAD, tokens_N2T, mask_N2T)  # no sequence ends with the pad id
  eos = int(tokens[2, 7])  # the last real token of row 2 (8 tokens): a tokenizer that pads with it
  with pytest.raises(ConfigError, match=rf"config.export=True: sequences end with token id {eos}, the tokenizer's"):
    check_last_token(eos, tokens_N2T, mask_N2T)
