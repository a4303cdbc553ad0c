"""Teacher-derived weights in the trainer: the sign gate, routing by task tag (m_i),
their config keys, and bad teacher input failing before training.

The trainer-level weights (TeacherStage.apply on a hand-made batch) must equal
the pure functions of objectives/teacher.py and objectives/teacher_routing.py.
"""

import dataclasses
import json
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
from run_helpers import REPO, load_config, shrink
from teacher_helpers import CFG, P_LEN, TOK, tiny_params

from jaxrl_llm.objectives import teacher as teacher_w
from jaxrl_llm.objectives import teacher_routing
from jaxrl_llm.tasks.arithmetic import ArithmeticTask
from jaxrl_llm.tasks.countdown import CountdownTask
from jaxrl_llm.tasks.files import FileTask
from jaxrl_llm.tasks.math_reward import math_verify_reward
from jaxrl_llm import teacher as tlib
from jaxrl_llm.training.config import from_config_dict
from jaxrl_llm.teacher.config import teacher_preflight

# A hand-made batch of 4 samples x 3 tokens. Row 3's tag has no teacher (m = 0);
# token (1, 2) is padding. The stage's signals are 0 off the mask and off the teacher.
MASK_BR = np.array([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 1]], bool)
HAS_B = np.array([True, True, True, False])
GAP_BR = np.where(MASK_BR & HAS_B[:, None], np.array(
    [[0.5, -0.5, 0.2], [-0.3, -0.1, 0.4], [1.0, -1.0, 0.0], [0.2, 0.3, -0.6]], np.float32), 0.0)
ADV_BR = np.repeat(np.array([[1.0], [-1.0], [0.0], [0.5]], np.float32), 3, axis=1) * MASK_BR
ENT_BR = np.where(MASK_BR, np.array([[0.5, 1.0, 2.0], [0.1, 3.0, 1.0], [1.5, 0.2, 0.7], [1.0, 1.0, 1.0]]), 0.0)
CORRECT_B = np.array([1.0, 0.0, 0.0, 0.0])
# sign(gap) * sign(A) > 0: row 0 (A > 0) at gap > 0, row 1 (A < 0) at gap < 0; A = 0 or gap = 0: closed.
GATE_BR = np.array([[1, 0, 1], [1, 1, 0], [0, 0, 0], [0, 0, 0]], np.float32)


def _signals():
  z = np.zeros_like(GAP_BR)
  return tlib.TeacherSignals(teacher_logp_BR=GAP_BR, student_logp_BR=z, gap_BR=GAP_BR,
                             teacher_entropy_BR=ENT_BR.astype(np.float32), kl_BR=z, has_teacher_B=HAS_B)


@pytest.mark.parametrize("sign_gate", [True, False])
@pytest.mark.parametrize("signal", ["distill", "gap_advantage", "srpo"])
def test_trainer_weights_equal_the_pure_functions(signal, sign_gate):
  kw = dict(coef=1.5, rl_coef=0.5, confidence_beta=0.7, tau_min=0.1, tau_max=0.9)
  cfg = tlib.TeacherConfig(source="sft", signal=signal, sign_gate=sign_gate, **kw)
  stage = tlib.TeacherStage(cfg, None, CFG, CFG, TOK, temperature=1.0, max_prompt_len=P_LEN)
  adv, extra, metrics = stage.apply(_signals(), ADV_BR, MASK_BR, CORRECT_B)

  gap, a = jnp.asarray(GAP_BR), jnp.asarray(ADV_BR)
  np.testing.assert_array_equal(teacher_w.sign_gate(gap, a), GATE_BR)  # the hand-made gate above
  gate = np.asarray(teacher_w.sign_gate(gap, a)) if sign_gate else np.ones_like(GAP_BR)
  tau = np.asarray(teacher_w.confidence_weight(jnp.asarray(ENT_BR), beta=0.7, tau_min=0.1, tau_max=0.9))
  m = HAS_B.astype(np.float32)[:, None]
  if signal == "distill":
    want_adv, want_w = 0.5 * ADV_BR, 1.5 * tau * gate * m
  elif signal == "gap_advantage":
    want_adv, want_w = 0.5 * ADV_BR + 1.5 * tau * gate * GAP_BR * m, None
  else:
    z_grpo, z_sdpo = teacher_routing.srpo_routes(jnp.asarray(CORRECT_B) > 0.5, jnp.asarray(HAS_B))
    np.testing.assert_array_equal(z_sdpo, [0, 1, 1, 0])  # (1 - c) m: row 3 has no teacher
    want_adv, want_w = ADV_BR * np.asarray(z_grpo)[:, None], 1.5 * tau * gate * np.asarray(z_sdpo)[:, None]
  np.testing.assert_allclose(adv, want_adv * MASK_BR, rtol=1e-6)
  if want_w is None:
    assert extra == {}
  else:
    np.testing.assert_allclose(extra["teacher_weight_BR"], want_w * MASK_BR, rtol=1e-6)
  if sign_gate:  # 4 of the 11 real tokens pass the gate
    assert metrics["teacher/gate_open_frac"] == pytest.approx(4 / 11)
  else:
    assert "teacher/gate_open_frac" not in metrics
  assert metrics["teacher/has_teacher_frac"] == 0.75


