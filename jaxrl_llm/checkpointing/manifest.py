"""Per-checkpoint manifest: every file's size and CRC32, to detect damage on disk.

Orbax makes a save atomic (it writes to a temporary directory and renames it
when complete), so a crash mid-save never leaves a half-written step behind.
It does not detect a step that was damaged afterwards (a truncated copy, a bad
disk, a partial rsync). The manifest covers that: it is written once a step is
committed and checked before the step is restored.
"""

import json
import os
import zlib

MANIFEST_NAME = "manifest.jaxrl.json"
_CHUNK = 1 << 20


def _crc32(path: str) -> int:
  crc = 0
  with open(path, "rb") as f:
    while chunk := f.read(_CHUNK):
      crc = zlib.crc32(chunk, crc)
  return crc


def _list_files(step_dir: str) -> dict[str, str]:
  """Relative path -> absolute path of every file under step_dir but the manifest."""
  out = {}
  for root, _, files in os.walk(step_dir):
    for name in files:
      full = os.path.join(root, name)
      rel = os.path.relpath(full, step_dir)
      if rel != MANIFEST_NAME:
        out[rel] = full
  return out


def write_manifest(step_dir: str) -> None:
  """Records size and CRC32 of every file of a committed step (atomically)."""
  entries = {
      rel: {"size": os.path.getsize(full), "crc32": _crc32(full)}
      for rel, full in sorted(_list_files(step_dir).items())
  }
  tmp = os.path.join(step_dir, MANIFEST_NAME + ".tmp")
  with open(tmp, "w") as f:
    json.dump({"files": entries}, f, indent=1)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, os.path.join(step_dir, MANIFEST_NAME))


def has_manifest(step_dir: str) -> bool:
  return os.path.exists(os.path.join(step_dir, MANIFEST_NAME))


def verify_manifest(step_dir: str) -> list[str]:
  """Returns the problems found (empty when the step matches its manifest).

  A step without a manifest (the process died between the commit and the
  manifest write) returns no problem: Orbax's commit guarantees it is complete.
  """
  path = os.path.join(step_dir, MANIFEST_NAME)
  if not os.path.exists(path):
    return []
  try:
    with open(path) as f:
      expected = json.load(f)["files"]
  except (OSError, ValueError, KeyError) as e:
    return [f"{MANIFEST_NAME} is unreadable ({e})"]
  found = _list_files(step_dir)
  problems = []
  for rel, want in expected.items():
    full = found.get(rel)
    if full is None:
      problems.append(f"{rel}: missing")
      continue
    size = os.path.getsize(full)
    if size != want["size"]:
      problems.append(f"{rel}: {size} bytes, expected {want['size']}")
    elif _crc32(full) != want["crc32"]:
      problems.append(f"{rel}: CRC32 differs from the one recorded at save")
  return problems
