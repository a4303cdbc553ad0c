"""PPO's clipped value loss (docs/objectives.md eq. 7.5).

    L_V = 1/2 max( (V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2 )

per token, aggregated like the policy loss (a WeightedSum). With clip=None it
is the plain 1/2 (V - R)^2. R are the GAE returns (advantages.gae).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_llm.objectives.aggregation import BatchNorms, WeightedSum, aggregate


def value_loss(values_BR, old_values_BR, returns_BR, mask_BR, *, clip: float | None,
               aggregation: str = "token_mean", norms: BatchNorms | None = None) -> WeightedSum:
  """Clipped value regression loss (to minimise)."""
  if not (values_BR.shape == old_values_BR.shape == returns_BR.shape == mask_BR.shape):
    raise ValueError(f"values_BR {values_BR.shape}, old_values_BR {old_values_BR.shape}, returns_BR "
                     f"{returns_BR.shape} and mask_BR {mask_BR.shape} must share one [B, R] shape")
  if clip is not None and not clip > 0:
    raise ValueError(f"clip={clip!r} is invalid: must be > 0 or None")
  sg = jax.lax.stop_gradient
  ret, old = sg(returns_BR), sg(old_values_BR)
  err = jnp.square(values_BR - ret)
  if clip is not None:
    clipped = old + jnp.clip(values_BR - old, -clip, clip)
    err = jnp.maximum(err, jnp.square(clipped - ret))
  return aggregate(jnp.where(mask_BR, 0.5 * err, 0.0), mask_BR, aggregation, norms)
