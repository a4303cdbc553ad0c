"""The RL run's optimizers, from its `train` section: what the trainer steps with and what the
compile command plans with (one definition, so the plan's update is the run's)."""

from __future__ import annotations

import dataclasses

import optax

from jaxrl_llm.learn.optim import adamw, warmup_schedule


@dataclasses.dataclass(frozen=True)
class RunOptimizers:
  lr_schedule: optax.Schedule  # the policy's learning rate of update k (logged as `lr`)
  tx: optax.GradientTransformation  # the policy's AdamW: warm-up, then cosine decay over every update
  vtx: optax.GradientTransformation  # PPO's value head's: warm-up, then constant train.value_lr


def run_optimizers(cfg) -> RunOptimizers:
  """The optimizers of the run config `cfg` (its `train` section; updates = steps x epochs x mini-batches)."""
  tr = cfg.train
  schedule = warmup_schedule(tr.lr, tr.warmup_steps, tr.steps * tr.epochs * tr.mini_batches,
                             decay_to=tr.lr_decay_to)
  tx = adamw(schedule, b1=tr.b1, b2=tr.b2, weight_decay=tr.weight_decay, clip_norm=tr.clip_norm)
  vtx = adamw(warmup_schedule(tr.value_lr, tr.warmup_steps), b1=tr.b1, b2=tr.b2, weight_decay=0.0,
              clip_norm=tr.clip_norm)
  return RunOptimizers(lr_schedule=schedule, tx=tx, vtx=vtx)
