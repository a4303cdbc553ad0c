"""Environments by name, as tasks/registry.py holds tasks.

A factory takes the env section (`EnvConfig`), the run's task, the shared `ToolPool` and the tokenizer
(which decodes turns given as ids) and returns a fresh `Env` (envs/base.py); the rollout loop makes
one per live episode:

    from jaxrl_llm.envs import registry
    registry.register_env("search", lambda cfg, task, pool, tok: SearchEnv(task, pool, tokenizer=tok))
    env = registry.make_env(EnvConfig(name="search"), task, pool, tokenizer)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jaxrl_llm.checks import check_choice
from jaxrl_llm.envs.base import Env
from jaxrl_llm.envs.builtin_tools import CALCULATOR, PYTHON
from jaxrl_llm.envs.calls import resolve_tool_call_format
from jaxrl_llm.envs.config import EnvConfig
from jaxrl_llm.envs.pool import ToolPool
from jaxrl_llm.envs.tool_env import ToolEnv
from jaxrl_llm.tasks.base import Task

EnvFactory = Callable[[EnvConfig, Task, ToolPool, Any], Env]  # (env config, task, tool pool, tokenizer) -> Env

_ENVS: dict[str, EnvFactory] = {}


def register_env(name: str, factory: EnvFactory) -> None:
  if name in _ENVS:
    raise ValueError(f"environment {name!r} is registered already")
  _ENVS[name] = factory


def env_names() -> tuple[str, ...]:
  return tuple(_ENVS)


def make_env(cfg: EnvConfig, task: Task, pool: ToolPool, tokenizer=None) -> Env:
  """A fresh environment `cfg.name` (one per live episode; the pool is shared)."""
  check_choice("config.env.name", cfg.name, env_names())
  return _ENVS[cfg.name](cfg, task, pool, tokenizer)


def make_pool(cfg: EnvConfig) -> ToolPool:
  """The run's tool pool: `cfg.workers` workers under `cfg.tools`' limits."""
  return ToolPool(cfg.workers, cfg.tools)


# ---- the built-in environments ----------------------------------------------------

def _tool_env(*tools):
  def factory(cfg: EnvConfig, task: Task, pool: ToolPool, tokenizer) -> Env:
    # "auto": the family of the tokenizer's chat template (envs/calls.py)
    fmt = resolve_tool_call_format(cfg.tool_call_format, getattr(tokenizer, "chat_template", None))
    return ToolEnv(task, tools, pool, call_format=cfg.call_format, max_turns=cfg.max_turns,
                   tokenizer=tokenizer, name=cfg.name, instructions=cfg.instructions, tool_call_format=fmt,
                   tools_in_template=cfg.tools_in_template, max_observation_tokens=cfg.max_observation_tokens)
  return factory


register_env("calculator", _tool_env(CALCULATOR))  # word_problems and arithmetic with a calculator
register_env("python", _tool_env(PYTHON))  # countdown with a Python runner
