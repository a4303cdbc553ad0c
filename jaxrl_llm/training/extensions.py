"""The extensions a run's config turns on.

Each entry names a config section (a field of `RunConfig`), says when the
section turns its extension on, and builds the extension from the section.
`Trainer` adds these to the extensions it is given explicitly, so a config
with a teacher section trains with the teacher whichever entry point runs it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jaxrl_llm.extension import Extension
from jaxrl_llm.teacher.extension import TeacherExtension
from jaxrl_llm.training import eos_penalty, kl_controller, model_reward

# (section, enabled(section) -> bool, factory(section) -> Extension)
CONFIG_EXTENSIONS: tuple[tuple[str, Callable[[Any], bool], Callable[[Any], Extension]], ...] = (
    ("teacher", lambda section: section.enabled, TeacherExtension),
    ("data", model_reward.enabled, model_reward.RewardModelExtension),  # data.reward=model
    # After the reward model's: the penalty is a term of the final reward, whatever scored it.
    ("data", lambda data: data.missing_eos_penalty > 0, eos_penalty.MissingEosPenalty),
    ("objective", lambda objective: objective.kl_target > 0, kl_controller.KLController),
)


def extensions_for(run_cfg) -> tuple[Extension, ...]:
  """The extensions `run_cfg`'s sections ask for, in CONFIG_EXTENSIONS order."""
  out = []
  for section, enabled, factory in CONFIG_EXTENSIONS:
    block = getattr(run_cfg, section)
    if enabled(block):
      out.append(factory(block))
  return tuple(out)
