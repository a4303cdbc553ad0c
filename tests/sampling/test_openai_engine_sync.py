"""The `openai` rollout engine's weights: the llama.cpp-like server process it starts and restarts on
a GGUF export (the stand-in fake_openai_server.py), a crash, a full disk at the export, the SGLang
hook, and RL steps through the trainer with a sync every step.
"""

import errno
import json
import os
import re
import sys

import jax
import numpy as np
import pytest

from jaxrl_llm.checks import ConfigError
from jaxrl_llm.model.params import init_params
from jaxrl_llm.sampling.openai_engine import OpenAIEngine, make_openai_engine
from jaxrl_llm.sampling.config import ServerConfig
from jaxrl_llm.sampling.weight_sync import SGLangDiskSync

sys.path.insert(0, os.path.dirname(__file__))
from openai_stand_in import (  # noqa: E402
    FAKE, MODEL, TOK, V, bigram,
    engine, hf_scorer, prompts, sampling, server, settings)


# ---- weights: the server process the engine starts, and the SGLang hook ------------------

def _managed(tmp_path, **kw) -> OpenAIEngine:
  cmd = f"{sys.executable} {FAKE} " + kw.pop("flags", "")
  s = ServerConfig(command=cmd, sync="restart", timeout_s=5.0, retries=2, backoff_s=0.01, wait_s=60.0,
                   concurrency=2, **kw)
  return make_openai_engine(model_cfg=MODEL, sampling_cfg=sampling(max_new_tokens=4), tokenizer=TOK, settings=s)


def test_sync_exports_restarts_and_versions_the_samples(tmp_path):
  eng = _managed(tmp_path, sync_every=2)
  try:
    p0 = init_params(MODEL, jax.random.key(0))
    with pytest.raises(RuntimeError, match="before sync"):
      eng.generate(prompts(), jax.random.key(0))
    eng.sync(p0, 0)
    first = eng.generate(prompts(), jax.random.key(0))
    assert (first.version_B == 0).all() and first.mask_BR.any(axis=1).all()
    m = eng.metrics()
    assert m["engine/syncs"] == 1.0 and m["engine/export_s"] > 0 and m["engine/reload_s"] > 0
    assert m["engine/sync_s"] >= m["engine/export_s"] + m["engine/reload_s"] * 0.99
    pid = eng.process.proc.pid
    eng.sync(init_params(MODEL, jax.random.key(1)), 1)  # sync_every=2: not yet
    assert eng.process.proc.pid == pid and eng.metrics()["engine/syncs"] == 1.0
    p2 = init_params(MODEL, jax.random.key(2))
    eng.sync(p2, 2)
    assert eng.process.proc.pid != pid and eng.process.model_path.endswith("policy-v2.f32.gguf")
    # verified: the server reports the new file, and scores the probe with it as the trainer does p2
    m = eng.metrics()
    assert m["engine/sync_version"] == 2.0 and m["engine/sync_probe_max_abs_dlogp"] < 1e-5
    assert m["engine/sync_check_failures"] == 0.0 and m["engine/sync_timeouts"] == 0.0
    second = eng.generate(prompts(), jax.random.key(0))
    assert (second.version_B == 2).all()
    # the stand-in samples from the exported embedding: new weights, other answers for the same seeds
    assert not np.array_equal(first.tokens_BR, second.tokens_BR)
    assert sorted(os.listdir(eng.weight_sync.out_dir)) == ["llama-server.log", "policy-v2.f32.gguf"]
  finally:
    eng.close()
  assert not eng.process.alive() and not os.path.exists(eng.weight_sync.out_dir)


def test_a_crashed_server_is_restarted_and_nothing_is_lost(tmp_path):
  marker = tmp_path / "crashed"
  eng = _managed(tmp_path, flags=f"--die-after 3 --die-marker {marker}")
  try:
    eng.sync(init_params(MODEL, jax.random.key(0)), 0)
    batch = eng.generate(prompts(), jax.random.key(0))
    assert marker.exists()  # it did crash, after 3 answers
    assert batch.mask_BR.any(axis=1).all()  # and every sample arrived
    m = eng.metrics()
    assert m["engine/server_exits"] == 1.0 and m["engine/server_restarts"] == 1.0 and m["engine/dropped"] == 0.0
  finally:
    eng.close()


def test_a_crashed_server_is_an_error_when_configured(tmp_path):
  eng = _managed(tmp_path, flags=f"--die-after 1 --die-marker {tmp_path / 'm'}", on_exit="error")
  try:
    eng.sync(init_params(MODEL, jax.random.key(0)), 0)
    with pytest.raises(RuntimeError, match=r"llama.cpp server on .* exited \(code 9\)"):
      eng.generate(prompts(), jax.random.key(0))
  finally:
    eng.close()


