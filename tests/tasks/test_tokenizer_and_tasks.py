"""Character tokenizer and the built-in verifiable tasks."""

import pytest

from jaxrl_llm.tasks.arithmetic import ArithmeticTask, arithmetic_format, arithmetic_reward, carry_free_sum
from jaxrl_llm.tasks.countdown import CountdownTask, countdown_format, countdown_reward
from jaxrl_llm.tasks.math_reward import math_verify_reward
from jaxrl_llm.model.tokenizer import CharTokenizer


def test_tokenizer_round_trip_and_specials():
  tok = CharTokenizer()
  assert (tok.pad_id, tok.eos_id, tok.bos_id) == (0, 1, 2)
  assert tok.vocab_size == 3 + 10 + 52 + 32 + 2  # specials, digits, letters, punctuation, space + newline
  ids = tok.encode("47+68=115")
  assert len(ids) == 9 and tok.decode(ids) == "47+68=115"
  # decode drops pad/bos and stops at the first eos
  assert tok.decode([tok.bos_id] + tok.encode("12") + [tok.eos_id] + tok.encode("99")) == "12"
  assert tok.decode([tok.pad_id, *tok.encode("7")]) == "7"
  msgs = [{"role": "system", "content": "S:"}, {"role": "user", "content": "1+1="}]
  assert tok.apply_chat_template(msgs, add_generation_prompt=True) == "S:1+1="


def test_tokenizer_rejects_unknown_character():
  with pytest.raises(ValueError, match="'é'"):
    CharTokenizer().encode("café")


def test_carry_free_sum_and_rewards():
  assert carry_free_sum(47, 68) == 5  # 7+8=15 -> 5, 4+6=10 -> 0: "05"
  assert carry_free_sum(12, 34) == 46  # no carries: the true sum
  assert carry_free_sum(99, 1) == 90  # 9+1 -> 0, 9+0 -> 9
  assert arithmetic_reward("47+68=", "115", "115") == 1.0
  assert arithmetic_reward("47+68=", " 115 ", "115") == 1.0
  assert arithmetic_reward("47+68=", "105", "115") == 0.0
  assert arithmetic_reward("47+68=", "115x", "115") == 0.0
  assert arithmetic_format("-12") and not arithmetic_format("1 2")


def test_arithmetic_splits_are_disjoint_deterministic_and_answers_right():
  task = ArithmeticTask(digits=2, seed=3, eval_fraction=0.1)
  train, ev = task.examples("train", 3000), task.examples("eval", 200)
  assert task.examples("eval", 200) == ev  # a pure function of the seed
  assert not {e.prompt for e in train} & {e.prompt for e in ev}
  for e in train[:200] + ev:
    a, b = e.prompt[:-1].split("+")
    assert 10 <= int(a) <= 99 and 10 <= int(b) <= 99
    assert e.answer == str(int(a) + int(b)) == e.demo  # wrong_fraction = 0
  other = ArithmeticTask(digits=2, seed=4, eval_fraction=0.1).examples("eval", 200)
  assert {e.prompt for e in other} != {e.prompt for e in ev}


def test_arithmetic_wrong_demos_are_carry_free_at_the_requested_rate():
  task = ArithmeticTask(digits=2, seed=0, wrong_fraction=0.5)
  ex = task.examples("train", 4000)
  wrong = [e for e in ex if e.demo != e.answer]
  for e in wrong:
    a, b = map(int, e.prompt[:-1].split("+"))
    assert e.demo == str(carry_free_sum(a, b))
  carry = [e for e in ex if str(carry_free_sum(*map(int, e.prompt[:-1].split("+")))) != e.answer]
  # Half of the problems with a carry get the wrong demo (binomial, 4 sigma band).
  frac = sum(e.demo != e.answer for e in carry) / len(carry)
  assert abs(frac - 0.5) < 4 * (0.25 / len(carry)) ** 0.5


@pytest.mark.parametrize("field,value", [("digits", 0), ("ops", "/"), ("wrong_fraction", 1.5),
                                         ("eval_fraction", 0.0)])
def test_arithmetic_bad_config(field, value):
  with pytest.raises(ValueError, match=field):
    ArithmeticTask(**{field: value})


def test_countdown_reward_checks_numbers_and_target():
  p = "3,5,7>22:"
  assert countdown_reward(p, "3*5+7", "") == 1.0
  assert countdown_reward(p, "7+5*3", "") == 1.0  # any valid expression counts
  assert countdown_reward(p, "(7+5)*3", "") == 0.0  # 36, wrong target
  assert countdown_reward(p, "3*5+7+0", "") == 0.0  # uses a number not given
  assert countdown_reward(p, "15+7", "") == 0.0  # numbers not the given ones
  assert countdown_reward(p, "__import__('os')", "") == 0.0  # never evaluated
  assert countdown_reward(p, "3*(5+", "") == 0.0
  assert countdown_format("3*(5+7)") and not countdown_format("3*(5+")


def test_countdown_examples_are_solvable_by_their_demo():
  task = CountdownTask(n_numbers=3, max_number=9, seed=1)
  ex = task.examples("train", 300)
  assert all(countdown_reward(e.prompt, e.demo, e.answer) == 1.0 for e in ex)
  ev = task.examples("eval", 50)
  assert not {e.prompt for e in ex} & {e.prompt for e in ev}
  wrong = CountdownTask(seed=1, wrong_fraction=1.0).examples("train", 300)
  # one operator swapped: the demo misses the target unless the swap is neutral (e.g. x*1 -> x+1 never is)
  assert sum(countdown_reward(e.prompt, e.demo, e.answer) for e in wrong) < 0.2 * len(wrong)


