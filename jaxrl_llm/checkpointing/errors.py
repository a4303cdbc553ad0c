"""Errors raised when a checkpoint cannot be found, read or used.

Each message names what was expected and what was found, so that a user who
points a run at the wrong directory or step knows what to fix.
"""


class CheckpointError(Exception):
  """Base class for checkpoint problems."""


class NoCheckpointError(CheckpointError, FileNotFoundError):
  """The directory holds no complete checkpoint."""


class StepNotFoundError(CheckpointError, KeyError):
  """The requested step was never saved (or was deleted by retention)."""

  def __str__(self):  # KeyError would otherwise quote the message.
    return str(self.args[0]) if self.args else ""


class CorruptCheckpointError(CheckpointError):
  """A checkpoint's files do not match the manifest written when it was saved."""


class IncompatibleCheckpointError(CheckpointError, ValueError):
  """A checkpoint was saved for a different model or state structure."""
