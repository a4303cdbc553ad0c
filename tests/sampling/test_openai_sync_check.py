"""The check of every weight sync (sampling/sync_check.py): the server must report the version pushed and
score a fixed probe as the trainer does, within the export's tolerance, in time.

Stand-ins (fake_openai_server.py): SGLang's update-in-place (in this process) whose raw log-probs come from
numpy_llama.py on the checkpoint it loaded, and llama.cpp's server process scoring with the GGUF it started
on. Faults: a server that silently keeps its old weights (and says so, or reports the new version), one that
takes too long, and the knobs (sync_check=False, sync_check_tol).
"""

import dataclasses
import os
import re
import sys
import tempfile

import jax
import numpy as np
import pytest

from jaxrl_llm.checks import ConfigError
from jaxrl_llm.cli import is_user_error
from jaxrl_llm.model.io.hf_io import save_hf
from jaxrl_llm.model.params import init_params
from jaxrl_llm.sampling.config import ServerConfig
from jaxrl_llm.sampling.openai_engine import OpenAIEngine, make_openai_engine
from jaxrl_llm.sampling.sync_check import (
    PROBE_LEN, SYNC_TOLERANCE, SyncCheckFailed, SyncTimeout, probe_ids, trainer_logp, version_of)
from jaxrl_llm.sampling.weight_sync import SGLangDiskSync

sys.path.insert(0, os.path.dirname(__file__))
import numpy_llama  # noqa: E402
from openai_stand_in import FAKE, MODEL, TOK, V, hf_scorer, prompts, sampling, server, settings  # noqa: E402,F401

# Two policies far apart on the probe (P1's weights 15 times larger: max |delta log p| ~ 5 nats, above every
# tolerance but the quantised exports'), so that a server still serving P0 shows in its log-probs too.
P0, P1 = init_params(MODEL, jax.random.key(0)), init_params(dataclasses.replace(MODEL, init_std=0.3), jax.random.key(1))


def _sglang(srv, tmp_path, **kw) -> OpenAIEngine:
  srv.load = hf_scorer
  return OpenAIEngine(model_cfg=MODEL, sampling_cfg=sampling(), tokenizer=TOK,
                      settings=settings(srv.url, sync="sglang", **kw),
                      weight_sync=SGLangDiskSync(model_cfg=MODEL, out_dir=str(tmp_path / "w")))


def _managed(**kw) -> OpenAIEngine:
  cmd = f"{sys.executable} {FAKE} " + kw.pop("flags", "")
  s = ServerConfig(command=cmd, sync="restart", timeout_s=5.0, retries=1, backoff_s=0.01, wait_s=60.0,
                   concurrency=2, **kw)
  return make_openai_engine(model_cfg=MODEL, sampling_cfg=sampling(max_new_tokens=4), tokenizer=TOK, settings=s)


def _one_line(e: SyncCheckFailed | SyncTimeout) -> str:
  msg = str(e)
  assert "\n" not in msg and is_user_error(e)  # the entry points print it as one `error:` line
  return msg


# ---- the probe ------------------------------------------------------------------------------------

def test_the_probe_is_fixed_and_clear_of_special_ids():
  a, b = probe_ids(V, {0, 1}), probe_ids(V, {0, 1})
  np.testing.assert_array_equal(a, b)  # fixed per vocabulary: every run and resume scores the same ids
  assert a.shape == (PROBE_LEN,) and a.dtype == np.int32 and not np.isin(a, [0, 1]).any() and (a < V).all()
  assert not np.array_equal(a, probe_ids(V, {0, 1}, seed=1))
  assert not np.isin(probe_ids(V, set(range(V - 1))), np.arange(V - 1)).any()  # only id V - 1 is left
  assert version_of("/tmp/x/policy-v12.q4_0.gguf") == 12 and version_of("7") == 7 and version_of("other") == -1


def test_the_trainer_side_is_response_logprobs_in_float32():
  probe = probe_ids(V, {0, 1})
  got = trainer_logp(P0, MODEL, probe)
  with tempfile.TemporaryDirectory() as d:  # the same model written out in numpy (float64, HF modeling_llama's)
    save_hf(P0, MODEL, d)
    model = numpy_llama.from_hf(d)
  want = np.array([numpy_llama.log_softmax(numpy_llama.llama_logits(model, probe[:t]))[probe[t]]
                   for t in range(1, PROBE_LEN)])
  assert got.shape == (PROBE_LEN - 1,)
  np.testing.assert_allclose(got, want, atol=1e-5)


