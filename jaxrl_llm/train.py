"""Entry point: `python -m jaxrl_llm.train --config=configs/gspo.py
[--config.some.key=value ...] [--workdir=DIR]`.

The config file's ConfigDict is converted once into a validated RunConfig
(every check runs before any model is built), saved to <workdir>/config.json,
and the run ends with <workdir>/summary.json.
"""

from __future__ import annotations

import json
import os
import time

from absl import app, flags, logging
from ml_collections import config_flags

from jaxrl_llm import cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "a configs/<method>.py file", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "run directory; default <workdir_root>/<method>-<UTC time>")
_ALLOW_CHANGE = flags.DEFINE_bool("allow_config_change", False, "resume a workdir whose saved config differs in "
                                  "result-changing keys (the change is recorded in config_history.jsonl)")
cli.define_debug_flag()


def default_workdir(root: str, method: str) -> str:
  return os.path.join(root, f"{method}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  # Orbax logs every checkpoint step at INFO; keep the console for the progress bar.
  logging.set_verbosity(logging.WARNING)

  from jaxrl_llm.model import distributed
  from jaxrl_llm.training.config import from_config_dict
  from jaxrl_llm.training.provenance import plain_config
  from jaxrl_llm.training.extensions import extensions_for
  from jaxrl_llm.training.loop import Trainer

  if _CONFIG.value is None:
    raise app.UsageError("--config=configs/<method>.py is required")
  cfg = from_config_dict(_CONFIG.value)
  # A multi-process run (a pod slice, SLURM, JAX_COORDINATOR_ADDRESS, ...) joins here, before any device
  # is touched; its processes must run the same code on the same config.
  distributed.initialize()
  distributed.check_same_everywhere("code", distributed.code_fingerprint())
  distributed.check_same_everywhere("configs", json.dumps(plain_config(cfg), sort_keys=True, default=str))
  for ext in extensions_for(cfg):  # e.g. teacher paths, vocabulary and topk, before any model is built
    ext.preflight(cfg)
  workdir = _WORKDIR.value or default_workdir(cfg.workdir_root, cfg.run_name)
  what = cfg.method if cfg.run_name == cfg.method else f"{cfg.run_name} (objective {cfg.method})"
  print(f"method {what} -> {workdir}")
  from jaxrl_llm.learn.shell import Stopped

  try:
    prefix = distributed.log_prefix()
    summary = Trainer(cfg, workdir, allow_config_change=_ALLOW_CHANGE.value, log=lambda s: print(prefix + s)).run()
  except Stopped as e:
    print(str(e))
    raise SystemExit(128 + 15) from None  # the conventional status of a SIGTERM
  print(json.dumps(summary, indent=2))
  print(f"eval accuracy {summary['eval_accuracy_start']:.3f} -> {summary['eval_accuracy_end']:.3f} "
        f"({summary['eval_gain']:+.3f}) in {summary['run_time_s']:.0f} s; summary: "
        f"{os.path.join(workdir, 'summary.json')}")


if __name__ == "__main__":
  cli.run(main)
