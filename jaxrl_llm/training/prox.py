"""Where log pi_prox comes from: one decision, resolved once per run.

pi_prox is the policy a batch's updates start from (docs/objectives.md, section 1).
The update's loss needs log pi_prox(y_t) only when the objective's trust
region or its correction on c reads it (`ObjectiveConfig.needs_prox`). Three
sources:

- `recompute`: one forward pass over the batch with the params the updates
  start from, before the first update. Exact for any number of updates per batch.
- `detach`: the update's own log pi_theta with its gradient stopped. At one
  update per batch pi_theta = pi_prox at that pass, so the number is the same
  and r = 1 exactly, one forward pass fewer (TRL's GRPOTrainer with
  num_iterations=1). Refused where something reads pi_prox before the update
  or a second update would see other params (`detach_blockers`).
- `behaviour`: the objective reads no pi_prox; the loss takes pi_prox := mu
  (so c = 1, and r is pi_theta / mu).

Independently of the source, the pre-update forward pass also runs when
something else reads it: the values of GAE, a KL to the reference (it is
taken from that pass's log-probs), or the `mismatch/*` metrics of a sampler
that differs from the policy on purpose. `ProxPlan.forward` says whether it runs.

The user's choice is `train.prox` (recompute | detach); `resolve_prox` turns it
and the objective into a `ProxPlan`, which `RunConfig.prox` holds and every
stage reads.
"""

from __future__ import annotations

import dataclasses

from jaxrl_llm.checks import bad

PROX_CHOICES = ("recompute", "detach")  # config.train.prox
PROX_SOURCES = ("recompute", "detach", "behaviour")  # ProxPlan.source


@dataclasses.dataclass(frozen=True)
class ProxPlan:
  source: str  # what the loss uses as log pi_prox: recompute | detach | behaviour (PROX_SOURCES)
  forward: bool  # whether one forward pass over the batch runs before its updates (log pi_prox, values)

  @property
  def detached(self) -> bool:
    """log pi_prox is the update's own log pi_theta, gradient stopped."""
    return self.source == "detach"


def detach_blockers(run_cfg) -> list[str]:
  """Why log pi_prox cannot come from the update's own forward pass: what reads it before the
  update, or a second update that would see other params. Empty: `detach` is exact."""
  tr, obj = run_cfg.train, run_cfg.objective
  out = []
  if tr.epochs * tr.mini_batches > 1:
    out.append(f"train.epochs x train.mini_batches = {tr.epochs * tr.mini_batches} updates per batch: after "
               "the first, pi_theta is no longer pi_prox")
  if run_cfg.use_value:
    out.append("objective.advantage='gae' reads the values of the recompute's pass")
  if obj.needs_ref or run_cfg.log.kl_to_ref:
    out.append("a KL to the reference (objective.kl_coef, log.kl_to_ref) is computed from log pi_prox "
               "before the update")
  return out


def resolve_prox(run_cfg) -> ProxPlan:
  """The run's `ProxPlan` from `train.prox` and the objective; a ConfigError where `detach` is refused."""
  choice, obj = run_cfg.train.prox, run_cfg.objective
  if choice == "detach":
    blockers = detach_blockers(run_cfg)
    if blockers:
      raise bad("config.train.prox", choice, f"{blockers[0]}: use 'recompute'")
    # Nothing may read a pass that does not run: the blockers above cover values and the reference.
    return ProxPlan(source="detach" if obj.needs_prox else "behaviour", forward=False)
  others = obj.needs_ref or run_cfg.log.kl_to_ref or run_cfg.use_value or run_cfg.rollout.mismatched
  return ProxPlan(source="recompute" if obj.needs_prox else "behaviour", forward=obj.needs_prox or others)
