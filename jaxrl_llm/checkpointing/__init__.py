"""Checkpoints and exact resume: Orbax manager, manifests, init from saved params."""

from jaxrl_llm.checkpointing.config import CheckpointConfig
from jaxrl_llm.checkpointing.errors import (
    CheckpointError,
    CorruptCheckpointError,
    IncompatibleCheckpointError,
    NoCheckpointError,
    StepNotFoundError,
)
from jaxrl_llm.checkpointing.manager import CheckpointManager, Restored

__all__ = [
    "CheckpointConfig", "CheckpointError", "CheckpointManager",
    "CorruptCheckpointError", "IncompatibleCheckpointError", "NoCheckpointError",
    "Restored", "StepNotFoundError",
]
