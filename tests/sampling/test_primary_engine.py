"""`PrimaryEngine` (sampling/primary_engine.py): an external engine in a run of several processes,
made and driven by process 0, its results and errors broadcast. Two local processes (gloo) over a
stand-in engine, against what the same calls give in one process."""

import json
import os
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

import primary_engine_worker as worker

HERE = os.path.dirname(__file__)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.mark.multiprocess
def test_process_0_drives_the_engine_and_every_process_gets_its_results(tmp_path):
  port, env = _free_port(), {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAXRL_LLM_FAULT")}
  procs, outs = [], [tmp_path / f"p{pid}.json" for pid in range(2)]
  for pid in range(2):
    procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, "primary_engine_worker.py"), str(pid),
                                   str(port), str(outs[pid])], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True))
  for p in procs:
    try:
      log = p.communicate(timeout=240)[0]
    except subprocess.TimeoutExpired:
      for q in procs:
        q.kill()
      pytest.fail("the two processes did not end")
    assert p.returncode == 0, log[-3000:]
  p0, p1 = (json.loads(o.read_text()) for o in outs)

  # One engine, in process 0; the others hold none and send nothing.
  assert (p0["made_here"], p1["made_here"]) == (1, 0) and "calls" not in p1
  assert p0["calls"] == ["sync", "sync", "generate", "turn", "turn", "generate", "generate", "close"]
  # The due sync got the whole sharded array gathered ([10] from process 0, [20] from process 1); the
  # one that was not due got nothing (no gather).
  assert p0["synced"] == [{"w": [10.0, 20.0]}, None]
  # What the engine returned, and its version and counters, in every process.
  key = jax.random.key(3)
  want = {"ids": [2, 3], "draw": np.asarray(jax.random.randint(key, (3,), 0, 1000)).tolist()}
  turns = [[[[7], 4, r, int(jax.random.randint(jax.random.fold_in(key, r), (), 0, 1000))], [[8], 0, r, None]]
           for r in range(2)]
  for r in (p0, p1):
    assert r["version0"] == -1 and r["version"] == 3
    assert r["batch"] == want
    assert r["metrics"] == {"engine/requests": 3.0}  # after the generation: sync, sync, generate
    for got, exp in zip(r["turns"], turns):
      assert [t[:3] for t in got] == [e[:3] for e in exp] and got[0][3] == exp[0][3]
    # process 0's exception, raised in every process at the same call; so is a result that does not pickle
    assert r["error"] == "the server said no"
    assert r["unsent"] in ("PicklingError", "AttributeError"), r["unsent"]
  assert p0["unsent"] == p1["unsent"]


def test_with_one_process_the_engine_is_called_as_it_is():
  from jaxrl_llm.sampling.primary_engine import PrimaryEngine  # pylint: disable=import-outside-toplevel

  inner = worker.StandIn()
  eng = PrimaryEngine(lambda: inner)
  eng.sync({"w": np.ones(2)}, 2)
  eng.sync({"w": np.ones(2)}, 3)
  assert eng.engine is inner and eng.version == 3 and inner.synced == [{"w": [1.0, 1.0]}, None]
  with pytest.raises(ValueError, match="the server said no"):
    eng.generate("fail", jax.random.key(0))
