"""The sync check against a server one optimizer step behind (sampling/sync_check.py, point 3): it reports the
new version but its log-probs are the previous sync's weights'. One real AdamW step of the tiny model moves the
probe by ~2e-3 nats (mean; max ~6e-3, q4_0 ~2e-2), inside every export type's tolerance but f32's, so only the
comparison with the previous sync's exported weights catches it; for every export type it does, and an honest
server passes.

Stand-ins (fake_openai_server.py, in this process): SGLang's update in place scoring with the checkpoint it
loaded (numpy_llama.from_hf), and llama.cpp's restart on a GGUF export done in place: the stand-in scores with
the file's decoder (numpy_llama.from_gguf, dequantised by the gguf package, not by the engine's code). The
fault: `stale = "weights"`, a reload that keeps the weights it had and reports the new ones.
"""

import os
import re
import sys

import numpy as np
import pytest

from jaxrl_llm.sampling.openai_engine import OpenAIEngine
from jaxrl_llm.sampling.sync_check import (
    PROBE_LEN, SYNC_TOLERANCE, SyncCheckFailed, closer_to_previous, probe_distances, trainer_logp)
from jaxrl_llm.sampling.weight_sync import RestartSync, SGLangDiskSync

sys.path.insert(0, os.path.dirname(__file__))
import numpy_llama  # noqa: E402
from openai_stand_in import MODEL, TOK, hf_scorer, policies, sampling, server, settings  # noqa: E402,F401

class GGUFInPlace(RestartSync):
  """RestartSync's GGUF export and its /props check; its restart done in place on the in-process stand-in,
  which then scores with the file's decoder, or, with `stale = "weights"`, keeps the decoder it had and
  reports the new file."""

  def __init__(self, srv, qtype: str, out_dir: str):
    super().__init__(model_cfg=MODEL, tokenizer=TOK, qtype=qtype, hf_path="", out_dir=out_dir)
    self.srv = srv

  def load(self, engine, exported, deadline) -> float:
    del engine, deadline
    if self.srv.stale != "weights":
      model = numpy_llama.from_gguf(exported.path)
      self.srv.scorer = lambda prefix: numpy_llama.llama_logits(model, prefix)
    self.srv.model_path = self.current = exported.path
    return 0.0


def _engine(srv, export: str, tmp_path) -> OpenAIEngine:
  if export == "hf":
    srv.load = hf_scorer
    sync = SGLangDiskSync(model_cfg=MODEL, out_dir=str(tmp_path / "w"))
  else:
    os.makedirs(tmp_path / "w")
    sync = GGUFInPlace(srv, export, str(tmp_path / "w"))
  return OpenAIEngine(model_cfg=MODEL, sampling_cfg=sampling(), tokenizer=TOK,
                      settings=settings(srv.url, sync="sglang" if export == "hf" else "none"), weight_sync=sync)


def _file_logp(path: str, probe) -> np.ndarray:
  """The probe's log-probs of an exported file, in numpy float64 (the stand-in's own decoder)."""
  model = numpy_llama.from_gguf(path) if path.endswith(".gguf") else numpy_llama.from_hf(path)
  return np.array([numpy_llama.log_softmax(numpy_llama.llama_logits(model, probe[:t]))[probe[t]]
                   for t in range(1, PROBE_LEN)])


def test_the_rule():
  # dist_prev < dist_new and dist_prev < gap / 2; NaN (no previous sync) never fails
  assert closer_to_previous(0.3, 0.01, 0.3) and not closer_to_previous(0.01, 0.3, 0.3)
  assert not closer_to_previous(0.3, 0.2, 0.3)  # closer to the previous, but not within half the update's move
  assert not closer_to_previous(0.2, 0.1, 0.0) and not closer_to_previous(0.1, float("nan"), float("nan"))
  theirs, new, prev = np.array([-1.0, -2.0, -3.0]), np.array([-1.0, -2.5, -3.0]), np.array([-1.2, -2.0, -2.0])
  # max |t - n| = 0.5; mean |t - n| = 0.5 / 3; mean |t - p| = (0.2 + 0 + 1) / 3; mean |n - p| = (0.2 + 0.5 + 1) / 3
  np.testing.assert_allclose(probe_distances(theirs, new, prev), (0.5, 0.5 / 3, 1.2 / 3, 1.7 / 3), rtol=1e-12)
  assert probe_distances(theirs, new, None)[2:] == pytest.approx((float("nan"),) * 2, nan_ok=True)


