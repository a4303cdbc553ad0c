"""The lab's grid: method specs, mismatch tokens, seeds, and the trainer flags of each run.

A method is a preset file `configs/<name>.py`, optionally with knobs changed
after `@`: `icepop@band_high=2` is IcePop with the band [0.5, 2] (a key
without a dot is an objective knob, `objective.band_high`; a dotted key is
any config key, `grpo@rollout.temperature=0.7`). A mismatch token sets the
rollout keys of sampling/mismatch.py: `none`, `bf16` (rollout.sampler_dtype),
`int8` / `int4` with an optional group size (`int4:128`, rollout.mismatch.quant
and rollout.mismatch.quant_group), `noise:S` (rollout.mismatch.noise), `stale:K`
(rollout.staleness), and several joined with `+` (`int4+stale:1`).

Every value reaches the trainer as a `--config.<key>=<value>` flag of
`python -m jaxrl_llm.train`, parsed there exactly as on the command line.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re

from jaxrl_llm.checks import RENAMED_KEYS, ConfigError, bad, check_choice, renamed_message
from jaxrl_llm.cli import load_config_file

MISMATCH_FORMS = "none, bf16, int8[:GROUP], int4[:GROUP], noise:STD, stale:K, or several joined with + (int4+stale:1)"
# Keys the lab sets in every run; a --config.<key> override of one is an error naming the lab's flag.
LAB_KEYS = {"seed": "--seeds", "init_checkpoint": "the lab's warm start", "train.steps": "--steps",
            "eval.every": "--eval-every", "log.every": "(every step is logged)"}
# Keys the --mismatch tokens set.
MISMATCH_KEYS = ("rollout.sampler_dtype", "rollout.mismatch.quant", "rollout.mismatch.quant_group",
                 "rollout.mismatch.noise", "rollout.staleness")
WARM_START_PRESET = "grpo"  # the preset the warm start runs with when no --config is given (its SFT only)


def default_configs_dir() -> str:
  """The repository's configs/ folder, next to the package."""
  return os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs")


def preset_names(configs_dir: str) -> tuple[str, ...]:
  """The method presets: configs/<name>.py."""
  if not os.path.isdir(configs_dir):
    raise ConfigError(f"--configs-dir={configs_dir!r} is not a directory: expected the folder of configs/<method>.py")
  return tuple(sorted(f[:-3] for f in os.listdir(configs_dir) if f.endswith(".py") and not f.startswith("_")))


@dataclasses.dataclass(frozen=True)
class MethodSpec:
  label: str  # as written on the command line: icepop@band_high=2
  preset: str  # configs/<preset>.py
  overrides: tuple[tuple[str, str], ...] = ()  # (config key, value as typed)


@dataclasses.dataclass(frozen=True)
class Mismatch:
  label: str  # as written: int4:128+stale:1
  settings: tuple[tuple[str, str], ...] = ()  # (config key, value) of the rollout


def parse_method(text: str, presets: tuple[str, ...]) -> MethodSpec:
  name, *changes = text.strip().split("@")
  check_choice("--methods", name, presets, lead="allowed (configs/*.py, optionally with @knob=value):")
  overrides = []
  for change in changes:
    key, sep, value = change.partition("=")
    if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", key) or not value:
      raise bad("--methods", text, f"{change!r} must be knob=value (objective.knob) or section.key=value")
    key = key if "." in key else f"objective.{key}"
    if key in RENAMED_KEYS:
      raise bad("--methods", text, renamed_message(key, value))
    if key in LAB_KEYS or key in MISMATCH_KEYS:
      raise bad("--methods", text, f"{key} is set by the lab ({LAB_KEYS.get(key, '--mismatch')})")
    overrides.append((key, value))
  return MethodSpec(text.strip(), name, tuple(overrides))


def parse_mismatch(text: str) -> Mismatch:
  """The rollout settings of one --mismatch token (forms: MISMATCH_FORMS)."""
  text = text.strip()
  if text == "none":
    return Mismatch("none")
  out: dict[str, str] = {}

  def put(key, value, part):
    if key in out:
      raise bad("--mismatch", text, f"{part!r} sets {key} a second time; allowed: {MISMATCH_FORMS}")
    out[key] = value

  for part in text.split("+"):
    kind, colon, arg = part.partition(":")
    if kind == "bf16" and not colon:
      put("rollout.sampler_dtype", "bfloat16", part)
    elif kind in ("int8", "int4"):
      put("rollout.mismatch.quant", kind, part)
      if colon:
        put("rollout.mismatch.quant_group", str(_number(text, part, arg, int, 1)), part)
    elif kind == "noise" and colon:
      put("rollout.mismatch.noise", repr(_number(text, part, arg, float, 0.0, 1.0)), part)
    elif kind == "stale" and colon:
      put("rollout.staleness", str(_number(text, part, arg, int, 1)), part)
    else:
      raise bad("--mismatch", text, f"unknown part {part!r}; allowed: {MISMATCH_FORMS}")
  return Mismatch(text, tuple(out.items()))


