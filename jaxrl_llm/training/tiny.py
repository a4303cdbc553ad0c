"""Tiny runs: the config keys that shrink a preset to seconds per step on a CPU,
declared once for the tests and scripts/ (`config_flags` for a command line,
`apply_settings` for a ConfigDict). Keys are those of training/defaults.py.
"""

from __future__ import annotations

# The tiny model: D 32, one layer, 2 query heads over 1 kv head, MLP width 64.
TINY_MODEL = {"model.d_model": 32, "model.n_layers": 1, "model.n_heads": 2, "model.n_kv_heads": 1,
              "model.d_ff": 64}

# A short run of the tiny model that still has every stage: an SFT warm start
# long enough that rewards vary within groups (1-digit sums, a format bonus),
# rollouts, updates that move the params, a checkpoint every 2 steps,
# evaluations. The resume tests and scripts/fault_matrix.py (set train.steps).
WARM_TINY_RUN = {
    **TINY_MODEL, "seed": 3, "checkpoint.every_steps": 2, "task.digits": 1, "task.n_train": 200,
    "data.format_weight": 0.5, "sft.steps": 60, "sft.lr": 0.02, "sft.warmup_steps": 5,
    "sft.wrong_fraction": 0.0, "sft.batch_size": 32, "rollout.prompts_per_step": 8, "rollout.group_size": 4,
    "eval.n_examples": 16, "train.lr": 1e-3, "train.warmup_steps": 2, "log.progress": False,
}


def config_flags(settings: dict) -> list[str]:
  """`--config.KEY=VALUE` per setting, for `python -m jaxrl_llm.train` and the other entry points."""
  return [f"--config.{key}={value}" for key, value in settings.items()]


def apply_settings(c, settings: dict):
  """Sets each dotted key of `settings` ("rollout.group_size") in the ConfigDict `c`; returns `c`."""
  for key, value in settings.items():
    node = c
    *parents, leaf = key.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = value
  return c
