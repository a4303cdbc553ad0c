"""The built-in tools: the calculator (called directly, it is a plain function) and the Python runner
(through the pool: it prints into the worker's capped output)."""

import pytest

from jaxrl_llm.envs.builtin_tools import CALCULATOR, PYTHON, calculator
from jaxrl_llm.envs.tool import ToolError


@pytest.mark.parametrize("expression,value", [
    ("7+5", "12"),
    ("(7 + 5) * 3", "36"),
    ("49 / 7", "7"),  # an integral float is written as an integer
    ("7 / 2", "3.5"),
    ("7 // 2", "3"),
    ("-7 % 3", "2"),
    ("2 ** 10", "1024"),
    ("2^10", "1024"),  # ^ is a power, as in calculators
    ("6 × 7", "42"),
    ("84 ÷ 2", "42"),
    ("1/3", "0.333333333333"),  # 12 significant digits
    ("10**99", "1" + "0" * 99),
    ("+-3", "-3"),
])
def test_calculator_values(expression, value):
  assert calculator(expression) == value


@pytest.mark.parametrize("expression,message", [
    ("1/0", "division by zero"),
    ("5 % 0", "division by zero"),
    ("9**9**9", "more than 100 digits"),  # refused before it is computed
    ("10**100", "more than 100 digits"),
    ("1e400", "not a finite number"),
    ("(-8) ** 0.5", "not a real number"),
    ("__import__('os').system('true')", "only numbers"),
    ("x + 1", "only numbers"),
    ("(1).real", "only numbers"),
    ("[1, 2]", "only numbers"),
    ("True + 1", "only numbers"),
    ("1j", "only numbers"),
    ("7 +", "cannot read"),
    ("", "empty expression"),
    ("1+" * 200 + "1", "longer than 256 characters"),
])
def test_calculator_refuses(expression, message):
  with pytest.raises(ToolError, match=message):
    calculator(expression)


def test_python_tool_output(pool):
  run = lambda code: pool.run(PYTHON.fn, {"code": code})  # noqa: E731
  assert run("print(3 * 5 + 7)").output == "22\n"
  assert run("x = 3 * 5\nx + 7").output == "22\n"  # the last expression's value, as a notebook shows it
  assert run("print('a')\nNone").output == "a\n"
  assert run("1 / 0").output == "ZeroDivisionError: division by zero\n"  # the program's error is output
  assert run("print(1\n").output.startswith("SyntaxError: ")
  assert run("import sys\nprint('before')\nsys.exit(3)\nprint('after')").output == "before\n"
  assert run("x = 1").status == "ok" and run("x = 1").output == ""
  # Each call is a fresh program: nothing carries over.
  assert run("y = 5").status == "ok"
  assert run("y").output == "NameError: name 'y' is not defined\n"


def test_calculator_through_the_pool(pool):
  assert pool.run(CALCULATOR.fn, {"expression": "(7+5)*3"}).output == "36"
  refused = pool.run(CALCULATOR.fn, {"expression": "1/0"})
  assert (refused.status, refused.output) == ("tool_error", "division by zero")
