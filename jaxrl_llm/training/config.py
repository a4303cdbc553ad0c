"""The run configuration as frozen, validated dataclasses.

`from_config_dict` converts the locked ml_collections ConfigDict of a
`configs/<method>.py` file once; the library only ever sees these
dataclasses. Each check names the field, its value and what is allowed, and
runs before any model is built.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from typing import Any

TASKS = ("arithmetic", "countdown", "file")
REWARDS = ("auto", "arithmetic", "countdown", "math_verify")
DTYPES = ("float32", "bfloat16")
KERNEL_IMPLS = ("auto", "pallas", "xla_chunked", "naive")
REMATS = ("none", "full", "save_dots")


def _fail(field: str, value: Any, allowed: str):
  raise ValueError(f"config.{field}={value!r} is invalid: {allowed}")


def _int(field: str, value: Any, low: int, high: int | None = None) -> None:
  if isinstance(value, bool) or not isinstance(value, int):
    _fail(field, value, "must be an int")
  if value < low or (high is not None and value > high):
    _fail(field, value, f"allowed {'>= ' + str(low) if high is None else f'[{low}, {high}]'}")


def _float(field: str, value: Any, low: float, high: float = math.inf, *, low_open=False) -> None:
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
    _fail(field, value, "must be a finite number")
  if value < low or value > high or (low_open and value == low):
    _fail(field, value, f"allowed {'(' if low_open else '['}{low}, {high}]")


def _choice(field: str, value: Any, allowed: tuple) -> None:
  if value not in allowed:
    close = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    _fail(field, value, f"allowed {allowed}{hint}")


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

  def __post_init__(self):
    _choice("task.name", self.name, TASKS)
    _int("task.digits", self.digits, 1, 9)
    _int("task.digits2", self.digits2, 0, 9)
    _int("task.n_numbers", self.n_numbers, 2, 6)
    _int("task.max_number", self.max_number, 2, 99)
    _float("task.eval_fraction", self.eval_fraction, 0.0, 0.5, low_open=True)
    _int("task.n_train", self.n_train, 1)
    if not self.ops or any(o not in "+-*" for o in self.ops):
      _fail("task.ops", self.ops, "a non-empty subset of '+-*'")


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

  def __post_init__(self):
    if not isinstance(self.tag_key, str):
      _fail("data.tag_key", self.tag_key, "a row key (str); empty: every row is tagged 'file'")
    _choice("data.reward", self.reward, REWARDS)
    _float("data.format_weight", self.format_weight, 0.0, 1.0)
    _float("data.reward_timeout_s", self.reward_timeout_s, 0.0, 3600.0, low_open=True)
    _int("data.reward_workers", self.reward_workers, 0, 256)
    _int("data.max_prompt_len", self.max_prompt_len, 1)


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  hf_path: str
  d_model: int
  n_layers: int
  n_heads: int
  n_kv_heads: int
  d_ff: int
  param_dtype: str
  compute_dtype: str
  remat: str

  def __post_init__(self):
    for f in ("d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff"):
      _int(f"model.{f}", getattr(self, f), 1)
    if self.d_model % self.n_heads:
      _fail("model.d_model", self.d_model, f"must be a multiple of model.n_heads={self.n_heads}")
    if self.n_heads % self.n_kv_heads:
      _fail("model.n_heads", self.n_heads, f"must be a multiple of model.n_kv_heads={self.n_kv_heads}")
    _choice("model.param_dtype", self.param_dtype, DTYPES)
    _choice("model.compute_dtype", self.compute_dtype, DTYPES)
    _choice("model.remat", self.remat, REMATS)


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  data: int
  fsdp: int
  tensor: int

  def __post_init__(self):
    if self.data != -1:
      _int("mesh.data", self.data, 1)
    _int("mesh.fsdp", self.fsdp, 1)
    _int("mesh.tensor", self.tensor, 1)


@dataclasses.dataclass(frozen=True)
class KernelsConfig:
  impl: str

  def __post_init__(self):
    _choice("kernels.impl", self.impl, KERNEL_IMPLS)


@dataclasses.dataclass(frozen=True)
class SFTConfig:
  steps: int
  batch_size: int
  lr: float
  warmup_steps: int
  wrong_fraction: float

  def __post_init__(self):
    _int("sft.steps", self.steps, 0)
    _int("sft.batch_size", self.batch_size, 1)
    _float("sft.lr", self.lr, 0.0, 1.0, low_open=True)
    _int("sft.warmup_steps", self.warmup_steps, 0)
    _float("sft.wrong_fraction", self.wrong_fraction, 0.0, 1.0)


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
  prompts_per_step: int
  group_size: int
  max_response_len: int
  temperature: float
  top_k: int
  top_p: float
  sampler_dtype: str
  staleness: int
  record_topk: int

  @property
  def batch_size(self) -> int:
    """B: samples per RL step."""
    return self.prompts_per_step * self.group_size

  def __post_init__(self):
    _int("rollout.prompts_per_step", self.prompts_per_step, 1)
    _int("rollout.group_size", self.group_size, 1)
    _int("rollout.max_response_len", self.max_response_len, 1)
    _float("rollout.temperature", self.temperature, 0.0, 10.0, low_open=True)
    _int("rollout.top_k", self.top_k, 0)
    _float("rollout.top_p", self.top_p, 0.0, 1.0, low_open=True)
    _choice("rollout.sampler_dtype", self.sampler_dtype, DTYPES)
    _int("rollout.staleness", self.staleness, 0, 64)
    _int("rollout.record_topk", self.record_topk, 0)


@dataclasses.dataclass(frozen=True)
class FilterConfig:
  dynamic_sampling: bool
  max_refill_rounds: int
  overlong_filter: bool
  overlong_buffer: int
  overlong_penalty: float

  def __post_init__(self):
    _int("filters.max_refill_rounds", self.max_refill_rounds, 0, 100)
    _int("filters.overlong_buffer", self.overlong_buffer, 0)
    _float("filters.overlong_penalty", self.overlong_penalty, 0.0, 100.0)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  steps: int
  epochs: int
  mini_batches: int
  micro_batch_size: int
  lr: float
  warmup_steps: int
  lr_decay_to: float
  weight_decay: float
  b1: float
  b2: float
  clip_norm: float
  value_lr: float

  def __post_init__(self):
    _int("train.steps", self.steps, 0)
    _int("train.epochs", self.epochs, 1)
    _int("train.mini_batches", self.mini_batches, 1)
    _int("train.micro_batch_size", self.micro_batch_size, 0)
    _float("train.lr", self.lr, 0.0, 1.0, low_open=True)
    _int("train.warmup_steps", self.warmup_steps, 0)
    _float("train.lr_decay_to", self.lr_decay_to, 0.0, 1.0)
    _float("train.weight_decay", self.weight_decay, 0.0, 10.0)
    _float("train.b1", self.b1, 0.0, 1.0)
    _float("train.b2", self.b2, 0.0, 1.0)
    _float("train.clip_norm", self.clip_norm, 0.0)
    _float("train.value_lr", self.value_lr, 0.0, 1.0, low_open=True)


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  n_examples: int
  every: int

  def __post_init__(self):
    _int("eval.n_examples", self.n_examples, 1)
    _int("eval.every", self.every, 0)


@dataclasses.dataclass(frozen=True)
class LogConfig:
  progress: bool
  every: int
  kl_to_ref: bool

  def __post_init__(self):
    _int("log.every", self.every, 1)


# Advantage estimators that need several samples per prompt (a group baseline
# or a group std): group size 1 makes them undefined or identically zero.
_GROUP_ADVANTAGES = ("grpo", "dr_grpo", "rloo", "reinforce_pp_baseline")


@dataclasses.dataclass(frozen=True)
class RunConfig:
  method: str
  seed: int
  workdir_root: str
  task: TaskConfig
  data: DataConfig
  model: ModelSpec
  mesh: MeshConfig
  kernels: KernelsConfig
  sft: SFTConfig
  rollout: RolloutConfig
  filters: FilterConfig
  train: TrainConfig
  eval: EvalConfig
  log: LogConfig
  objective: Any  # jaxrl_llm.objectives.ObjectiveConfig
  teacher: Any = None  # jaxrl_llm.training.teacher.TeacherConfig; None: no teacher section
  checkpoint: Any = None  # jaxrl_llm.checkpointing.CheckpointConfig (when, what to keep)
  init_checkpoint: str = ""  # new run's params from a run workdir or a HF directory; "" = fresh init

  @property
  def mini_batch_size(self) -> int:
    return self.rollout.batch_size // self.train.mini_batches

  @property
  def micro_batch_size(self) -> int:
    return self.train.micro_batch_size or self.mini_batch_size

  @property
  def use_value(self) -> bool:
    return self.objective.advantage == "gae"

  def __post_init__(self):
    _int("seed", self.seed, 0)
    obj, ro, tr = self.objective, self.rollout, self.train
    G = ro.group_size
    if obj.advantage in _GROUP_ADVANTAGES and G < 2:
      what = "std normalisation over the group" if obj.advantage == "grpo" else "a group baseline"
      _fail("rollout.group_size", G, f"objective.advantage={obj.advantage!r} uses {what}, undefined (or "
            f"identically zero) with one sample per prompt: use group_size >= 2")
    if self.filters.dynamic_sampling and G < 2:
      _fail("rollout.group_size", G, "filters.dynamic_sampling drops groups with equal rewards: needs >= 2")
    if ro.batch_size % tr.mini_batches:
      _fail("train.mini_batches", tr.mini_batches,
            f"must divide the batch of prompts_per_step x group_size = {ro.batch_size} samples")
    mini = self.mini_batch_size
    if tr.micro_batch_size and mini % tr.micro_batch_size:
      _fail("train.micro_batch_size", tr.micro_batch_size,
            f"must divide the mini-batch of {mini} samples (batch {ro.batch_size} / mini_batches "
            f"{tr.mini_batches}); 0 uses the whole mini-batch")
    if obj.aggregation == "group_token_mean" and (mini % G or self.micro_batch_size % G):
      _fail("train.micro_batch_size", tr.micro_batch_size,
            f"aggregation 'group_token_mean' needs whole groups: mini-batch ({mini}) and micro-batch "
            f"({self.micro_batch_size}) sizes must be multiples of group_size={G}")
    if self.filters.overlong_buffer >= ro.max_response_len:
      _fail("filters.overlong_buffer", self.filters.overlong_buffer,
            f"must be < rollout.max_response_len={ro.max_response_len}")
    if obj.needs_centering and ro.record_topk < 1:
      _fail("rollout.record_topk", ro.record_topk,
            "Score Centering (objective.kappa=1) needs the sampler's top-k log-probs: set it >= 1")
    if obj.needs_token_kl and (ro.top_k or ro.top_p < 1.0):
      _fail("rollout.top_k", ro.top_k, f"TRM's token KL(mu || pi_theta) is recomputed from the sampler's "
            f"untruncated distribution: needs top_k=0 and top_p=1 (top_p={ro.top_p})")
    if self.task.name == "file" and not self.data.path:
      _fail("data.path", self.data.path, "task.name='file' needs a .jsonl or .parquet file")
    if self.task.name == "file" and self.sft.steps > 0:
      _fail("sft.steps", self.sft.steps, "the SFT warm start needs demonstrations, which only the built-in "
            "tasks have: set sft.steps=0 for task.name='file'")

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)


_SECTIONS = {"task": TaskConfig, "data": DataConfig, "model": ModelSpec, "mesh": MeshConfig,
             "kernels": KernelsConfig, "sft": SFTConfig, "rollout": RolloutConfig, "filters": FilterConfig,
             "train": TrainConfig, "eval": EvalConfig, "log": LogConfig}


def resolve_objective(method: str, block: dict):
  """The ObjectiveConfig of `method` with the config's knob values."""
  from jaxrl_llm import objectives

  if method not in objectives.PRESETS:
    _choice("method", method, tuple(sorted(objectives.PRESETS)))
  knobs = dict(block)
  source = knobs.pop("name", method)
  if source != method:
    _fail("method", method, f"config.objective holds the knobs of preset {source!r}: choose a method by "
          f"its config file (configs/{method}.py), not by overriding config.method")
  try:
    return objectives.get_preset(method, **knobs)
  except (TypeError, ValueError) as e:
    raise ValueError(f"config.objective: {e}") from None