def test_route_by_tag_equals_teacher_for_tasks(tmp_path):
  from jaxrl_llm.model.io import hf_io
  for name, seed in (("a", 0), ("b", 1)):
    hf_io.save_hf(tiny_params(seed), CFG, str(tmp_path / name))
  a, b = tmp_path / "a", tmp_path / "b"
  cfg = tlib.TeacherConfig(source="checkpoint", route_by_tag=f"x={a}, y={b} ,z={a}")
  assert cfg.routes == (("x", str(a)), ("y", str(b)), ("z", str(a)))
  _, params, cfgs, info = tlib.build_teacher(cfg, tiny_params(2), CFG, sft_fn=None, train_examples=[])
  assert len(params) == 2 and cfgs == (CFG, CFG)  # a shared path loads once
  assert info["tag_teacher"] == {"x": 0, "y": 1, "z": 0}
  np.testing.assert_array_equal(params[1]["embed_VD"], tiny_params(1)["embed_VD"])
  stage = tlib.TeacherStage(cfg, params, cfgs, CFG, TOK, temperature=1.0, max_prompt_len=P_LEN,
                            tag_teacher=info["tag_teacher"])
  idx_B, has_B = stage.route(("y", "w", "x", "z", ""))
  # Task ids in the order of the routes, the unknown tags last: y=1, w=3, x=0, z=2, ''=3.
  want_idx, want_has = teacher_routing.teacher_for_tasks(jnp.asarray([1, 3, 0, 2, 3]), [0, 1, 0, -1], 2)
  np.testing.assert_array_equal(idx_B, want_idx)
  np.testing.assert_array_equal(has_B, want_has)
  np.testing.assert_array_equal(idx_B, [1, 0, 0, 0, 0])
  np.testing.assert_array_equal(has_B, [True, False, True, True, False])


@pytest.mark.parametrize("kw,match", [
    (dict(topk=-1), r"teacher\.topk=-1.*int >= 0"),
    (dict(topk=4, signal="gap_advantage"), r"teacher\.topk=4.*loss forms"),
    (dict(topk=4, topk_tail="tail"), r"teacher\.topk_tail='tail'.*allowed \('bucket', 'renormalize'\)"),
    (dict(sign_gate=1), r"teacher\.sign_gate=1.*a bool"),
    (dict(sign_gate=True, signal="rlsd"), r"teacher\.sign_gate=True.*rlsd"),
    (dict(jsd_beta=-0.1), r"teacher\.jsd_beta=-0\.1.*\[0, 1\]"),
    (dict(source="checkpoint", route_by_tag="a"), r"teacher\.route_by_tag='a'.*'tag=path'"),
    (dict(source="checkpoint", route_by_tag="a=x,a=y"), r"route_by_tag='a=x,a=y'.*'a' appears twice"),
    (dict(source="sft", route_by_tag="a=x"), r"route_by_tag='a=x'.*needs source='checkpoint'"),
    (dict(source="checkpoint", route_by_tag="a=x", checkpoint="y"), r"teacher\.checkpoint='y'.*leave it empty"),
])
def test_teacher_config_errors_name_field_value_and_allowed(kw, match):
  kw = {"source": "sft", **kw}
  with pytest.raises(ValueError, match=match):
    tlib.TeacherConfig(**kw)


