"""Two local CPU processes (gloo collectives) run one sharded forward and
backward over a (2, 2, 2) mesh spanning both; each must agree with the same
step run in this single process on its 8 fake devices."""

import json
import os
import socket
import subprocess
import sys

import pytest

from jaxrl_llm.model.distributed import DistributedConfig, config_from_env, initialize
from jaxrl_llm.model.sharding import MeshConfig, make_mesh

import multihost_step

HERE = os.path.dirname(__file__)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_processes_agree_with_single_process(tmp_path):
  port = _free_port()
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  procs, outs = [], []
  for pid in range(2):
    out = tmp_path / f"p{pid}.json"
    outs.append(out)
    procs.append(subprocess.Popen(
        [sys.executable, os.path.join(HERE, "multihost_worker.py"), str(pid), str(port), str(out)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
  logs = []
  for p in procs:
    try:
      logs.append(p.communicate(timeout=240)[0])
    except subprocess.TimeoutExpired:
      for q in procs:
        q.kill()
      pytest.fail("multi-process workers timed out")
  for p, log in zip(procs, logs):
    assert p.returncode == 0, log[-3000:]

  ref = multihost_step.run(make_mesh(MeshConfig(2, 2, 2)))
  results = [json.loads(o.read_text()) for o in outs]
  assert sorted(r["process_index"] for r in results) == [0, 1]
  for r in results:
    # Same program, same mesh shape, same shards: only the collectives'
    # transport differs (gloo vs in-process), so agreement is to f32 rounding.
    assert r["loss"] == pytest.approx(ref["loss"], rel=1e-6)
    assert r["grad_sq"].keys() == ref["grad_sq"].keys()
    for name, value in ref["grad_sq"].items():
      assert value > 0, name
      assert r["grad_sq"][name] == pytest.approx(value, rel=1e-5), name


def test_config_from_env():
  assert config_from_env({}) is None
  cfg = config_from_env({"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234", "JAX_NUM_PROCESSES": "4",
                         "JAX_PROCESS_ID": "3", "JAX_LOCAL_DEVICE_IDS": "0,1"})
  assert cfg == DistributedConfig("10.0.0.1:1234", 4, 3, local_device_ids=(0, 1))
  with pytest.raises(ValueError, match=r"\['JAX_PROCESS_ID'\] missing"):
    config_from_env({"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "2"})
  with pytest.raises(ValueError, match="JAX_NUM_PROCESSES must be an integer"):
    config_from_env({"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "two",
                     "JAX_PROCESS_ID": "0"})


def test_config_validation():
  with pytest.raises(ValueError, match="coordinator_address"):
    DistributedConfig("localhost", 2, 0)
  with pytest.raises(ValueError, match=r"process_id must be in \[0, 2\)"):
    DistributedConfig("h:1", 2, 2)
  with pytest.raises(ValueError, match="cpu_collectives"):
    DistributedConfig("h:1", 2, 0, cpu_collectives="nccl")


def test_single_process_is_a_no_op(monkeypatch):
  for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "SLURM_JOB_ID",
               "OMPI_COMM_WORLD_SIZE", "TPU_WORKER_HOSTNAMES", "MEGASCALE_COORDINATOR_ADDRESS",
               "JOBSET_NAME"):
    monkeypatch.delenv(name, raising=False)
  assert initialize() is False

