"""Multi-digit arithmetic: prompt "47+68=", answer "115", response "115<eos>".

Demonstrations for the SFT warm start are wrong on purpose for a fraction of
problems: they use the carry-free sum (47+68 -> "05"), a systematic mistake
that imitation reproduces and that a verifier can correct.

With `tool_demos` the right demonstrations use the calculator in the plain tag
format of the "calculator" environment (envs/calls.py, call_format "tags"):
"<calc>47+68</calc><result>115</result>115", the call, the environment's
answer, then the final answer; the wrong ones answer from memory, without it.
In an episode the turn stops at "</calc>" and the environment writes the
result, so RL can learn that answers that call the tool are right more often.
"""

from __future__ import annotations

import dataclasses
import re

from jaxrl_llm.tasks.base import Example
from jaxrl_llm.tasks.split import check_split, in_eval_split, split_rng

_INT = re.compile(r"-?\d+")
OPS = ("+", "-", "*")


def carry_free_sum(a: int, b: int) -> int:
  """Digit-wise sum modulo 10 with every carry dropped (47+68 -> 5)."""
  out, place = 0, 1
  while a or b:
    out += ((a % 10 + b % 10) % 10) * place
    a, b, place = a // 10, b // 10, place * 10
  return out


def arithmetic_reward(prompt: str, response: str, answer: str) -> float:
  """1 if the response is exactly the answer (an integer, nothing else), else 0."""
  del prompt
  return 1.0 if response.strip() == answer.strip() else 0.0


def arithmetic_format(response: str) -> bool:
  return _INT.fullmatch(response.strip()) is not None


@dataclasses.dataclass(frozen=True)
class ArithmeticTask:
  digits: int = 2  # first operand size in decimal digits
  digits2: int = 0  # second operand size; 0: same as `digits`
  ops: str = "+"  # operators to draw from, a subset of "+-*"
  seed: int = 0  # fixes the train/eval split and the problems drawn
  eval_fraction: float = 0.1  # share of the problem space held out for eval
  wrong_fraction: float = 0.0  # share of demonstrations that are wrong (carry dropped)
  tool_demos: bool = False  # right demonstrations call the calculator (<calc>a+b</calc><result>c</result>c)
  name: str = "arithmetic"

  def __post_init__(self):
    if not 1 <= self.digits <= 9:
      raise ValueError(f"arithmetic digits={self.digits} must be in [1, 9]")
    if not 0 <= self.digits2 <= 9:
      raise ValueError(f"arithmetic digits2={self.digits2} must be in [0, 9] (0: same as digits)")
    if not self.ops or any(o not in OPS for o in self.ops):
      raise ValueError(f"arithmetic ops={self.ops!r} must be a non-empty subset of {''.join(OPS)!r}")
    if not 0.0 < self.eval_fraction < 1.0:
      raise ValueError(f"arithmetic eval_fraction={self.eval_fraction} must be in (0, 1)")
    if not 0.0 <= self.wrong_fraction <= 1.0:
      raise ValueError(f"arithmetic wrong_fraction={self.wrong_fraction} must be in [0, 1]")

  reward_fn = staticmethod(arithmetic_reward)
  format_fn = staticmethod(arithmetic_format)

  def _wrong(self, a: int, op: str, b: int) -> int:
    if op == "+":
      return carry_free_sum(a, b)
    if op == "-":
      return a - b + 10  # forgets a borrow in the tens
    return a * b + a  # off by one multiplicand

  def _range(self, digits: int) -> tuple[int, int]:
    return (10 ** (digits - 1) if digits > 1 else 0), 10**digits

  def _example(self, a: int, op: str, b: int, rng) -> Example:
    answer = str(eval(f"{a}{op}{b}"))  # noqa: S307 - two ints and one operator
    wrong = rng.random() < self.wrong_fraction
    right = f"<calc>{a}{op}{b}</calc><result>{answer}</result>{answer}" if self.tool_demos else answer
    return Example(prompt=f"{a}{op}{b}=", answer=answer, demo=str(self._wrong(a, op, b)) if wrong else right,
                   tag=self.name)

  def examples(self, split: str, n: int) -> list[Example]:
    """`n` examples of `split`. A problem space of at most 10^5 problems is
    enumerated: eval returns each held-out problem at most once (so possibly
    fewer than n), train cycles through reshuffled passes."""
    check_split(split)
    rng = split_rng(self.seed, split)
    (lo1, hi1), (lo2, hi2) = self._range(self.digits), self._range(self.digits2 or self.digits)
    want_eval = split == "eval"
    if (hi1 - lo1) * (hi2 - lo2) * len(self.ops) <= 100_000:
      space = [(a, op, b) for a in range(lo1, hi1) for op in self.ops for b in range(lo2, hi2)
               if in_eval_split(f"{a}{op}{b}=", self.seed, self.eval_fraction) == want_eval]
      if not space:
        raise ValueError(f"arithmetic: the {split} split is empty (eval_fraction={self.eval_fraction})")
      if want_eval:
        order = rng.permutation(len(space))[:n]
        return [self._example(*space[i], rng) for i in order]
      out = []
      while len(out) < n:
        out += [self._example(*space[i], rng) for i in rng.permutation(len(space))[:n - len(out)]]
      return out
    out = []
    while len(out) < n:
      a, b = int(rng.integers(lo1, hi1)), int(rng.integers(lo2, hi2))
      op = self.ops[int(rng.integers(len(self.ops)))]
      if in_eval_split(f"{a}{op}{b}=", self.seed, self.eval_fraction) == want_eval:
        out.append(self._example(a, op, b, rng))
    return out
