"""A workdir's config: what a run resumes with, and a record of what changed (the RL run's and the
reward-model run's; each passes its own defaults: training/provenance.py, reward_model/trainer.py).

A workdir with checkpoints resumes when the same command runs again. A new
config that differs from the saved `config.json` in anything that changes
the result (the method, a knob, the data, the schedule) is refused, naming
the keys, unless the run is told to continue with it (`--allow_config_change`);
then the change is appended to `config_history.jsonl` beside `config.json`,
which holds the config the run continues with.

A config.json written before a key was renamed (checks.py's `RENAMED_KEYS`) is read
with its keys moved to their new names (`upgrade`), and a key added since at its
default (`fill_defaults`), so an old workdir still resumes and evaluates, and is compared
and rewritten in the current layout.
"""

from __future__ import annotations

import copy
import json
import os
import time
from collections.abc import Callable

from jaxrl_llm.checks import RENAMED_KEYS, ConfigError
from jaxrl_llm.model import distributed

CONFIG_FILE = "config.json"
HISTORY_FILE = "config_history.jsonl"
# Keys (or section prefixes) that do not change what the run computes: where it
# logs, how often it saves or evaluates, how many processes score rewards, which
# steps it dumps (a dumped step's update is the same, tests/training/test_dump_inspect.py).
RESULT_NEUTRAL = ("name", "workdir_root", "log.progress", "log.every", "log.dump_steps", "data.reward_workers",
                  "eval.every", "checkpoint.", "rollout.overlap",  # overlap: when batches are made, not what they are
                  # whether a sync is verified, and how long it may take: a step passes or fails, never differs
                  "rollout.server.sync_check", "rollout.server.sync_check_tol", "rollout.server.sync_timeout_s")


def upgrade(saved: dict) -> dict:
  """A saved config (config.json's dict) with every renamed key moved to its new place; the rest as is."""
  out = copy.deepcopy(saved)
  for old, new in RENAMED_KEYS.items():
    *parents, leaf = old.split(".")
    node = out
    for p in parents:
      node = node.get(p) if isinstance(node, dict) else None
    if not isinstance(node, dict) or leaf not in node:
      continue
    value = node.pop(leaf)
    *parents, leaf = new.split(".")
    node = out
    for p in parents:
      node = node.setdefault(p, {})
    node.setdefault(leaf, value)
  return out


def fill_defaults(saved: dict, defaults: dict) -> dict:
  """`upgrade(saved)` with every key it lacks (a workdir written before the key existed) added at
  its value in `defaults` (the config kind's nested default dict, which keeps what the run
  computed): what a saved config.json is read as. The defaults are declared in the kind's
  defaults.py only, so a section's dataclass has none of its own."""
  out = upgrade(saved)

  def fill(node: dict, default: dict) -> None:
    for k, v in default.items():
      if k not in node:
        node[k] = copy.deepcopy(v)
      elif isinstance(v, dict) and isinstance(node[k], dict) and k != "objective":  # a preset's knobs are complete
        fill(node[k], v)

  fill(out, defaults)
  return out


def flatten(d: dict, prefix: str = "") -> dict:
  out = {}
  for k, v in d.items():
    key = f"{prefix}{k}"
    if isinstance(v, dict):
      out.update(flatten(v, key + "."))
    else:
      out[key] = v
  return out


def plain_config(cfg) -> dict:
  """The RunConfig as the JSON that config.json holds."""
  return json.loads(json.dumps(cfg.to_dict(), default=str))


def config_changes(old: dict, new: dict, defaults: Callable[[], dict] = dict) -> dict[str, tuple]:
  """{key: (old, new)} for every key whose change changes the result.

  A key that the saved config lacks (a workdir written before the key
  existed) and that the new config holds at its default is no change: every
  key is added with the default that keeps what runs computed before it. A
  renamed key of `old` is compared under its new name (`upgrade`). `defaults()`: the config's
  flattened defaults (asked for only when `new` has keys `old` lacks)."""
  a, b = flatten(upgrade(old)), flatten(new)
  defaults = defaults() if set(b) - set(a) else {}
  out = {}
  for key in sorted(set(a) | set(b)):
    if any(key == n or (n.endswith(".") and key.startswith(n)) for n in RESULT_NEUTRAL):
      continue
    if key not in a and key in defaults and b[key] == defaults[key]:
      continue
    if a.get(key, "<absent>") != b.get(key, "<absent>"):
      out[key] = (a.get(key, "<absent>"), b.get(key, "<absent>"))
  return out


def record_config(workdir: str, cfg, *, resuming: bool, allow_change: bool, log,
                  defaults: Callable[[], dict] = dict) -> None:
  """Before a run writes its config.json: refuse a resume with another config, or record the change.
  `defaults`: as `config_changes`'s."""
  path = os.path.join(workdir, CONFIG_FILE)
  new = plain_config(cfg)
  if resuming and os.path.exists(path):
    with open(path) as f:
      old = json.load(f)
    changes = config_changes(old, new, defaults)
    if changes:
      listed = "; ".join(f"{k}: {o!r} -> {n!r}" for k, (o, n) in list(changes.items())[:12])
      more = f" (and {len(changes) - 12} more)" if len(changes) > 12 else ""
      if not allow_change:
        raise ConfigError(f"workdir {workdir!r} holds a run of another config, which this command would resume "
                          f"and change: {listed}{more}. Rerun with the saved config, choose another --workdir, "
                          f"or pass --allow_config_change to continue with the new one (recorded in {HISTORY_FILE})")
      if distributed.is_primary():
        with open(os.path.join(workdir, HISTORY_FILE), "a") as f:
          f.write(json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                              "changes": {k: list(v) for k, v in changes.items()}}) + "\n")
      log(f"config changed on resume (allowed): {listed}{more}")
  distributed.barrier("provenance_read")  # every process has read the old config.json before it is replaced
  if distributed.is_primary():
    with open(path, "w") as f:
      json.dump(new, f, indent=2)
