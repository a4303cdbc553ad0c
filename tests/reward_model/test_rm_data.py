"""Preference rows: bad rows name the file, line and field before any workdir exists; the held-out
split; the built-in arithmetic pairs and their label noise; how a pair becomes tokens."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from jaxrl_llm.checks import ConfigError
from jaxrl_llm.model.tokenizer import CharTokenizer
from jaxrl_llm.reward_model import data as data_lib
from jaxrl_llm.reward_model.config import reward_config_from_dict
from jaxrl_llm.reward_model.defaults import reward_model_config
from jaxrl_llm.tasks.arithmetic import arithmetic_reward, carry_free_sum
from jaxrl_llm.training.tiny import apply_settings

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOOD = {"prompt": "2+3=", "chosen": "5", "rejected": "6"}


def write_jsonl(path, rows):
  with open(path, "w") as f:
    for row in rows:
      f.write(json.dumps(row) + "\n")
  return str(path)


@pytest.mark.parametrize("bad,field,message", [
    ({"prompt": "1+1=", "rejected": "3"}, "chosen", "is missing"),
    ({"prompt": "1+1=", "chosen": "2"}, "rejected", "is missing"),
    ({"prompt": "1+1=", "chosen": "2", "rejected": "2"}, "rejected", "equals 'chosen'"),
    ({"prompt": "1+1=", "chosen": 2, "rejected": "3"}, "chosen", "allowed a string or"),
    ({"prompt": "1+1=", "chosen": "2", "rejected": [{"role": "assistant", "content": "3"}]}, "rejected",
     "both plain text or both message lists"),
    ({"prompt": "1+1=", "chosen": "2", "rejected": "3", "margin": "big"}, "margin", "allowed a finite number"),
])
def test_bad_rows_name_file_line_and_field(tmp_path, bad, field, message):
  path = write_jsonl(tmp_path / "prefs.jsonl", [GOOD, GOOD, bad, GOOD])
  with pytest.raises(ConfigError) as e:
    data_lib.load_pairs(path)
  text = str(e.value)
  assert text.startswith(f"{path}:3: field {field!r}"), text
  assert message in text and "\n" not in text


def test_identical_message_lists_are_refused(tmp_path):
  msgs = [{"role": "assistant", "content": "hi"}]
  path = write_jsonl(tmp_path / "chat.jsonl", [{"prompt": [{"role": "user", "content": "hey"}], "chosen": msgs,
                                                "rejected": msgs}])
  with pytest.raises(ConfigError, match=r"chat.jsonl:1: field 'rejected' equals 'chosen'"):
    data_lib.load_pairs(path)


def test_parquet_rows_are_named_by_row(tmp_path):
  import pyarrow as pa
  import pyarrow.parquet as pq

  path = str(tmp_path / "prefs.parquet")
  pq.write_table(pa.table({"prompt": ["a", "b"], "chosen": ["x", "y"], "rejected": ["z", "y"]}), path)
  with pytest.raises(ConfigError, match=r"prefs.parquet: row 2: field 'rejected' equals 'chosen'"):
    data_lib.load_pairs(path)


def test_not_json_names_the_line(tmp_path):
  path = tmp_path / "prefs.jsonl"
  path.write_text(json.dumps(GOOD) + "\n{not json\n")
  with pytest.raises(ConfigError, match=r"prefs.jsonl:2: not valid JSON"):
    data_lib.load_pairs(str(path))


def test_rows_and_margins(tmp_path):
  rows = [GOOD, {"chosen": "yes", "rejected": "no", "margin": 1.5},
          {"prompt": [{"role": "user", "content": "hi"}], "chosen": [{"role": "assistant", "content": "hello"}],
           "rejected": [{"role": "assistant", "content": "go away"}]}]
  pairs = data_lib.load_pairs(write_jsonl(tmp_path / "p.jsonl", rows))
  assert [p.margin for p in pairs] == [None, 1.5, None]
  assert pairs[1].prompt == ""  # an implicit prompt
  assert pairs[2].chosen == ({"role": "assistant", "content": "hello"},)
  tok = CharTokenizer()
  ids = data_lib.pair_ids(tok, pairs, chat_template=False)
  # plain text: [BOS] prompt response EOS; messages: the chat template (the character tokenizer concatenates)
  assert ids[0][0] == [tok.bos_id] + tok.encode("2+3=5") + [tok.eos_id]
  assert ids[1][1] == [tok.bos_id] + tok.encode("no") + [tok.eos_id]
  assert ids[2][0] == tok.encode("hihello")
  arrays = data_lib.encode_pairs(pairs, ids, max_len=16, pad_id=tok.pad_id, default_margin=0.25)
  np.testing.assert_array_equal(arrays.margin_N, [0.25, 1.5, 0.25])
  assert arrays.tokens_N2T.shape == (3, 2, 16)
  assert arrays.mask_N2T[0, 0].sum() == 7 and not arrays.mask_N2T[0, 0, 7:].any()  # right-padded
  with pytest.raises(ConfigError, match=r"p.jsonl:3: field 'rejected' is 9 tokens .* config.data.max_len=8"):
    data_lib.encode_pairs(pairs, ids, max_len=8, pad_id=0, default_margin=0.0)


def test_held_out_split_is_seeded_and_keeps_a_prompt_on_one_side(tmp_path):
  rows = [{"prompt": f"q{i % 50}", "chosen": f"good {i}", "rejected": f"bad {i}"} for i in range(400)]
  path = write_jsonl(tmp_path / "p.jsonl", rows)
  train = data_lib.file_pairs(path, "", "train", seed=1, eval_fraction=0.2)
  held = data_lib.file_pairs(path, "", "eval", seed=1, eval_fraction=0.2)
  assert len(train) + len(held) == 400 and held
  assert not {p.prompt for p in train} & {p.prompt for p in held}
  assert [p.chosen for p in held] == [p.chosen for p in data_lib.file_pairs(path, "", "eval", seed=1,
                                                                             eval_fraction=0.2)]
  other = data_lib.file_pairs(path, "", "eval", seed=2, eval_fraction=0.2)
  assert {p.prompt for p in other} != {p.prompt for p in held}
  eval_path = write_jsonl(tmp_path / "e.jsonl", rows[:3])
  assert len(data_lib.file_pairs(path, eval_path, "train", seed=1, eval_fraction=0.2)) == 400
  assert len(data_lib.file_pairs(path, eval_path, "eval", seed=1, eval_fraction=0.2)) == 3


def test_builtin_pairs_follow_the_gold_reward_and_label_noise():
  kw = dict(digits=2, digits2=1, ops="+", seed=0, eval_fraction=0.2)
  clean = data_lib.arithmetic_pairs("train", 2000, label_noise=0.0, **kw)
  answer = lambda p: str(eval(p.prompt[:-1]))  # noqa: E731, S307 - "a+b="
  assert all(arithmetic_reward(p.prompt, p.chosen, answer(p)) == 1.0 for p in clean)
  assert all(arithmetic_reward(p.prompt, p.rejected, answer(p)) == 0.0 for p in clean)
  for p in clean:  # the policy's systematic mistake: the carry-free sum, or a carry that is not there
    free = str(carry_free_sum(*map(int, p.prompt[:-1].split("+"))))
    assert p.rejected == (free if free != p.chosen else str(int(p.chosen) + 10)), p
  assert 0.3 < np.mean([int(p.rejected) < int(p.chosen) for p in clean]) < 0.6  # both kinds of carry error
  noisy = data_lib.arithmetic_pairs("train", 2000, label_noise=0.3, **kw)
  swapped = [p.swapped for p in noisy]
  assert 0.25 < np.mean(swapped) < 0.35
  assert all(arithmetic_reward(p.prompt, p.rejected, answer(p)) == 1.0 for p in noisy if p.swapped)
  assert [p.prompt for p in noisy] == [p.prompt for p in clean]  # the noise swaps; it draws no other problems
  assert swapped == [p.swapped for p in data_lib.arithmetic_pairs("train", 2000, label_noise=0.3, **kw)]
  held = data_lib.arithmetic_pairs("eval", 1000, label_noise=0.3, **kw)
  assert not any(p.swapped for p in held)
  assert not {p.prompt for p in held} & {p.prompt for p in clean}


def test_wrong_answers_of_each_operator():
  assert data_lib.wrong_answer("47+8=", "55") == "45"  # the carry dropped
  assert data_lib.wrong_answer("41+8=", "49") == "59"  # a carry that is not there
  assert data_lib.wrong_answer("52-7=", "45") == "55"  # a forgotten borrow
  assert data_lib.wrong_answer("12*3=", "36") == "48"  # one multiplicand too many
  assert data_lib.wrong_answer("0*7=", "0") == "10"


def test_word_problem_pairs_follow_the_verifier():
  """data.task=word_problems: chosen is what the task's verifier accepts, rejected the story's two
  numbers under another operation, which the verifier refuses; held-out problems are the task's."""
  from jaxrl_llm.tasks.word_problems import WordProblemTask

  kw = dict(max_number=10, seed=0, eval_fraction=0.2)
  task = WordProblemTask(**kw)
  answers = {ex.prompt: ex.answer for ex in task.examples("train", 400)}
  pairs = data_lib.word_problem_pairs("train", 400, label_noise=0.0, **kw)
  assert [p.prompt for p in pairs] == [ex.prompt for ex in task.examples("train", 400)]
  for p in pairs:
    a, b = (int(x) for x in re.findall(r"\d+", p.prompt)[-2:])
    assert task.reward_fn(p.prompt, p.chosen, answers[p.prompt]) == 1.0
    assert task.reward_fn(p.prompt, p.rejected, answers[p.prompt]) == 0.0
    assert int(p.rejected) in {a + b, a - b, a * b, a // b} - {int(p.chosen)} or int(p.rejected) == int(p.chosen) + 1
  noisy = data_lib.word_problem_pairs("train", 400, label_noise=0.5, **kw)
  assert 0.4 < np.mean([p.swapped for p in noisy]) < 0.6
  held = data_lib.word_problem_pairs("eval", 100, label_noise=0.5, **kw)
  assert not any(p.swapped for p in held) and not {p.prompt for p in held} & set(answers)
  assert data_lib.wrong_operation("Ava has 2 cards. She gets 2 more.", "4", np.random.default_rng(0)) in ("0", "1")
  with pytest.raises(ConfigError, match=r"config.data.task='poems' is invalid"):
    _config(**{"data.task": "poems"})
  with pytest.raises(ConfigError, match=r"config.data.task='word_problems' is invalid: 'arithmetic' with "
                                        r"config.objective='process'"):
    _config(**{"data.task": "word_problems", "objective": "process"})


def _config(**settings):
  return reward_config_from_dict(apply_settings(reward_model_config(), settings))


def test_config_errors_name_the_field():
  with pytest.raises(ConfigError, match=r"config.data.label_noise=1.5 is out of range"):
    _config(**{"data.label_noise": 1.5})
  with pytest.raises(ConfigError, match=r"config.data.label_noise=0.1 is invalid: swaps pairs of the built-in set"):
    _config(**{"data.label_noise": 0.1, "data.path": "x.jsonl"})
  with pytest.raises(ConfigError, match=r"config.train.center_coef=-1.0 is out of range"):
    _config(**{"train.center_coef": -1.0})


def test_a_bad_row_fails_before_the_workdir_exists(tmp_path):
  from jaxrl_llm.reward_model.trainer import RewardModelRun

  path = write_jsonl(tmp_path / "prefs.jsonl", [GOOD, {"prompt": "1+1=", "chosen": "2"}])
  workdir = tmp_path / "run"
  with pytest.raises(ConfigError, match=r"prefs.jsonl:2: field 'rejected' is missing"):
    RewardModelRun(_config(**{"data.path": path}), str(workdir)).run()
  assert not workdir.exists()


@pytest.mark.slow
def test_entry_point_reports_a_bad_row_in_one_line(tmp_path):
  path = write_jsonl(tmp_path / "prefs.jsonl", [GOOD, GOOD, {"prompt": "4+4=", "chosen": "8", "rejected": "8"}])
  workdir = tmp_path / "run"
  proc = subprocess.run([sys.executable, "-m", "jaxrl_llm.reward_model", "--config=configs/reward_model.py",
                         f"--config.data.path={path}", f"--workdir={workdir}"], cwd=REPO, capture_output=True,
                        text=True, timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert proc.returncode == 2, proc.stderr[-2000:]
  errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
  assert errors == [f"error: {path}:3: field 'rejected' equals 'chosen' ('8'): a pair needs two different "
                    "responses"], proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr
  assert not workdir.exists()
