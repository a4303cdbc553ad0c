"""Countdown: combine the given numbers with + - * and parentheses to reach a
target. Prompt "3,5,7>22:", a correct response "3*5+7" (each number used
exactly once). The verifier parses the expression safely (no eval).

With `tool_demos` the right demonstrations check their expression with the
"python" environment's tool in the plain tag format (envs/calls.py, call_format
"tags"), whose observation is what the program prints: half check the right
expression and answer it ("<python>3*5+7</python><result>22\n</result>3*5+7"),
half first try the expression with one operator swapped, read its value, then
check and answer the right one (guess, verify, correct); the wrong
demonstrations (`wrong_fraction`) answer the swapped expression from memory,
without the tool. So RL can learn that checking, and trying again after a
wrong value, pays.
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import operator
import re

from jaxrl_llm.tasks.base import Example
from jaxrl_llm.tasks.split import check_split, in_eval_split, split_rng

_ALLOWED = re.compile(r"[0-9+\-*() ]+")
_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _evaluate(node: ast.AST, used: list[int]) -> int:
  if isinstance(node, ast.Constant) and isinstance(node.value, int):
    used.append(node.value)
    return node.value
  if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
    return _BINOPS[type(node.op)](_evaluate(node.left, used), _evaluate(node.right, used))
  raise ValueError("not a +-* expression over integers")


def parse_prompt(prompt: str) -> tuple[list[int], int]:
  numbers, target = prompt.rstrip(":").split(">")
  return [int(x) for x in numbers.split(",")], int(target)


def countdown_reward(prompt: str, response: str, answer: str) -> float:
  """1 if `response` uses the prompt's numbers exactly once each and equals the target."""
  del answer  # any valid expression counts, not only the reference one
  numbers, target = parse_prompt(prompt)
  expr = response.strip()
  if not expr or len(expr) > 64 or not _ALLOWED.fullmatch(expr):
    return 0.0
  try:
    used: list[int] = []
    value = _evaluate(ast.parse(expr, mode="eval").body, used)
  except (SyntaxError, ValueError, RecursionError):
    return 0.0
  same_numbers = collections.Counter(used) == collections.Counter(numbers)
  return 1.0 if same_numbers and value == target else 0.0


def countdown_format(response: str) -> bool:
  expr = response.strip()
  if not expr or not _ALLOWED.fullmatch(expr):
    return False
  try:
    _evaluate(ast.parse(expr, mode="eval").body, [])
  except (SyntaxError, ValueError, RecursionError):
    return False
  return True


@dataclasses.dataclass(frozen=True)
class CountdownTask:
  n_numbers: int = 3  # how many numbers to combine
  max_number: int = 9  # numbers are drawn from [1, max_number]
  seed: int = 0  # fixes the train/eval split and the problems drawn
  eval_fraction: float = 0.1  # share of the problem space held out for eval
  wrong_fraction: float = 0.0  # share of demonstrations with one operator swapped
  tool_demos: bool = False  # right demonstrations check with the python tool (module docstring)
  name: str = "countdown"

  def __post_init__(self):
    if not 2 <= self.n_numbers <= 6:
      raise ValueError(f"countdown n_numbers={self.n_numbers} must be in [2, 6]")
    if not 2 <= self.max_number <= 99:
      raise ValueError(f"countdown max_number={self.max_number} must be in [2, 99]")
    if not 0.0 < self.eval_fraction < 1.0:
      raise ValueError(f"countdown eval_fraction={self.eval_fraction} must be in (0, 1)")
    if not 0.0 <= self.wrong_fraction <= 1.0:
      raise ValueError(f"countdown wrong_fraction={self.wrong_fraction} must be in [0, 1]")

  reward_fn = staticmethod(countdown_reward)
  format_fn = staticmethod(countdown_format)

  def examples(self, split: str, n: int) -> list[Example]:
    check_split(split)
    rng = split_rng(self.seed, split)
    want_eval = split == "eval"
    out = []
    while len(out) < n:
      nums = [int(x) for x in rng.integers(1, self.max_number + 1, size=self.n_numbers)]
      ops = [str(rng.choice(list("+-*"))) for _ in range(self.n_numbers - 1)]
      expr = str(nums[0]) + "".join(o + str(x) for o, x in zip(ops, nums[1:]))
      target = _evaluate(ast.parse(expr, mode="eval").body, [])
      if target < 0:
        continue
      shown = sorted(nums)
      prompt = ",".join(map(str, shown)) + f">{target}:"
      if in_eval_split(prompt, self.seed, self.eval_fraction) != want_eval:
        continue
      def swapped() -> str:  # the expression with one operator swapped
        i = int(rng.integers(len(ops)))
        changed = ops.copy()
        changed[i] = {"+": "-", "-": "+", "*": "+"}[ops[i]]
        return str(nums[0]) + "".join(o + str(x) for o, x in zip(changed, nums[1:]))

      demo = expr
      if rng.random() < self.wrong_fraction:
        demo = swapped()
      elif self.tool_demos:
        demo = f"<python>{expr}</python><result>{target}\n</result>{expr}"
        if rng.random() < 0.5:  # guess, verify, correct
          guess = swapped()
          demo = f"<python>{guess}</python><result>{_evaluate(ast.parse(guess, mode='eval').body, [])}\n</result>{demo}"
      out.append(Example(prompt=prompt, answer=expr, demo=demo, tag=self.name))
    return out
