"""`train.prox='detach'`: log pi_prox from the update's own forward pass, gradient stopped.

At one update per batch pi_prox is the policy the update starts from, so its
log-probs are the update's own log pi_theta: the run must equal the one that
recomputes them with a separate forward pass (to float rounding: the two
passes are separate XLA programs), make no such pass, and have r = 1 exactly.
Where something needs log pi_prox before the update, or a later update sees
other params, the config refuses 'detach' and says why.
"""

import jax
import numpy as np
import pytest

from run_helpers import load_config, make_trainer, shrink
from jaxrl_llm.checks import ConfigError
from jaxrl_llm.training import step as step_lib
from jaxrl_llm.training.config import from_config_dict


def _cfg(prox: str, method: str = "grpo", **overrides):
  return from_config_dict(shrink(load_config(method), **{
      "train.prox": prox, "log.kl_to_ref": False, "train.steps": 2, "train.lr": 1e-2, "train.warmup_steps": 0,
      **overrides}))


def _run(cfg, workdir, monkeypatch):
  calls = []
  real = step_lib.policy_logprobs
  monkeypatch.setattr(step_lib, "policy_logprobs", lambda *a, **k: calls.append(1) or real(*a, **k))
  tr = make_trainer(cfg, workdir, lambda line: None)
  summary = tr.run()
  monkeypatch.setattr(step_lib, "policy_logprobs", real)
  return tr, summary, len(calls)


@pytest.mark.slow
def test_detach_equals_the_recompute_with_one_pass_fewer(tmp_path, monkeypatch):
  tr_r, _, passes_r = _run(_cfg("recompute"), tmp_path / "recompute", monkeypatch)
  tr_d, _, passes_d = _run(_cfg("detach"), tmp_path / "detach", monkeypatch)
  assert (passes_r, passes_d) == (2, 0)  # one recompute per step, none when detached
  hist_r, hist_d = tr_r.history, tr_d.history
  for a, b in zip(hist_r, hist_d):
    assert a["reward/mean"] == b["reward/mean"]  # the same samples (params equal so far to rounding)
    # -mean(A r) over ~160 tokens, ~0 on-policy: r = exp(logp - prox) is 1 to the two programs' f32
    # rounding of logp (ulps of |logp| ~ 5), summed in another order: bounded by ~160 * u * mean|A|
    # ~ 1e-5; measured 0 over 5 seeds
    np.testing.assert_allclose(b["loss/policy"], a["loss/policy"], rtol=1e-5, atol=1e-5)
    assert b["kl/theta_prox"] == 0.0  # r = exp(logp - stop_gradient(logp)) = 1 exactly
  for x, y in zip(jax.tree.leaves(tr_r.final_state.params), jax.tree.leaves(tr_d.final_state.params)):
    np.testing.assert_allclose(np.asarray(y), np.asarray(x), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("method, overrides, why", [
    ("grpo", {"train.epochs": 2}, r"train.epochs x train.mini_batches = 2 updates per batch"),
    ("grpo", {"train.mini_batches": 2}, r"train.epochs x train.mini_batches = 2 updates per batch"),
    ("ppo", {}, r"objective.advantage='gae' reads the values"),
    ("grpo", {"log.kl_to_ref": True}, r"a KL to the reference"),
])
def test_detach_is_refused_where_pi_prox_is_needed_apart(method, overrides, why):
  with pytest.raises(ConfigError, match=rf"config.train.prox='detach' is invalid: {why}.*use 'recompute'"):
    _cfg("detach", method, **overrides)
  _cfg("recompute", method, **overrides)  # the same config recomputes


def test_prox_source_is_checked():
  with pytest.raises(ConfigError, match=r"config.train.prox='reuse' is invalid.*'recompute', 'detach'"):
    _cfg("reuse")
