"""Where log pi_prox comes from (training/prox.py): one decision per run, read by every stage.

The expected plans are written out case by case from the rule (docs/objectives.md, section 1):
the loss reads pi_prox only through a trust region on r or a correction on c; otherwise pi_prox := mu.
The pre-update forward pass runs when the loss reads a recomputed pi_prox, or when the values
(GAE), a KL to the reference or a deliberate sampler mismatch read that pass.
"""

import pytest
from run_helpers import load_config, shrink

from jaxrl_llm.checks import ConfigError
from jaxrl_llm.training.config import from_config_dict
from jaxrl_llm.training.prox import ProxPlan


def _plan(name, **overrides):
  return from_config_dict(shrink(load_config(name), **overrides)).prox


# (config, overrides, expected plan). GSPO clips r (trust region "ppo"): it reads pi_prox.
# REINFORCE and RLOO have neither a trust region nor a correction: pi_prox := mu. ScaleRL-GSPO
# corrects on rho = pi_theta / mu: no pi_prox either. PPO's GAE reads the values of the pass.
CASES = [
    ("gspo", {}, ProxPlan(source="recompute", forward=True)),
    ("gspo", {"train.prox": "detach", "log.kl_to_ref": False}, ProxPlan(source="detach", forward=False)),
    ("reinforce", {"log.kl_to_ref": False}, ProxPlan(source="behaviour", forward=False)),
    ("reinforce", {}, ProxPlan(source="behaviour", forward=True)),  # kl/ref reads the pass
    ("rloo", {"log.kl_to_ref": False, "train.prox": "detach"}, ProxPlan(source="behaviour", forward=False)),
    ("scalerl_gspo", {"log.kl_to_ref": False}, ProxPlan(source="behaviour", forward=False)),
    ("scalerl_gspo", {"log.kl_to_ref": False, "rollout.staleness": 1}, ProxPlan(source="behaviour", forward=True)),
    ("ppo", {"log.kl_to_ref": False}, ProxPlan(source="recompute", forward=True)),
    ("token_tis", {"log.kl_to_ref": False, "train.prox": "detach"}, ProxPlan(source="detach", forward=False)),
]


@pytest.mark.parametrize("name,overrides,expected", CASES)
def test_the_plan_follows_the_objective_and_the_choice(name, overrides, expected):
  assert _plan(name, **overrides) == expected


def test_the_plan_is_resolved_once():
  cfg = from_config_dict(shrink(load_config("gspo")))
  assert cfg.prox is cfg.prox


@pytest.mark.parametrize("overrides,why", [
    ({"train.prox": "detach"}, "a KL to the reference"),
    ({"train.prox": "detach", "log.kl_to_ref": False, "train.epochs": 2}, "2 updates per batch"),
])
def test_detach_is_refused_where_it_would_change_the_number(overrides, why):
  with pytest.raises(ConfigError, match=rf"config.train.prox='detach' is invalid: .*{why}.*use 'recompute'"):
    _plan("gspo", **overrides)