def from_config_dict(cd) -> RunConfig:
  """Converts a (locked) ml_collections ConfigDict once into a RunConfig."""
  d = cd.to_dict() if hasattr(cd, "to_dict") else dict(cd)
  teacher = _teacher_section(d.pop("teacher")) if "teacher" in d else None
  checkpoint = _checkpoint_section(d.pop("checkpoint")) if "checkpoint" in d else None
  init_checkpoint = d.pop("init_checkpoint", "")
  expected = set(_SECTIONS) | {"method", "seed", "workdir_root", "objective"}
  unknown, missing = sorted(set(d) - expected), sorted(expected - set(d))
  if unknown or missing:
    raise ValueError(f"config: unknown top-level keys {unknown}, missing keys {missing}")
  sections = {}
  for name, cls in _SECTIONS.items():
    fields = {f.name for f in dataclasses.fields(cls)}
    extra, absent = sorted(set(d[name]) - fields), sorted(fields - set(d[name]))
    if extra or absent:
      raise ValueError(f"config.{name}: unknown keys {extra}, missing keys {absent}")
    sections[name] = cls(**d[name])
  return RunConfig(method=d["method"], seed=d["seed"], workdir_root=d["workdir_root"],
                   objective=resolve_objective(d["method"], d["objective"]), teacher=teacher,
                   checkpoint=checkpoint, init_checkpoint=init_checkpoint, **sections)


def _teacher_section(block: dict):
  """The teacher section as a validated TeacherConfig (imported here: it pulls in jax)."""
  from jaxrl_llm.training.teacher import TeacherConfig

  fields = {f.name for f in dataclasses.fields(TeacherConfig)}
  extra, absent = sorted(set(block) - fields), sorted(fields - set(block))
  if extra or absent:
    raise ValueError(f"config.teacher: unknown keys {extra}, missing keys {absent}")
  return TeacherConfig(**block)


def _checkpoint_section(block: dict):
  """The checkpoint section as a validated CheckpointConfig (no jax import)."""
  from jaxrl_llm.checkpointing.config import CheckpointConfig

  fields = {f.name for f in dataclasses.fields(CheckpointConfig)}
  extra, absent = sorted(set(block) - fields), sorted(fields - set(block))
  if extra or absent:
    raise ValueError(f"config.checkpoint: unknown keys {extra}, missing keys {absent}")
  return CheckpointConfig(**block)
