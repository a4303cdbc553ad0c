"""The token-weight dump's files: where they live, how they are written and read.

A run with `log.dump_steps` writes, for each chosen step N,

    WORKDIR/dumps/step_N.npz    the step's arrays (training/dump.py lists them)
    WORKDIR/dumps/step_N.json   the run's method and config summary, texts, token pieces

Both are written atomically (a temporary file in the same folder, flushed,
then renamed), the arrays first: a step counts as dumped once its JSON is
there. `read_dump` is what the inspector (`python -m jaxrl_llm.inspect`)
and any other reader use; its errors name what the workdir does hold.
This module imports nothing of the package, so any layer may read dumps.
"""

from __future__ import annotations

import io
import json
import os
import re

import numpy as np

DUMP_DIR = "dumps"
DUMP_FORMAT = "jaxrl_llm.token_dump/1"
_NAME = re.compile(r"^step_(\d+)\.json$")


def dump_paths(workdir: str, step: int) -> tuple[str, str]:
  """(arrays .npz, info .json) of step `step`."""
  base = os.path.join(workdir, DUMP_DIR, f"step_{int(step)}")
  return base + ".npz", base + ".json"


def _atomic_write(path: str, data: bytes) -> None:
  tmp = f"{path}.tmp.{os.getpid()}"
  with open(tmp, "wb") as f:
    f.write(data)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def write_dump(workdir: str, step: int, arrays: dict, info: dict) -> str:
  """Writes step `step`'s dump; -> the JSON's path. `arrays`: name -> numpy array."""
  npz_path, json_path = dump_paths(workdir, step)
  os.makedirs(os.path.dirname(npz_path), exist_ok=True)
  buf = io.BytesIO()
  np.savez_compressed(buf, **{k: np.asarray(v) for k, v in arrays.items()})
  _atomic_write(npz_path, buf.getvalue())
  _atomic_write(json_path, json.dumps({"format": DUMP_FORMAT, "step": int(step), **info}).encode())
  return json_path


def dumped_steps(workdir: str) -> list[int]:
  """Steps with a complete dump (both files), ascending; [] when there is none."""
  folder = os.path.join(workdir, DUMP_DIR)
  if not os.path.isdir(folder):
    return []
  steps = []
  for name in os.listdir(folder):
    m = _NAME.match(name)
    if m and os.path.exists(os.path.join(folder, f"step_{m.group(1)}.npz")):
      steps.append(int(m.group(1)))
  return sorted(steps)


def read_dump(workdir: str, step: int) -> tuple[dict, dict]:
  """-> (arrays {name: numpy array}, info dict) of step `step`.

  FileNotFoundError / NotADirectoryError name the workdir and the steps it
  holds when the step was not dumped.
  """
  if not os.path.exists(workdir):
    raise FileNotFoundError(f"workdir {workdir!r} does not exist")
  if not os.path.isdir(workdir):
    raise NotADirectoryError(f"workdir {workdir!r} is a file: expected a run's directory")
  steps = dumped_steps(workdir)
  if not steps:
    raise FileNotFoundError(f"workdir {workdir!r} holds no token-weight dumps ({os.path.join(workdir, DUMP_DIR)} "
                            "has none): run with --config.log.dump_steps=(N,...) to dump steps")
  if int(step) not in steps:
    raise FileNotFoundError(f"step {step} was not dumped in {workdir!r}: the dumped steps are "
                            f"{', '.join(str(s) for s in steps)}")
  npz_path, json_path = dump_paths(workdir, step)
  with open(json_path) as f:
    info = json.load(f)
  if info.get("format") != DUMP_FORMAT:
    raise ValueError(f"{json_path}: format {info.get('format')!r} is not {DUMP_FORMAT!r}")
  with np.load(npz_path) as z:
    arrays = {k: z[k] for k in z.files}
  return arrays, info
