"""The built-in tools: a calculator (for word_problems) and a Python runner (for countdown).

Both run inside a tool worker (envs/pool.py), so the worker's limits bound them; the calculator also
bounds its own numbers, so that "9**9**9" is refused at once rather than timed out.
"""

from __future__ import annotations

import ast
import builtins
import math
import operator

from jaxrl_llm.envs.tool import Tool, ToolError

MAX_EXPRESSION_CHARS = 256  # a calculator expression's length
MAX_RESULT_DIGITS = 100  # digits of an integer the calculator will compute (and of a power's estimate)
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
# Spellings a model writes for the operators: × and ÷, and ^ for a power (as in most calculators).
_SPELLINGS = {"×": "*", "÷": "/", "^": "**", "−": "-"}


def _check_size(value):
  if isinstance(value, float) and not math.isfinite(value):
    raise ToolError("the result is not a finite number")
  if isinstance(value, int) and abs(value) >= 10**MAX_RESULT_DIGITS:
    raise ToolError(f"the result has more than {MAX_RESULT_DIGITS} digits")
  return value


def _evaluate(node: ast.AST):
  if isinstance(node, ast.Constant) and type(node.value) in (int, float):
    return _check_size(node.value)
  if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
    return _UNARY[type(node.op)](_evaluate(node.operand))
  if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
    left, right = _evaluate(node.left), _evaluate(node.right)
    if isinstance(node.op, ast.Pow):
      # digits of left ** right, estimated before computing it
      if abs(right) > 1 and abs(left) > 1 and abs(right) * math.log10(abs(left)) > MAX_RESULT_DIGITS:
        raise ToolError(f"the result has more than {MAX_RESULT_DIGITS} digits")
      if isinstance(left, (int, float)) and left < 0 and not float(right).is_integer():
        raise ToolError("a negative number to a fractional power is not a real number")
    try:
      return _check_size(_BINARY[type(node.op)](left, right))
    except ZeroDivisionError:
      raise ToolError("division by zero") from None
    except OverflowError:
      raise ToolError("the result is not a finite number") from None
  raise ToolError("only numbers, + - * / // % ** and parentheses are allowed")


def format_number(value) -> str:
  """An integer, or an integral float below 1e15, as digits ("12", not "12.0"); other floats with 12
  significant digits."""
  if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
    return str(int(value))
  if isinstance(value, float):
    return f"{value:.12g}"
  return str(value)


def calculator(expression: str) -> str:
  """The value of an arithmetic expression: numbers, + - * / // % ** (^ too) and parentheses.

  Evaluated from its syntax tree, never by eval: a name, a call or an attribute is refused.
  """
  text = expression.strip()
  for spelling, op in _SPELLINGS.items():
    text = text.replace(spelling, op)
  if not text:
    raise ToolError("empty expression")
  if len(text) > MAX_EXPRESSION_CHARS:
    raise ToolError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
  try:
    tree = ast.parse(text, mode="eval")
  except (SyntaxError, ValueError, RecursionError, MemoryError):
    raise ToolError(f"cannot read {expression.strip()[:80]!r} as an arithmetic expression") from None
  try:
    return format_number(_evaluate(tree.body))
  except RecursionError:
    raise ToolError("the expression is nested too deeply") from None


def python(code: str) -> str:
  """Runs `code` as a fresh program (its own globals). The output is what it prints, then the value of
  its last line when that is an expression (as a notebook cell shows it). An exception in the code is
  output too ("ZeroDivisionError: division by zero"), not a tool failure: the model reads it as it
  would read an interpreter's. Running out of memory is not (the worker reports it)."""
  try:
    tree = ast.parse(code, mode="exec")
  except (SyntaxError, ValueError) as e:
    print(f"SyntaxError: {getattr(e, 'msg', e)}")
    return ""
  last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
  namespace = {"__name__": "__main__", "__builtins__": builtins}
  try:
    exec(compile(tree, "<code>", "exec"), namespace)  # noqa: S102 - the purpose of this tool
    if last is not None:
      value = eval(compile(ast.Expression(last.value), "<code>", "eval"), namespace)  # noqa: S307
      if value is not None:
        print(repr(value))
  except MemoryError:
    raise
  except SystemExit:
    pass  # the program ended itself
  except Exception as e:  # noqa: BLE001 - the program's own error is its output
    print(f"{type(e).__name__}: {e}")
  return ""


CALCULATOR = Tool(
    name="calculator", fn=calculator, tag="calc",
    description="Evaluates an arithmetic expression (numbers, + - * / // % ** and parentheses).",
    parameters={"expression": {"type": "string", "description": "the expression, e.g. (7 + 5) * 3"}})
PYTHON = Tool(
    name="python", fn=python, tag="python",
    description="Runs a short Python program and returns what it prints (and its last expression's value).",
    parameters={"code": {"type": "string", "description": "the program"}})
