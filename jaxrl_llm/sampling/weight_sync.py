"""How an external rollout engine's server gets the trainer's weights (`config.rollout.server.sync`).

`push(engine, params, version)` makes the server sample with `params` from
now on and returns what it cost (`SyncCost`), or None when the server's
weights are not the trainer's to set.

* `RestartSync` ("restart", llama.cpp): export the params to a GGUF file
  (model/gguf_export.py, `server.export` = f32 | f16 | q8_0 | q4_0) and
  restart the server process on it (server_process.py). Runs here, tested
  against llama.cpp's server.
* `SGLangDiskSync` ("sglang"): write the params as a Hugging Face checkpoint
  (`hf_io.save_hf`) and ask the server to load it in place with SGLang's
  `POST /update_weights_from_disk {"model_path": DIR}` (answer `{"success":
  true, "message": ...}`). SGLang needs a GPU: this hook is exercised here
  only against a stand-in server that speaks the same two calls, never
  against SGLang itself.
* vLLM: no hook. Its weight transfer (`VLLM_SERVER_DEV_MODE=1`,
  HTTP `init_weight_transfer_engine` / `start_weight_update` /
  `update_weights` / `finish_weight_update`, with the tensors sent over
  NCCL or CUDA IPC from a trainer process that joins its process group) has
  no CPU path; a hook would be a `WeightSync` whose `push` makes those four
  calls around a broadcast of the Hugging Face tensors (`hf_io.name_table`
  gives their names and layout). Running or testing it needs a GPU.
* `NoSync` ("none"): an external server whose weights stay fixed; its
  samples record policy version -1 (no trainer step made them).
"""

from __future__ import annotations

import dataclasses
import errno
import os
import shutil
import tempfile
import time
from typing import Protocol

from jaxrl_llm.model.config import ModelConfig
from jaxrl_llm.model.gguf_export import export_gguf
from jaxrl_llm.model.hf_io import save_hf


@dataclasses.dataclass(frozen=True)
class SyncCost:
  export_s: float  # params -> file
  reload_s: float  # the server taking the file (a restart, a load in place)


class WeightSync(Protocol):
  def push(self, engine, params, version: int) -> SyncCost | None:
    """Make `engine`'s server sample with `params` (the policy of step `version`)."""

  def close(self) -> None:
    """Remove what push wrote."""


class NoSync:
  def push(self, engine, params, version: int) -> SyncCost | None:
    del engine, params, version
    return None

  def close(self) -> None:
    pass


class RestartSync:
  """llama.cpp: a GGUF export, then the server process restarted on it (the engine's `process`)."""

  def __init__(self, *, model_cfg: ModelConfig, tokenizer, qtype: str, hf_path: str, out_dir: str):
    self.model_cfg, self.tokenizer, self.qtype, self.hf_path = model_cfg, tokenizer, qtype, hf_path
    self.out_dir, self.current = out_dir, ""

  @staticmethod
  def make_dir() -> str:
    return tempfile.mkdtemp(prefix="jaxrl_llm_engine_")

  def push(self, engine, params, version: int) -> SyncCost:
    """A full disk at the export is an error (OSError ENOSPC naming the file and the free space): the
    partial file is removed (export_gguf), the server is not restarted and keeps the previous weights,
    and the run stops at that step; its last checkpoint is untouched, a rerun resumes from it. (Going on
    with the old weights would grow the staleness past rollout.staleness without a bound.)"""
    path = os.path.join(self.out_dir, f"policy-v{version}.{self.qtype}.gguf")
    try:
      export = export_gguf(params, self.model_cfg, path, tokenizer=self.tokenizer, qtype=self.qtype,
                           hf_path=self.hf_path, name=f"jaxrl_llm policy v{version}")
    except OSError as e:
      if e.errno != errno.ENOSPC:
        raise
      free = shutil.disk_usage(self.out_dir).free
      serving = f"still serves {self.current}" if self.current else "has no weights yet"
      raise OSError(errno.ENOSPC, f"rollout engine: no space left on device for the weight sync of policy "
                    f"version {version} to {path} ({free / 2**20:.1f} MiB free in {self.out_dir}); the partial "
                    f"file is removed and the server {serving}. Free space (or choose a smaller "
                    f"config.rollout.server.export) and rerun to resume from the last checkpoint") from None
    reload_s = engine.process.start(path)
    if engine.client is None:  # the first server: check its model and vocabulary once
      engine.connect(engine.process.url)
    if self.current and self.current != path and os.path.exists(self.current):
      os.remove(self.current)
    self.current = path
    return SyncCost(export_s=export.seconds, reload_s=reload_s)

  def close(self) -> None:
    shutil.rmtree(self.out_dir, ignore_errors=True)


class SGLangDiskSync:
  """SGLang: a Hugging Face checkpoint on disk, loaded in place by POST /update_weights_from_disk."""

  def __init__(self, *, model_cfg: ModelConfig, out_dir: str = ""):
    self.model_cfg = model_cfg
    self.out_dir = out_dir or tempfile.mkdtemp(prefix="jaxrl_llm_engine_")

  def push(self, engine, params, version: int) -> SyncCost:
    t0 = time.perf_counter()
    path = os.path.join(self.out_dir, f"policy-v{version}")
    shutil.rmtree(path, ignore_errors=True)
    save_hf(params, self.model_cfg, path)
    t1 = time.perf_counter()
    answer = engine.client.post("/update_weights_from_disk", {"model_path": path})
    if not answer.get("success", False):
      raise RuntimeError(f"rollout engine: {engine.client.base_url}/update_weights_from_disk refused {path}: "
                         f"{answer.get('message', answer)}")
    for old in os.listdir(self.out_dir):
      if old != os.path.basename(path):
        shutil.rmtree(os.path.join(self.out_dir, old), ignore_errors=True)
    return SyncCost(export_s=t1 - t0, reload_s=time.perf_counter() - t1)

  def close(self) -> None:
    shutil.rmtree(self.out_dir, ignore_errors=True)
