"""Tasks and reward functions by name: the one place a run looks them up.

A task factory takes the run's config (`RunConfig`: its `task`, `data`,
`sft` sections and `seed`) and returns a `Task` (tasks/base.py). A reward is
a pair (reward_fn, format_fn). The config's validation reads the names from
here, so a task registered here is a valid `config.task.name`, and a reward a
valid `config.data.reward`:

    from jaxrl_llm.tasks import registry
    registry.register_task("parity", lambda cfg: ParityTask(seed=cfg.seed))
    registry.register_reward("parity", parity_reward, parity_format)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jaxrl_llm.tasks.arithmetic import ArithmeticTask, arithmetic_format, arithmetic_reward
from jaxrl_llm.tasks.base import FormatFn, RewardFn, Task
from jaxrl_llm.tasks.chain import ChainTask, chain_format, chain_reward
from jaxrl_llm.tasks.countdown import CountdownTask, countdown_format, countdown_reward
from jaxrl_llm.tasks.files import FileTask
from jaxrl_llm.tasks.math_reward import boxed_format, math_verify_reward
from jaxrl_llm.tasks.word_problems import WordProblemTask

TaskFactory = Callable[[Any], Task]  # (run config) -> Task

_TASKS: dict[str, TaskFactory] = {}
_REWARDS: dict[str, tuple[RewardFn, FormatFn | None]] = {}
# data.reward = "auto": the task's own reward_fn / format_fn (a file task: math_verify).
AUTO_REWARD = "auto"
# data.reward = "model": a trained reward model scores the samples (data.reward_model); the task's own
# reward (as for "auto") is the gold verifier it is mixed with and whose accuracy is logged.
MODEL_REWARD = "model"


def register_task(name: str, factory: TaskFactory) -> None:
  if name in _TASKS:
    raise ValueError(f"task {name!r} is registered already")
  _TASKS[name] = factory


def register_reward(name: str, reward_fn: RewardFn, format_fn: FormatFn | None = None) -> None:
  if name in _REWARDS or name in (AUTO_REWARD, MODEL_REWARD):
    raise ValueError(f"reward {name!r} is registered already")
  _REWARDS[name] = (reward_fn, format_fn)


def task_names() -> tuple[str, ...]:
  return tuple(_TASKS)


def reward_names() -> tuple[str, ...]:
  """Allowed values of config.data.reward ('auto' first)."""
  return (AUTO_REWARD,) + tuple(_REWARDS)


def make_task(cfg) -> Task:
  """The task `cfg.task.name` built from the run config."""
  return _TASKS[cfg.task.name](cfg)


def reward_fns(name: str, task: Task | None = None) -> tuple[RewardFn, FormatFn | None]:
  """(reward_fn, format_fn) of reward `name`; 'auto' is the task's own, and so is 'model' (the gold
  verifier beside the reward model)."""
  if name in (AUTO_REWARD, MODEL_REWARD):
    return task.reward_fn, task.format_fn
  return _REWARDS[name]


# ---- the built-in tasks and rewards ----------------------------------------------

def _arithmetic(cfg) -> Task:
  t = cfg.task
  return ArithmeticTask(digits=t.digits, digits2=t.digits2, ops=t.ops, seed=cfg.seed,
                        eval_fraction=t.eval_fraction, wrong_fraction=cfg.sft.wrong_fraction, tool_demos=t.tool_demos)


def _countdown(cfg) -> Task:
  t = cfg.task
  return CountdownTask(n_numbers=t.n_numbers, max_number=t.max_number, seed=cfg.seed,
                       eval_fraction=t.eval_fraction, wrong_fraction=cfg.sft.wrong_fraction, tool_demos=t.tool_demos)


def _chain(cfg) -> Task:
  t = cfg.task
  return ChainTask(n_terms=t.n_numbers, digits=t.digits, seed=cfg.seed, eval_fraction=t.eval_fraction,
                   wrong_fraction=cfg.sft.wrong_fraction, errors=t.chain_errors)


def _word_problems(cfg, prompt_format: str = "instruction") -> Task:
  return WordProblemTask(max_number=cfg.task.max_number, seed=cfg.seed, eval_fraction=cfg.task.eval_fraction,
                         prompt_format=prompt_format)


def _file(cfg) -> Task:
  d = cfg.data
  # A file's rows carry no reward of their own: 'auto' checks math answers.
  fn, fmt = reward_fns("math_verify" if d.reward in (AUTO_REWARD, MODEL_REWARD) else d.reward)
  return FileTask(path=d.path, reward_fn=fn, format_fn=fmt, prompt_key=d.prompt_key, answer_key=d.answer_key,
                  tag_key=d.tag_key, eval_path=d.eval_path, eval_fraction=cfg.task.eval_fraction, seed=cfg.seed)


register_task("arithmetic", _arithmetic)
register_task("countdown", _countdown)
register_task("chain", _chain)
register_task("file", _file)
register_task("word_problems", _word_problems)
# The same problems for a base model: "Question: ...\nAnswer:" prompts, the reply's first line judged.
register_task("word_problems_qa", lambda cfg: _word_problems(cfg, "qa"))
register_reward("arithmetic", arithmetic_reward, arithmetic_format)
register_reward("countdown", countdown_reward, countdown_format)
register_reward("chain", chain_reward, chain_format)
register_reward("math_verify", math_verify_reward, boxed_format)
