"""Helpers shared by the trainer tests (training/, teacher/, ...): configs shrunk for CPU."""

import importlib.util
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(REPO, "configs")


def parity_reward(prompt, response, answer):
  """A reward a freshly initialised model earns about half the time (odd
  response length, set by when it emits EOS): groups get real advantages, so
  tests of the loop see non-zero updates without a warm start."""
  return float(len(response) % 2)


def make_trainer(cfg, workdir, log, **kwargs):
  """A Trainer scoring with `parity_reward`."""
  from jaxrl_llm.tasks.rewards import RewardRunner
  from jaxrl_llm.training.loop import Trainer

  tr = Trainer(cfg, str(workdir), log=log, **kwargs)
  tr.runner = RewardRunner(parity_reward)
  return tr


def load_config(name: str):
  """configs/<name>.py's get_config(), loaded the way the entry point does."""
  spec = importlib.util.spec_from_file_location(f"cfg_{name}", os.path.join(CONFIGS, f"{name}.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod.get_config()


def shrink(c, **overrides):
  """A tiny model and batch: seconds per step on the CPU."""
  c.model.d_model, c.model.n_layers, c.model.n_heads, c.model.n_kv_heads, c.model.d_ff = 32, 1, 2, 1, 64
  c.sft.steps, c.train.steps = 0, 3
  c.rollout.prompts_per_step, c.rollout.group_size, c.rollout.max_response_len = 8, 4, 5
  c.data.max_prompt_len = 0
  c.eval.n_examples = 8
  c.task.n_train = 256
  c.log.progress = False
  c.teacher.sft_steps, c.teacher.hint_sft_steps = 20, min(c.teacher.hint_sft_steps, 20)  # teacher warm starts
  for key, value in overrides.items():
    node = c
    *parents, leaf = key.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = value
  return c