def test_new_keys_are_validated_from_the_config_file():
  c = load_config("opd")
  c.teacher.topk = -2
  with pytest.raises(ValueError, match=r"config\.teacher\.topk=-2"):
    from_config_dict(c)
  d = load_config("opd").to_dict()
  d["data"]["tag_key"] = 3
  with pytest.raises(ValueError, match=r"config\.data\.tag_key=3"):
    from_config_dict(d)


def test_preflight_rejects_bad_teachers_before_training(tmp_path):
  from jaxrl_llm.model.io import hf_io
  V = CFG.vocab_size  # 99, the character tokenizer's
  other = dataclasses.replace(CFG, vocab_size=V + 5)
  hf_io.save_hf(tiny_params(0, other), other, str(tmp_path / "wide_vocab"))
  hf_io.save_hf(tiny_params(1), CFG, str(tmp_path / "same_vocab"))

  def run_cfg(**teacher):
    return from_config_dict(shrink(load_config("opd"), **{f"teacher.{k}": v for k, v in teacher.items()}))

  with pytest.raises(FileNotFoundError, match=r"teacher\.checkpoint=.*nope.*does not exist"):
    teacher_preflight(run_cfg(source="checkpoint", checkpoint=str(tmp_path / "nope")))
  with pytest.raises(FileNotFoundError, match=r"teacher\.route_by_tag\[math\]=.*nope.*does not exist"):
    teacher_preflight(run_cfg(source="checkpoint", route_by_tag=f"arithmetic={tmp_path / 'same_vocab'},"
                                                                f"math={tmp_path / 'nope'}"))
  with pytest.raises(ValueError, match=rf"teacher\.checkpoint=.*wide_vocab.*vocab_size={V + 5} but the "
                                       rf"student has {V}"):
    teacher_preflight(run_cfg(source="checkpoint", checkpoint=str(tmp_path / "wide_vocab")))
  with pytest.raises(ValueError, match=rf"teacher\.topk={V + 1} is invalid: allowed \[0, {V}\]"):
    teacher_preflight(run_cfg(topk=V + 1))
  teacher_preflight(run_cfg(source="checkpoint", checkpoint=str(tmp_path / "same_vocab"), topk=V))  # fine


@pytest.mark.slow
def test_cli_fails_on_a_missing_teacher_before_making_the_workdir(tmp_path):
  r = subprocess.run([sys.executable, "-m", "jaxrl_llm.train", "--config=configs/opd.py",
                      "--config.teacher.source=checkpoint", f"--config.teacher.checkpoint={tmp_path}/nope",
                      f"--workdir={tmp_path}/run"], cwd=REPO, capture_output=True, text=True, timeout=300,
                     env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert r.returncode != 0 and "config.teacher.checkpoint=" in r.stderr and "does not exist" in r.stderr
  assert not (tmp_path / "run").exists()


def test_examples_carry_their_task_tag(tmp_path):
  assert {e.tag for e in ArithmeticTask().examples("train", 5)} == {"arithmetic"}
  assert {e.tag for e in CountdownTask().examples("train", 5)} == {"countdown"}
  f = tmp_path / "d.jsonl"
  f.write_text("".join(json.dumps({"q": f"{i}+1=", "a": str(i + 1), "domain": "ab"[i % 2]}) + "\n"
                       for i in range(8)))
  tagged = FileTask(path=str(f), reward_fn=math_verify_reward, prompt_key="q", answer_key="a", tag_key="domain",
                    eval_fraction=0.25)
  rows = tagged.examples("train", 8)
  assert {e.tag for e in rows} == {"a", "b"}
  assert all(e.tag == "ab"[int(e.prompt.split("+")[0]) % 2] for e in rows)  # row i has domain "ab"[i % 2]
  plain = FileTask(path=str(f), reward_fn=math_verify_reward, prompt_key="q", answer_key="a", eval_fraction=0.25)
  assert {e.tag for e in plain.examples("train", 8)} == {"file"}
  missing = FileTask(path=str(f), reward_fn=math_verify_reward, prompt_key="q", answer_key="a", tag_key="topic")
  with pytest.raises(ValueError, match=r"d\.jsonl:1: line 1 has no 'topic' key.*data\.tag_key"):
    missing.examples("train", 8)
  from jaxrl_llm.tasks.pipeline import encode_prompts
  pb = encode_prompts(TOK, tagged.examples("train", 4), 8)
  assert pb.tags == tuple(e.tag for e in tagged.examples("train", 4))