def _fill_the_disk(out_dir, seen):
  """A GGUFWriter.write_tensors_to_file that writes part of the file, then finds the disk full."""
  def write(self, *args, **kwargs):
    del args, kwargs
    for fout in self.fout:
      fout.write(b"\0" * 4096)
      fout.flush()
    seen.extend(f for f in os.listdir(out_dir) if ".partial-" in f)  # the partial file is on disk
    raise OSError(errno.ENOSPC, "No space left on device")
  return write


def test_a_full_disk_at_the_sync_export_is_an_error_and_the_server_keeps_its_weights(tmp_path, monkeypatch):
  # Decision (weight_sync.RestartSync.push): an OSError(ENOSPC) naming the file and the free space; the
  # partial file removed; the server not restarted, still serving the previous export.
  import gguf

  eng = _managed(tmp_path)
  try:
    eng.sync(init_params(MODEL, jax.random.key(0)), 0)
    before = eng.generate(prompts(), jax.random.key(0))
    pid, out_dir = eng.process.proc.pid, eng.weight_sync.out_dir
    partial = []
    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", _fill_the_disk(out_dir, partial))
    with pytest.raises(OSError) as e:
      eng.sync(init_params(MODEL, jax.random.key(1)), 1)
    msg = str(e.value)
    assert e.value.errno == errno.ENOSPC and "\n" not in msg
    target, previous = os.path.join(out_dir, "policy-v1.f32.gguf"), os.path.join(out_dir, "policy-v0.f32.gguf")
    assert re.search(rf"policy version 1 to {re.escape(target)} \(\d+\.\d MiB free in {re.escape(out_dir)}\); the "
                     rf"partial file is removed and the server still serves {re.escape(previous)}\.", msg), msg
    assert partial and sorted(os.listdir(out_dir)) == ["llama-server.log", "policy-v0.f32.gguf"]
    assert eng.process.alive() and eng.process.proc.pid == pid and eng.process.model_path == previous
    assert eng.metrics()["engine/syncs"] == 1.0 and eng.version == 0
    after = eng.generate(prompts(), jax.random.key(0))  # the previous weights: the same answers to the same seeds
    assert (after.version_B == 0).all()
    np.testing.assert_array_equal(after.tokens_BR, before.tokens_BR)
  finally:
    eng.close()


@pytest.mark.slow
def test_a_full_disk_at_a_sync_stops_the_run_and_the_last_checkpoint_resumes(tmp_path, monkeypatch, quiet_log):
  # In a run: the step whose sync fails raises (before its update); the step before it is saved, the
  # engine's server and export folder are gone; the same command, with space again, resumes.
  import gguf
  from run_helpers import load_config, make_trainer, shrink

  from jaxrl_llm.training import loop
  from jaxrl_llm.training.config import from_config_dict

  monkeypatch.setattr(loop, "write_report_safely", lambda workdir, log: None)  # not under test: seconds saved
  c = shrink(load_config("grpo"), **{"rollout.engine": "openai", "rollout.server.command": f"{sys.executable} {FAKE}",
                                     "rollout.server.concurrency": 4, "rollout.server.backoff_s": 0.01,
                                     "train.steps": 2, "checkpoint.every_steps": 1})
  cfg, wd = from_config_dict(c), tmp_path / "run"
  real, exports = gguf.GGUFWriter.write_tensors_to_file, []

  def second_export_fills_the_disk(self, *args, **kwargs):
    exports.append(self.path)
    if len(exports) == 2:
      raise OSError(errno.ENOSPC, "No space left on device")
    return real(self, *args, **kwargs)

  monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", second_export_fills_the_disk)
  tr = make_trainer(cfg, wd, quiet_log)
  with pytest.raises(OSError, match=r"no space left on device for the weight sync of policy version 1 to \S+"
                                    r"policy-v1\.f32\.gguf \(\d+\.\d MiB free"):
    tr.run()
  assert not tr.engine.process.alive() and not os.path.exists(tr.engine.weight_sync.out_dir)
  assert sorted(int(d) for d in os.listdir(wd / "checkpoints") if d.isdigit()) == [1]
  monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", real)
  logs = []
  summary = make_trainer(cfg, wd, logs.append).run()
  assert any("resumed from checkpoint step 1" in line for line in logs) and summary["rl_steps"] == 2
  assert [json.loads(line)["step"] for line in open(wd / "metrics.jsonl")] == [1, 2]


def test_missing_server_binary_is_one_line_error():
  s = ServerConfig(command="no-such-llama-server -t 1", sync="restart")
  with pytest.raises(ConfigError, match="'no-such-llama-server' is not an executable on PATH"):
    make_openai_engine(model_cfg=MODEL, sampling_cfg=sampling(), tokenizer=TOK, settings=s)


def test_a_tokenizer_the_export_cannot_write_is_refused_before_any_sync():
  class OtherTokenizer:  # e.g. a Hugging Face tokenizer of a checkpoint not converted from a GGUF file
    vocab_size = V

  s = ServerConfig(command=f"{sys.executable} {FAKE}", sync="restart")
  with pytest.raises(ConfigError, match="model.hf_path='/some/hf/dir' cannot be written as GGUF metadata"):
    make_openai_engine(model_cfg=MODEL, sampling_cfg=sampling(), tokenizer=OtherTokenizer(), settings=s,
                       hf_path="/some/hf/dir")


