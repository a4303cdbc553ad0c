"""rollout.exact: on-policy, the log mu the built-in sampler records == the trainer's log pi_prox,
bitwise, for static, continuous and multi-turn (kept KV cache) sampling, in f32 and bf16 compute
(issue 43, item 2; sampling/exact.py).

The engine cases run the run's engines as the trainer wraps them (JaxSampler, with slots for
continuous batching; EpisodeEngine for episodes; ExactEngine around them) on a tiny model, and
compare the recorded `behav_logp_BR` with the trainer's recompute (training/recompute.py's
policy_logprobs, RecomputeSpec.rowwise as rollout.exact sets it) on every sampled token, with `==`.
Static f32 sampling runs as one trainer step, the wiring end to end: the step's `mismatch/*`
metrics are exactly 0. That the recompute is the padded forward's value to rounding is
tests/training/test_batch_invariance.py's. Without the mode the same step's rows differ in the last
bits (the KV-cache decode's matmuls and attention sums are not the full forward's): checked too, so
it is the mode that makes them equal.
"""

import dataclasses

import jax
import numpy as np
import pytest

from run_helpers import load_config, make_trainer, shrink
from jaxrl_llm import model as model_lib
from jaxrl_llm.checks import ConfigError
from jaxrl_llm.envs import registry
from jaxrl_llm.envs.base import Observation
from jaxrl_llm.model import sharding as sharding_lib
from jaxrl_llm.model.tokenizer import CharTokenizer
from jaxrl_llm.sampling.engine import JaxSampler
from jaxrl_llm.sampling.exact import ExactEngine
from jaxrl_llm.tasks.pipeline import PromptBatch
from jaxrl_llm.training.config import from_config_dict
from jaxrl_llm.training.episodes import EpisodeEngine, EpisodePlayer
from jaxrl_llm.training.recompute import RecomputeSpec, policy_logprobs
from jaxrl_llm.training.step import build_batch, rollout_and_score

TOK = CharTokenizer()
PROMPTS = ("12+3=", "7+45=", "3+9=", "60+1=")
ENV = {"env.name": "exact_echo", "env.max_turns": 2, "env.max_turn_tokens": 5, "env.max_tokens": 20,
       "data.max_prompt_len": 8}


class EchoEnv:
  """Two turns: turn 0's observation is a fixed tool result, turn 1 ends the episode."""

  name, stop_strings = "exact_echo", ()

  def reset(self, example):
    self.turns = 0
    return [{"role": "user", "content": example.prompt}]

  def step(self, turn, *, truncated=False):
    self.turns += 1
    if self.turns == 1:
      return Observation(({"role": "tool", "content": "=7\n"},), {"correct": 0.0}, False, "tool_result")
    return Observation((), {"correct": 1.0}, True, "answer")


@pytest.fixture
def echo_env():
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(registry, "_ENVS", dict(registry._ENVS))
    registry.register_env("exact_echo", lambda cfg, task, pool, tok: EchoEnv())
    yield


def _prompts():
  ids = [TOK.encode(p) for p in PROMPTS]
  P = 8
  tokens_BP = np.array([[TOK.pad_id] * (P - len(r)) + r for r in ids], np.int32)
  return PromptBatch(tokens_BP=tokens_BP, mask_BP=tokens_BP != TOK.pad_id, prompts=PROMPTS,
                     answers=("15", "52", "12", "61"), tags=("t",) * 4)


def _engine_rows(sampling, dtype):
  """(log mu as recorded, the trainer's log pi_prox, mask) of 4 prompts x 4 samples."""
  run_cfg = from_config_dict(shrink(load_config("gspo"), **{"rollout.group_size": 4, "rollout.exact": True,
                                                           **(ENV if sampling == "multi_turn" else {})}))
  model_cfg = model_lib.ModelConfig.tiny(TOK.vocab_size, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1,
                                         head_dim=16, d_ff=64, compute_dtype=dtype)
  params = model_lib.init_params(model_cfg, jax.random.key(0))
  scfg = run_cfg.rollout.sampling(TOK)
  sampler = JaxSampler(model_cfg=model_cfg, sampling_cfg=scfg, tokenizer=TOK,
                       slots=8 if sampling == "continuous" else 0, chunk=2)
  engine = sampler
  player = EpisodePlayer(run_cfg, None, TOK) if sampling == "multi_turn" else None
  try:
    if player is not None:
      engine = EpisodeEngine(sampler, player, scfg)
    engine = ExactEngine(engine, sampler, impl=run_cfg.kernels.impl, chunk=16)
    engine.sync(params, 0)
    rows = engine.generate(_prompts(), jax.random.key(1))
  finally:
    if player is not None:
      player.close()
  spec = RecomputeSpec(model_cfg=model_cfg, temperature=run_cfg.rollout.temperature, impl=run_cfg.kernels.impl,
                       chunk=16, rowwise=True)
  prox_BR, _ = policy_logprobs(params, rows, spec)
  return np.asarray(sharding_lib.fetch(rows.behav_logp_BR)), prox_BR, np.asarray(rows.mask_BR), rows


