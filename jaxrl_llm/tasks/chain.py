"""Chained sums written step by step: the built-in task with reasoning steps.

Prompt "23+8+15=", a correct response one running sum per line, each line
closed by a newline: "31\n46\n". Every line is a step (process supervision,
spec 003; `objective.advantage = "grpo_process"` with a process reward
model, reward_model/process.py), and a step's gold label is known:

    line k is good  <=>  lines 0..k all equal the partial sums s_1..s_{k+1}

(Math-Shepherd's definition, Wang et al. 2024, with a perfect completer: a
step is good when the answer can still be reached from it, so every step
after the first wrong one is bad.) The outcome reward is 1 when the last
line is the total.

Wrong demonstrations (`wrong_fraction`) make one step's mistake the carry
error of the arithmetic task (`wrong_step`) and continue correctly from the
wrong value, so the error propagates to the final answer as it would in a
model's chain of thought (`errors="one"`). With `errors="every_carry"` a wrong
demonstration instead drops the carry at every step that has one (the
arithmetic task's systematic error, continued from the wrong value): at
wrong_fraction > 1/2 a well-fitted warm start then drops carries when
decoding greedily, a mistake RL against the verifier can undo. With "one",
each step is wrong in only wrong_fraction / (n_terms - 1) of the
demonstrations, so greedy decoding of a well-fitted model is right: what
greedy gets wrong is what the model has not learned, and at temperature 1 a
share of the right totals come after wrong steps (measured in
docs/benchmarks.md), which the outcome verifier rewards alike.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

from jaxrl_llm.tasks.arithmetic import carry_free_sum
from jaxrl_llm.tasks.base import Example
from jaxrl_llm.tasks.split import check_split, in_eval_split, split_rng

SEPARATOR = "\n"  # closes every step of a response
_INT = re.compile(r"\d+")


def terms(prompt: str) -> list[int]:
  """The summands of a prompt "a+b+c="."""
  body = prompt.strip().rstrip("=")
  if not body or not all(_INT.fullmatch(t) for t in body.split("+")):
    raise ValueError(f"not a chained-sum prompt: {prompt!r}")
  return [int(t) for t in body.split("+")]


def partial_sums(prompt: str) -> list[int]:
  """s_1..s_{n-1}: the running sums after each summand past the first (the n-1 lines of a response)."""
  t = terms(prompt)
  out, acc = [], t[0]
  for x in t[1:]:
    acc += x
    out.append(acc)
  return out


def response_steps(response: str) -> list[str]:
  """The steps of a response: its lines, a final line without a newline included (empty ones are not)."""
  return [line for line in response.split(SEPARATOR) if line.strip()]


def step_labels(prompt: str, steps: list[str]) -> list[bool]:
  """The module docstring's gold label of each step (a line that is not a plain integer is wrong)."""
  sums = partial_sums(prompt)
  out, ok = [], True
  for k, line in enumerate(steps):
    ok = ok and k < len(sums) and _INT.fullmatch(line.strip()) is not None and int(line) == sums[k]
    out.append(ok)
  return out


def wrong_step(acc: int, x: int) -> int:
  """The carry error on acc + x: the carry-free sum, or acc + x + 10 where no carry is dropped."""
  wrong = carry_free_sum(acc, x)
  return wrong if wrong != acc + x else acc + x + 10


def chain_reward(prompt: str, response: str, answer: str) -> float:
  """1 if the last step is the total, else 0 (the steps before it are the process reward's to judge)."""
  del prompt
  steps = response_steps(response)
  return 1.0 if steps and steps[-1].strip() == answer.strip() else 0.0


def chain_format(response: str) -> bool:
  """Every step a plain integer."""
  steps = response_steps(response)
  return bool(steps) and all(_INT.fullmatch(s.strip()) for s in steps)


@dataclasses.dataclass(frozen=True)
class ChainTask:
  n_terms: int = 3  # summands per problem (n_terms - 1 steps)
  digits: int = 2  # summand size in decimal digits
  seed: int = 0  # fixes the train/eval split and the problems drawn
  eval_fraction: float = 0.1  # share of the problem space held out for eval
  wrong_fraction: float = 0.0  # share of demonstrations with carry errors (then propagated)
  errors: str = "one"  # one | every_carry: the module docstring
  name: str = "chain"

  def __post_init__(self):
    if not 2 <= self.n_terms <= 6:
      raise ValueError(f"chain n_terms={self.n_terms} must be in [2, 6]")
    if not 1 <= self.digits <= 9:
      raise ValueError(f"chain digits={self.digits} must be in [1, 9]")
    if not 0.0 < self.eval_fraction < 1.0:
      raise ValueError(f"chain eval_fraction={self.eval_fraction} must be in (0, 1)")
    if not 0.0 <= self.wrong_fraction <= 1.0:
      raise ValueError(f"chain wrong_fraction={self.wrong_fraction} must be in [0, 1]")
    if self.errors not in ("one", "every_carry"):
      raise ValueError(f"chain errors={self.errors!r} must be 'one' or 'every_carry'")

  reward_fn = staticmethod(chain_reward)
  format_fn = staticmethod(chain_format)

  def problem(self, rng) -> str:
    lo = 10 ** (self.digits - 1) if self.digits > 1 else 0
    xs = [int(x) for x in rng.integers(lo, 10 ** self.digits, size=self.n_terms)]
    return "+".join(map(str, xs)) + "="

  def solution(self, prompt: str, wrong_at: int | None = None, drop_carries: bool = False,
               wrong: Callable[[int, int], int] = wrong_step) -> list[str]:
    """The steps of a solution; with `wrong_at` = k, step k writes wrong(acc, x) (the carry error by
    default) and the rest follow it; with `drop_carries`, every step drops its carry (if it has one) and
    the rest follow it."""
    t = terms(prompt)
    acc, lines = t[0], []
    for k, x in enumerate(t[1:]):
      if drop_carries:
        acc = carry_free_sum(acc, x)
      else:
        acc = wrong(acc, x) if k == wrong_at else acc + x
      lines.append(str(acc))
    return lines

  def examples(self, split: str, n: int) -> list[Example]:
    check_split(split)
    rng = split_rng(self.seed, split)
    want_eval = split == "eval"
    out = []
    while len(out) < n:
      prompt = self.problem(rng)
      if in_eval_split(prompt, self.seed, self.eval_fraction) != want_eval:
        continue
      wrong = rng.random() < self.wrong_fraction
      if self.errors == "every_carry":
        steps = self.solution(prompt, drop_carries=wrong)
      else:
        steps = self.solution(prompt, int(rng.integers(self.n_terms - 1)) if wrong else None)
      demo = "".join(line + SEPARATOR for line in steps)
      out.append(Example(prompt=prompt, answer=str(sum(terms(prompt))), demo=demo, tag=self.name))
    return out
