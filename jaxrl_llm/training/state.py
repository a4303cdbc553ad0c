"""The full, resumable training state in one pytree.

Everything a checkpoint needs to continue a run exactly lives here: the
policy and its optimizer state, the value head (PPO), the frozen reference
params, the sampler's lagged snapshots (staleness), the PRNG key, the step
and the prompt iterator's position.
"""

from __future__ import annotations

import jax
from flax import struct

from jaxrl_llm.training.update import UpdateState


@struct.dataclass
class TrainState:
  step: jax.Array  # int32 [] RL steps completed
  params: dict  # policy params (model pytree; shapes per model.param_shapes)
  opt_state: tuple  # optax AdamW state of `params`
  value_params: dict  # value head {w1_DF [D, F], b1_F [F], w2_F [F], b2 []} (PPO; unused otherwise)
  value_opt_state: tuple  # optax state of `value_params`
  ref_params: dict | None  # frozen pi_ref (the warm-started model) when the KL needs it, else None
  lag_params: tuple  # (theta_{s-k}, ..., theta_{s-1}) at step s, oldest first; the sampler uses lag_params[0]
  key: jax.Array  # PRNG key, split once per step
  data_state: dict = struct.field(pytree_node=False, default_factory=dict)  # grain iterator state (host)

  def update_state(self) -> UpdateState:
    """The part of the state an optimizer update replaces (training/update.py)."""
    return UpdateState(params=self.params, opt_state=self.opt_state, value_params=self.value_params,
                       value_opt_state=self.value_opt_state)

  def with_update(self, u: UpdateState) -> "TrainState":
    return self.replace(params=u.params, opt_state=u.opt_state, value_params=u.value_params,
                        value_opt_state=u.value_opt_state)

  def sampler_params(self) -> dict:
    """The params the sampler uses: k steps stale, or the current ones for k = 0."""
    return self.lag_params[0] if self.lag_params else self.params

  def push_lag(self, params) -> "TrainState":
    """Appends theta_s (the params step s started from) as the newest snapshot,
    dropping the oldest; called once step s's updates are done."""
    if not self.lag_params:
      return self
    return self.replace(lag_params=self.lag_params[1:] + (params,))
