"""The reward-model run's config as frozen, validated dataclasses.

`reward_config_from_dict` converts the locked ConfigDict of `configs/reward_model.py`
(keys, defaults and their meaning: reward_model/defaults.py) once; the model,
mesh and checkpoint sections are the RL run's own dataclasses, and a `.gguf`
model.hf_path or init_checkpoint is replaced by its converted directory. Every check
names the field, its value and what is allowed (jaxrl_llm/checks.py).
"""

from __future__ import annotations

import dataclasses

from jaxrl_llm.checkpointing.config import CheckpointConfig
from jaxrl_llm.checks import (bad, check_bool, check_choice, check_float, check_int, check_keys,
                              section_from_dict)
from jaxrl_llm.model.config import ModelSpec
from jaxrl_llm.model.io.gguf_io import resolve_model_path
from jaxrl_llm.model.sharding import MeshConfig
from jaxrl_llm.objectives.preference import check_dpo_knobs
from jaxrl_llm.tasks.arithmetic import OPS

PAIR_TASKS = ("arithmetic", "word_problems")  # data.task: the built-in pairs' problems (reward_model/data.py)
STEP_ERRORS = ("carry", "varied")  # data.step_errors: a built-in wrong solution's mistake (reward_model/process.py)


@dataclasses.dataclass(frozen=True)
class PreferenceDataConfig:
  path: str
  eval_path: str
  eval_fraction: float
  chat_template: bool
  max_len: int
  n_train: int
  n_eval: int
  task: str
  max_number: int
  digits: int
  digits2: int
  ops: str
  n_terms: int
  step_separator: str
  end_step: bool
  truncated_fraction: float
  step_errors: str
  label_noise: float

  def __post_init__(self):
    for f in ("path", "eval_path", "ops", "step_separator"):
      if not isinstance(getattr(self, f), str):
        raise bad(f"config.data.{f}", getattr(self, f), "a string")
    if self.eval_path and not self.path:
      raise bad("config.data.eval_path", self.eval_path, "needs data.path (the training rows) as well")
    check_float("config.data.eval_fraction", self.eval_fraction, 0.0, 1.0, low_open=True, high_open=True)
    check_bool("config.data.chat_template", self.chat_template)
    check_int("config.data.max_len", self.max_len, 0)
    check_int("config.data.n_train", self.n_train, 1)
    check_int("config.data.n_eval", self.n_eval, 1)
    check_choice("config.data.task", self.task, PAIR_TASKS)
    check_int("config.data.max_number", self.max_number, 3, 1000)
    check_int("config.data.digits", self.digits, 1, 9)
    check_int("config.data.digits2", self.digits2, 0, 9)
    if not self.ops or any(o not in OPS for o in self.ops):
      raise bad("config.data.ops", self.ops, f"a non-empty subset of {''.join(OPS)!r}")
    check_int("config.data.n_terms", self.n_terms, 2, 6)
    if not self.step_separator:
      raise bad("config.data.step_separator", self.step_separator, "a non-empty string (it closes every step)")
    check_bool("config.data.end_step", self.end_step)
    check_choice("config.data.step_errors", self.step_errors, STEP_ERRORS)

    check_float("config.data.truncated_fraction", self.truncated_fraction, 0.0, 1.0, high_open=True)
    if self.truncated_fraction and not self.end_step:
      raise bad("config.data.truncated_fraction", self.truncated_fraction,
                "0 unless config.data.end_step=True (a cut solution differs from a whole one only at its end step)")
    check_float("config.data.label_noise", self.label_noise, 0.0, 1.0)
    if self.label_noise and self.path:
      raise bad("config.data.label_noise", self.label_noise,
                "swaps pairs of the built-in set (flips its step labels) only: 0 with data.path")


@dataclasses.dataclass(frozen=True)
class RewardTrainConfig:
  steps: int
  batch_size: int
  micro_batch_size: int
  lr: float
  warmup_steps: int
  lr_decay_to: float
  weight_decay: float
  b1: float
  b2: float
  clip_norm: float
  margin: float
  center_coef: float
  last_step_only: bool

  def __post_init__(self):
    check_int("config.train.steps", self.steps, 0)
    check_int("config.train.batch_size", self.batch_size, 1)
    check_int("config.train.micro_batch_size", self.micro_batch_size, 0)
    if self.micro_batch_size and self.batch_size % self.micro_batch_size:
      raise bad("config.train.micro_batch_size", self.micro_batch_size,
                f"must divide train.batch_size={self.batch_size}; 0 uses the whole batch")
    check_float("config.train.lr", self.lr, 0.0, 1.0, low_open=True)
    check_int("config.train.warmup_steps", self.warmup_steps, 0)
    check_float("config.train.lr_decay_to", self.lr_decay_to, 0.0, 1.0)
    check_float("config.train.weight_decay", self.weight_decay, 0.0, 10.0)
    check_float("config.train.b1", self.b1, 0.0, 1.0)
    check_float("config.train.b2", self.b2, 0.0, 1.0)
    check_float("config.train.clip_norm", self.clip_norm, 0.0)
    check_float("config.train.margin", self.margin)
    check_float("config.train.center_coef", self.center_coef, 0.0)
    check_bool("config.train.last_step_only", self.last_step_only)


@dataclasses.dataclass(frozen=True)
class RewardEvalConfig:
  every: int

  def __post_init__(self):
    check_int("config.eval.every", self.every, 0)


@dataclasses.dataclass(frozen=True)
class RewardLogConfig:
  every: int

  def __post_init__(self):
    check_int("config.log.every", self.every, 1)


