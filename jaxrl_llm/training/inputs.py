"""Building what a run needs from its RunConfig: the mesh, tokenizer and examples (`run_data`) and
the reward runner (tokenizers: model/tokenizer.py; tasks: tasks/registry.py; the model config and
params on the mesh: model/build.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from jaxrl_llm.checks import ConfigError
from jaxrl_llm.model import sharding as sharding_lib
from jaxrl_llm.model.tokenizer import check_hf_dir, make_tokenizer
from jaxrl_llm.tasks import registry
from jaxrl_llm.tasks.pipeline import resolve_prompt_len
from jaxrl_llm.tasks.rewards import RewardRunner
from jaxrl_llm.training.episodes import longest_opening
from jaxrl_llm.training.evaluation import Evaluator


def make_reward_runner(cfg, task) -> RewardRunner:
  fn, fmt = registry.reward_fns(cfg.data.reward, task)
  return RewardRunner(fn, fmt, format_weight=cfg.data.format_weight, timeout_s=cfg.data.reward_timeout_s,
                      workers=cfg.data.reward_workers)


@dataclasses.dataclass(frozen=True)
class RunData:
  """What a run reads before any model exists: the mesh, the tokenizer and the task's examples. The
  trainer and `python -m jaxrl_llm.evaluate` both start from it, so they see the same prompts."""

  cfg: Any  # training.config.RunConfig, data.max_prompt_len resolved (0 -> the longest prompt's length)
  mesh: jax.sharding.Mesh
  batch_sharding: jax.sharding.NamedSharding  # leading (batch) axis over data x fsdp
  batch_shards: int  # mesh.data x mesh.fsdp: batches are a multiple of this
  tokenizer: Any
  task: Any  # tasks.base.Task
  train_examples: list
  eval_examples: list

  def evaluator(self, model_cfg, runner: RewardRunner, episodes=None) -> Evaluator:
    """The run's evaluation; `episodes`: the run's EpisodePlayer (training/episodes.py) when it has an
    environment, whose episodes are then what is evaluated."""
    c = self.cfg
    return Evaluator(model_cfg, self.tokenizer, runner, c.rollout, max_prompt_len=c.data.max_prompt_len,
                     chat_template=c.data.chat_template, batch_sharding=self.batch_sharding, pad_to=self.batch_shards,
                     episodes=episodes, batch_size=c.eval.batch_size)


def check_batch_shards(cfg, shards: int) -> None:
  """The step's prompts, its micro-batch and the warm start's split evenly over the mesh's batch shards."""
  sizes = [("rollout.prompts_per_step", cfg.rollout.prompts_per_step),
           ("train.micro_batch_size (or the mini-batch)", cfg.micro_batch_size)]
  if cfg.sft.steps:  # (an extension's warm start, without one of the run's, checks in run_sft)
    sizes.append(("sft.micro_batch_size (or sft.batch_size)", cfg.sft.micro_batch_size or cfg.sft.batch_size))
  for name, size in sizes:
    if size % shards:
      raise ConfigError(f"config.{name}={size} must be a multiple of the {shards} batch shards of the mesh "
                        f"(mesh.data x mesh.fsdp)")


def _fit_openings(cfg, tokenizer, task, examples, by_hand: bool):
  """`cfg` with data.max_prompt_len raised to the longest opening prompt of the environment, rounded up
  to a multiple of 8, when it was 0 (resolved from the bare prompts); set `by_hand`, an opening longer
  than it is a ConfigError. Also the one-line error of an environment that cannot start an episode."""
  longest = longest_opening(cfg.env, task, tokenizer, cfg.data.chat_template, examples)
  if cfg.data.max_prompt_len >= longest:
    return cfg
  if by_hand:
    raise ConfigError(f"config.data.max_prompt_len={cfg.data.max_prompt_len} is shorter than the longest opening "
                      f"prompt of env.name={cfg.env.name!r} ({longest} tokens, its instructions included): raise "
                      "it, or set it to 0")
  return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, max_prompt_len=-(-longest // 8) * 8))


def run_data(cfg, devices=None) -> RunData:
  """The run's mesh (over `devices`, None: all), tokenizer and examples; checks a Hugging Face
  folder for everything it lacks first."""
  if cfg.model.hf_path:  # everything missing from the folder at once, before anything is read
    check_hf_dir(cfg.model.hf_path, chat_template=cfg.data.chat_template)
  mesh = sharding_lib.make_mesh(cfg.mesh, devices)
  tokenizer = make_tokenizer(cfg.model.hf_path)
  task = registry.make_task(cfg)
  train_examples = task.examples("train", cfg.task.n_train)
  eval_examples = task.examples("eval", cfg.eval.n_examples)
  by_hand = cfg.data.max_prompt_len > 0
  if not by_hand:  # 0: fit the longest prompt (tasks/pipeline.py)
    prompt_len = resolve_prompt_len(0, tokenizer, train_examples + eval_examples, cfg.data.chat_template)
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, max_prompt_len=prompt_len))
  if cfg.env.active:  # an episode's opening prompt (instructions and all) is its row's prompt
    cfg = _fit_openings(cfg, tokenizer, task, train_examples + eval_examples, by_hand)
  return RunData(cfg=cfg, mesh=mesh, batch_sharding=sharding_lib.batch_sharding(mesh, ndim=1),
                 batch_shards=sharding_lib.batch_shards(mesh), tokenizer=tokenizer, task=task,
                 train_examples=train_examples, eval_examples=eval_examples)
