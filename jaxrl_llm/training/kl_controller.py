"""objective.kl_target > 0: the KL coefficient beta adapted to a target KL each step (Ziegler et al.
2019; the update rule and its units: objectives/kl_control.py), joined to the loop as an extension.

    build_batch      step t's advantages fold -beta_t * KL into the reward (`objective`: the
                     objective with kl_coef = beta_t), then `observe` measures KL_t on the step's
                     samples (log pi_prox against log pi_ref, the objective's estimator, summed per
                     answer, averaged over answers) and sets beta_{t+1}
    checkpoint_trees beta (f32; the coefficient step t+1 will use), so a resumed run continues exactly

beta starts at objective.kl_coef. The step logs kl/coef (beta_t, the coefficient its rewards used),
kl/answer (KL_t, nats per answer) and kl/error (e_t).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from jaxrl_llm.checkpointing.run import ExtraTree
from jaxrl_llm.extension import Extension, SetupEnv
from jaxrl_llm.model import sharding as sharding_lib
from jaxrl_llm.objectives import kl_control
from jaxrl_llm.objectives.kl import kl_penalty

COEF_KEY = "kl_controller"  # the checkpoint's tree of beta


class KLController(Extension):
  """objective.kl_target > 0: beta_{t+1} = beta_t (1 + K_beta e_t) (objectives/kl_control.py)."""

  name = "kl_controller"

  def __init__(self, objective_cfg):
    self.cfg = objective_cfg  # objectives.ObjectiveConfig
    self.coef = float(np.float32(objective_cfg.kl_coef))
    self.replicated = None

  def setup(self, env: SetupEnv, params):
    self.replicated = sharding_lib.replicated(env.mesh)
    return params

  def objective(self, obj):
    """`obj` with this step's coefficient beta_t as its kl_coef."""
    return dataclasses.replace(obj, kl_coef=self.coef)

  def observe(self, prox_logp_BR, ref_logp_BR, mask_BR) -> dict:
    """Measures KL_t on the step's sampled tokens `mask_BR` (n_t = its rows) and moves beta to
    beta_{t+1}, rounded to f32 as the checkpoint holds it; -> the step's metrics."""
    c = self.cfg
    mask = np.asarray(mask_BR, bool)
    # The estimator and the log-ratio clamp of the penalty this coefficient scales (fold_kl_into_rewards'
    # default clamp), so the controller steers the KL the reward pays.
    k_BR = np.asarray(kl_penalty(jnp.asarray(prox_logp_BR), jnp.asarray(ref_logp_BR), c.kl_estimator))
    kl = kl_control.answer_kl(k_BR, mask)
    used = self.coef
    nxt = kl_control.next_kl_coef(used, kl, target=c.kl_target, horizon=c.kl_horizon, n_samples=mask.shape[0])
    self.coef = float(np.float32(nxt))
    return {"kl/coef": used, "kl/answer": kl, "kl/error": kl_control.kl_error(kl, c.kl_target)}

  def checkpoint_trees(self) -> dict:
    return {COEF_KEY: ExtraTree(get=self._tree, set=self._set)}

  def _tree(self) -> dict:
    return {"coef": sharding_lib.put(jnp.asarray(self.coef, jnp.float32), self.replicated)}

  def _set(self, tree) -> None:
    self.coef = float(sharding_lib.fetch(tree["coef"]))

  def summary(self) -> dict:
    return {"kl_target": self.cfg.kl_target, "kl_horizon": self.cfg.kl_horizon, "kl_coef_final": self.coef}


def find(extensions) -> KLController | None:
  """The run's KL controller among its extensions, None without objective.kl_target."""
  return next((e for e in extensions if isinstance(e, KLController)), None)