def test_sglang_hook_writes_a_checkpoint_and_asks_the_server_to_load_it(server, tmp_path):
  server.load = hf_scorer  # the stand-in serves the checkpoint it loads (the sync check scores it)
  eng = OpenAIEngine(model_cfg=MODEL, sampling_cfg=sampling(), tokenizer=TOK,
                     settings=settings(server.url, sync="sglang"),
                     weight_sync=SGLangDiskSync(model_cfg=MODEL, out_dir=str(tmp_path / "w")))
  eng.sync(init_params(MODEL, jax.random.key(0)), 3)
  assert server.loaded == [str(tmp_path / "w" / "policy-v3")] and server.weight_version == "3"
  assert os.path.isfile(tmp_path / "w" / "policy-v3" / "config.json")
  assert (eng.generate(prompts(), jax.random.key(0)).version_B == 3).all()


# ---- the trainer through the engine ---------------------------------------------------------

@pytest.mark.slow
def test_rl_steps_through_the_engine_sync_every_step(tmp_path, quiet_log):
  from run_helpers import load_config, make_trainer, shrink

  from jaxrl_llm.training.config import from_config_dict

  c = shrink(load_config("grpo"), **{"rollout.engine": "openai", "rollout.server.command": f"{sys.executable} {FAKE}",
                                     "rollout.server.concurrency": 4, "rollout.server.backoff_s": 0.01,
                                     "train.steps": 2})
  tr = make_trainer(from_config_dict(c), tmp_path / "run", quiet_log)
  state = tr.start_rl(tr.setup_extensions(tr.init_state(jax.random.key(0))))
  eng = tr.context.engine
  try:
    assert isinstance(eng, OpenAIEngine)
    for step in range(2):
      state, metrics = tr.step(state)
      assert eng.version == step and eng.metrics()["engine/syncs"] == step + 1  # a new export every step
      assert np.isfinite(metrics["loss/total"])
      # mu is the stand-in's bigram, not the policy: an external engine always gets pi_prox recomputed and
      # log c = log pi_prox - log mu measured (both near uniform at init, so the gap is small but not zero)
      assert 0.0 < metrics["mismatch/log_c_abs_mean"] < np.inf
      # The engine's counters and the samples' policy version reach the step's metrics.
      assert metrics["engine/syncs"] == step + 1 and metrics["rollout/version_lag_mean"] == 0.0
    assert eng.metrics()["engine/dropped"] == 0.0
  finally:
    eng.close()


@pytest.mark.slow
def test_a_dropped_sample_is_out_of_the_loss_and_its_groups_baseline(tmp_path, quiet_log, server):
  """rollout.server.on_failure=drop: the failed request's row has no tokens; its group's GRPO advantages are
  those of the group without it, (R_i - mean) / (std + eps) over the samples that came back."""
  from run_helpers import load_config, make_trainer, shrink

  from jaxrl_llm.rundir.token_dump import read_dump
  from jaxrl_llm.training.config import from_config_dict

  c = shrink(load_config("grpo"), **{"rollout.engine": "openai", "rollout.server.url": server.url,
                                     "rollout.server.sync": "none", "rollout.server.on_exit": "error", "rollout.server.on_failure": "drop",
                                     "rollout.server.retries": 1, "rollout.server.concurrency": 1,
                                     "rollout.server.backoff_s": 0.01, "train.steps": 1, "log.dump_steps": (1,)})
  tr = make_trainer(from_config_dict(c), tmp_path / "run", quiet_log)
  state = tr.start_rl(tr.setup_extensions(tr.init_state(jax.random.key(0))))
  try:
    server.script = ["500", "500"]  # the first request of the step and its one retry fail: dropped
    state, metrics = tr.step(state)
  finally:
    tr.context.engine.close()
  assert tr.context.engine.metrics()["engine/dropped"] == 1.0
  G = c.rollout.group_size
  assert metrics["rollout/dropped_frac"] == pytest.approx(1.0 / (c.rollout.prompts_per_step * G))
  arrays, _ = read_dump(str(tmp_path / "run"), 1)
  dropped = np.flatnonzero(arrays["length_B"] == 0)
  assert dropped.size == 1
  b = int(dropped[0])
  assert not arrays["loss_mask_BR"][b].any() and not arrays["adv_in_BR"][b].any()
  g = b // G
  rows = [i for i in range(g * G, (g + 1) * G) if i != b]
  rewards = arrays["reward_B"][rows].astype(np.float64)
  want = (rewards - rewards.mean()) / (rewards.std(ddof=1) + 1e-6)
  np.testing.assert_allclose(arrays["seq_adv_B"][rows], want, atol=1e-5)
  got_all = np.ones(len(arrays["reward_B"]), bool)
  got_all[b] = False
  assert metrics["reward/mean"] == pytest.approx(float(arrays["reward_B"][got_all].mean()), abs=1e-6)
