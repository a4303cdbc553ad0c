"""docs/architecture.md's "how to add" recipes, followed step by step.

Each test adds a toy piece the way the recipe says, changing only what the
recipe names (a registry entry is added with monkeypatch, as an edit of that
file would; a config file is written to a temporary folder), then runs the
trainer on it and checks that the piece really ran.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from run_helpers import load_config, make_trainer, shrink
from jaxrl_llm import objectives
from jaxrl_llm.cli import load_config_file
from jaxrl_llm.extension import Extension
from jaxrl_llm.tasks import registry
from jaxrl_llm.tasks.base import Example
from jaxrl_llm.training.config import from_config_dict
from jaxrl_llm.training.loop import Trainer


def _two_steps(tr):
  """(params before, params after, last metrics) of two RL steps (the first update's learning rate is 0)."""
  state = tr.start_rl(tr.setup_extensions(tr.init_state(jax.random.key(0))))
  before = jax.device_get(state.params)
  for _ in range(2):
    state, metrics = tr.step(state)
  return before, jax.device_get(state.params), metrics


def _changed(a, b) -> float:
  return max(float(np.abs(x - y).max()) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


# ---- an objective preset: objectives/presets.py's PRESETS + configs/<name>.py ------------

@pytest.mark.slow
def test_add_an_objective_preset(tmp_path, monkeypatch, quiet_log):
  # Step 1: the preset is data, one PRESETS entry (here: REINFORCE with a truncated token IS weight on c).
  toy = objectives.ObjectiveConfig(name="toy_tis", correction="tis", is_cap=1.5, aggregation="token_mean",
                                   advantage="grpo")
  monkeypatch.setitem(objectives.PRESETS, "toy_tis", toy)
  # Step 2: configs/toy_tis.py, the same few lines as every method's file.
  path = tmp_path / "toy_tis.py"
  path.write_text('from jaxrl_llm.training.defaults import get_config as _base\n\n\n'
                  'def get_config():\n  return _base("toy_tis")\n')
  cfg = from_config_dict(shrink(load_config_file(str(path)), **{"train.steps": 2}))
  assert cfg.method == "toy_tis" and cfg.objective == toy
  assert "toy_tis" in objectives.method_table()  # the README's table is generated from PRESETS
  before, after, metrics = _two_steps(make_trainer(cfg, tmp_path / "run", quiet_log))
  assert np.isfinite(metrics["loss/total"]) and metrics["update/skipped_nonfinite"] == 0.0
  assert _changed(before, after) > 1e-6  # a real update
  assert "correction/clip_high_frac" in metrics  # the preset's truncation is diagnosed


# ---- a task: a Task class + tasks/registry.py's register_task / register_reward ---------

@dataclasses.dataclass(frozen=True)
class EchoTask:
  """Prompt 'k:' -> answer 'k' for one digit k; the split is by parity."""

  seed: int = 0
  name: str = "echo"

  @staticmethod
  def reward_fn(prompt, response, answer):
    del prompt
    return 1.0 if response == answer else 0.0

  format_fn = None

  def examples(self, split, n):
    digits = [d for d in range(10) if (d % 2 == 1) == (split == "eval")]
    rng = np.random.default_rng(self.seed)
    return [Example(prompt=f"{d}:", answer=str(d), demo=str(d), tag=self.name)
            for d in rng.choice(digits, size=n)]


@pytest.mark.slow
def test_add_a_task(tmp_path, monkeypatch, quiet_log):
  monkeypatch.setattr(registry, "_TASKS", dict(registry._TASKS))  # undone after the test
  monkeypatch.setattr(registry, "_REWARDS", dict(registry._REWARDS))
  calls = []

  def echo_reward(prompt, response, answer):
    calls.append((prompt, response, answer))
    return EchoTask.reward_fn(prompt, response, answer)

  registry.register_task("echo", lambda cfg: EchoTask(seed=cfg.seed))
  registry.register_reward("echo", echo_reward)
  c = shrink(load_config("grpo"), **{"train.steps": 2, "task.name": "echo", "data.reward": "echo"})
  tr = Trainer(from_config_dict(c), str(tmp_path), log=quiet_log)  # rewards from the registry
  assert all(e.prompt in {f"{d}:" for d in range(0, 10, 2)} for e in tr.train_examples)
  assert all(e.prompt in {f"{d}:" for d in range(1, 10, 2)} for e in tr.eval_examples)
  _, _, metrics = _two_steps(tr)
  B = c.rollout.prompts_per_step * c.rollout.group_size
  assert len(calls) == 2 * B and all(p[:-1] == a for p, _, a in calls)  # the task's prompts and answers
  expected = np.mean([EchoTask.reward_fn(*x) for x in calls[B:]])  # the last step's rewards
  np.testing.assert_allclose(metrics["reward/mean"], expected, rtol=0, atol=1e-7)
  tr.runner.close()


# ---- an extension: a subclass of jaxrl_llm.extension.Extension, passed to the Trainer -----

class ZeroAdvantage(Extension):
  """Sets every advantage to 0 (so the policy loss has no gradient) and counts its calls;
  its call count is a checkpointed tree."""

  name = "zero_adv"

  def __init__(self):
    self.calls = jnp.zeros((), jnp.int32)

  def rewrite_batch(self, state, samples, scores, adv_BR, mask_BR):
    self.calls = self.calls + 1
    return np.zeros_like(adv_BR), {}, {"zero_adv/calls": float(self.calls)}

  def checkpoint_trees(self):
    from jaxrl_llm.checkpointing.run import ExtraTree

    return {"zero_adv_calls": ExtraTree(get=lambda: self.calls, set=self._restore)}

  def _restore(self, tree):
    self.calls = tree


@pytest.mark.slow
def test_add_an_extension(tmp_path, quiet_log):
  overrides = {"train.steps": 2, "log.kl_to_ref": False, "objective.kl_coef": 0.0}
  cfg = from_config_dict(shrink(load_config("grpo"), **overrides))
  before, after, metrics = _two_steps(make_trainer(cfg, tmp_path / "plain", quiet_log))
  assert _changed(before, after) > 1e-6  # without the extension the step updates the policy
  ext = ZeroAdvantage()
  before, after, metrics = _two_steps(make_trainer(cfg, tmp_path / "ext", quiet_log, extensions=[ext]))
  assert metrics["zero_adv/calls"] == 2.0 and metrics["adv/abs_mean"] == 0.0
  assert _changed(before, after) == 0.0  # A = 0: zero gradient, Adam moves nothing
  # Its tree rides with the run's checkpoints: a resumed run hands it back.
  first = ZeroAdvantage()
  make_trainer(cfg, tmp_path / "resume", quiet_log, extensions=[first]).run()
  assert int(first.calls) == 2
  again = ZeroAdvantage()
  c3 = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, steps=3))
  make_trainer(c3, tmp_path / "resume", quiet_log, extensions=[again], allow_config_change=True).run()
  assert int(again.calls) == 3  # 2 restored + 1 step after the resume