# static f32 runs through the trainer (test_a_step_with_the_mode_logs_zero_mismatch)
@pytest.mark.parametrize("sampling, dtype", [
    ("static", "bfloat16"), ("continuous", "float32"), ("continuous", "bfloat16"),
    pytest.param("multi_turn", "float32", marks=pytest.mark.slow),
    pytest.param("multi_turn", "bfloat16", marks=pytest.mark.slow)])
def test_exact_log_mu_is_the_trainers_log_pi_prox(echo_env, sampling, dtype):
  mu, prox, mask, rows = _engine_rows(sampling, dtype)
  assert mask.sum() > 0 and np.all(mu[mask] < 0) and np.all(mu[~mask] == 0)
  if sampling == "multi_turn":  # two turns with the environment's tokens between them, outside the mask
    assert np.all(rows.context_BR.sum(axis=1) > mask.sum(axis=1)) and rows.turn_BR.max() == 1
  assert np.array_equal(mu[mask], prox[mask]), f"max |log c| {np.abs(mu - prox)[mask].max():.3g}"


@pytest.mark.slow
@pytest.mark.parametrize("exact", [True, False])
def test_a_step_with_the_mode_logs_zero_mismatch(tmp_path, exact):
  """One trainer step (static sampling, f32, the 8-device test mesh), as the run wires the mode
  (Trainer.rollout_engine, build_batch): log mu == log pi_prox and the step's mismatch metrics are 0.
  Without the mode the KV-cache decode's own log mu differs in the last bits (rounding, < 1e-5)."""
  cfg = from_config_dict(shrink(load_config("gspo"), **{"train.micro_batch_size": 8, "rollout.exact": exact}))
  tr = make_trainer(cfg, tmp_path, lambda s: None)
  state = tr.start_rl(tr.init_state(jax.random.key(0)))
  tr.rollout_engine()
  with jax.sharding.use_abstract_mesh(tr.mesh.abstract_mesh):
    sb = rollout_and_score(tr.context, state, jax.random.key(1))
    batch, stats = build_batch(tr.context, state, sb)
  tr.context.engine.close()
  mask = np.asarray(sb.samples.mask_BR)
  mu, prox = np.asarray(sharding_lib.fetch(batch.behav_logp_BR))[mask], batch.prox_logp_BR[mask]
  assert mask.sum() > 0 and np.all(mu < 0)
  if exact:
    assert np.array_equal(mu, prox)
    for key in ("mismatch/log_c_abs_mean", "mismatch/seq_abs_log_c_max", "mismatch/c_out_0.5_2_frac"):
      assert stats[key] == 0.0, key
  else:
    assert 0 < np.abs(mu - prox).max() < 1e-5 and 0 < stats["mismatch/log_c_abs_mean"] < 1e-6


@pytest.mark.parametrize("overrides, message", [
    ({"rollout.top_k": 5}, "config.rollout.top_k=5 is invalid"),
    ({"rollout.top_p": 0.9}, "config.rollout.top_p=0.9 is invalid"),
    ({"rollout.record_topk": 2}, "config.rollout.record_topk=2 is invalid"),
])
def test_exact_mode_settings_are_checked(overrides, message):
  with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
    from_config_dict(shrink(load_config("gspo"), **{"rollout.exact": True, **overrides}))
  rollout = from_config_dict(shrink(load_config("gspo"))).rollout
  with pytest.raises(ConfigError, match=r"config\.rollout\.exact must be a bool, got 1"):
    dataclasses.replace(rollout, exact=1)
