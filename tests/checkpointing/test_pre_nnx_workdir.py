"""A workdir written before the decoder became Flax NNX modules still resumes.

tests/data/pre_nnx_workdir is the run of tests/checkpointing/test_resume.py's command (the tiny
model, gspo, train.steps=4) made by the package at commit b095d40, the last one whose decoder was
plain functions over a params dict, cut back to what a crash after step 2 leaves: checkpoint 2,
the config, the first two metrics rows. params_step4.npz holds that same version's params at the
end of the uninterrupted run.

Resuming it with today's code must restore step 2 as written and finish the run with the old
version's final params: the NNX modules' state is the same tree of the same arrays, and the
computation the same. (A deliberate change of numerics would show here first, as a small
difference: the tolerance is f32 rounding over two steps; measured when it was written: equal
bit for bit.)
"""

import os
import shutil
import subprocess
import sys

import numpy as np
import orbax.checkpoint as ocp

from run_helpers import ONE_DEVICE_XLA_FLAGS
from jaxrl_llm.training.tiny import WARM_TINY_RUN, config_flags

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURE = os.path.join(REPO, "tests", "data", "pre_nnx_workdir")


def flat_params(checkpoint) -> dict:
  params = ocp.PyTreeCheckpointer().restore(str(checkpoint / "state"))["params"]
  return {"/".join(map(str, k)): np.asarray(v) for k, v in ocp.tree.to_flat_dict(params).items()}


def test_workdir_from_before_nnx_resumes_and_ends_where_that_version_ended(tmp_path):
  workdir = tmp_path / "run"
  shutil.copytree(FIXTURE, workdir, ignore=shutil.ignore_patterns("params_step4.npz"))
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=ONE_DEVICE_XLA_FLAGS)
  cmd = [sys.executable, "-m", "jaxrl_llm.train", "--config=configs/gspo.py",
         *config_flags({**WARM_TINY_RUN, "train.steps": 4}), f"--workdir={workdir}"]
  proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert "resumed from checkpoint step 2" in proc.stdout + proc.stderr

  got, at_step2 = (flat_params(workdir / "checkpoints" / str(step)) for step in (4, 2))
  want = dict(np.load(os.path.join(FIXTURE, "params_step4.npz")))
  assert got.keys() == want.keys()
  # Steps 3 and 4 moved the weights (so agreeing at step 4 says something).
  assert not np.array_equal(at_step2["layers/wq_LDNH"], want["layers/wq_LDNH"])
  for name in want:
    np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)
  rows = [line for line in open(workdir / "metrics.jsonl")]
  assert len(rows) == 4
