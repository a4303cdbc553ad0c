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
