"""The teacher inside the trainer: short fixed-seed runs (tiny model) and config errors."""

import json

import pytest

from conftest import load_config, shrink
from jaxrl_llm.training.config import from_config_dict
from jaxrl_llm.training.loop import Trainer


def _rows(path):
  return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_opd_moves_the_student_towards_the_teacher(tmp_path, quiet_log):
  """Pure distillation (rl_coef = 0): the reverse KL to a fixed teacher falls step after step.

  The teacher is the SFT-made one (correct demonstrations), the student starts
  from scratch (sft.steps = 0), so the gap is large and one signal drives it.
  """
  c = shrink(load_config("opd"), **{"train.steps": 6, "train.lr": 3e-3, "train.warmup_steps": 0, "teacher.sft_steps": 60,
                                    "sft.batch_size": 32})
  cfg = from_config_dict(c)
  assert cfg.teacher.signal == "distill" and cfg.teacher.rl_coef == 0.0
  Trainer(cfg, str(tmp_path), log=quiet_log).run()
  rows = _rows(tmp_path)
  kl = [r["teacher/kl_student_teacher"] for r in rows]
  # The loss term is the KL of the batch (token mean, weight 1): same number two ways.
  for r in rows:
    assert r["loss/teacher"] == pytest.approx(r["teacher/kl_student_teacher"], rel=1e-4)
    assert r["loss/pg"] == 0.0 and r["teacher/routed_frac"] == 1.0
  assert kl[-1] < 0.7 * kl[0], kl


@pytest.mark.slow
def test_rlsd_and_srpo_runs_log_their_routing(tmp_path, quiet_log):
  for name in ("rlsd", "srpo"):
    c = shrink(load_config(name), **{"train.steps": 2, "teacher.hint_sft_steps": 20, "sft.batch_size": 16})
    out = tmp_path / name
    Trainer(from_config_dict(c), str(out), log=quiet_log).run()
    for r in _rows(out):
      assert 0.0 <= r["teacher/routed_frac"] <= 1.0
      assert r["teacher/entropy"] > 0.0
      if name == "srpo":  # failed samples with a hint go to the teacher: 1 - accuracy
        assert r["teacher/routed_frac"] == pytest.approx(1.0 - r["reward/accuracy"])
        assert "loss/teacher" in r
      else:
        assert r["teacher/routed_frac"] == 0.0 and "loss/teacher" not in r


def test_missing_teacher_checkpoint_fails_before_rl(tmp_path, quiet_log):
  c = shrink(load_config("opd"), **{"teacher.source": "checkpoint",
                                    "teacher.checkpoint": str(tmp_path / "no_such_teacher")})
  with pytest.raises(FileNotFoundError, match="teacher.checkpoint=.*no_such_teacher.*does not exist"):
    Trainer(from_config_dict(c), str(tmp_path / "run"), log=quiet_log).run()
  c.teacher.jsd_beta = 2.0
  with pytest.raises(ValueError, match=r"teacher.jsd_beta=2.0"):
    from_config_dict(c)
