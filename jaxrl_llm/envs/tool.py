"""A tool: a named function that runs in a tool worker (envs/pool.py) on the arguments of a call.

The function is given by reference ("module:function", or a module-level function, stored as its
reference) because it runs in another process, which imports it there. It takes the call's arguments
as keywords and returns a str. A tool's output is what the function prints followed by what it
returns, capped by the pool (`ToolLimits.output_chars`). For input it refuses (an expression that does
not parse, a division by zero) it raises `ToolError`: the message goes back to the model and the
episode goes on; any other exception is a crash.

This module imports only the standard library (and checks.py): the worker imports it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

from jaxrl_llm.checks import check_choice

# JSON-schema types an argument may have, with the Python types a value of each may be.
ARGUMENT_TYPES = {"string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,)}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*")


class ToolError(Exception):
  """Raised by a tool for input it refuses; the message becomes the observation."""


def function_path(fn: Callable | str) -> str:
  """"module:qualname" of a module-level function (a str is returned as it is)."""
  if isinstance(fn, str):
    module, _, name = fn.partition(":")
    if not module or not name:
      raise ValueError(f"Tool.fn={fn!r} is invalid: allowed 'module:function'")
    return fn
  name = getattr(fn, "__qualname__", "")
  if not name or "<" in name or "." in name or getattr(fn, "__module__", "__main__") == "__main__":
    raise ValueError(f"Tool.fn={fn!r} is invalid: allowed a module-level function of an importable module "
                     "(a worker imports it)")
  return f"{fn.__module__}:{name}"


@dataclasses.dataclass(frozen=True)
class Tool:
  """A tool as the model sees it (name, description, parameters) and as a worker runs it (fn)."""

  name: str  # what a call names, e.g. "calculator"
  fn: str  # "module:function" run in a worker as fn(**arguments) -> str (a function is stored as its path)
  description: str  # one sentence for the model's instructions
  parameters: dict  # argument name -> {"type": one of ARGUMENT_TYPES, "description": ...}; all required
  tag: str = ""  # the plain format's tag: <tag>body</tag> calls the tool with its one parameter = body

  def __post_init__(self):
    if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
      raise ValueError(f"Tool.name={self.name!r} is invalid: allowed letters, digits, '_' and '-'")
    object.__setattr__(self, "fn", function_path(self.fn))
    if not isinstance(self.parameters, dict) or not self.parameters:
      raise ValueError(f"Tool.parameters={self.parameters!r} is invalid: allowed a non-empty dict "
                       "name -> {'type': ..., 'description': ...}")
    for arg, spec in self.parameters.items():
      if not isinstance(spec, dict):
        raise ValueError(f"Tool.parameters[{arg!r}]={spec!r} is invalid: allowed {{'type': ..., 'description': ...}}")
      check_choice(f"Tool.parameters[{arg!r}]['type']", spec.get("type"), tuple(ARGUMENT_TYPES))
    if self.tag and (not _NAME.fullmatch(self.tag) or len(self.parameters) != 1):
      raise ValueError(f"Tool.tag={self.tag!r} is invalid: allowed a plain name, on a tool with exactly one "
                       f"parameter (this one has {sorted(self.parameters)})")

  @property
  def tag_argument(self) -> str:
    """The parameter a tag's body fills."""
    return next(iter(self.parameters))

  def schema(self) -> dict:
    """The function schema chat templates take as `tools=[...]` (OpenAI's form)."""
    return {"type": "function", "function": {
        "name": self.name, "description": self.description,
        "parameters": {"type": "object", "properties": dict(self.parameters),
                       "required": list(self.parameters)}}}

  def check_arguments(self, arguments: dict) -> str:
    """"" when `arguments` fit the parameters, else what is wrong (one line)."""
    missing = [a for a in self.parameters if a not in arguments]
    unknown = sorted(a for a in arguments if a not in self.parameters)
    if missing or unknown:
      return f"{self.name}: missing arguments {missing}, unknown arguments {unknown}"
    for arg, spec in self.parameters.items():
      value, kinds = arguments[arg], ARGUMENT_TYPES[spec["type"]]
      if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        return f"{self.name}: argument {arg}={value!r} is not of type {spec['type']}"
    return ""
