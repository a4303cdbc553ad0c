"""The run config's `task` and `data` sections (keys documented in
jaxrl_llm/training/defaults.py). Task and reward names come from
tasks/registry.py."""

from __future__ import annotations

import dataclasses

from jaxrl_llm.checks import bad, check_bool, check_choice, check_float, check_int
from jaxrl_llm.tasks import registry
from jaxrl_llm.tasks.registry import MODEL_REWARD

REWARD_NORMS = ("none", "running", "group")  # data.reward_norm (reward_model/rl_reward.py)
PROCESS_REDUCES = ("min", "prod")  # data.process_reduce (reward_model/process.py's solution_score)
CHAIN_ERRORS = ("one", "every_carry")  # task.chain_errors (tasks/chain.py)
TOOL_DEMO_TASKS = ("arithmetic", "countdown")  # task.tool_demos: arithmetic with the calculator, countdown with python


@dataclasses.dataclass(frozen=True)
class TaskConfig:
  name: str
  digits: int
  digits2: int
  ops: str
  n_numbers: int
  max_number: int
  eval_fraction: float
  n_train: int
  tool_demos: bool
  chain_errors: str

  def __post_init__(self):
    check_choice("config.task.name", self.name, registry.task_names())
    check_int("config.task.digits", self.digits, 1, 9)
    check_int("config.task.digits2", self.digits2, 0, 9)
    check_int("config.task.n_numbers", self.n_numbers, 2, 6)
    check_int("config.task.max_number", self.max_number, 2, 99)
    check_float("config.task.eval_fraction", self.eval_fraction, 0.0, 0.5, low_open=True)
    check_int("config.task.n_train", self.n_train, 1)
    check_bool("config.task.tool_demos", self.tool_demos)
    check_choice("config.task.chain_errors", self.chain_errors, CHAIN_ERRORS)
    if self.tool_demos and self.name not in TOOL_DEMO_TASKS:
      raise bad("config.task.tool_demos", self.tool_demos,
                f"False for task.name={self.name!r}: the tasks with tool demonstrations are {', '.join(TOOL_DEMO_TASKS)}")
    if not self.ops or any(o not in "+-*" for o in self.ops):
      raise bad("config.task.ops", self.ops, "a non-empty subset of '+-*'")


def reward_model_paths(value: str) -> tuple[str, ...]:
  """The workdirs of data.reward_model: comma-separated, surrounding spaces dropped; () for ""."""
  return tuple(p.strip() for p in value.split(",")) if value else ()


@dataclasses.dataclass(frozen=True)
class DataConfig:
  path: str
  eval_path: str
  prompt_key: str
  answer_key: str
  tag_key: str
  reward: str
  format_weight: float
  reward_timeout_s: float
  reward_workers: int
  max_prompt_len: int
  chat_template: bool
  reward_model: str  # data.reward=model: the reward model's workdir, or several comma-separated (an ensemble)
  reward_model_weight: float
  verifier_weight: float
  reward_norm: str
  process_reduce: str
  reward_model_uncertainty_k: float  # an ensemble's reward mean - k * std over its members (rl_reward.py)
  reward_clip: float  # c > 0: the normalised reward model's reward clipped to [-c, c]; 0: off
  missing_eos_penalty: float  # subtracted from the reward of a sample cut without EOS; 0: off

  @property
  def reward_models(self) -> tuple[str, ...]:
    """data.reward_model's workdirs: one, or an ensemble's members (comma-separated)."""
    return reward_model_paths(self.reward_model)

  def __post_init__(self):
    if not isinstance(self.tag_key, str):
      raise bad("config.data.tag_key", self.tag_key, "a row key (str); empty: every row is tagged 'file'")
    check_choice("config.data.reward", self.reward, registry.reward_names() + (MODEL_REWARD,))
    if isinstance(self.reward_model, (list, tuple)) and all(isinstance(p, str) for p in self.reward_model):
      object.__setattr__(self, "reward_model", ",".join(self.reward_model))  # an ensemble given as a list
    if not isinstance(self.reward_model, str):
      raise bad("config.data.reward_model", self.reward_model, "a reward model's workdir (str), or several "
                "comma-separated")
    if (self.reward == MODEL_REWARD) != bool(self.reward_model):
      raise bad("config.data.reward_model", self.reward_model,
                f"a reward model's workdir exactly when config.data.reward={MODEL_REWARD!r} "
                f"(config.data.reward={self.reward!r})")
    paths = reward_model_paths(self.reward_model)
    if "" in paths or len(set(paths)) != len(paths):
      raise bad("config.data.reward_model", self.reward_model, "one reward model's workdir, or several distinct "
                "ones separated by commas (an ensemble), none empty")
    check_float("config.data.reward_model_uncertainty_k", self.reward_model_uncertainty_k, 0.0, 100.0)
    if self.reward_model_uncertainty_k > 0 and len(paths) < 2:
      raise bad("config.data.reward_model_uncertainty_k", self.reward_model_uncertainty_k,
                f"an ensemble's mean - k * std needs two or more reward models in config.data.reward_model "
                f"(got {len(paths) if self.reward_model else 0}); allowed 0 with one")
    check_float("config.data.reward_clip", self.reward_clip, 0.0, 1e6)
    if self.reward_clip > 0 and self.reward != MODEL_REWARD:
      raise bad("config.data.reward_clip", self.reward_clip, f"clips the reward model's reward: needs "
                f"config.data.reward={MODEL_REWARD!r} (config.data.reward={self.reward!r}); allowed 0 without")
    check_float("config.data.missing_eos_penalty", self.missing_eos_penalty, 0.0, 100.0)
    check_float("config.data.reward_model_weight", self.reward_model_weight, 0.0, 100.0)
    check_float("config.data.verifier_weight", self.verifier_weight, 0.0, 100.0)
    check_choice("config.data.reward_norm", self.reward_norm, REWARD_NORMS)
    check_choice("config.data.process_reduce", self.process_reduce, PROCESS_REDUCES)
    check_float("config.data.format_weight", self.format_weight, 0.0, 1.0)
    check_float("config.data.reward_timeout_s", self.reward_timeout_s, 0.0, 3600.0, low_open=True)
    check_int("config.data.reward_workers", self.reward_workers, 0, 256)
    check_int("config.data.max_prompt_len", self.max_prompt_len, 0)  # 0: the longest prompt (pipeline.resolve_prompt_len)
    check_bool("config.data.chat_template", self.chat_template)
