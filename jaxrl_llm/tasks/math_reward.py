"""Math answers checked with math-verify (symbolic equivalence, LaTeX or plain).

math-verify's own signal-based timeouts are turned off here: the reward runner
wraps each call in one timeout of its own (see `rewards.py`), and two nested
SIGALRM timers would cancel each other.
"""

from __future__ import annotations


def math_verify_reward(prompt: str, response: str, answer: str) -> float:
  """1 if the response's final answer is mathematically equal to `answer`."""
  del prompt
  import math_verify  # imported lazily: it pulls in sympy (about a second)

  gold = math_verify.parse(answer if "$" in answer or "\\" in answer else f"${answer}$",
                           parsing_timeout=None)
  pred = math_verify.parse(response, parsing_timeout=None)
  if not gold or not pred:
    return 0.0
  return 1.0 if math_verify.verify(gold, pred, timeout_seconds=None) else 0.0


def boxed_format(response: str) -> bool:
  """The response states a final answer as \\boxed{...}."""
  return "\\boxed{" in response
