"""Logits parity against transformers' PyTorch models (f32, CPU), with padding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from jaxrl_llm.model import forward, logits
from jaxrl_llm.model.io.hf_io import load_hf

from hf_fixtures import VOCAB

TOL = 1e-4  # max abs logit difference (acceptance criterion)


def padded_batch():
  """4 rows of 14 tokens: full, left-padded by 3 and 6, right-padded by 5."""
  T = 14
  tokens = np.array(jax.random.randint(jax.random.key(1), (4, T), 0, VOCAB), np.int32)
  mask = np.ones((4, T), bool)
  mask[1, :3] = False
  mask[2, :6] = False
  mask[3, T - 5:] = False
  positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int32)
  return tokens, mask, positions


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama"])
def test_logits_match_transformers(hf_dirs, family):
  tokens, mask, positions = padded_batch()
  ref_model = transformers.AutoModelForCausalLM.from_pretrained(
      hf_dirs[family], attn_implementation="eager", dtype=torch.float32).eval()
  with torch.no_grad():
    ref = ref_model(input_ids=torch.from_numpy(tokens).long(),
                    attention_mask=torch.from_numpy(mask).long(),
                    position_ids=torch.from_numpy(positions).long()).logits.numpy()
  params, cfg = load_hf(hf_dirs[family])
  hidden, _ = jax.jit(forward, static_argnums=1)(params, cfg, jnp.asarray(tokens),
                                                 jnp.asarray(positions), jnp.asarray(mask))
  ours = np.asarray(logits(params, cfg, hidden))
  assert ours.shape == ref.shape == (4, 14, VOCAB)
  diff = np.abs(ours - ref)[mask]  # padded positions carry no meaning in either model
  print(f"{family}: max abs logit diff {diff.max():.3g}")
  assert diff.max() <= TOL, f"{family}: max abs logit diff {diff.max():.3g}"
  # The comparison is not vacuous: logits vary by O(1) across the vocabulary.
  assert np.std(ref[mask]) > 0.1
