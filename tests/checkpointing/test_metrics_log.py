"""metrics.jsonl and TensorBoard events, including the cut-back on resume."""

import glob
import json
import os
import struct

import numpy as np
from tensorboardX.proto import event_pb2

from jaxrl_llm.checkpointing.metrics_log import MetricsWriter, read_metrics, truncate_metrics


def tb_scalars(logdir):
  """(tag, step, value) of every scalar in the event files (TFRecord framing:
  u64 length, u32 crc, payload, u32 crc)."""
  out = []
  for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
    data = open(path, "rb").read()
    pos = 0
    while pos < len(data):
      (n,) = struct.unpack("<Q", data[pos:pos + 8])
      ev = event_pb2.Event.FromString(data[pos + 12:pos + 12 + n])
      pos += 12 + n + 4
      for v in ev.summary.value:
        out.append((v.tag, ev.step, v.simple_value))
  return out


def test_writer_rows_and_tensorboard(tmp_path):
  w = MetricsWriter(str(tmp_path))
  w.write(1, {"reward/mean": np.float32(0.5), "kl": 0.01, "note": "x", "ok": True})
  w.write(2, {"reward/mean": 0.75, "kl": float("nan")})
  w.close()
  rows = read_metrics(os.path.join(tmp_path, "metrics.jsonl"))
  assert rows[0] == {"step": 1, "reward/mean": 0.5, "kl": 0.01, "note": "x", "ok": True}
  assert rows[1]["step"] == 2 and rows[1]["reward/mean"] == 0.75
  # Strings, booleans and NaN are kept out of TensorBoard.
  assert sorted(tb_scalars(os.path.join(tmp_path, "tb"))) == sorted([
      ("reward/mean", 1, 0.5), ("kl", 1, np.float32(0.01)), ("reward/mean", 2, 0.75)])


def test_resume_cuts_rows_after_the_checkpoint_and_partial_lines(tmp_path):
  path = os.path.join(tmp_path, "metrics.jsonl")
  with open(path, "w") as f:
    for s in range(1, 6):
      f.write(json.dumps({"step": s, "r": s / 10}) + "\n")
    f.write('{"step": 6, "r": 0.')  # cut by a kill mid-write
  assert [r["step"] for r in read_metrics(path)] == [1, 2, 3, 4, 5]
  w = MetricsWriter(str(tmp_path), resume_step=3, tensorboard=False)
  w.write(4, {"r": 0.4})
  w.close()
  assert read_metrics(path) == [{"step": 1, "r": 0.1}, {"step": 2, "r": 0.2},
                                {"step": 3, "r": 0.3}, {"step": 4, "r": 0.4}]
  assert truncate_metrics(path, 2) == 2
  # A fresh (non-resumed) run in the same workdir starts an empty log.
  MetricsWriter(str(tmp_path), tensorboard=False).close()
  assert read_metrics(path) == []