def test_prompt_len_zero_fits_the_longest_prompt():
  """data.max_prompt_len = 0 pads to the longest prompt rounded up to 8; a set length is kept."""
  from jaxrl_llm.model.tokenizer import CharTokenizer
  from jaxrl_llm.tasks.base import Example
  from jaxrl_llm.tasks.pipeline import encode_prompts, longest_prompt, resolve_prompt_len

  tok = CharTokenizer()
  examples = [Example(prompt=p, answer="1") for p in ("1+2=", "12+345=", "9*9=")]
  assert longest_prompt(tok, examples, chat_template=False) == len("12+345=") + 1  # + BOS
  assert resolve_prompt_len(0, tok, examples, chat_template=False) == 8
  assert resolve_prompt_len(0, tok, examples + [Example(prompt="1" * 8, answer="1")], chat_template=False) == 16
  assert resolve_prompt_len(5, tok, examples, chat_template=False) == 5
  batch = encode_prompts(tok, examples, resolve_prompt_len(0, tok, examples, chat_template=False))
  assert batch.mask_BP.sum(axis=1).tolist() == [5, 8, 5]


def test_word_problems_answers_splits_and_reward():
  """Each answer recomputed from the prompt's words and numbers; the splits are disjoint."""
  import re

  from jaxrl_llm.tasks.word_problems import WordProblemTask

  task = WordProblemTask(max_number=12, seed=3)
  train, held_out = task.examples("train", 500), task.examples("eval", 100)
  assert len(train) == 500 and len(held_out) == 100
  assert not {e.prompt for e in train} & {e.prompt for e in held_out}
  assert len({e.prompt for e in held_out}) == 100
  for ex in train + held_out:
    a, b = map(int, re.findall(r"\d+", ex.prompt)[:2])
    if " more" in ex.prompt or "puts" in ex.prompt:
      want = a + b
    elif "gave away" in ex.prompt:
      want = a - b
    elif "boxes" in ex.prompt:
      want = a * b
    else:
      want = a // b
      assert a % b == 0
    assert ex.answer == str(want) and want >= 0, ex.prompt
  assert task.reward_fn("", f"The answer is {held_out[0].answer}.", held_out[0].answer) == 1.0
  assert task.reward_fn("", str(int(held_out[0].answer) + 1), held_out[0].answer) == 0.0
  assert task.format_fn(" 12 ") and not task.format_fn("twelve")


def test_word_problems_qa_format():
  """The "qa" format for a base model: the same held-out problems as the instruction format, as
  "Question: ...\nAnswer:"; its reward reads the reply's first line, which a base model's run-on
  reply needs."""
  import types

  from jaxrl_llm.tasks import registry
  from jaxrl_llm.tasks.word_problems import INSTRUCTION, WordProblemTask

  plain = WordProblemTask(max_number=12, seed=3)
  qa = WordProblemTask(max_number=12, seed=3, prompt_format="qa")
  for split in ("train", "eval"):
    a, b = plain.examples(split, 40), qa.examples(split, 40)
    assert [e.answer for e in a] == [e.answer for e in b]
    for x, y in zip(a, b):
      assert x.prompt.startswith(INSTRUCTION)
      assert y.prompt == f"Question: {x.prompt[len(INSTRUCTION):]}\nAnswer:"
  assert qa.examples("eval", 1)[0].prompt == f"Question: {plain.examples('eval', 1)[0].prompt[len(INSTRUCTION):]}\nAnswer:"

  run_on = " 12\nQuestion: Tom has 5 apples"  # a base model goes on with the next question
  assert qa.reward_fn("", run_on, "12") == 1.0 and qa.format_fn(run_on)
  assert plain.reward_fn("", run_on, "12") == 0.0 and not plain.format_fn(run_on)  # math-verify reads the 5
  assert qa.reward_fn("", " 11\n12", "12") == 0.0  # a later line does not count
  assert qa.reward_fn("", " 12 cookies\nQuestion:", "12") == 1.0
  assert qa.reward_fn("", " 5 + 7 = 12\n", "12") == 1.0 and not qa.format_fn(" 5 + 7 = 12\n")
  # The answer must be written out: an expression math-verify would evaluate to it earns nothing.
  assert math_verify_reward("", "7-5", "2") == 1.0
  assert qa.reward_fn("", " 7-5\n", "2") == 0.0 and qa.reward_fn("", " 49/7", "7") == 0.0
  assert qa.reward_fn("", " 6 + 8\n14", "14") == 0.0 and qa.reward_fn("", " 2 * 6 = 12 cookies", "12") == 1.0
  assert qa.reward_fn("", " -12", "-12") == 1.0 and qa.reward_fn("", " 7-5=2", "2") == 1.0
  with pytest.raises(ValueError, match=r"prompt_format='chat' is invalid: allowed \('instruction', 'qa'\)"):
    WordProblemTask(prompt_format="chat")

  # config.task.name = word_problems_qa builds it (the examples' tag stays word_problems).
  cfg = types.SimpleNamespace(seed=3, task=types.SimpleNamespace(name="word_problems_qa", max_number=12,
                                                                 eval_fraction=0.2))
  assert registry.make_task(cfg) == qa and qa.examples("eval", 1)[0].tag == "word_problems"
