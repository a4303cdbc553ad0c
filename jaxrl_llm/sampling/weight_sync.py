"""How an external rollout engine's server gets the trainer's weights (`config.rollout.server.sync`).

A sync has three parts, which the engine calls in order (openai_engine.py):
`export(params, version)` writes the weights where the server can read
them (`Exported`, or None when the server's weights are not the trainer's
to set); `load(engine, exported, deadline)` makes the server sample with
them from now on and returns the seconds it took; `served(engine, deadline)`
is what the server reports it serves, which must equal `exported.tag`
(the sync check, sync_check.py). `load` and `served` stay within the
`deadline` (config.rollout.server.sync_timeout_s, sync_check.Deadline),
raising a SyncTimeout past it. `kind` names the weights' format for the
check's tolerance (sync_check.SYNC_TOLERANCE), and `expected(params)` gives
the weights the server holds once it has loaded the export of `params`, as
the trainer computes them (`exported_weights`: the export's rounding, for
the check's log p_new and log p_prev).

* `RestartSync` ("restart", llama.cpp): export the params to a GGUF file
  (model/io/gguf_export.py, `server.export` = f32 | f16 | q8_0 | q4_0) named
  after the version (`policy-v{version}.{export}.gguf`) and restart the
  server process on it (server_process.py); llama.cpp's GET /props reports
  the file it loaded (`model_path`). Runs here, tested against llama.cpp's
  server.
* `SGLangDiskSync` ("sglang"): write the params as a Hugging Face checkpoint
  (`hf_io.save_hf`) and ask the server to load it in place with SGLang's
  `POST /update_weights_from_disk {"model_path": DIR, "weight_version": "V"}`
  (answer `{"success": true, "message": ...}`); GET /get_weight_version
  (newer SGLang: /model_info) answers `{"weight_version": "V"}`. SGLang
  needs a GPU: this hook is exercised here only against a stand-in server
  that speaks the same calls, never against SGLang itself.
* vLLM: no hook. Its weight transfer (`VLLM_SERVER_DEV_MODE=1`,
  HTTP `init_weight_transfer_engine` / `start_weight_update` /
  `update_weights` / `finish_weight_update`, with the tensors sent over
  NCCL or CUDA IPC from a trainer process that joins its process group) has
  no CPU path; a hook would be a `WeightSync` whose `push` makes those four
  calls around a broadcast of the Hugging Face tensors (`hf_io.name_table`
  gives their names and layout). Running or testing it needs a GPU.
* `NoSync` ("none"): an external server whose weights stay fixed; its
  samples record policy version -1 (no trainer step made them). Nothing
  to check.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import shutil
import tempfile
import time
from typing import Protocol

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.model import lora
from jaxrl_llm.model.config import ModelConfig
from jaxrl_llm.model.io.gguf_export import export_gguf
from jaxrl_llm.model.io.gguf_quants import dequantize
from jaxrl_llm.model.io.hf_io import name_table, save_hf
from jaxrl_llm.sampling.http_client import ServerRejected, ServerUnavailable
from jaxrl_llm.sampling.server_process import ServerNotReady
from jaxrl_llm.sampling.sync_check import Deadline, SyncCheckFailed


@dataclasses.dataclass(frozen=True)
class Exported:
  """The weights of one version, written for the server."""
  path: str  # the GGUF file / Hugging Face directory
  version: int  # the policy version
  tag: str  # what the server reports serving once it has loaded them (`served`)
  export_s: float  # params -> file


def exported_weights(params, cfg: ModelConfig, kind: str) -> tuple[dict, ModelConfig]:
  """(float32 params, their config): the weights a server holds once it has loaded the `kind` export of
  `params` (a model of `cfg`), dequantised. A LoRA model merged (W + s A B, lora.merged), as both exports
  write it. GGUF (model/io/gguf_export.py, export_gguf): each 2-D Hugging Face tensor (`hf_io.name_table`;
  export_gguf's `w.ndim == 2`) rounded to float16, or quantised with gguf's own quantiser
  (`gguf.quants.quantize`, export_gguf's call) and read back with the GGUF reader's `gguf_quants.dequantize`;
  norms and biases stay float32. The blocks run along the last Hugging Face axis, so llama's per-head row
  permutation of q/k (gguf_export.permute_heads) does not change them and is not applied here. "f32" and
  "hf" (hf_io.save_hf, which writes cfg.param_dtype): the params in that dtype."""
  import gguf

  params, cfg = lora.merged(params, cfg)
  host = jax.tree.map(lambda x: np.array(jax.device_get(x), np.float32), params)  # a copy: written below
  if kind in ("f16", "q8_0", "q4_0"):
    for entry in name_table(cfg):
      leaf = host
      for key in entry.ours:
        leaf = leaf[key]
      part = leaf[entry.layer] if entry.layer is not None else leaf
      w = entry.to_hf(part)
      if w.ndim != 2:
        continue
      if kind == "f16":
        w = w.astype(np.float16).astype(np.float32)
      else:
        qtype = gguf.GGMLQuantizationType[kind.upper()]
        w = dequantize(gguf.quants.quantize(np.ascontiguousarray(w, np.float32), qtype), int(qtype), w.shape)
      part[...] = entry.to_ours(w)
  elif kind == "hf" and cfg.param_dtype != "float32":
    host = jax.tree.map(lambda x: x.astype(cfg.param_jnp_dtype).astype(np.float32), host)
  elif kind not in ("f32", "hf"):
    raise ValueError(f"exported_weights: kind {kind!r} is not one of f32, f16, q8_0, q4_0, hf")
  placed = jax.tree.map(lambda h, x: jax.device_put(h, x.sharding) if isinstance(x, jax.Array) else jnp.asarray(h),
                        host, params)  # where the trainer's params are: one device need not hold them all
  return placed, dataclasses.replace(cfg, param_dtype="float32")


class WeightSync(Protocol):
  kind: str  # the weights' format: the key of the check's tolerance (sync_check.SYNC_TOLERANCE)

  def export(self, params, version: int) -> Exported | None:
    """Write `params` (the policy of step `version`) for the server; None: its weights are not ours to set."""

  def expected(self, params) -> tuple[dict, ModelConfig]:
    """The weights the server holds once it has loaded the export of `params` (`exported_weights`)."""

  def load(self, engine, exported: Exported, deadline: Deadline) -> float:
    """Make `engine`'s server sample with `exported` from now on; the seconds it took."""

  def served(self, engine, deadline: Deadline) -> str:
    """What the server reports it serves (compared with `Exported.tag`)."""

  def close(self) -> None:
    """Remove what export wrote."""


class NoSync:
  kind = "none"

  def export(self, params, version: int) -> Exported | None:
    del params, version
    return None

  def expected(self, params) -> tuple[dict, ModelConfig]:
    raise AssertionError("NoSync exports nothing")

  def load(self, engine, exported: Exported, deadline: Deadline) -> float:
    raise AssertionError("NoSync exports nothing to load")

  def served(self, engine, deadline: Deadline) -> str:
    raise AssertionError("NoSync exports nothing to check")

  def close(self) -> None:
    pass


class RestartSync:
  """llama.cpp: a GGUF export, then the server process restarted on it (the engine's `process`)."""

  def __init__(self, *, model_cfg: ModelConfig, tokenizer, qtype: str, hf_path: str, out_dir: str):
    self.model_cfg, self.tokenizer, self.qtype, self.hf_path = model_cfg, tokenizer, qtype, hf_path
    self.out_dir, self.current, self.kind = out_dir, "", qtype

  @staticmethod
  def make_dir() -> str:
    return tempfile.mkdtemp(prefix="jaxrl_llm_engine_")

  def export(self, params, version: int) -> Exported:
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
    return Exported(path=path, version=version, tag=path, export_s=export.seconds)

  def expected(self, params) -> tuple[dict, ModelConfig]:
    return exported_weights(params, self.model_cfg, self.qtype)

  def load(self, engine, exported: Exported, deadline: Deadline) -> float:
    """Restart the server on the file, within the deadline (the server's own wait_s still bounds it)."""
    doing = f"the llama.cpp server's restart on {exported.path}"
    left = deadline.left(doing)
    try:
      reload_s = engine.process.start(exported.path, wait_s=min(left, engine.process.wait_s))
    except ServerNotReady:
      if left < engine.process.wait_s:
        raise deadline.timeout(doing) from None
      raise
    if engine.client is None:  # the first server: check its model and vocabulary once
      engine.connect(engine.process.url)
    if self.current and self.current != exported.path and os.path.exists(self.current):
      os.remove(self.current)
    self.current = exported.path
    return reload_s

  def served(self, engine, deadline: Deadline) -> str:
    """llama.cpp's GET /props `model_path`: the -m file of the running server."""
    return _get_field(engine, "/props", "model_path", deadline)

  def close(self) -> None:
    shutil.rmtree(self.out_dir, ignore_errors=True)


class SGLangDiskSync:
  """SGLang: a Hugging Face checkpoint on disk, loaded in place by POST /update_weights_from_disk."""

  kind = "hf"

  def __init__(self, *, model_cfg: ModelConfig, out_dir: str = ""):
    self.model_cfg = model_cfg
    self.out_dir = out_dir or tempfile.mkdtemp(prefix="jaxrl_llm_engine_")

  def export(self, params, version: int) -> Exported:
    t0 = time.perf_counter()
    path = os.path.join(self.out_dir, f"policy-v{version}")
    shutil.rmtree(path, ignore_errors=True)
    save_hf(params, self.model_cfg, path)
    return Exported(path=path, version=version, tag=str(version), export_s=time.perf_counter() - t0)

  def expected(self, params) -> tuple[dict, ModelConfig]:
    return exported_weights(params, self.model_cfg, "hf")

  def load(self, engine, exported: Exported, deadline: Deadline) -> float:
    t0 = time.perf_counter()
    doing = f"{engine.client.base_url}/update_weights_from_disk of {exported.path}"
    try:
      answer = engine.client.post("/update_weights_from_disk", {"model_path": exported.path,
                                                                "weight_version": exported.tag},
                                  timeout_s=deadline.left(doing))
    except ServerUnavailable:
      deadline.left(doing)  # a SyncTimeout when the deadline was what ended it
      raise
    if not answer.get("success", False):
      raise RuntimeError(f"rollout engine: {engine.client.base_url}/update_weights_from_disk refused "
                         f"{exported.path}: {answer.get('message', answer)}")
    for old in os.listdir(self.out_dir):
      if old != os.path.basename(exported.path):
        shutil.rmtree(os.path.join(self.out_dir, old), ignore_errors=True)
    return time.perf_counter() - t0

  def served(self, engine, deadline: Deadline) -> str:
    """SGLang's GET /get_weight_version (newer releases: /model_info) `weight_version`."""
    try:
      return _get_field(engine, "/get_weight_version", "weight_version", deadline)
    except SyncCheckFailed:
      return _get_field(engine, "/model_info", "weight_version", deadline)

  def close(self) -> None:
    shutil.rmtree(self.out_dir, ignore_errors=True)


def _get_field(engine, path: str, key: str, deadline: Deadline) -> str:
  """GET `path`'s `key` (a string), within the deadline; a SyncCheckFailed when the server has none."""
  doing = f"GET {engine.client.base_url}{path}"
  try:
    value = engine.client.get(path, timeout_s=min(engine.cfg.timeout_s, deadline.left(doing))).get(key)
  except ServerUnavailable as e:
    deadline.left(doing)
    raise SyncCheckFailed(f"rollout engine: the weight sync of policy version {deadline.version} is not verified: "
                          f"{doing} failed ({e})") from None
  except ServerRejected as e:
    value, why = None, str(e)
  else:
    why = f"its answer has no {key!r}"
  if not isinstance(value, (str, int)) or value == "":
    raise SyncCheckFailed(f"rollout engine: the weight sync of policy version {deadline.version} is not verified: "
                          f"the server does not say which weights it serves ({doing}: {why})")
  return str(value)
