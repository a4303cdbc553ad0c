"""Checkpoints and exact resume: Orbax manager, manifests, init from saved params.

The config and the errors import without JAX or Orbax (the run config imports
them); the manager loads on first use.
"""

from jaxrl_llm.checkpointing.config import CheckpointConfig
from jaxrl_llm.checkpointing.errors import (
    CheckpointError,
    CorruptCheckpointError,
    IncompatibleCheckpointError,
    NoCheckpointError,
    StepNotFoundError,
)

__all__ = [
    "CheckpointConfig", "CheckpointError", "CheckpointManager",
    "CorruptCheckpointError", "IncompatibleCheckpointError", "NoCheckpointError",
    "Restored", "StepNotFoundError",
]


def __getattr__(name):
  if name in ("CheckpointManager", "Restored"):
    from jaxrl_llm.checkpointing import manager  # pylint: disable=import-outside-toplevel
    return getattr(manager, name)
  raise AttributeError(f"module 'jaxrl_llm.checkpointing' has no attribute {name!r}")
