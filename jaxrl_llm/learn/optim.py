"""Optimizer: AdamW behind global-norm clipping, with a warm-up schedule, and
the guarded update that keeps a non-finite loss or gradient out of the weights."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def warmup_schedule(peak_lr: float, warmup_steps: int, total_steps: int = 0,
                    decay_to: float = 1.0) -> optax.Schedule:
  """The learning rate of update k = 0, 1, ...: a linear warm-up, then constant (decay_to=1) or a
  cosine decay to `decay_to * peak_lr` at update `total_steps`.

  The warm-up counts the update it is applied to, lr_k = peak_lr * (k + 1) / warmup_steps for
  k < warmup_steps, so the first update moves the weights (peak_lr / warmup_steps) and update
  warmup_steps - 1 is the first at peak_lr; warmup_steps=0 starts at peak_lr. (A ramp from 0 at
  k = 0, optax's linear_schedule(0, peak, n), spends the first update at lr 0: a no-op that still
  moves Adam's moments.)
  """
  if decay_to == 1.0 or total_steps <= warmup_steps:
    rest = optax.constant_schedule(peak_lr)
  else:
    rest = optax.cosine_decay_schedule(peak_lr, total_steps - warmup_steps, alpha=decay_to)
  if warmup_steps == 0:
    return rest

  def schedule(count):
    warm = peak_lr * (count + 1) / warmup_steps
    return jnp.where(count < warmup_steps, warm, rest(count - warmup_steps))

  return schedule


def adamw(schedule: optax.Schedule, *, b1: float, b2: float, weight_decay: float,
          clip_norm: float) -> optax.GradientTransformation:
  parts = [optax.clip_by_global_norm(clip_norm)] if clip_norm > 0 else []
  parts.append(optax.adamw(schedule, b1=b1, b2=b2, weight_decay=weight_decay))
  return optax.chain(*parts)


def guarded_update(tx: optax.GradientTransformation, grads, opt_state, params, loss):
  """Applies the update only when the loss and every gradient are finite.

  Returns (params, opt_state, grad_norm, skipped) where skipped is 1.0 when the
  update was dropped (params and optimizer state unchanged), else 0.0.
  """
  grad_norm = optax.tree.norm(grads)
  ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  # Zero the gradients before the optimizer sees them so no NaN enters the
  # moments even transiently; then keep the old state wholesale.
  safe_grads = jax.tree.map(lambda g: jnp.where(ok, g, jnp.zeros_like(g)), grads)
  updates, new_opt_state = tx.update(safe_grads, opt_state, params)
  new_params = optax.apply_updates(params, updates)
  keep = lambda new, old: jnp.where(ok, new, old)  # noqa: E731
  params = jax.tree.map(keep, new_params, params)
  opt_state = jax.tree.map(keep, new_opt_state, opt_state)
  return params, opt_state, grad_norm, 1.0 - ok.astype(jnp.float32)
