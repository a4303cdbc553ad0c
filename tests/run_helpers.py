"""Helpers shared by the trainer tests (training/, teacher/, ...): configs shrunk for CPU."""

import importlib.util
import os

# XLA:CPU with LLVM's cheap passes, the elemental fusion emitters, each program's machine code made in
# one piece and Eigen's kernels on the calling thread: the suite is compile-bound (tests/conftest.py).
CHEAP_XLA_FLAGS = (
    "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true --xla_cpu_use_fusion_emitters=false"
    " --xla_cpu_parallel_codegen_split_count=1 --xla_cpu_multi_thread_eigen=false")
# The subprocesses that run on one CPU device.
ONE_DEVICE_XLA_FLAGS = f"--xla_force_host_platform_device_count=1 {CHEAP_XLA_FLAGS}"

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(REPO, "configs")


def parity_reward(prompt, response, answer):
  """A reward a freshly initialised model earns about half the time (odd
  response length, set by when it emits EOS): groups get real advantages, so
  tests of the loop see non-zero updates without a warm start."""
  return float(len(response) % 2)


def make_trainer(cfg, workdir, log, *, reward=parity_reward, **kwargs):
  """A Trainer scoring with `reward` (a reward function; default `parity_reward`)."""
  from jaxrl_llm.tasks.rewards import RewardRunner
  from jaxrl_llm.training.loop import Trainer

  runner = reward if isinstance(reward, RewardRunner) else RewardRunner(reward)
  return Trainer(cfg, str(workdir), log=log, reward=runner, **kwargs)


def load_config(name: str):
  """configs/<name>.py's get_config(), loaded the way the entry point does."""
  spec = importlib.util.spec_from_file_location(f"cfg_{name}", os.path.join(CONFIGS, f"{name}.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod.get_config()


def shrink(c, **overrides):
  """A tiny model and batch: seconds per step on the CPU."""
  from jaxrl_llm.training.tiny import TINY_MODEL, apply_settings

  apply_settings(c, TINY_MODEL)
  c.sft.steps, c.train.steps = 0, 3
  c.rollout.prompts_per_step, c.rollout.group_size, c.rollout.max_response_len = 8, 4, 5
  c.data.max_prompt_len = 0
  c.eval.n_examples = 8
  c.task.n_train = 256
  c.log.progress = False
  c.teacher.sft_steps, c.teacher.hint_sft_steps = 20, min(c.teacher.hint_sft_steps, 20)  # teacher warm starts
  return apply_settings(c, overrides)
