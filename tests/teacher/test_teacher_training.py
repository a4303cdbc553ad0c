"""The teacher inside the trainer: short fixed-seed runs (tiny model) and config errors."""

import json

import pytest

from run_helpers import load_config, make_trainer, shrink
from jaxrl_llm.training.config import from_config_dict
from jaxrl_llm.training.loop import Trainer


def _rows(path):
  return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_opd_trains_on_the_reverse_kl_to_the_teacher(tmp_path, quiet_log):
  """Pure distillation (rl_coef = 0): the loss the update minimises is the batch's reverse KL.

  The teacher is the SFT-made one (correct demonstrations), the student starts
  from scratch (sft.steps = 0). The KL on fresh rollouts is too noisy over a
  few steps to show a trend on a tiny model, so this checks the wiring: the
  loss term equals KL(p || q) computed independently by the teacher stage, the
  reward branch is off, and the gradient reaches the weights.
  """
  c = shrink(load_config("opd"), **{"train.steps": 3, "teacher.sft_steps": 30, "sft.batch_size": 32})
  cfg = from_config_dict(c)
  assert cfg.teacher.signal == "distill" and cfg.teacher.rl_coef == 0.0
  Trainer(cfg, str(tmp_path), log=quiet_log).run()
  rows = _rows(tmp_path)
  assert len(rows) == 3
  for r in rows:
    assert r["teacher/kl_student_teacher"] > 1e-3  # a real gap to close
    assert r["loss/teacher"] == pytest.approx(r["teacher/kl_student_teacher"], rel=1e-4)
    assert r["loss/total"] == pytest.approx(r["loss/teacher"], rel=1e-4)
    assert r["loss/pg"] == 0.0 and r["teacher/routed_frac"] == 1.0
    assert r["grad/norm"] > 0.0


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


@pytest.mark.slow
def test_routed_topk_sign_gated_distillation_trains(tmp_path, quiet_log):
  """route_by_tag, topk and sign_gate together in the trainer.

  The arithmetic prompts carry the tag "arithmetic", routed to a saved teacher
  (another width than the student: only the vocabulary must match). The
  reward is parity_reward, so groups have advantages of both signs and the
  sign gate opens on some tokens, not all.
  """
  import jax
  from jaxrl_llm import model as model_lib
  from jaxrl_llm.model.io import hf_io
  from jaxrl_llm.model.tokenizer import CharTokenizer

  tcfg = model_lib.ModelConfig.tiny(CharTokenizer().vocab_size, d_model=48, n_layers=1, n_heads=2, n_kv_heads=1,
                                    head_dim=24, d_ff=64)
  hf_io.save_hf(model_lib.init_params(tcfg, jax.random.key(7)), tcfg, str(tmp_path / "teacher"))
  c = shrink(load_config("opd"), **{
      "train.steps": 2, "teacher.source": "checkpoint", "teacher.signal": "distill", "teacher.rl_coef": 1.0,
      "teacher.route_by_tag": f"arithmetic={tmp_path / 'teacher'}",
      "teacher.topk": 8, "teacher.topk_tail": "bucket", "teacher.sign_gate": True})
  make_trainer(from_config_dict(c), tmp_path / "run", quiet_log).run()
  rows = _rows(tmp_path / "run")
  assert len(rows) == 2
  for r in rows:
    assert r["teacher/has_teacher_frac"] == 1.0 and r["teacher/routed_frac"] == 1.0
    assert 0.0 < r["teacher/gate_open_frac"] < 1.0
    assert 0.0 < r["loss/teacher"] < 10.0
    assert r["grad/norm"] > 0.0


def test_missing_teacher_checkpoint_fails_before_rl(tmp_path, quiet_log):
  c = shrink(load_config("opd"), **{"teacher.source": "checkpoint",
                                    "teacher.checkpoint": str(tmp_path / "no_such_teacher")})
  with pytest.raises(FileNotFoundError, match="teacher.checkpoint=.*no_such_teacher.*does not exist"):
    Trainer(from_config_dict(c), str(tmp_path / "run"), log=quiet_log).run()
  c.teacher.jsd_beta = 2.0
  with pytest.raises(ValueError, match=r"teacher.jsd_beta=2.0"):
    from_config_dict(c)