# ---- the knobs ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, match", [
    (dict(sync_check=1), r"config.rollout.server.sync_check must be a bool, got 1"),
    (dict(sync_check_tol=-0.1), r"config.rollout.server.sync_check_tol=-0.1 is out of range: allowed \[0.0, 1000.0\]"),
    (dict(sync_timeout_s=0.0), r"config.rollout.server.sync_timeout_s=0.0 is out of range: allowed \(0.0, 86400.0\]"),
])
def test_bad_knobs_are_one_line_errors(kw, match):
  with pytest.raises(ConfigError, match=match):
    ServerConfig(**kw)


def test_a_workdir_saved_before_the_check_reads_with_it_on():
  from jaxrl_llm.training.config import from_config_dict
  from jaxrl_llm.training.defaults import get_config
  from jaxrl_llm.training.provenance import complete, plain_config, result_changes

  cfg = from_config_dict(get_config("grpo"))
  old = plain_config(cfg)
  for key in ("sync_check", "sync_check_tol", "sync_timeout_s"):
    del old["rollout"]["server"][key]
  read = from_config_dict(complete(old))
  assert read.rollout.server == cfg.rollout.server
  assert (read.rollout.server.sync_check, read.rollout.server.sync_check_tol) == (True, 0.0)
  assert result_changes(old, plain_config(cfg)) == {}


# ---- SGLang's update in place (the stand-in in this process) -------------------------------------------

def test_a_faithful_update_passes_and_is_recorded(server, tmp_path):
  eng = _sglang(server, tmp_path)
  eng.sync(P0, 0)
  eng.sync(P1, 1)
  m = eng.metrics()
  assert m["engine/syncs"] == 2.0 and m["engine/sync_version"] == 1.0
  assert m["engine/sync_probe_max_abs_dlogp"] < 1e-5  # float32 trainer against the float64 stand-in
  assert m["engine/sync_check_failures"] == 0.0 and m["engine/sync_timeouts"] == 0.0
  assert server.probes == 2 * (PROBE_LEN - 1) and server.requests == []  # one request per probe position
  assert (eng.generate(prompts(), jax.random.key(0)).version_B == 1).all()


def test_a_server_that_keeps_its_old_weights_and_version_fails_the_sync(server, tmp_path):
  eng = _sglang(server, tmp_path)
  eng.sync(P0, 0)
  server.stale = "all"  # answers success, changes nothing
  with pytest.raises(SyncCheckFailed) as e:
    eng.sync(P1, 1)
  msg = _one_line(e.value)
  gap = float(np.abs(trainer_logp(P0, MODEL, eng.probe_L) - trainer_logp(P1, MODEL, eng.probe_L)).max())
  assert gap > SYNC_TOLERANCE["hf"]  # the two policies are far apart on the probe: the log-probs show it too
  assert re.fullmatch(
      r"rollout engine: the weight sync of policy version 1 is not verified: the server reports serving version 0 "
      rf"\(0\), and its log-probs of the probe \({PROBE_LEN} fixed tokens\) differ from the trainer's by max "
      r"\|delta log p\| = ([0-9.]+) \(tolerance 2, measured for 'hf' weights, config.rollout.server.sync_check_tol "
      r"sets another; config.rollout.server.sync_check=False turns the check off\)", msg), msg
  m = eng.metrics()
  assert m["engine/sync_version"] == 0.0 and m["engine/sync_check_failures"] == 1.0
  assert m["engine/sync_probe_max_abs_dlogp"] == pytest.approx(gap, rel=1e-3)
  assert m["engine/syncs"] == 1.0 and eng.version == 0  # the failed sync is not counted as one


def test_a_server_that_reports_the_new_version_but_serves_other_log_probs_fails(server, tmp_path):
  # The first sync (no previous one to compare with): the tolerance alone. The stand-in reports version 0 but
  # still scores with its bigram table, which no decoder's weights give.
  eng = _sglang(server, tmp_path)
  server.stale = "weights"
  with pytest.raises(SyncCheckFailed, match=r"policy version 0 is not verified: the server reports serving it \(0\), "
                                            r"but its log-probs of the probe .* max \|delta log p\| = [0-9.]+ "
                                            r"\(tolerance 2, ") as e:
    eng.sync(P0, 0)
  _one_line(e.value)
  m = eng.metrics()
  assert m["engine/sync_version"] == 0.0 and m["engine/sync_probe_max_abs_dlogp"] > 2.0
  assert "engine/sync_probe_dist_prev" not in m and m["engine/sync_probe_dist_new"] > 0.1


