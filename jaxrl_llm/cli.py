"""How the entry points end: one short line for a user's mistake, a traceback for a bug.

A user error is a bad flag or config value, a misspelled config key, a file
or directory that is missing or of the wrong kind, or a checkpoint that
cannot be used: the entry point prints `error: <what, which value, what is
allowed>` and exits with status 2. Anything else is a bug and keeps its
traceback. `--debug` shows the traceback of user errors too. `--help` prints
the usage and exits 0 (absl's own exits 1, as for a bad flag).

    if __name__ == "__main__":
      cli.run(main)          # instead of absl.app.run(main)

`load_config_file` loads a `--config=FILE` the way the entry points do, for
the lab and for a recipe built on another one.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import os
import re
import sys
import traceback
from collections.abc import Callable

import ml_collections

from jaxrl_llm.checks import RENAMED_KEYS, ConfigError, renamed_message

EXIT_USER_ERROR = 2
# Files and directories a user pointed at (a missing file, a file where a directory belongs, ...).
_OS_ERRORS = (FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError, PermissionError)


def load_config_file(path: str) -> ml_collections.ConfigDict:
  """get_config() of a config file, loaded the way `--config=FILE` of the trainer loads it (a recipe
  built on another one loads it with this: configs/examples/*_no_tool.py)."""
  if not os.path.isfile(path):
    raise ConfigError(f"--config={path!r}: no such file (expected a configs/<method>.py-style file)")
  spec = importlib.util.spec_from_file_location(f"config_{hashlib.md5(path.encode()).hexdigest()}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


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
    renamed = "" if flag else _renamed_key_message(text)  # a flag's renamed key was refused before parsing
    if renamed:
      return renamed
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

  guard(refuse_renamed_flags, sys.argv[1:])
  show_help_if_asked(sys.argv[1:])
  guard(app.run, main)


# absl's help flags (-? is --help's short name), and whether each shows only the main module's flags.
_HELP_FLAGS = {"?": True, "help": True, "helpshort": True, "helpfull": False}


def show_help_if_asked(argv: list[str]) -> None:
  """absl's usage text and exit 0 when a help flag is among the flags (before any `--`).
  absl prints the same text but exits 1, its status for a bad flag; help that was asked for succeeded."""
  from absl import app

  args = argv[:argv.index("--")] if "--" in argv else argv
  asked = [a.lstrip("-") for a in args if a.startswith("-") and a.lstrip("-") in _HELP_FLAGS]
  if not asked:
    return
  short = _HELP_FLAGS[asked[0]]
  app.usage(shorthelp=short, writeto_stdout=True)
  if short:
    print("\nTry --helpfull to get a list of all flags.")
  sys.exit(0)


def refuse_renamed_flags(argv: list[str]) -> None:
  """A ConfigError naming the new key for a `--config.<key>` flag whose key was renamed
  (checks.py's RENAMED_KEYS), e.g. `--config.rollout.async=True`; before ml_collections
  parses the flags, which would fail on the keyword or name no new key."""
  for i, arg in enumerate(argv):
    if not arg.startswith("--config."):
      continue
    path, eq, value = arg.partition("=")
    if not eq and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
      value = argv[i + 1]  # --config.key VALUE
    # `rollout["async"]` is ml_collections' subscript spelling of `rollout.async`.
    key = re.sub(r"""\[\s*["']([^"']+)["']\s*\]""", r".\1", path[len("--config."):])
    if key in RENAMED_KEYS:
      raise ConfigError(renamed_message(key, value or "..."))


def _renamed_key_message(text: str) -> str:
  """The refusal of a renamed key that a config file set (`c.rollout["async"] = True`, say), or ""
  when the key ml_collections refused was not renamed. Its error names the key and the fields of
  its section, among which the new key's first part (`rollout.overlap`, `rollout.server`) is."""
  found = re.match(r"""Key "([^"]+)" does not exist and cannot be added .*Other fields present: (.*)""", text,
                   re.DOTALL)
  if not found:
    return ""
  name, fields = found.groups()

  def sibling(old: str) -> str:  # the new key's first part in the old key's section
    section = old.rpartition(".")[0]
    return RENAMED_KEYS[old].removeprefix(section + ".").split(".")[0]

  olds = [old for old in RENAMED_KEYS if old.rpartition(".")[2] == name and f"'{sibling(old)}'" in fields]
  return renamed_message(olds[0]) if len(olds) == 1 else ""


def define_debug_flag() -> None:
  from absl import flags

  if "debug" not in flags.FLAGS:
    flags.DEFINE_bool("debug", False, "show the traceback of a user error (a bad flag, value or file)")
