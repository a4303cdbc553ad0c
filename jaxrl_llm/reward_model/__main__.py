"""Entry point: `python -m jaxrl_llm.reward_model --config=configs/reward_model.py
[--config.some.key=value ...] [--workdir=DIR]`.

Trains a reward model from preference pairs, a process reward model from stepwise labels
(config.objective="process"), or the policy itself from the pairs by Direct Preference Optimization
(config.objective="dpo", `--config=configs/dpo.py`; reward_model/trainer.py): the
config is validated and every pair read before any workdir exists; a bad
value or row ends with one `error:` line and exit status 2. The run ends
with <workdir>/summary.json and, with `export`, <workdir>/hf.
"""

from __future__ import annotations

import json
import os
import time

from absl import app, flags, logging
from ml_collections import config_flags

from jaxrl_llm import cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "configs/reward_model.py", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "run directory; default <workdir_root>/<name>-<UTC time>")
_ALLOW_CHANGE = flags.DEFINE_bool("allow_config_change", False, "resume a workdir whose saved config differs in "
                                  "result-changing keys (the change is recorded in config_history.jsonl)")
cli.define_debug_flag()


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  logging.set_verbosity(logging.WARNING)  # Orbax logs every checkpoint step at INFO
  from jaxrl_llm.checkpointing.provenance import plain_config
  from jaxrl_llm.learn.shell import Stopped
  from jaxrl_llm.model import distributed
  from jaxrl_llm.reward_model.config import reward_config_from_dict
  from jaxrl_llm.reward_model.trainer import RewardModelRun

  if _CONFIG.value is None:
    raise app.UsageError("--config=configs/reward_model.py is required")
  cfg = reward_config_from_dict(_CONFIG.value)
  # A multi-process run (a pod slice, SLURM, JAX_COORDINATOR_ADDRESS, ...) joins here, before any device
  # is touched, as `python -m jaxrl_llm.train` does; its processes must run the same code on the same config.
  distributed.initialize()
  distributed.check_same_everywhere("code", distributed.code_fingerprint())
  distributed.check_same_everywhere("configs", json.dumps(plain_config(cfg), sort_keys=True, default=str))
  workdir = _WORKDIR.value or os.path.join(cfg.workdir_root,
                                           f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}")
  prefix = distributed.log_prefix()
  run = RewardModelRun(cfg, workdir, allow_config_change=_ALLOW_CHANGE.value,  # reads every pair: errors first
                       log=lambda s: print(prefix + s))
  print(f"{'DPO policy' if cfg.dpo_run else 'reward model'} {cfg.name} -> {workdir}")
  try:
    summary = run.run()
  except Stopped as e:  # SIGTERM: the step in progress was saved; the same command resumes
    print(str(e))
    raise SystemExit(128 + 15) from None  # the conventional status of a SIGTERM
  print(json.dumps(summary, indent=2))
  what = "step" if cfg.process else "pairwise"
  extra = (f", first wrong step found in {summary['eval_first_error_accuracy_end']:.3f} of solutions, "
           f"ProcessBench F1 {summary['eval_processbench_f1_end']:.3f}" if cfg.process else "")
  if cfg.dpo_run:  # the implicit reward beta log(pi / pi_ref): its margin starts at 0 (pi = pi_ref)
    extra = f", implicit reward margin {summary['eval_margin_start']:.3f} -> {summary['eval_margin_end']:.3f}"
  print(f"held-out {what} accuracy {summary['eval_accuracy_start']:.3f} -> {summary['eval_accuracy_end']:.3f} "
        f"(ECE {summary['eval_ece_end']:.3f}{extra}) in {summary['run_time_s']:.0f} s; summary: "
        f"{os.path.join(workdir, 'summary.json')}")


if __name__ == "__main__":
  cli.run(main)
