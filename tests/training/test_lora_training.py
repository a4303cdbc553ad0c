"""A LoRA run of the trainer (model/lora.py): only the adapters train, the optimizer holds only
them, the frozen base is the KL reference with no second copy, and QLoRA runs from the command line."""

import json
import math
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from run_helpers import ONE_DEVICE_XLA_FLAGS, REPO, load_config, make_trainer, shrink
from jaxrl_llm.model import lora
from jaxrl_llm.training.config import from_config_dict


def _nbytes(tree) -> int:
  return sum(x.nbytes for x in jax.tree.leaves(tree))


def _buffers(tree) -> dict:
  """Distinct device buffers of a tree: pointer -> bytes."""
  return {x.addressable_data(0).unsafe_buffer_pointer(): x.nbytes for x in jax.tree.leaves(tree)}


@pytest.mark.slow
def test_lora_run_trains_only_the_adapters_against_the_frozen_base(tmp_path, quiet_log):
  c = shrink(load_config("grpo"), **{"model.lora.rank": 8, "model.lora.alpha": 16.0, "objective.kl_coef": 0.05,
                                     "rollout.staleness": 1, "train.lr": 1e-2})
  tr = make_trainer(from_config_dict(c), tmp_path, quiet_log)
  state = tr.start_rl(tr.setup_extensions(tr.init_state(jax.random.key(0))))
  trainable, frozen = lora.partition(state.params)
  base0 = jax.tree.map(np.asarray, frozen)
  adapters0 = jax.tree.map(np.asarray, trainable)
  assert set(trainable["layers"]) == {n for t in tr.model_cfg.lora.targets for n in lora.adapter_names(t)}
  # The optimizer holds the adapters' moments only: 2 x (their bytes), plus counters.
  opt_bytes = _nbytes(state.opt_state)
  assert 2 * _nbytes(trainable) <= opt_bytes < 2 * _nbytes(trainable) + 1024
  # The KL reference and the staleness snapshot share the base's buffers: no second copy.
  for snap in (state.ref_params, state.lag_params[0]):
    assert {k: v for k, v in _buffers(lora.base(snap)).items()} == _buffers(frozen)
    assert not set(_buffers(lora.trainable(snap))) & set(_buffers(trainable))  # adapters copied
  distinct = {**_buffers(state.params), **_buffers(state.ref_params), **_buffers(state.lag_params)}
  assert sum(distinct.values()) < _nbytes(frozen) + 3 * _nbytes(trainable) + 1024
  for _ in range(3):
    state, metrics = tr.step(state)
    assert metrics["update/skipped_nonfinite"] == 0.0 and metrics["grad/norm"] > 0
  assert math.isfinite(metrics["kl/ref"]) and metrics["kl/ref"] > 0  # the adapters moved the policy
  trainable, frozen = lora.partition(state.params)
  jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, frozen), base0)  # base untouched
  moved = jax.tree.map(lambda a, b: float(np.abs(np.asarray(a) - b).max()), trainable, adapters0)
  assert all(v > 0 for v in jax.tree.leaves(moved)), moved
  # The reference is still the base + the adapters as RL started (B = 0: the base itself).
  assert all(np.all(np.asarray(b) == 0) for n, b in state.ref_params["layers"].items() if "_lora_b_" in n)


@pytest.mark.slow
def test_qlora_runs_from_the_command_line_and_resumes(tmp_path):
  """`--config.model.lora.rank=8 --config.model.lora.quant=int8` through the entry point, then the
  same workdir again with one more step: the checkpoint (int8 base, adapters) restores."""
  def run(steps):
    cmd = [sys.executable, "-m", "jaxrl_llm.train", "--config=configs/grpo.py", f"--workdir={tmp_path}",
           "--config.model.lora.rank=8", "--config.model.lora.quant=int8", "--config.model.lora.quant_block=32",
           "--config.sft.steps=0", f"--config.train.steps={steps}", "--config.rollout.prompts_per_step=8",
           "--config.rollout.group_size=4", "--config.rollout.max_response_len=5", "--config.eval.n_examples=8",
           "--config.log.progress=False", "--config.checkpoint.every_steps=1"] + (
               ["--allow_config_change"] if steps > 1 else [])
    # One CPU device, as a user's laptop run has (the suite's fake 8-device mesh made it 1.4x slower).
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=ONE_DEVICE_XLA_FLAGS)
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]

  rows = run(1)
  assert [r["step"] for r in rows] == [1]
  rows = run(2)
  assert [r["step"] for r in rows] == [1, 2]
  assert all(r["update/skipped_nonfinite"] == 0.0 and math.isfinite(r["loss/total"]) for r in rows)
