"""rollout.exact's tokens (sampling/verify.py): the samples are those an inverse-CDF sampler draws from
the trainer's full-sequence forward, one forward per token, with the decode's uniforms
u(b, t) = uniform(fold_in(fold_in(key, b), t)), bit for bit, in f32 and bf16 compute, for static and
continuous batching, whatever the proposal the KV-cache decode made.

The reference here samples token by token: at step t it runs the row-wise program on the row's
tokens so far, draws from its state at t, and ends a row at EOS or R tokens. It shares the row-wise
program with the verification (the trainer's distribution is that program), not the protocol: no KV
cache, no verification, no re-decode. The engine's log mu of the verified tokens is the trainer's
(tests/sampling/test_exact_logprobs.py); here it is checked against the row-wise program again.
"""

import contextlib
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from run_helpers import load_config, shrink
from jaxrl_llm import model as model_lib
from jaxrl_llm.model.invariant import rowwise_logprobs
from jaxrl_llm.model.sharding import MeshConfig, batch_sharding, make_mesh, replicated
from jaxrl_llm.model.tokenizer import CharTokenizer
from jaxrl_llm.sampling import verify
from jaxrl_llm.sampling.engine import JaxSampler
from jaxrl_llm.sampling.exact import ExactEngine
from jaxrl_llm.sampling.generate import sampler_model_config
from jaxrl_llm.sampling.loop import cast_params
from jaxrl_llm.tasks.pipeline import PromptBatch
from jaxrl_llm.training.config import from_config_dict

TOK = CharTokenizer()
PROMPTS = ("12+3=", "7+45=", "3+9=", "60+1=")
G = 8


def _setup(dtype, slots=0, temperature=1.0, data=0):
  run_cfg = from_config_dict(shrink(load_config("gspo"), **{"rollout.group_size": G, "rollout.exact": True,
                                                           "rollout.temperature": temperature}))
  model_cfg = model_lib.ModelConfig.tiny(TOK.vocab_size, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1,
                                         head_dim=16, d_ff=64, compute_dtype=dtype)
  # Larger weights than the initialiser's: peaked, varied distributions, so that draws depend on them.
  params = jax.tree.map(lambda x: x * 3 if x.ndim == 2 else x, model_lib.init_params(model_cfg, jax.random.key(0)))
  scfg = run_cfg.rollout.sampling(TOK)
  rows = None
  if data:  # the rows over a data axis of `data` devices, the params replicated
    mesh = make_mesh(MeshConfig(data=data, fsdp=1, tensor=1), devices=jax.devices()[:data])
    rows, params = batch_sharding(mesh), jax.device_put(params, replicated(mesh))
  sampler = JaxSampler(model_cfg=model_cfg, sampling_cfg=scfg, tokenizer=TOK, slots=slots, chunk=2,
                       batch_sharding=rows)
  return model_cfg, params, scfg, sampler, run_cfg


def _prompts():
  ids = [TOK.encode(p) for p in PROMPTS]
  P = 8
  tokens_BP = np.array([[TOK.pad_id] * (P - len(r)) + r for r in ids], np.int32)
  return PromptBatch(tokens_BP=tokens_BP, mask_BP=tokens_BP != TOK.pad_id, prompts=PROMPTS,
                     answers=("15", "52", "12", "61"), tags=("t",) * 4)


