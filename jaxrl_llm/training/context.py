"""What every stage of an RL step reads: one frozen `StepContext`, built once by the loop.

The stages (training/step.py and the modules it calls) are functions of
(context, state, batch); none of them receives the Trainer. What changes
during a run is in the `TrainState` pytree; what the context holds does not
change once RL starts: configs, the mesh and its batch sharding, the
tokenizer, the reward runner, the prompt pipeline (an iterator whose
position is part of the state), the rollout engine, the compiled update, the
learning-rate schedule and the extensions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax

from jaxrl_llm.model import ModelConfig
from jaxrl_llm.sampling.config import SamplingConfig
from jaxrl_llm.sampling.engine import RolloutEngine
from jaxrl_llm.tasks.pipeline import PromptPipeline
from jaxrl_llm.tasks.rewards import RewardRunner
from jaxrl_llm.training.pack import PackPolicy
from jaxrl_llm.training.update import Updater


@dataclasses.dataclass(frozen=True)
class StepContext:
  cfg: Any  # training.config.RunConfig
  model_cfg: ModelConfig
  mesh: jax.sharding.Mesh
  batch_sharding: jax.sharding.NamedSharding  # leading (batch) axis over data x fsdp
  replicated: jax.sharding.NamedSharding
  tokenizer: Any
  runner: RewardRunner  # the verifier (tasks/rewards.py)
  pipeline: PromptPipeline  # the next step's prompts
  sampling_cfg: SamplingConfig  # how the engine samples (mu's processing)
  engine: RolloutEngine  # what samples the rollouts (sampling/engine.py)
  updater: Updater  # the compiled update (training/update.py): updater.apply(state, mini_batch, aux)
  lr_schedule: Callable[[int], Any]  # optimizer update count -> learning rate
  extensions: tuple = ()  # jaxrl_llm.extension.Extension, in call order
  workdir: str = ""  # the run's directory (the token-weight dumps go to <workdir>/dumps)
  pack: PackPolicy | None = None  # train.pack: when the update and the recompute run rows packed (training/pack.py)

  def updates_done(self, state) -> int:
    """Optimizer updates taken before `state`'s next step."""
    return int(state.step) * self.cfg.train.epochs * self.cfg.train.mini_batches
