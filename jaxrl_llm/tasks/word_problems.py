"""Short arithmetic word problems with numeric answers, checked by math-verify.

"Mia has 7 apples. She buys 5 more. How many apples does Mia have now?" ->
"12". Problems are drawn from a few sentence templates (addition,
subtraction, multiplication, sharing), names, objects and small numbers, so a
small instruct model solves some but not all of them: a task for RL-training a
real pretrained model through its chat template. The reward is math-verify's
equivalence of the response's final answer with the reference number (the
same checker as data files use, `math_reward.py`); the format check asks for
a bare number.
"""

from __future__ import annotations

import dataclasses
import re

from jaxrl_llm.tasks.base import Example
from jaxrl_llm.tasks.math_reward import math_verify_reward
from jaxrl_llm.tasks.split import check_split, in_eval_split, split_rng

NAMES = ("Mia", "Tom", "Ava", "Leo", "Zoe", "Sam", "Ivy", "Max", "Eva", "Ben", "Lily", "Noah")
OBJECTS = ("apples", "pencils", "stickers", "marbles", "books", "cookies", "coins", "shells", "cards", "flowers")
# (template, answer(a, b)); {n} name, {o} object, {a} {b} numbers, {p} pronoun.
TEMPLATES = (
    ("{n} has {a} {o}. {p} gets {b} more. How many {o} does {n} have now?", lambda a, b: a + b),
    ("{n} had {a} {o} and gave away {b}. How many {o} does {n} have left?", lambda a, b: a - b),
    ("{n} buys {a} boxes with {b} {o} in each box. How many {o} does {n} have?", lambda a, b: a * b),
    ("{n} shares {a} {o} equally among {b} friends. How many {o} does each friend get?", lambda a, b: a // b),
    ("There are {a} {o} on a table and {n} puts {b} more there. How many {o} are on the table?",
     lambda a, b: a + b),
)
INSTRUCTION = "Reply with only the final number, nothing else. "  # before the question: small models follow it better there
_NUMBER = re.compile(r"-?\d+")


def number_format(response: str) -> bool:
  """The response is a bare integer."""
  return _NUMBER.fullmatch(response.strip()) is not None


@dataclasses.dataclass(frozen=True)
class WordProblemTask:
  max_number: int = 20  # operands drawn from [2, max_number]
  seed: int = 0  # fixes the train/eval split and the problems drawn
  eval_fraction: float = 0.2  # share of the problem space held out for eval
  name: str = "word_problems"

  def __post_init__(self):
    if not isinstance(self.max_number, int) or not 3 <= self.max_number <= 1000:
      raise ValueError(f"word_problems max_number={self.max_number!r} must be an int in [3, 1000]")
    if not 0.0 < self.eval_fraction < 1.0:
      raise ValueError(f"word_problems eval_fraction={self.eval_fraction} must be in (0, 1)")

  reward_fn = staticmethod(math_verify_reward)
  format_fn = staticmethod(number_format)

  def _draw(self, rng) -> Example:
    t = int(rng.integers(len(TEMPLATES)))
    template, answer = TEMPLATES[t]
    a, b = (int(x) for x in rng.integers(2, self.max_number + 1, size=2))
    if t == 1 and b > a:  # no negative remainders
      a, b = b, a
    if t == 3:  # sharing divides exactly
      a = a * b
    name = NAMES[int(rng.integers(len(NAMES)))]
    pronoun = "She" if name in ("Mia", "Ava", "Zoe", "Ivy", "Eva", "Lily") else "He"
    prompt = template.format(n=name, o=OBJECTS[int(rng.integers(len(OBJECTS)))], a=a, b=b, p=pronoun)
    value = str(answer(a, b))
    return Example(prompt=INSTRUCTION + prompt, answer=value, demo=value, tag=self.name)

  def examples(self, split: str, n: int) -> list[Example]:
    """`n` distinct-by-split examples: a problem is held out when a seeded hash
    of its text says so, so train and eval never share one."""
    check_split(split)
    rng = split_rng(self.seed, split)
    want_eval = split == "eval"
    out, seen = [], set()
    for _ in range(200 * n + 1000):
      if len(out) == n:
        break
      ex = self._draw(rng)
      if in_eval_split(ex.prompt, self.seed, self.eval_fraction) != want_eval:
        continue
      if want_eval and ex.prompt in seen:  # eval counts each problem once
        continue
      seen.add(ex.prompt)
      out.append(ex)
    return out