def _token_by_token(model_cfg, params, scfg, impl, key, logits_bytes=verify.LOGITS_BYTES):
  """(tokens_BR, length_B): each token drawn from the row-wise full forward of the row's tokens so far."""
  prompts = _prompts()
  prompt_BP, mask_BP = np.repeat(prompts.tokens_BP, G, axis=0), np.repeat(prompts.mask_BP, G, axis=0)
  B, R = prompt_BP.shape[0], scfg.max_new_tokens
  run_params, run_cfg = cast_params(params, scfg.dtype), sampler_model_config(model_cfg, scfg)
  keys_BR = verify.step_key_data(key, jnp.arange(B, dtype=jnp.int32), R)
  tokens = np.full((B, R), scfg.pad_id, np.int32)
  live = np.ones(B, bool)
  length = np.zeros(B, np.int32)
  for t in range(R):
    upto_BR = np.broadcast_to(np.arange(R) <= t, (B, R))
    _, hidden_BRD = rowwise_logprobs(run_params, prompt_BP, mask_BP, tokens, upto_BR, upto_BR, model_cfg=run_cfg,
                                     temperature=scfg.temperature, impl=impl)
    draws = np.asarray(verify.head_draws(run_params, hidden_BRD, upto_BR, keys_BR, model_cfg=run_cfg, cfg=scfg,
                                         logits_bytes=logits_bytes))
    tokens[live, t] = draws[live, t]
    length[live] += 1
    live &= ~np.isin(tokens[:, t], scfg.eos_ids)
  return tokens, length


