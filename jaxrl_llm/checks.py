"""Validation of config values, shared by every config section of the package.

Each check raises a `ConfigError` (a `ValueError`) naming the field, the
value and what is allowed; a value of the wrong type raises
`ConfigTypeError`, which is both a `ConfigError` and a `TypeError`:

    config.rollout.top_p=1.5 is out of range: allowed (0.0, 1.0]
    config.task.name='arith' is invalid: allowed ('arithmetic', ...) (did you mean 'arithmetic'?)

`field` is the full name a user would type (`config.rollout.top_p`,
`SamplingConfig.top_k`, `ObjectiveConfig.eps_low`). A key that was renamed
(`RENAMED_KEYS`) is refused naming its new spelling. This module imports
nothing else of the package, so every layer may use it.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from typing import Any, Iterable

# Floating dtypes by name, for every config field that holds one (model,
# sampler). The arrays' dtype objects are looked up by these names where the
# arrays are made (jnp / numpy / ml_dtypes).
DTYPES = ("float32", "bfloat16", "float16")


# Config keys that were renamed: old dotted key -> new one. Old spellings are history, never
# changed: an old key given on the command line or in a config file is refused naming the new one
# (cli.py, `check_keys`), and a saved config.json is read with them (training/provenance.py).
RENAMED_KEYS = {
    "rollout.async": "rollout.overlap",  # a Python keyword; config.json held its field name, async_
    "rollout.async_": "rollout.overlap",
    "rollout.quant": "rollout.mismatch.quant",
    "rollout.quant_group": "rollout.mismatch.quant_group",
    "rollout.noise": "rollout.mismatch.noise",
    "rollout.noise_seed": "rollout.mismatch.noise_seed",
    "rollout.sync_every": "rollout.server.sync_every",
    **{f"rollout.server_{k}": f"rollout.server.{k}" for k in (
        "url", "model", "command", "export", "sync", "concurrency", "timeout_s", "retries", "backoff_s",
        "on_failure", "on_exit", "wait_s")},
}


def renamed_message(old: str, value: str = "") -> str:
  """The one-line refusal of the renamed key `old` (dotted, without `config.`); `value`: the flag's."""
  new = RENAMED_KEYS[old]
  if value:
    return f"config.{old} was renamed: use --config.{new}={value}"
  return (f"config.{old} was renamed: use config.{new} (--config.{new}=... on the command line, "
          f"c.{new} = ... in a config file)")


class ConfigError(ValueError):
  """A config value outside what is allowed (the message names field, value, range)."""


class ConfigTypeError(ConfigError, TypeError):
  """A config value of the wrong type."""


def bad(field: str, value: Any, allowed: str) -> ConfigError:
  """The error for `field=value`, with `allowed` saying what would be accepted."""
  return ConfigError(f"{field}={value!r} is invalid: {allowed}")


def check_int(field: str, value: Any, low: int, high: int | None = None) -> int:
  if isinstance(value, bool) or not isinstance(value, int):
    raise ConfigTypeError(f"{field} must be an int, got {value!r} ({type(value).__name__})")
  if value < low or (high is not None and value > high):
    allowed = f">= {low}" if high is None else f"in [{low}, {high}]"
    raise ConfigError(f"{field}={value!r} is out of range: allowed {allowed}")
  return value


def check_float(field: str, value: Any, low: float = -math.inf, high: float = math.inf, *,
                low_open: bool = False, high_open: bool = False) -> float:
  """A finite number in [low, high] (an open end excludes its bound); returns it as a float."""
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    raise ConfigTypeError(f"{field} must be a number, got {value!r} ({type(value).__name__})")
  if not math.isfinite(value):
    raise ConfigError(f"{field}={value!r} must be finite")
  if value < low or value > high or (low_open and value == low) or (high_open and value == high):
    lo, hi = "(" if low_open else "[", ")" if high_open else "]"
    raise ConfigError(f"{field}={value!r} is out of range: allowed {lo}{low}, {high}{hi}")
  return float(value)


def check_bool(field: str, value: Any) -> bool:
  if not isinstance(value, bool):
    raise ConfigTypeError(f"{field} must be a bool, got {value!r} ({type(value).__name__})")
  return value


def check_choice(field: str, value: Any, allowed: Iterable, *, lead: str = "allowed") -> None:
  """`value` is one of `allowed`; the message lists them after `lead` and suggests the closest."""
  allowed = tuple(allowed)
  if value not in allowed:
    close = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise bad(field, value, f"{lead} {allowed}{hint}")


def check_keys(section: str, given: Iterable[str], expected: Iterable[str]) -> None:
  """A config section holds exactly the expected keys (a typo is an error, not a default)."""
  given, expected = set(given), set(expected)
  unknown, missing = sorted(given - expected), sorted(expected - given)
  if unknown or missing:
    hints = []
    for key in unknown:
      old = f"{section.removeprefix('config.')}.{key}"
      if old in RENAMED_KEYS:
        raise ConfigError(renamed_message(old))
      close = difflib.get_close_matches(key, sorted(expected), n=1)
      if close:
        hints.append(f"{key!r} -> {close[0]!r}?")
    hint = f" (did you mean {', '.join(hints)})" if hints else ""
    raise ConfigError(f"{section}: unknown keys {unknown}, missing keys {missing}{hint}")


def section_from_dict(name: str, cls: type, block: dict):
  """A config section's dict as its dataclass `cls`, every key checked (`check_keys`).

  A field whose default is a dataclass is a section inside the section (rollout.mismatch, model.lora):
  a dict there is parsed the same way, and a block that leaves it out keeps its default (the reward
  model's config has no model.lora). A library class's own error gets the section's name.
  """
  fields = dataclasses.fields(cls)
  inner = {f.name: type(f.default) for f in fields if dataclasses.is_dataclass(f.default)}
  check_keys(f"config.{name}", block, [f.name for f in fields if f.name in block or f.name not in inner])
  block = {k: section_from_dict(f"{name}.{k}", inner[k], v) if k in inner and isinstance(v, dict) else v
           for k, v in block.items()}
  try:
    return cls(**block)
  except ConfigError as e:
    if "config." in str(e):
      raise
    raise type(e)(f"config.{name}: {e}") from None

