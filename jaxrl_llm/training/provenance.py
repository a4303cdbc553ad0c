"""The RL run's config record: checkpointing/provenance.py with the run config's defaults
(training/defaults.py), which keep what a workdir written before a key existed computed."""

from __future__ import annotations

from jaxrl_llm.checkpointing import provenance as _provenance
from jaxrl_llm.checkpointing.provenance import (CONFIG_FILE, HISTORY_FILE, RESULT_NEUTRAL, flatten,  # noqa: F401
                                                plain_config, upgrade)


def complete(saved: dict) -> dict:
  """A saved config.json's dict with renamed keys moved and every key it lacks at its default
  (`fill_defaults`): what `python -m jaxrl_llm.evaluate` reads a workdir's config as."""
  from jaxrl_llm.training.defaults import get_config

  out = upgrade(saved)
  try:
    defaults = get_config(out.get("method", "gspo")).to_dict()
  except Exception:  # noqa: BLE001 - an unknown method: from_config_dict names it
    return out
  return _provenance.fill_defaults(out, defaults)


def run_defaults(method) -> dict:
  """The flattened default config of `method` (training/defaults.py), {} if it has none."""
  from jaxrl_llm.training.config import from_config_dict
  from jaxrl_llm.training.defaults import get_config

  try:
    return flatten(plain_config(from_config_dict(get_config(method))))
  except Exception:  # noqa: BLE001 - an unknown method: no defaults to compare with
    return {}


def result_changes(old: dict, new: dict) -> dict[str, tuple]:
  """`config_changes` of two RL configs: {key: (old, new)} for every key whose change changes the result."""
  return _provenance.config_changes(old, new, lambda: run_defaults(new.get("method")))
