"""How the entry points end: one short line for a user's mistake, a traceback for a bug.

A user error is a bad flag or config value, a misspelled config key, a file
or directory that is missing or of the wrong kind, or a checkpoint that
cannot be used: the entry point prints `error: <what, which value, what is
allowed>` and exits with status 2. Anything else is a bug and keeps its
traceback. `--debug` shows the traceback of user errors too.

    if __name__ == "__main__":
      cli.run(main)          # instead of absl.app.run(main)
"""

from __future__ import annotations

import ast
import keyword
import sys
import traceback
from collections.abc import Callable

from jaxrl_llm.checks import ConfigError

EXIT_USER_ERROR = 2
# Files and directories a user pointed at (a missing file, a file where a directory belongs, ...).
_OS_ERRORS = (FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError, PermissionError)


def _from_config_parsing(e: BaseException) -> bool:
  """A config key error raised while ml_collections parsed a --config.* flag."""
  return isinstance(e, (AttributeError, KeyError)) and any(
      "ml_collections" in frame.filename for frame in traceback.extract_tb(e.__traceback__))


def is_user_error(e: BaseException) -> bool:
  from jaxrl_llm.checkpointing.errors import CheckpointError

  if isinstance(e, (ConfigError, CheckpointError) + _OS_ERRORS) or _from_config_parsing(e):
    return True
  # ml_collections reports a config file it could not load as an OSError around the real cause.
  return isinstance(e, OSError) and "Failed loading config file" in str(e)


def message(e: BaseException) -> str:
  """The error's text on one or a few lines, without Python's quoting of it."""
  text = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
  if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
    try:
      text = str(ast.literal_eval(text))  # ml_collections wraps its message in a repr
    except (ValueError, SyntaxError):
      pass
  if _from_config_parsing(e):
    key = text.splitlines()[0].strip("'\"") if text else ""
    flag = next((a for a in sys.argv[1:] if a.startswith("--config.") and key and key in a), "")
    hint = " ".join(line.strip() for line in text.splitlines()[1:])
    text = f"unknown config key {key!r}" + (f" in {flag.split('=')[0]}" if flag else "") + (f": {hint}" if hint else "")
  if isinstance(e, OSError) and "Failed loading config file" in text:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    text = "--config: cannot load the config file: " + " ".join(lines[-2:])
  return text


def guard(fn: Callable, *args):
  """fn(*args); a user error ends the process with one line on stderr and status 2."""
  debug = any(a in ("--debug", "--debug=true", "--debug=True", "--debug=1") for a in sys.argv[1:])
  try:
    return fn(*args)
  except SystemExit:
    raise
  except Exception as e:  # pylint: disable=broad-except
    if debug or not is_user_error(e):
      raise
    print(f"error: {message(e)}", file=sys.stderr)
    print("(--debug shows the traceback)", file=sys.stderr)
    sys.exit(EXIT_USER_ERROR)


def run(main: Callable) -> None:
  """absl.app.run(main), with user errors reported in one line (exit 2)."""
  from absl import app

  sys.argv[1:] = [keyword_flag(a) for a in sys.argv[1:]]
  guard(app.run, main)


def keyword_flag(arg: str) -> str:
  """`--config.rollout.async=True` -> `--config.rollout["async"]=True`: ml_collections reads a
  `--config.` path as Python, where a keyword (`async`) cannot follow a dot; the subscript says the same."""
  if not arg.startswith("--config."):
    return arg
  path, eq, value = arg.partition("=")
  parts = path[len("--"):].split(".")
  if not any(keyword.iskeyword(p) for p in parts):
    return arg
  out = parts[0]
  for p in parts[1:]:
    out += f'["{p}"]' if keyword.iskeyword(p) else f".{p}"
  return f"--{out}{eq}{value}"


def define_debug_flag() -> None:
  from absl import flags

  if "debug" not in flags.FLAGS:
    flags.DEFINE_bool("debug", False, "show the traceback of a user error (a bad flag, value or file)")
