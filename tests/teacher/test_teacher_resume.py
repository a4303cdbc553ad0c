"""A moving self-teacher survives a resume: its weights are saved with the run's
checkpoints, so a run stopped and resumed continues with the same teacher."""

import os
import shutil

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from run_helpers import load_config, shrink
from jaxrl_llm.training.config import from_config_dict
from jaxrl_llm.training.loop import Trainer

STEPS = 4


def _trainer(workdir, log):
  # SDPO (reverse KL to the hinted self-teacher) with an EMA teacher that moves a lot each step.
  c = shrink(load_config("sdpo"), **{"teacher.schedule": "ema", "teacher.ema_decay": 0.5,
                                     "teacher.hint_sft_steps": 0, "train.steps": STEPS, "train.lr": 3e-3,
                                     "train.warmup_steps": 0, "checkpoint.every_steps": 1})
  # On the 8-device test mesh: the restored state (PRNG key and step included) must land on it.
  return Trainer(from_config_dict(c), str(workdir), log=log)


def _leaves(tree):
  return [np.asarray(x) for x in jax.tree.leaves(tree)]


def _saved(workdir, step):
  return ocp.PyTreeCheckpointer().restore(os.path.join(workdir, "checkpoints", str(step), "state"))


@pytest.mark.slow
def test_ema_self_teacher_stopped_and_resumed_equals_the_uninterrupted_run(tmp_path, quiet_log):
  """Tolerance: none (bitwise), as for the plain resume: same programs, same device, same seeds.

  The stopped run is the uninterrupted one's workdir without its last
  checkpoint (same config, so the same learning-rate schedule): the resume
  starts at step 3 and redoes step 4.
  """
  full = _trainer(tmp_path / "full", quiet_log)
  full.run()
  shutil.copytree(tmp_path / "full", tmp_path / "resumed")
  shutil.rmtree(tmp_path / "resumed" / "checkpoints" / str(STEPS))
  logs = []
  resumed = _trainer(tmp_path / "resumed", logs.append)
  resumed.run()
  assert any("resumed from checkpoint step 3" in line for line in logs)

  # The teacher is not a function of the checkpointed TrainState: at the resume point
  # it has moved away from theta_0 and from the student, so rebuilding it would give
  # another teacher. (The first update has learning rate 0 under the warm-up, so
  # phi_1 = theta_0: the resume point is step 3.)
  saved3 = _saved(tmp_path / "resumed", 3)
  init = _leaves(full.init_state(jax.random.key(0)).params)
  teacher3 = _leaves(saved3["teacher_params"])
  assert any(not np.array_equal(t, i) for t, i in zip(teacher3, init))
  assert any(not np.array_equal(t, s) for t, s in zip(teacher3, _leaves(saved3["params"])))

  for a, b in zip(_leaves(full.extension("teacher").stage.params), _leaves(resumed.extension("teacher").stage.params)):
    np.testing.assert_array_equal(a, b)
  for a, b in zip(_leaves(full.final_state.params), _leaves(resumed.final_state.params)):
    np.testing.assert_array_equal(a, b)
  end_full, end_resumed = _saved(tmp_path / "full", STEPS), _saved(tmp_path / "resumed", STEPS)
  for a, b in zip(_leaves(end_full["teacher_params"]), _leaves(end_resumed["teacher_params"])):
    np.testing.assert_array_equal(a, b)
  assert full.history[-1]["teacher/kl_student_teacher"] == resumed.history[-1]["teacher/kl_student_teacher"]
