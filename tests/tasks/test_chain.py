"""The chained-sum task: its gold step labels (Math-Shepherd's: good while every line so far is a
right partial sum), wrong demonstrations whose carry error propagates, the outcome reward and format."""

import pytest

from jaxrl_llm.tasks.chain import ChainTask, chain_format, chain_reward, response_steps, step_labels, wrong_step
from jaxrl_llm.tasks.split import in_eval_split, split_rng


def test_step_labels_are_good_until_the_first_wrong_line():
  assert step_labels("23+8+15=", ["31", "46"]) == [True, True]
  assert step_labels("23+8+15=", ["21", "36"]) == [False, False]  # 23+8 without the carry, then right from 21
  assert step_labels("23+8+15=", ["31", "36"]) == [True, False]
  assert step_labels("23+8+15=", ["31", "46", "50"]) == [True, True, False]  # a step past the last sum
  assert step_labels("23+8+15=", ["31", "x"]) == [True, False]


def test_wrong_demonstrations_carry_their_error_to_the_answer():
  task = ChainTask(n_terms=4, digits=1, seed=0, wrong_fraction=1.0)
  for ex in task.examples("train", 40):
    steps = response_steps(ex.demo)
    labels = step_labels(ex.prompt, steps)
    k = labels.index(False)  # exactly one carry error ...
    assert labels == [True] * k + [False] * (len(steps) - k)
    xs = [int(t) for t in ex.prompt.rstrip("=").split("+")]
    prev = xs[0] if k == 0 else int(steps[k - 1])
    assert int(steps[k]) == wrong_step(prev, xs[k + 1])
    for j in range(k + 1, len(steps)):  # ... and every later line adds right from the wrong value
      assert int(steps[j]) == int(steps[j - 1]) + xs[j + 1]
    assert ex.demo.endswith("\n") and chain_reward(ex.prompt, ex.demo, ex.answer) == 0.0


def test_every_carry_demonstrations_drop_each_carry_and_the_default_stream_is_unchanged():
  task = ChainTask(n_terms=4, digits=1, seed=0, wrong_fraction=1.0, errors="every_carry")
  n_carry = 0
  for ex in task.examples("train", 60):
    xs = [int(t) for t in ex.prompt.rstrip("=").split("+")]
    acc = xs[0]
    for line, x in zip(response_steps(ex.demo), xs[1:]):  # each line: the last one plus x, carry dropped
      dropped = (acc % 10 + x) % 10 + acc // 10 * 10
      n_carry += dropped != acc + x
      assert int(line) == dropped, (ex.prompt, ex.demo)
      acc = dropped
    assert ex.demo.endswith("\n")
  assert n_carry > 20  # the problems do have carries to drop
  # A problem without a carry has a right demonstration even when it is a wrong one.
  assert ChainTask(n_terms=3, digits=1).solution("1+2+3=", drop_carries=True) == ["3", "6"]
  # errors="one" (the default) draws the same demonstrations as before the option existed: a
  # demonstration's wrong step is drawn only for the wrong ones, after the draw that picks them.
  task = ChainTask(n_terms=4, digits=1, seed=3, wrong_fraction=0.6)
  a = task.examples("train", 50)
  rng, want = split_rng(3, "train"), []
  while len(want) < 50:  # the draws as written before the option: the problem, wrong or not, its step
    prompt = task.problem(rng)
    if in_eval_split(prompt, 3, task.eval_fraction):
      continue
    wrong_at = int(rng.integers(3)) if rng.random() < 0.6 else None
    want.append("".join(line + "\n" for line in task.solution(prompt, wrong_at)))
  assert [e.demo for e in a] == want and sum(chain_reward(e.prompt, e.demo, e.answer) == 0.0 for e in a) > 15
  with pytest.raises(ValueError, match="errors='all'"):
    ChainTask(errors="all")


def test_reward_and_format():
  assert wrong_step(8, 7) == 5 and wrong_step(3, 4) == 17  # carry dropped; no carry to drop: +10
  assert chain_reward("3+5+7=", "8\n15\n", "15") == 1.0
  assert chain_reward("3+5+7=", "9\n15", "15") == 1.0  # the outcome reward reads the last line only
  assert chain_reward("3+5+7=", "8\n16\n", "15") == 0.0
  assert chain_format("8\n15\n") and not chain_format("8\nfifteen\n") and not chain_format("")
  right = ChainTask(n_terms=3, digits=2, seed=1).examples("eval", 20)
  assert all(chain_reward(e.prompt, e.demo, e.answer) == 1.0 for e in right)
  with pytest.raises(ValueError, match="n_terms=7"):
    ChainTask(n_terms=7)
