"""metrics.jsonl and TensorBoard events, including the cut-back on resume."""

import glob
import json
import os
import struct

import numpy as np
from tensorboardX.proto import event_pb2

from jaxrl_llm.rundir.metrics import TensorBoardWriter, read_metrics, truncate_metrics


def records(path):
  """Payloads of a TFRecord file (u64 length, u32 crc, payload, u32 crc)."""
  data, pos, out = open(path, "rb").read(), 0, []
  while pos < len(data):
    (n,) = struct.unpack("<Q", data[pos:pos + 8])
    out.append(data[pos + 12:pos + 12 + n])
    pos += 12 + n + 4
  return out


def tb_scalars(logdir):
  """(tag, step, value) of every scalar in the event files."""
  out = []
  for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
    for rec in records(path):
      ev = event_pb2.Event.FromString(rec)
      out += [(v.tag, ev.step, v.simple_value) for v in ev.summary.value]
  return out


def test_tensorboard_scalars_and_purge_on_resume(tmp_path):
  w = TensorBoardWriter(str(tmp_path))
  w.write(1, {"reward/mean": np.float32(0.5), "kl": 0.01, "note": "x", "ok": True})
  w.write(2, {"reward/mean": 0.75, "kl": float("nan")})
  w.write(3, {"reward/mean": 0.8})
  w.close()
  # Strings, booleans and NaN are kept out of TensorBoard.
  assert sorted(tb_scalars(os.path.join(tmp_path, "tb"))) == sorted([
      ("reward/mean", 1, 0.5), ("kl", 1, np.float32(0.01)), ("reward/mean", 2, 0.75),
      ("reward/mean", 3, np.float32(0.8))])
  # Resuming from step 1: the process writes step 2 again; TensorBoard is told
  # to purge events after step 1 (a purge marker at step 2 in the new file).
  w = TensorBoardWriter(str(tmp_path), resume_step=1)
  w.write(2, {"reward/mean": 0.25})
  w.close()
  files = sorted(glob.glob(os.path.join(tmp_path, "tb", "events.out.tfevents.*")),
                 key=os.path.getmtime)
  assert len(files) == 2  # the first file is kept, not reopened
  events = [event_pb2.Event.FromString(p) for p in records(files[1])]
  # The purge marker: events at step 2 before any summary, which make
  # TensorBoard hide the old file's events from step 2 on.
  markers = [e.step for e in events if not e.summary.value]
  assert markers == [0, 2, 2]  # the file header, then the marker pair
  assert [(v.tag, e.step, v.simple_value) for e in events for v in e.summary.value] == [
      ("reward/mean", 2, 0.25)]


def test_resume_cuts_rows_after_the_checkpoint_and_partial_lines(tmp_path):
  path = os.path.join(tmp_path, "metrics.jsonl")
  with open(path, "w") as f:
    for s in range(1, 6):
      f.write(json.dumps({"step": s, "r": s / 10}) + "\n")
    f.write('{"step": 6, "r": 0.')  # cut by a kill mid-write
  assert [r["step"] for r in read_metrics(path)] == [1, 2, 3, 4, 5]
  assert truncate_metrics(path, 3) == 3
  assert read_metrics(path) == [{"step": 1, "r": 0.1}, {"step": 2, "r": 0.2},
                                {"step": 3, "r": 0.3}]
  assert open(path).read().endswith("\n")  # appending after the cut starts a new line
  assert truncate_metrics(path, 0) == 0  # a fresh run: nothing kept
  assert read_metrics(path) == []
  assert truncate_metrics(os.path.join(tmp_path, "absent.jsonl"), 3) == 0