class Scrambled:
  """A proposal engine: the sampler's batch with some rows' tokens replaced by other valid samples
  (random ids, ended by EOS at a random length or at R): what the verification gets must not matter."""

  def __init__(self, inner, seed):
    self.inner, self.rng = inner, np.random.default_rng(seed)

  def generate(self, prompts, key):
    batch = self.inner.generate(prompts, key)
    tokens, mask, length = batch.tokens_BR.copy(), batch.mask_BR.copy(), batch.length_B.copy()
    B, R = tokens.shape
    eos = TOK.eos_ids[0]
    for b in self.rng.choice(B, B // 2, replace=False):
      n = int(self.rng.integers(1, R + 1))
      row = self.rng.choice([i for i in range(TOK.vocab_size) if i not in TOK.eos_ids and i != TOK.pad_id], n)
      if n < R:
        row[-1] = eos
      tokens[b], mask[b], length[b] = TOK.pad_id, False, n
      tokens[b, :n], mask[b, :n] = row, True
    return dataclasses.replace(batch, tokens_BR=tokens, mask_BR=mask, context_BR=mask.copy(), length_B=length,
                               truncated_B=length == R)

  def __getattr__(self, name):
    return getattr(self.inner, name)


SLOW = pytest.mark.slow  # over 5 s each on 2 cores: the fast tier keeps a plain and a scrambled case


@pytest.mark.parametrize("dtype, slots, scrambled, temperature, data", [
    ("float32", 0, False, 1.0, 0), pytest.param("float32", 8, False, 1.0, 0, marks=SLOW),
    pytest.param("bfloat16", 0, False, 1.0, 0, marks=SLOW), pytest.param("bfloat16", 8, False, 0.7, 0, marks=SLOW),
    ("float32", 0, True, 1.0, 0), pytest.param("bfloat16", 8, True, 1.0, 0, marks=SLOW),
    pytest.param("float32", 0, True, 0.7, 4, marks=SLOW)])
def test_exact_tokens_are_the_full_forward_samplers(dtype, slots, scrambled, temperature, data):
  model_cfg, params, scfg, sampler, run_cfg = _setup(dtype, slots, temperature, data)
  key = jax.random.key(3)
  inner = Scrambled(sampler, seed=slots) if scrambled else sampler
  engine = ExactEngine(inner, sampler, impl=run_cfg.kernels.impl, chunk=16)
  engine.sync(params, 0)
  mesh = sampler.batch_sharding.mesh if data else None
  with jax.sharding.use_abstract_mesh(mesh.abstract_mesh) if data else contextlib.nullcontext():
    rows = engine.generate(_prompts(), key)
  want_tokens, want_length = _token_by_token(model_cfg, params, scfg, run_cfg.kernels.impl, key)
  np.testing.assert_array_equal(rows.length_B, want_length)
  np.testing.assert_array_equal(rows.tokens_BR, want_tokens)
  np.testing.assert_array_equal(rows.mask_BR, np.arange(scfg.max_new_tokens)[None] < want_length[:, None])
  assert rows.responses == tuple(TOK.decode(r) for r in want_tokens)
  mask = np.asarray(rows.mask_BR)
  want_mu, _ = rowwise_logprobs(cast_params(params, scfg.dtype), rows.prompt_BP, rows.prompt_mask_BP, rows.tokens_BR,
                                mask, mask, model_cfg=sampler_model_config(model_cfg, scfg),
                                temperature=scfg.temperature, impl=run_cfg.kernels.impl)
  np.testing.assert_array_equal(np.asarray(rows.behav_logp_BR), np.asarray(want_mu))
  # The logits made 3 positions at a time (a large vocabulary's way): the same draws.
  small, _ = _token_by_token(model_cfg, params, scfg, run_cfg.kernels.impl, key,
                             logits_bytes=3 * 4 * model_cfg.vocab_size)
  np.testing.assert_array_equal(small, want_tokens)
  np.testing.assert_array_equal(rows.truncated_B, ~np.isin(want_tokens, TOK.eos_ids).any(axis=1))
  counts = engine.metrics()
  if scrambled:  # the scrambled rows differ from their first token on (a random id rarely is the draw)
    assert counts["exact/redrawn_rows"] >= len(PROMPTS) * G // 4 and counts["exact/verify_rounds"] >= 1
    if dtype == "float32":  # the re-decode after the first differing token needs no second round in f32
      assert counts["exact/verify_rounds"] == 1
  assert len(set(map(tuple, want_tokens))) > len(PROMPTS)  # the samples vary: the draws were tested
  # The KV-cache decode proposes the same tokens in f32 here (no redraw); in bf16 it may differ.
  if not scrambled and dtype == "float32":
    assert counts["exact/redrawn_rows"] == 0
  sampler.close()


def test_a_row_redrawn_into_an_ending_token_ends_there():
  cfg = from_config_dict(shrink(load_config("gspo"))).rollout.sampling(TOK)
  cfg = dataclasses.replace(cfg, stop_ids=(TOK.encode("\n")[0],), stop_sequences=((5, 6),))
  row = np.array([3, 5, 6, 9, 9, 9][:cfg.max_new_tokens], np.int32)
  assert verify.forced_end(row, 2, cfg) == verify.FINISH_STOP  # ends with the sequence (5, 6)
  row[1] = TOK.eos_ids[0]
  assert verify.forced_end(row, 1, cfg) == verify.FINISH_EOS
  row[0] = TOK.encode("\n")[0]
  assert verify.forced_end(row, 0, cfg) == verify.FINISH_STOP
  assert verify.forced_end(np.full(cfg.max_new_tokens, 9, np.int32), cfg.max_new_tokens - 1, cfg) == verify.FINISH_LENGTH
  assert verify.forced_end(np.full(cfg.max_new_tokens, 9, np.int32), 0, cfg) is None


def test_a_proposal_that_stops_without_an_end_token_is_refused():
  model_cfg, params, scfg, sampler, run_cfg = _setup("float32")

  class Cut(Scrambled):
    def generate(self, prompts, key):
      batch = self.inner.generate(prompts, key)
      tokens, mask, length = batch.tokens_BR.copy(), batch.mask_BR.copy(), batch.length_B.copy()
      tokens[5, 1:], mask[5, 1:], length[5] = TOK.pad_id, False, 1
      tokens[5, 0] = TOK.encode("7")[0]  # not an end token, and the row stops after it
      return dataclasses.replace(batch, tokens_BR=tokens, mask_BR=mask, context_BR=mask.copy(), length_B=length)

  engine = ExactEngine(Cut(sampler, seed=0), sampler, impl=run_cfg.kernels.impl, chunk=16)
  engine.sync(params, 0)
  with pytest.raises(ValueError, match=r"rollout\.exact: rows \[5\] end before \d+ tokens without an end-of-sequence"):
    engine.generate(_prompts(), jax.random.key(3))
