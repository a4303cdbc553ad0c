"""Damaged checkpoints on disk are detected and the previous one is used;
a process killed mid-save leaves the previous checkpoint usable."""

import os
import signal
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.checkpointing import (
    CheckpointConfig, CheckpointManager, CorruptCheckpointError)


def state_at(step: int):
  return {"w": jnp.full((64, 8), float(step)), "count": jnp.asarray(step)}


def save_steps(path, steps):
  with CheckpointManager(str(path), CheckpointConfig(keep_last=5)) as m:
    for s in steps:
      m.save(s, state_at(s), data_state={"index": 10 * s})


def array_files(step_dir):
  """The data files of the state item (the biggest ones Orbax writes)."""
  out = []
  for root, _, files in os.walk(os.path.join(step_dir, "state")):
    out += [os.path.join(root, f) for f in files]
  return sorted(out, key=os.path.getsize, reverse=True)


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_damaged_latest_falls_back_to_previous(tmp_path, damage):
  save_steps(tmp_path, [1, 2, 3])
  victim = array_files(os.path.join(tmp_path, "3"))[0]
  if damage == "truncate":
    size = os.path.getsize(victim)
    with open(victim, "r+b") as f:
      f.truncate(size // 2)
  elif damage == "flip":
    with open(victim, "r+b") as f:
      f.seek(os.path.getsize(victim) // 2)
      byte = f.read(1)
      f.seek(-1, os.SEEK_CUR)
      f.write(bytes([byte[0] ^ 0xFF]))
  else:
    os.remove(victim)
  m = CheckpointManager(str(tmp_path), CheckpointConfig(keep_last=5))
  r = m.restore(state_at(0))
  assert r.step == 2
  assert [s for s, _ in r.skipped] == [3]
  rel = os.path.relpath(victim, os.path.join(tmp_path, "3"))
  assert rel in r.skipped[0][1]
  np.testing.assert_array_equal(r.state["w"], np.full((64, 8), 2.0))
  assert int(r.state["count"]) == 2
  assert r.data_state == {"index": 20}
  # Asking for the damaged step explicitly is an error, not a silent fallback.
  with pytest.raises(CorruptCheckpointError, match=r"step 3 .* is damaged: .*" + rel):
    m.restore(state_at(0), step=3)


def test_all_damaged_is_an_error_listing_each_step(tmp_path):
  save_steps(tmp_path, [1, 2])
  for s in (1, 2):
    os.remove(array_files(os.path.join(tmp_path, str(s)))[0])
  with pytest.raises(CorruptCheckpointError, match=r"every checkpoint .*step 2: .*step 1: "):
    CheckpointManager(str(tmp_path)).restore(state_at(0))


def test_kill_mid_save_keeps_previous_checkpoint(tmp_path):
  """SIGKILL right after an async save of step 2 starts: step 1 stays usable."""
  # The kill races the background write: on a loaded machine the write can win (the main thread is
  # not scheduled before it ends). Up to 3 tries, each in a fresh folder, until one kill lands mid-save.
  for attempt in range(3):
    folder = tmp_path / f"try{attempt}"
    script = textwrap.dedent(f"""
        import os, signal
        import jax.numpy as jnp
        from jaxrl_llm.checkpointing import CheckpointConfig, CheckpointManager
        m = CheckpointManager({str(folder)!r}, CheckpointConfig(async_save=True))
        m.save(1, {{"w": jnp.full((64, 8), 1.0), "count": jnp.asarray(1)}})
        m.wait()
        # 64 MB, so the background write of step 2 is still running at the kill.
        m.save(2, {{"w": jnp.full((4096, 4096), 2.0), "count": jnp.asarray(2)}})
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    if [d for d in os.listdir(folder) if "tmp" in d]:
      break
  else:
    pytest.fail("in 3 tries the kill came after step 2 committed: the test did not test")
  tmp_path = folder
  m = CheckpointManager(str(tmp_path))
  assert m.all_steps() == [1]
  r = m.restore(state_at(0))
  assert r.step == 1
  np.testing.assert_array_equal(r.state["w"], np.full((64, 8), 1.0))
  # The resumed run saves step 2 again over the leftover temporary.
  m.save(2, state_at(2))
  m.close()
  assert [d for d in os.listdir(tmp_path) if "tmp" in d] == []
  r = CheckpointManager(str(tmp_path)).restore(state_at(0))
  assert r.step == 2 and int(r.state["count"]) == 2