@pytest.mark.parametrize("export", ["f32", "f16", "q8_0", "q4_0", "hf"])
def test_a_server_one_optimizer_step_behind_is_caught_and_an_honest_one_passes(server, tmp_path, export):
  p0, p1, p2 = policies()
  eng = _engine(server, export, tmp_path)
  eng.sync(p0, 0)
  v0 = eng.weight_sync.current if export != "hf" else str(tmp_path / "w" / "policy-v0")
  want0 = _file_logp(v0, eng.probe_L)  # before the next sync removes the file
  eng.sync(p1, 1)  # honest: the new weights, closer to them than to the previous ones
  m = eng.metrics()
  v1 = eng.weight_sync.current if export != "hf" else str(tmp_path / "w" / "policy-v1")
  want1 = _file_logp(v1, eng.probe_L)
  gap = float(np.abs(want1 - want0).mean())  # how far the step moved the exported weights' probe log-probs
  print(f"{export}: one AdamW step moves the probe by mean {gap:.2e}, max {np.abs(want1 - want0).max():.2e}")
  assert np.abs(want1 - want0).max() > 1e-3
  if export != "f32":  # inside the tolerance: the tolerance alone cannot tell the two versions apart
    assert np.abs(want1 - want0).max() < SYNC_TOLERANCE[export]
  assert m["engine/syncs"] == 2.0 and m["engine/sync_check_failures"] == 0.0
  assert m["engine/sync_probe_dist_new"] < 1e-5  # float32 trainer on the exported weights, float64 stand-in
  # the trainer's exported weights (engine code: weight_sync.exported_weights) are the file's (gguf's dequantiser)
  assert m["engine/sync_probe_dist_prev"] == pytest.approx(gap, rel=1e-3)
  if export in ("f16", "q8_0", "q4_0"):  # the rounding is the export's: params as trained score elsewhere
    raw = trainer_logp(p1, MODEL, eng.probe_L)
    assert np.abs(raw - want1).mean() > 10 * m["engine/sync_probe_dist_new"]

  server.stale = "weights"  # the next reload keeps version 1's weights and reports version 2
  with pytest.raises(SyncCheckFailed) as e:
    eng.sync(p2, 2)
  msg = str(e.value)
  assert "\n" not in msg
  tag = re.escape(eng.weight_sync.current if export != "hf" else "2")
  got = re.fullmatch(
      rf"rollout engine: the weight sync of policy version 2 is not verified: the server reports serving it \({tag}\), "
      rf"but its log-probs of the probe \({PROBE_LEN} fixed tokens\) are those of the previous sync's weights "
      r"\(version 1\): mean \|delta log p\| = (\S+) to them, (\S+) to version 2's, which the update moved by (\S+) "
      r"\(rule: fails when the distance to the previous weights is below the distance to the new ones and below "
      r"half the update's move; config.rollout.server.sync_check=False turns the check off\)", msg)
  assert got, msg
  m = eng.metrics()
  assert m["engine/sync_check_failures"] == 1.0 and m["engine/syncs"] == 2.0 and eng.version == 1
  if export != "f32":
    assert m["engine/sync_probe_max_abs_dlogp"] < SYNC_TOLERANCE[export]  # the hole: inside the tolerance
  check = eng.last_check
  assert m["engine/sync_probe_dist_prev"] == check.dist_prev < 1e-5 and check.prev_version == 1
  # the server scores as version 1's file: its distance to the new weights is the step's move, v1 -> v2
  assert m["engine/sync_probe_dist_new"] == check.dist_new == pytest.approx(check.gap, rel=1e-3)
  assert check.gap > 1e-4
  printed = [float(x) for x in got.groups()]  # 3 significant digits
  np.testing.assert_allclose(printed, [check.dist_prev, check.dist_new, check.gap], rtol=5e-3)
