"""JSONL datasets and contained reward functions."""

import json
import time

import pytest

from jaxrl_llm.tasks.files import FileTask, load_examples
from jaxrl_llm.tasks.math_reward import math_verify_reward
from jaxrl_llm.tasks.rewards import RewardRunner


def _write(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_jsonl_loads_with_configured_keys(tmp_path):
  f = tmp_path / "d.jsonl"
  _write(f, [{"q": f"What is {i}+1?", "a": str(i + 1)} for i in range(40)])
  ex = load_examples(str(f), "q", "a")
  assert len(ex) == 40 and ex[3].prompt == "What is 3+1?" and ex[3].answer == "4"
  task = FileTask(path=str(f), reward_fn=math_verify_reward, prompt_key="q", answer_key="a",
                  eval_fraction=0.25, seed=0)
  tr, ev = task.examples("train", 100), task.examples("eval", 100)
  assert len(tr) == 100 and not {e.prompt for e in tr} & {e.prompt for e in ev}
  assert len({e.prompt for e in tr}) + len(ev) == 40


def test_row_missing_answer_names_file_and_line(tmp_path):
  f = tmp_path / "bad.jsonl"
  f.write_text('{"prompt": "a", "answer": "1"}\n\n{"prompt": "b"}\n')
  with pytest.raises(ValueError, match=r"bad\.jsonl:3: line 3 has no 'answer' key"):
    load_examples(str(f), "prompt", "answer")


def test_bad_json_and_missing_file(tmp_path):
  f = tmp_path / "x.jsonl"
  f.write_text('{"prompt": "a", "answer": "1"}\n{oops\n')
  with pytest.raises(ValueError, match=r"x\.jsonl:2: not valid JSON"):
    load_examples(str(f), "prompt", "answer")
  with pytest.raises(FileNotFoundError, match="nope.jsonl"):
    load_examples(str(tmp_path / "nope.jsonl"), "prompt", "answer")


def test_math_verify_reward_symbolic_equivalence():
  assert math_verify_reward("", "so the answer is $\\boxed{\\frac{1}{2}}$", "0.5") == 1.0
  assert math_verify_reward("", "$\\boxed{3}$", "4") == 0.0
  assert math_verify_reward("", "no answer here", "4") == 0.0


def _raises(prompt, response, answer):
  if response == "boom":
    raise RuntimeError("bad reward function")
  return 1.0


def _hangs(prompt, response, answer):
  if response == "hang":
    while True:
      time.sleep(0.01)
  return 1.0


def test_raising_and_hanging_rewards_are_contained_in_process():
  r = RewardRunner(_raises, timeout_s=1.0)(["p"] * 3, ["ok", "boom", "ok"], ["a"] * 3)
  assert r.reward_B.tolist() == [1.0, 0.0, 1.0] and r.failed_B.tolist() == [False, True, False]
  t0 = time.time()
  r = RewardRunner(_hangs, timeout_s=0.3)(["p"] * 3, ["hang", "ok", "hang"], ["a"] * 3)
  assert r.reward_B.tolist() == [0.0, 1.0, 0.0] and r.timed_out_B.tolist() == [True, False, True]
  assert time.time() - t0 < 5.0


def test_hanging_reward_is_contained_in_worker_processes():
  runner = RewardRunner(_hangs, timeout_s=0.5, workers=1)
  try:
    r = runner(["p"] * 3, ["ok", "hang", "ok"], ["a"] * 3)
    assert r.reward_B.tolist() == [1.0, 0.0, 1.0] and r.timed_out_B.tolist() == [False, True, False]
    r = runner(["p"] * 2, ["ok", "boom"], ["a"] * 2)  # the pool still works afterwards
    assert r.reward_B.tolist() == [1.0, 1.0]
  finally:
    runner.close()


def test_format_bonus_and_nonfinite_reward():
  fmt = lambda s: s.isdigit()  # noqa: E731
  r = RewardRunner(lambda p, s, a: float(s == a), fmt, format_weight=0.1)(["p"] * 3, ["4", "5", "x"], ["4"] * 3)
  assert r.reward_B.tolist() == pytest.approx([1.1, 0.1, 0.0]) and r.correct_B.tolist() == [1.0, 0.0, 0.0]
  r = RewardRunner(lambda p, s, a: float("nan"))(["p"], ["x"], ["a"])
  assert r.reward_B.tolist() == [0.0] and r.failed_B.tolist() == [True]
