"""Short arithmetic word problems with numeric answers, checked by math-verify.

"Mia has 7 apples. She buys 5 more. How many apples does Mia have now?" ->
"12". Problems are drawn from a few sentence templates (addition,
subtraction, multiplication, sharing), names, objects and small numbers, so a
small instruct model solves some but not all of them: a task for RL-training a
real pretrained model. The reward is math-verify's equivalence of the
response's final answer with the reference number (the same checker as data
files use, `math_reward.py`); the format check asks for a bare number.

Two prompt formats (`prompt_format`): "instruction" puts a one-line
instruction before the problem, for an instruct model's chat template; "qa"
writes "Question: <problem>\nAnswer:", plain text for a base model without
one. A base model goes on after its answer (" 12\nQuestion: ..."), so in the
"qa" format the reward and the format check read the response's first line
only, as few-shot evaluations stop at the first line break, and that line
must write the answer's number out: an expression such as "7-5" earns 0
although math-verify evaluates it to 2, since RL otherwise teaches a model
to answer with the operation and its operands instead of their result. No
solved examples precede the question: they multiply the prompt's tokens,
which are most of a step's cost, for no accuracy gain that stood out from
noise (docs/benchmarks.md, "Real checkpoints on a CPU"). Both formats hold
out the same problems.
"""

from __future__ import annotations

import dataclasses
import re

from jaxrl_llm.checks import check_choice
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
PROMPT_FORMATS = ("instruction", "qa")
_NUMBER = re.compile(r"-?\d+")
_OPERATION = re.compile(r"\d\s*[-+*/×÷^]\s*\d")  # "7-5", "49 / 7": an operation on two numbers


def qa_prompt(problem: str) -> str:
  """The "qa" format: a base model continues "Answer:" with the answer."""
  return f"Question: {problem}\nAnswer:"


def first_line(response: str) -> str:
  """The response up to its first line break, surrounding whitespace dropped: " 12\n\nQuestion: ..." -> "12"."""
  return response.strip().split("\n", 1)[0].strip()


def number_format(response: str) -> bool:
  """The response is a bare integer."""
  return _NUMBER.fullmatch(response.strip()) is not None


@dataclasses.dataclass(frozen=True)
class WordProblemTask:
  max_number: int = 20  # operands drawn from [2, max_number]
  seed: int = 0  # fixes the train/eval split and the problems drawn
  eval_fraction: float = 0.2  # share of the problem space held out for eval
  prompt_format: str = "instruction"  # instruction (an instruct model's chat template) | qa (a base model)
  name: str = "word_problems"

  def __post_init__(self):
    if not isinstance(self.max_number, int) or not 3 <= self.max_number <= 1000:
      raise ValueError(f"word_problems max_number={self.max_number!r} must be an int in [3, 1000]")
    if not 0.0 < self.eval_fraction < 1.0:
      raise ValueError(f"word_problems eval_fraction={self.eval_fraction} must be in (0, 1)")
    check_choice("word_problems prompt_format", self.prompt_format, PROMPT_FORMATS)

  def _answer_text(self, response: str) -> str:
    """What the verifier reads: the whole response, or its first line in the "qa" format."""
    return first_line(response) if self.prompt_format == "qa" else response

  def reward_fn(self, prompt: str, response: str, answer: str) -> float:
    """1 if the response's final answer equals `answer` (math-verify). In the "qa" format: of its first
    line, whose answer (after its last "=", if any) must be a number, not an operation ("7-5" for 2
    earns 0, "7-5=2" earns 1)."""
    text = self._answer_text(response)
    if self.prompt_format == "qa" and _OPERATION.search(text.rsplit("=", 1)[-1]):
      return 0.0  # the line ends on an operation, not on its result
    return math_verify_reward(prompt, text, answer)

  def format_fn(self, response: str) -> bool:
    return number_format(self._answer_text(response))

  def _draw(self, rng) -> tuple[str, str]:
    """(problem text, answer)."""
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
    return prompt, str(answer(a, b))

  def examples(self, split: str, n: int) -> list[Example]:
    """`n` distinct-by-split examples: a problem is held out when a seeded hash
    of its instruction-format text says so (whatever the prompt format), so
    train and eval never share one."""
    check_split(split)
    rng = split_rng(self.seed, split)
    want_eval = split == "eval"
    out, seen = [], set()
    for _ in range(200 * n + 1000):
      if len(out) == n:
        break
      problem, value = self._draw(rng)
      key = INSTRUCTION + problem
      if in_eval_split(key, self.seed, self.eval_fraction) != want_eval:
        continue
      if want_eval and key in seen:  # eval counts each problem once
        continue
      seen.add(key)
      prompt = key if self.prompt_format == "instruction" else qa_prompt(problem)
      out.append(Example(prompt=prompt, answer=value, demo=value, tag=self.name))
    return out