def _number(text, part, arg, kind, low, high=None):
  try:
    v = kind(arg)
  except ValueError:
    v = None
  if v is None or not (v > low if kind is float else v >= low) or (high is not None and v > high):
    span = f"in ({low}, {high}]" if kind is float else f"an integer >= {low}"
    raise bad("--mismatch", text, f"{part!r} needs {span}; allowed: {MISMATCH_FORMS}")
  return v


def parse_seeds(text: str) -> tuple[int, ...]:
  """--seeds=N (seeds 0..N-1) or an explicit list --seeds=0,3,7."""
  try:
    values = [int(s) for s in text.split(",")]
  except ValueError:
    values = []
  if not values or any(v < 0 for v in values):
    raise bad("--seeds", text, "a count N >= 1 (seeds 0..N-1) or a list of seeds >= 0 (0,3,7)")
  if "," not in text:
    if values[0] < 1:
      raise bad("--seeds", text, "a count N >= 1 (seeds 0..N-1) or a list of seeds >= 0 (0,3,7)")
    return tuple(range(values[0]))
  if len(set(values)) != len(values):
    raise bad("--seeds", text, "each seed once")
  return tuple(values)


def slug(text: str) -> str:
  """A folder name for a method or mismatch label (`noise:0.05` -> `noise-0.05`)."""
  return re.sub(r"[^A-Za-z0-9._@=+-]", "-", text)


@dataclasses.dataclass(frozen=True)
class Cell:
  method: MethodSpec
  mismatch: Mismatch
  seed: int

  @property
  def name(self) -> str:
    return f"{slug(self.method.label)}__{slug(self.mismatch.label)}__s{self.seed}"


def make_cells(methods, mismatches, seeds) -> list[Cell]:
  """Every (method, mismatch, seed), seed-major so that one seed's grid completes first."""
  cells = [Cell(m, x, s) for s in seeds for x in mismatches for m in methods]
  names = [c.name for c in cells]
  if len(set(names)) != len(names):
    twice = sorted({n for n in names if names.count(n) > 1})
    raise ConfigError(f"--methods / --mismatch: {twice} name the same run twice (each method and mismatch once)")
  return cells


# ---- config overrides -------------------------------------------------------------
def parse_overrides(args: list[str]) -> dict[str, str]:
  """`--config.key=value` arguments -> {key: value as typed} (applied to every run)."""
  out = {}
  for a in args:
    key, sep, value = a[len("--config."):].partition("=")
    if not a.startswith("--config.") or not sep or not key:
      raise ConfigError(f"argument {a!r} is not a lab flag: expected --config.<key>=<value> or a flag of --help")
    if key in RENAMED_KEYS:
      raise ConfigError(renamed_message(key, value))
    if key in LAB_KEYS:
      raise bad(f"--config.{key}", value, f"the lab sets it: use {LAB_KEYS[key]}")
    if key in MISMATCH_KEYS:
      raise bad(f"--config.{key}", value, f"the lab sets it from --mismatch ({MISMATCH_FORMS})")
    out[key] = value
  return out


def _flat(d: dict, prefix: str = "") -> dict:
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(_flat(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def flag_value(value) -> str:
  """A config value as `--config.key=` text that ml_collections parses back to it."""
  if isinstance(value, bool):
    return "true" if value else "false"
  if isinstance(value, (int, float)):
    return repr(value)
  if isinstance(value, (tuple, list)):
    return repr(tuple(value))
  if isinstance(value, str):
    return value
  raise ConfigError(f"a config value {value!r} ({type(value).__name__}) cannot be passed as a flag")


def base_overrides(base_path: str, configs_dir: str) -> tuple[str, dict[str, str]]:
  """(the base's method, its changes as flags): what `--config=BASE.py` changes from
  configs/<its method>.py, outside `method`, `name` and the objective block (each
  run's method sets those) and the keys the lab sets (LAB_KEYS)."""
  base = load_config_file(base_path)
  method = base.method
  preset_path = os.path.join(configs_dir, f"{method}.py")
  if not os.path.isfile(preset_path):
    raise bad(f"--config={base_path}: config.method", method, f"expected a preset with a file in {configs_dir}")
  ref = _flat(load_config_file(preset_path).to_dict())
  out = {}
  for key, value in sorted(_flat(base.to_dict()).items()):
    if key in ("method", "name") or key.startswith("objective.") or key in LAB_KEYS:
      continue
    if key not in ref:
      raise ConfigError(f"--config={base_path}: key {key!r} is not in {preset_path}")
    if value != ref[key]:
      if value is None:
        raise ConfigError(f"--config={base_path}: {key}=None cannot be passed to the runs; set a value")
      if key in MISMATCH_KEYS:
        raise bad(f"--config={base_path}: {key}", value, f"the lab sets it from --mismatch ({MISMATCH_FORMS})")
      out[key] = flag_value(value)
  return method, out


def file_sha(path: str) -> str:
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()[:16]
