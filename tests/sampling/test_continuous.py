"""Continuous batching (sampling/continuous.py) samples what the static sampler does for the same key:
the same tokens, finish reasons and lengths, and log mu, raw log-probs and top-k equal to float
rounding, whatever the number of slots and the chunk length; with fewer slots than samples, samples
queue and take the slots that ended."""

import dataclasses

import jax
import numpy as np
import pytest

from jaxrl_llm.sampling.config import SamplingConfig
from jaxrl_llm.sampling.continuous import generate_continuous
from jaxrl_llm.sampling.generate import generate
from sampling_helpers import pad_prompts, tiny_model

PROMPTS = [[5, 9, 2, 33, 17, 8], [41, 3], [7, 7, 19, 25], [11], [30, 31]]


def assert_same(got, want):
  np.testing.assert_array_equal(np.asarray(got.tokens_BR), np.asarray(want.tokens_BR))
  np.testing.assert_array_equal(np.asarray(got.mask_BR), np.asarray(want.mask_BR))
  np.testing.assert_array_equal(np.asarray(got.finish_reason_B), np.asarray(want.finish_reason_B))
  np.testing.assert_array_equal(np.asarray(got.length_B), np.asarray(want.length_B))
  np.testing.assert_array_equal(np.asarray(got.prompt_index_B), np.asarray(want.prompt_index_B))
  np.testing.assert_allclose(np.asarray(got.behav_logp_BR), np.asarray(want.behav_logp_BR), atol=2e-5)
  for name in ("raw_logp_BR", "topk_logp_BRK"):
    if getattr(want, name) is not None:
      np.testing.assert_allclose(np.asarray(getattr(got, name)), np.asarray(getattr(want, name)), atol=2e-5)
  if want.topk_ids_BRK is not None:
    np.testing.assert_array_equal(np.asarray(got.topk_ids_BRK), np.asarray(want.topk_ids_BRK))


@pytest.mark.slow
@pytest.mark.parametrize("slots, chunk", [(3, 4), (7, 1), (16, 5)])
def test_continuous_batching_samples_the_static_tokens(slots, chunk):
  cfg_m, params = tiny_model()
  # EOS on two common ids: lengths from 1 to R, so slots end at different times and samples queue.
  cfg = SamplingConfig(temperature=1.0, max_new_tokens=14, n_samples=3, pad_id=47, eos_ids=(3, 20),
                       record_topk=2, record_raw_logp=True, top_k=30)
  prompt_BP, mask_BP = pad_prompts(PROMPTS, "mixed")
  want = generate(params, cfg_m, prompt_BP, mask_BP, cfg, jax.random.key(4))
  got = generate_continuous(params, cfg_m, prompt_BP, mask_BP, cfg, jax.random.key(4), slots=slots, chunk=chunk)
  assert_same(got, want)
  lengths = np.asarray(want.length_B)
  assert lengths.min() < 6 and lengths.max() == 14 and len(set(lengths.tolist())) >= 5  # a long tail, really


@pytest.mark.slow
def test_continuous_batching_with_sliding_window_layers_stop_sequences_and_a_mesh():
  """Local layers read each slot's own position (moved by the compaction); slots split over a 2-device
  data axis."""
  from jax.sharding import Mesh

  cfg_m, params = tiny_model(layer_types=("sliding_attention", "full_attention"), sliding_window=4)
  cfg = SamplingConfig(temperature=0.8, max_new_tokens=12, n_samples=2, pad_id=47, eos_ids=(3,),
                       stop_sequences=((9, 10), (40,)))
  prompt_BP, mask_BP = pad_prompts(PROMPTS, "left")
  want = generate(params, cfg_m, prompt_BP, mask_BP, cfg, jax.random.key(8))
  got = generate_continuous(params, cfg_m, prompt_BP, mask_BP, dataclasses.replace(cfg), jax.random.key(8),
                            slots=4, chunk=3, mesh=Mesh(np.asarray(jax.devices()[:2]), ("data",)))
  assert_same(got, want)


def test_continuous_batching_refuses_bad_slots():
  cfg_m, params = tiny_model()
  prompt_BP, mask_BP = pad_prompts(PROMPTS, "left")
  with pytest.raises(ValueError, match=r"slots=0 must be an int >= 1"):
    generate_continuous(params, cfg_m, prompt_BP, mask_BP, SamplingConfig(pad_id=47), jax.random.key(0), slots=0)


@pytest.mark.slow
def test_a_run_with_continuous_batching_trains_on_the_static_samples(tmp_path):
  """rollout.continuous_slots reaches the built-in engine: two GRPO steps of the tiny model sample the
  same responses (and so the same rewards) as the static batch, and train to the same loss."""
  import json

  from run_helpers import make_trainer, shrink
  from jaxrl_llm.training.config import from_config_dict
  from jaxrl_llm.training.defaults import get_config

  rows = {}
  for slots in (0, 16):
    cfg = from_config_dict(shrink(get_config("grpo"), **{
        "train.steps": 2, "rollout.max_response_len": 8, "rollout.continuous_slots": slots, "rollout.decode_chunk": 3}))
    make_trainer(cfg, tmp_path / f"s{slots}", lambda s: None).run()
    rows[slots] = [json.loads(line) for line in (tmp_path / f"s{slots}" / "metrics.jsonl").read_text().splitlines()]
  for static, cont in zip(rows[0], rows[16]):
    assert cont["reward/mean"] == static["reward/mean"]
    assert cont["response/length_mean"] == static["response/length_mean"]
    np.testing.assert_allclose(cont["loss/total"], static["loss/total"], rtol=1e-4, atol=1e-6)
