"""Fault injection for the reliability matrix (scripts/fault_matrix.py): off unless asked for.

`JAXRL_LLM_FAULT="point:n:action[,point:n:action...]"` makes the n-th time the
process passes `point(name)` do `action`:

    kill     SIGKILL this process (a crash: nothing is flushed or cleaned up)
    term     SIGTERM this process (a graceful stop: the trainer saves and exits)
    enospc   raise OSError(ENOSPC) (a full disk during a write)
    nan      point() returns True: the caller poisons its value with NaN
    hang     sleep for an hour (a hung reward function)
    raise    raise RuntimeError (a crashing reward function)

Points: `sft_step`, `rollout`, `update`, `checkpoint_save`, `checkpoint_write`, `eval`, `reward`,
`advantage`, `decode_chunk` (continuous batching, after each chunk), `episode_round` (after each
round of environment steps of a training rollout). `traced(name)` is read when a function is traced for jit (`grad_nan`, `logits_nan`):
such a fault poisons every call of the compiled function. With the variable unset every call is a
dictionary lookup.
"""

from __future__ import annotations

import errno
import os
import signal
import time

ENV = "JAXRL_LLM_FAULT"
ACTIONS = ("kill", "term", "enospc", "nan", "hang", "raise")


def _parse(spec: str) -> dict[str, tuple[int, str]]:
  out = {}
  for entry in filter(None, (e.strip() for e in spec.split(","))):
    parts = entry.split(":")
    if len(parts) != 3 or not parts[1].isdigit() or parts[2] not in ACTIONS:
      raise ValueError(f"{ENV}={spec!r}: entry {entry!r} must be point:n:action with action in {ACTIONS}")
    out[parts[0]] = (int(parts[1]), parts[2])
  return out


_PLAN = _parse(os.environ.get(ENV, ""))
_COUNTS: dict[str, int] = {}


def point(name: str) -> bool:
  """Passes the point `name`; True when the caller should poison its value (action nan)."""
  if name not in _PLAN:
    return False
  _COUNTS[name] = _COUNTS.get(name, 0) + 1
  n, action = _PLAN[name]
  if _COUNTS[name] != n:
    return False
  if action == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
  if action == "term":
    os.kill(os.getpid(), signal.SIGTERM)
    return False
  if action == "enospc":
    raise OSError(errno.ENOSPC, f"No space left on device (injected at {name} #{n})")
  if action == "hang":
    time.sleep(3600)
  if action == "raise":
    raise RuntimeError(f"injected failure at {name} #{n}")
  return action == "nan"


def traced(name: str) -> bool:
  """Whether the fault `name` is planned (read at trace time, for faults inside a jitted function)."""
  return name in _PLAN
