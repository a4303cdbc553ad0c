"""What the benchmarks of scripts/ share: every measurement runs in a fresh
child process of the benchmark's own script (`--worker NAME`), which prints
its result as one JSON line (`emit`); the parent reads it back (`spawn`) and
records the machine's load around every child, so a reader can tell a
measurement taken on a busy machine. Imported by the scripts (`python
scripts/<bench>.py` puts scripts/ on sys.path); not a benchmark itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

RESULT = "RESULT "  # the prefix of a child's result line on its stdout


def load() -> dict:
  """The machine's load averages (1, 5 and 15 minutes) and what `uptime` prints."""
  out = {"loadavg": list(os.getloadavg())}
  try:
    out["uptime"] = subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    pass
  return out


def emit(result: dict) -> None:
  """A child's result, as the line `spawn` reads back."""
  print(RESULT + json.dumps(result), flush=True)


def spawn(script: str, argv: list[str], worker: str, *, extra=(), timeout: float | None = None,
          cwd: str | None = None) -> dict:
  """Runs `script *argv --worker worker *extra` in a fresh Python and returns the
  result it emitted, with the machine's load before and after the child
  (`load_before`, `load_after`). A child that fails, emits nothing or runs
  past `timeout` seconds ends the benchmark with a SystemExit naming it."""
  name = os.path.basename(script).removesuffix(".py")
  before = load()
  cmd = [sys.executable, os.path.abspath(script), *argv, "--worker", worker, *extra]
  try:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd)
  except subprocess.TimeoutExpired:
    raise SystemExit(f"{name}: the {worker} child ran past --child-timeout={timeout:g} s") from None
  lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT)]
  if proc.returncode or not lines:
    raise SystemExit(f"{name}: the {worker} child failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
  result = json.loads(lines[-1][len(RESULT):])
  result["load_before"], result["load_after"] = before, load()
  return result