def test_the_tolerance_knob_and_the_off_switch(server, tmp_path):
  eng = _sglang(server, tmp_path, sync_check_tol=1e-9)  # tighter than float error: the faithful update fails
  with pytest.raises(SyncCheckFailed, match=r"reports serving it \(0\), but .* \(tolerance 1e-09, "
                                            r"config.rollout.server.sync_check_tol; "):
    eng.sync(P0, 0)
  server.stale = "weights"
  loose = _sglang(server, tmp_path, sync_check_tol=100.0)
  loose.sync(P1, 1)  # other weights, inside a tolerance of 100 nats
  assert 2.0 < loose.metrics()["engine/sync_probe_max_abs_dlogp"] < 100.0
  server.probes = 0
  off = _sglang(server, tmp_path, sync_check=False)
  off.sync(P1, 2)
  assert server.probes == 0 and "engine/sync_version" not in off.metrics() and off.version == 2


def test_an_update_that_takes_too_long_fails_the_sync(server, tmp_path):
  eng = _sglang(server, tmp_path, sync_timeout_s=0.3)
  server.update_s = 1.0
  with pytest.raises(SyncTimeout) as e:
    eng.sync(P0, 0)
  assert re.fullmatch(r"rollout engine: the weight sync of policy version 0 timed out: http://127.0.0.1:\d+/"
                      r"update_weights_from_disk of \S+/policy-v0 did not finish within "
                      r"config.rollout.server.sync_timeout_s=0.3 s", _one_line(e.value)), str(e.value)
  assert eng.metrics()["engine/sync_timeouts"] == 1.0 and eng.metrics()["engine/syncs"] == 0.0


def test_a_server_that_cannot_say_what_it_serves_fails_the_sync(server, tmp_path):
  eng = _sglang(server, tmp_path)
  server.weight_version = None
  server.load = None
  server.update = lambda req: {"success": True, "message": "loaded"}  # an SGLang without weight versions
  with pytest.raises(SyncCheckFailed, match=r"policy version 0 is not verified: the server does not say which "
                                            r"weights it serves \(GET http://127.0.0.1:\d+/model_info: .*404"):
    eng.sync(P0, 0)


# ---- llama.cpp's server process (the stand-in program) ---------------------------------------------

def test_a_restarted_server_that_kept_its_first_file_fails_the_sync(tmp_path):
  marker = tmp_path / "first-file"
  eng = _managed(flags=f"--stale {marker}")
  try:
    eng.sync(P0, 0)
    assert eng.metrics()["engine/sync_version"] == 0.0
    with pytest.raises(SyncCheckFailed) as e:
      eng.sync(P1, 1)
    msg = _one_line(e.value)
    first = marker.read_text()
    assert first.endswith("policy-v0.f32.gguf")
    assert re.search(rf"policy version 1 is not verified: the server reports serving version 0 \({re.escape(first)}\), "
                     r"and its log-probs .* = [0-9.]+ \(tolerance 0.001, measured for 'f32' weights", msg), msg
  finally:
    eng.close()


def test_a_server_slow_to_restart_fails_the_sync(tmp_path):
  eng = _managed(flags="--load-s 30", sync_timeout_s=1.0)
  try:
    with pytest.raises(SyncTimeout, match=r"weight sync of policy version 0 timed out: the llama.cpp server's "
                                          r"restart on \S+policy-v0.f32.gguf did not finish within "
                                          r"config.rollout.server.sync_timeout_s=1 s") as e:
      eng.sync(P0, 0)
    _one_line(e.value)
    assert not eng.process.alive() and eng.metrics()["engine/sync_timeouts"] == 1.0
  finally:
    eng.close()


# ---- the trainer: the step fails ------------------------------------------------------------------------

@pytest.mark.slow
def test_a_stale_server_fails_the_rl_step(tmp_path, quiet_log):
  from run_helpers import load_config, make_trainer, shrink

  from jaxrl_llm.training.config import from_config_dict

  c = shrink(load_config("grpo"), **{"rollout.engine": "openai",
                                     "rollout.server.command": f"{sys.executable} {FAKE} --stale {tmp_path / 'm'}",
                                     "rollout.server.concurrency": 4, "rollout.server.backoff_s": 0.01,
                                     "train.steps": 2})
  tr = make_trainer(from_config_dict(c), tmp_path / "run", quiet_log)
  state = tr.start_rl(tr.setup_extensions(tr.init_state(jax.random.key(0))))
  eng = tr.context.engine
  try:
    state, metrics = tr.step(state)  # the first sync: the file the server started on
    assert metrics["engine/sync_version"] == 0.0 and metrics["engine/sync_probe_max_abs_dlogp"] < 1e-3
    with pytest.raises(SyncCheckFailed, match=r"policy version 1 is not verified: the server reports serving "
                                              r"version 0 \(\S+policy-v0.f32.gguf\)"):
      tr.step(state)
  finally:
    eng.close()
