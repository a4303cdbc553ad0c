"""Preference pairs from the policy's own samples, labelled by the verifier (reward_model/data.py's
`policy_pairs`, written by `python -m jaxrl_llm.evaluate --pairs_out`)."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from run_helpers import ONE_DEVICE_XLA_FLAGS, REPO

from jaxrl_llm.reward_model.data import load_pairs, policy_pairs
from jaxrl_llm.training.tiny import WARM_TINY_RUN, config_flags


def test_pairs_are_correct_over_incorrect_per_prompt_by_hand():
  prompts = ["1+1=", "2+2=", "3+3=", "4+4="]
  responses = [("2", "3", "2", "11"),   # correct {2}, incorrect {3, 11}: 2 combinations
               ("4", "4", "4", "4"),    # all correct: no pair
               ("5", "7", "9", "5"),    # all wrong: no pair
               ("6", "06", "5", "8")]   # correct {6, 06} (the verifier's say), incorrect {5, 8}: 4
  correct = np.array([[1, 0, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 0, 0]], bool)
  rows = policy_pairs(prompts, responses, correct, per_prompt=3, seed=0)
  by_prompt = {}
  for r in rows:
    by_prompt.setdefault(r["prompt"], []).append((r["chosen"], r["rejected"]))
  assert sorted(by_prompt["1+1="]) == [("2", "11"), ("2", "3")]  # fewer than per_prompt exist: all, once
  assert "2+2=" not in by_prompt and "3+3=" not in by_prompt
  got = by_prompt["4+4="]
  assert len(got) == 3 == len(set(got))  # per_prompt of the 4, none twice
  assert all(c in ("6", "06") and r in ("5", "8") for c, r in got)
  assert rows == policy_pairs(prompts, responses, correct, per_prompt=3, seed=0)  # seeded
  with pytest.raises(ValueError, match="per_prompt=0"):
    policy_pairs(prompts, responses, correct, per_prompt=0, seed=0)


def _env():
  return {**os.environ, "XLA_FLAGS": ONE_DEVICE_XLA_FLAGS, "JAX_PLATFORMS": "cpu"}


@pytest.mark.slow
def test_evaluate_writes_verifier_labelled_pairs_of_a_runs_samples(tmp_path):
  """A tiny run (40 warm-start steps, 1 RL step), then `evaluate --split=train --n_samples=4 --pairs_out`:
  every pair's chosen answer is the sum (computed here from the prompt), its rejected one is not, and
  the reward model's own loader reads the file."""
  wd, out = tmp_path / "run", tmp_path / "pairs.jsonl"
  flags = config_flags({**WARM_TINY_RUN, "train.steps": 1, "sft.steps": 40})
  run = subprocess.run([sys.executable, "-m", "jaxrl_llm.train", "--config=configs/gspo.py", *flags,
                        f"--workdir={wd}"], cwd=REPO, env=_env(), capture_output=True, text=True, timeout=600)
  assert run.returncode == 0, run.stderr[-3000:]
  ev = subprocess.run([sys.executable, "-m", "jaxrl_llm.evaluate", f"--workdir={wd}", "--split=train",
                       "--n_samples=4", f"--pairs_out={out}", "--pairs_per_prompt=2"],
                      cwd=REPO, env=_env(), capture_output=True, text=True, timeout=600)
  assert ev.returncode == 0, ev.stderr[-3000:]
  rows = [json.loads(line) for line in out.read_text().splitlines()]
  assert f"{len(rows)} preference pairs" in ev.stdout
  assert len(rows) >= 10  # a half-trained policy is right and wrong on many training problems
  for r in rows:
    a, b = map(int, re.fullmatch(r"(\d+)\+(\d+)=", r["prompt"]).groups())
    assert r["chosen"].strip() == str(a + b), r
    assert r["rejected"].strip() != str(a + b), r
  # At most 2 per problem drawn (200 training rows; 1-digit sums repeat, each draw has its own samples).
  assert len(rows) <= 2 * WARM_TINY_RUN["task.n_train"]
  pairs = load_pairs(str(out))
  assert [(p.prompt, p.chosen, p.rejected) for p in pairs] == [(r["prompt"], r["chosen"], r["rejected"]) for r in rows]
  # Bad input: one line, no traceback.
  bad = subprocess.run([sys.executable, "-m", "jaxrl_llm.evaluate", f"--workdir={wd}", f"--pairs_out={out}"],
                       cwd=REPO, env=_env(), capture_output=True, text=True, timeout=600)
  assert bad.returncode == 2 and "--pairs_out needs --n_samples >= 2 (got 0)" in bad.stderr
  assert "Traceback" not in bad.stderr