@dataclasses.dataclass(frozen=True)
class DPOConfig:
  """objective="dpo" (objectives/preference.py): the policy itself learns from the pairs."""

  beta: float  # scale of the implicit reward beta * log(pi / pi_ref) (the KL coefficient of the RLHF objective)
  loss_type: str  # sigmoid | robust | ipo (objectives/preference.py)
  label_smoothing: float  # eps, the assumed share of flipped labels (sigmoid: cDPO, robust: rDPO; ipo: 0)
  reference: str  # pi_ref: "" the initial policy (fresh, model.hf_path, init_checkpoint); a run's workdir or HF dir

  def __post_init__(self):
    check_dpo_knobs(self.beta, self.loss_type, self.label_smoothing, prefix="config.dpo")
    if not isinstance(self.reference, str):
      raise bad("config.dpo.reference", self.reference, "a path (a run's workdir or a HF directory) or ''")


REWARD_SECTIONS: dict[str, type] = {
    "data": PreferenceDataConfig,
    "model": ModelSpec,  # model/config.py
    "mesh": MeshConfig,  # model/sharding.py
    "train": RewardTrainConfig,
    "eval": RewardEvalConfig,
    "log": RewardLogConfig,
    "checkpoint": CheckpointConfig,  # checkpointing/config.py
    "dpo": DPOConfig,
}
REWARD_TOP_KEYS = ("name", "objective", "seed", "workdir_root", "init_checkpoint", "export")
# objective: "bradley_terry" trains r(x, y) from preference pairs (loss.py); "process" trains a score per
# reasoning step from stepwise labels (process.py); "dpo" trains the policy itself from the pairs
# (objectives/preference.py), its implicit reward beta * log(pi / pi_ref) in the Bradley-Terry likelihood.
OBJECTIVES = ("bradley_terry", "process", "dpo")


@dataclasses.dataclass(frozen=True)
class RewardModelConfig:
  name: str  # the run's name (console, summary, default workdir)
  objective: str  # one of OBJECTIVES
  seed: int
  workdir_root: str
  init_checkpoint: str  # the trunk's params from a run's workdir or a HF directory; "": fresh (or model.hf_path)
  export: bool  # write <workdir>/hf, a Hugging Face sequence-classification folder, at the end
  data: PreferenceDataConfig
  model: ModelSpec
  mesh: MeshConfig
  train: RewardTrainConfig
  eval: RewardEvalConfig
  log: RewardLogConfig
  checkpoint: CheckpointConfig
  dpo: DPOConfig

  def __post_init__(self):
    if not isinstance(self.name, str) or not self.name:
      raise bad("config.name", self.name, "a non-empty string")
    check_choice("config.objective", self.objective, OBJECTIVES)
    check_int("config.seed", self.seed, 0)
    if self.process and self.data.task != "arithmetic":
      raise bad("config.data.task", self.data.task, "'arithmetic' with config.objective='process' (the built-in "
                "stepwise rows are chained sums)")
    if self.objective != "bradley_terry":
      for field, value in (("train.margin", self.train.margin), ("train.center_coef", self.train.center_coef)):
        if value:
          raise bad(f"config.{field}", value, f"0 with config.objective={self.objective!r} (a Bradley-Terry "
                    "reward model's term)")
    if not self.process and self.data.end_step:
      raise bad("config.data.end_step", True, f"False with config.objective={self.objective!r} (a stepwise "
                "label option: objective='process')")
    if not self.process and self.train.last_step_only:
      raise bad("config.train.last_step_only", True, f"False with config.objective={self.objective!r} (a stepwise "
                "label option: objective='process')")
    if self.dpo_run and self.export:
      raise bad("config.export", True, "False with config.objective='dpo' (it trains a policy, not a score head; "
                "its checkpoints are init_checkpoint for an RL run)")
    if not self.dpo_run and self.dpo.reference:
      raise bad("config.dpo.reference", self.dpo.reference, "'' unless config.objective='dpo'")
    if not isinstance(self.init_checkpoint, str):
      raise bad("config.init_checkpoint", self.init_checkpoint, "a path (a run's workdir or a HF directory) or ''")
    check_bool("config.export", self.export)

  @property
  def run_name(self) -> str:
    return self.name

  @property
  def process(self) -> bool:
    """A process reward model (per-step labels)."""
    return self.objective == "process"

  @property
  def dpo_run(self) -> bool:
    """Direct Preference Optimization of the policy (no score head)."""
    return self.objective == "dpo"

  @property
  def builtin(self) -> bool:
    """The built-in arithmetic pairs (no data.path)."""
    return not self.data.path

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)


def reward_config_from_dict(cd) -> RewardModelConfig:
  """The locked ConfigDict of configs/reward_model.py (or its dict) as a RewardModelConfig."""
  d = cd.to_dict() if hasattr(cd, "to_dict") else dict(cd)
  check_keys("config", d, set(REWARD_SECTIONS) | set(REWARD_TOP_KEYS))
  cfg = RewardModelConfig(**{k: d[k] for k in REWARD_TOP_KEYS},
                          **{name: section_from_dict(name, cls, d[name]) for name, cls in REWARD_SECTIONS.items()})
  # A .gguf checkpoint -> the Hugging Face directory converted from it (model/io/gguf_io.py), as the RL run does.
  hf_path = resolve_model_path(cfg.model.hf_path, field="config.model.hf_path", chat_template=cfg.data.chat_template)
  init = resolve_model_path(cfg.init_checkpoint, field="config.init_checkpoint")
  ref = resolve_model_path(cfg.dpo.reference, field="config.dpo.reference")
  return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, hf_path=hf_path), init_checkpoint=init,
                             dpo=dataclasses.replace(cfg.dpo, reference=ref))
