"""The run configuration as frozen, validated dataclasses.

`from_config_dict` converts the locked ml_collections ConfigDict of a
`configs/<method>.py` file (keys and defaults: training/defaults.py) once;
the library only ever sees these dataclasses. Each section's dataclass lives
next to the code that owns it (`SECTIONS` says where); this module holds the
loop's own sections (train, eval, log) and `RunConfig`, whose checks span
sections. Every check names the field, its value and what is allowed
(jaxrl_llm/checks.py), and runs before any model is built.
"""

from __future__ import annotations

import dataclasses
import functools

from jaxrl_llm.checkpointing.config import CheckpointConfig
from jaxrl_llm.checks import (ConfigError, bad, check_bool, check_choice, check_float, check_int, check_keys,
                              section_from_dict)
from jaxrl_llm.envs.config import NO_ENV, EnvConfig
from jaxrl_llm.envs.registry import env_names
from jaxrl_llm.kernels.config import KernelsConfig
from jaxrl_llm.model.config import ModelSpec
from jaxrl_llm.model.sharding import MeshConfig
from jaxrl_llm.objectives import ObjectiveConfig
from jaxrl_llm.sampling.config import RolloutConfig
from jaxrl_llm.sampling.engine import engine_names
from jaxrl_llm.tasks.config import DataConfig, TaskConfig
from jaxrl_llm.teacher.config import TeacherConfig
from jaxrl_llm.training.score import FilterConfig
from jaxrl_llm.training.guards import GuardConfig
from jaxrl_llm.training.model_paths import resolve_model_paths
from jaxrl_llm.training.prox import PROX_CHOICES, ProxPlan, resolve_prox
from jaxrl_llm.training.sft import SFTConfig


SHARE_PROMPT_CHOICES = ("auto", "on", "off")
PACK_CHOICES = ("auto", "on", "off")  # train.pack (training/pack.py)
AUTO_MICRO_BATCH_TOKENS = 2048  # train.micro_batch_tokens = 0 with a checkpoint model


def micro_batch_for_tokens(mini: int, seq_len: int, tokens: int, multiple: int = 1) -> int:
  """The largest micro-batch that divides the mini-batch `mini`, is a multiple
  of `multiple` (the mesh's batch shards) and holds at most `tokens` tokens of
  `seq_len` each; the smallest such divisor when even that is over budget."""
  sizes = [m for m in range(multiple, mini + 1, multiple) if mini % m == 0]
  fitting = [m for m in sizes if m * seq_len <= tokens]
  return max(fitting) if fitting else min(sizes, default=mini)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  steps: int
  epochs: int
  mini_batches: int
  micro_batch_size: int
  micro_batch_tokens: int
  lr: float
  warmup_steps: int
  lr_decay_to: float
  weight_decay: float
  b1: float
  b2: float
  clip_norm: float
  value_lr: float
  prox: str  # where log pi_prox comes from: recompute | detach (training/prox.py)
  share_prompt: str  # a group's prompt run once per forward of the update and recompute: auto | on | off
  pack: str  # the update's and recompute's rows packed end to end in buffers: auto | on | off (training/pack.py)
  pack_length: int  # slots per packing buffer; 0: the cheapest of 1, 1.5 and 2 padded sequences

  def __post_init__(self):
    check_int("config.train.steps", self.steps, 0)
    check_int("config.train.epochs", self.epochs, 1)
    check_int("config.train.mini_batches", self.mini_batches, 1)
    check_int("config.train.micro_batch_size", self.micro_batch_size, 0)
    check_int("config.train.micro_batch_tokens", self.micro_batch_tokens, 0)
    check_float("config.train.lr", self.lr, 0.0, 1.0, low_open=True)
    check_int("config.train.warmup_steps", self.warmup_steps, 0)
    check_float("config.train.lr_decay_to", self.lr_decay_to, 0.0, 1.0)
    check_float("config.train.weight_decay", self.weight_decay, 0.0, 10.0)
    check_float("config.train.b1", self.b1, 0.0, 1.0)
    check_float("config.train.b2", self.b2, 0.0, 1.0)
    check_float("config.train.clip_norm", self.clip_norm, 0.0)
    check_float("config.train.value_lr", self.value_lr, 0.0, 1.0, low_open=True)
    check_choice("config.train.prox", self.prox, PROX_CHOICES)
    check_choice("config.train.share_prompt", self.share_prompt, SHARE_PROMPT_CHOICES)
    check_choice("config.train.pack", self.pack, PACK_CHOICES)
    check_int("config.train.pack_length", self.pack_length, 0)


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  n_examples: int
  every: int
  batch_size: int  # examples greedy-decoded at once (training/evaluation.py)

  def __post_init__(self):
    check_int("config.eval.n_examples", self.n_examples, 1)
    check_int("config.eval.batch_size", self.batch_size, 1)
    check_int("config.eval.every", self.every, 0)


@dataclasses.dataclass(frozen=True)
class LogConfig:
  progress: bool
  every: int
  kl_to_ref: bool
  dump_steps: tuple[int, ...]  # RL steps (1-based) whose batches the token-weight dump writes

  def __post_init__(self):
    check_bool("config.log.progress", self.progress)
    check_int("config.log.every", self.every, 1)
    check_bool("config.log.kl_to_ref", self.kl_to_ref)
    steps = self.dump_steps
    if isinstance(steps, int) and not isinstance(steps, bool):
      steps = (steps,)
    if not isinstance(steps, (tuple, list)):
      raise bad("config.log.dump_steps", steps, "a tuple of RL step numbers >= 1, e.g. (1, 50)")
    for n in steps:
      check_int("config.log.dump_steps (an entry)", n, 1)
    object.__setattr__(self, "dump_steps", tuple(sorted(set(steps))))


# Section name -> its dataclass (and where it lives).
SECTIONS: dict[str, type] = {
    "task": TaskConfig,  # tasks/config.py
    "data": DataConfig,  # tasks/config.py
    "model": ModelSpec,  # model/config.py
    "mesh": MeshConfig,  # model/sharding.py
    "kernels": KernelsConfig,  # kernels/config.py
    "sft": SFTConfig,  # training/sft.py
    "rollout": RolloutConfig,  # sampling/config.py
    "env": EnvConfig,  # envs/config.py
    "filters": FilterConfig,  # training/score.py
    "train": TrainConfig,
    "eval": EvalConfig,
    "log": LogConfig,
    "guard": GuardConfig,  # training/guards.py
    "checkpoint": CheckpointConfig,  # checkpointing/config.py
    "teacher": TeacherConfig,  # teacher/config.py
}
# Sections an older config may lack; they take their dataclass's defaults.
OPTIONAL_SECTIONS = ("checkpoint", "teacher", "guard", "env")

# Advantage estimators that need several samples per prompt (a group baseline
# or a group std): group size 1 makes them undefined or identically zero.
_GROUP_ADVANTAGES = ("grpo", "dr_grpo", "rloo", "reinforce_pp_baseline", "grpo_process")


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
  objective: ObjectiveConfig
  init_checkpoint: str  # new run's params from a run workdir or a HF directory; "" = fresh init
  name: str = ""  # what the run calls itself: the method, or a recipe built on it (sdpo = grpo + a teacher)
  guard: GuardConfig = GuardConfig()  # runs without a learning signal
  checkpoint: CheckpointConfig = CheckpointConfig()  # when to save, what to keep
  teacher: TeacherConfig = TeacherConfig()  # the teacher extension's section; source='none': no teacher
  env: EnvConfig = EnvConfig()  # multi-turn episodes with tools; name='none': single-turn samples

  @property
  def mini_batch_size(self) -> int:
    return self.rollout.batch_size // self.train.mini_batches

  @property
  def micro_batch_size(self) -> int:
    return self.train.micro_batch_size or self.mini_batch_size

  @property
  def prompt_group(self) -> int:
    """G where the update's and the recompute's forward passes run each group's prompt once
    (`train.share_prompt`, model/logprobs.response_hidden), else 1. Needs whole groups in every
    micro-batch (and recompute chunk, the same size) and mini-batch; "auto" shares where they are
    whole and where it costs fewer FLOPs for the batch's shapes (logprobs.shared_prompt_pays, decided
    per compiled shape), "on" always, and refuses a config without whole groups (`_check`)."""
    G = self.rollout.group_size
    if self.train.share_prompt == "off" or G == 1 or not self._whole_groups():
      return 1
    return G

  @property
  def always_share(self) -> bool:
    """train.share_prompt = "on": share each group's prompt even where it costs more FLOPs. Decided here
    once; the update, the recompute and the packing rule take it from here (their `from_run`)."""
    return self.train.share_prompt == "on"

  def check_pack_length(self) -> None:
    """Raise where `train.pack_length` is shorter than one packing unit: the prompt's padded width
    (data.max_prompt_len, resolved) and prompt_group responses (training/pack.py)."""
    unit = self.data.max_prompt_len + self.prompt_group * self.response_len
    if self.train.pack_length and self.train.pack_length < unit:
      raise bad("config.train.pack_length", self.train.pack_length,
                f"0 (auto) or at least one unit of {unit} slots (data.max_prompt_len {self.data.max_prompt_len} "
                f"+ {self.prompt_group} x {self.response_len} response tokens)")

  def _whole_groups(self) -> bool:
    G = self.rollout.group_size
    return self.mini_batch_size % G == 0 and self.micro_batch_size % G == 0

  @property
  def response_len(self) -> int:
    """R, the response tokens of a batch row: an episode's after its opening prompt (env.max_tokens),
    or a single-turn sample's (rollout.max_response_len)."""
    return self.env.max_tokens if self.env.active else self.rollout.max_response_len

  def with_micro_batch(self, prompt_len: int, batch_shards: int) -> "RunConfig":
    """This config with `train.micro_batch_size` set from `train.micro_batch_tokens`
    when it is 0 (`micro_batch_for_tokens`); unchanged when it is set, or when no
    token budget applies (the tiny model's default)."""
    tr = self.train
    budget = tr.micro_batch_tokens or (AUTO_MICRO_BATCH_TOKENS if self.model.hf_path else 0)
    if tr.micro_batch_size or not budget:
      return self
    micro = micro_batch_for_tokens(self.mini_batch_size, prompt_len + self.response_len, budget,
                                   batch_shards)
    return dataclasses.replace(self, train=dataclasses.replace(tr, micro_batch_size=micro))

  @property
  def use_value(self) -> bool:
    return self.objective.advantage == "gae"

  @functools.cached_property
  def prox(self) -> ProxPlan:
    """Where log pi_prox comes from and whether the pre-update forward pass runs (training/prox.py),
    resolved once; `__post_init__` resolves it first, so a refused choice stops the run there."""
    return resolve_prox(self)

  @property
  def run_name(self) -> str:
    return self.name or self.method

  def __post_init__(self):
    check_int("config.seed", self.seed, 0)
    if not isinstance(self.name, str):
      raise bad("config.name", self.name, "a string (the run's name; '' is the method's)")
    obj, ro, tr = self.objective, self.rollout, self.train
    G = ro.group_size
    check_choice("config.rollout.engine", ro.engine, engine_names())
    if obj.advantage in _GROUP_ADVANTAGES and G < 2:
      what = "std normalisation over the group" if obj.advantage == "grpo" else "a group baseline"
      raise bad("config.rollout.group_size", G, f"objective.advantage={obj.advantage!r} uses {what}, undefined "
                f"(or identically zero) with one sample per prompt: use group_size >= 2")
    if self.filters.dynamic_sampling and G < 2:
      raise bad("config.rollout.group_size", G, "filters.dynamic_sampling drops groups with equal rewards: needs >= 2")
    self.prox  # noqa: B018  (resolves train.prox against the objective; raises where it is refused)
    if self.filters.dynamic_sampling and ro.overlap:
      raise bad("config.filters.dynamic_sampling", True, "rollout.overlap generates the next batch before this one "
                "is scored, and the refill rounds depend on the scores: use one of the two")
    if ro.batch_size % tr.mini_batches:
      raise bad("config.train.mini_batches", tr.mini_batches,
                f"must divide the batch of prompts_per_step x group_size = {ro.batch_size} samples")
    mini = self.mini_batch_size
    if tr.micro_batch_size and mini % tr.micro_batch_size:
      raise bad("config.train.micro_batch_size", tr.micro_batch_size,
                f"must divide the mini-batch of {mini} samples (batch {ro.batch_size} / mini_batches "
                f"{tr.mini_batches}); 0 uses the whole mini-batch")
    if obj.aggregation == "group_token_mean" and (mini % G or self.micro_batch_size % G):
      raise bad("config.train.micro_batch_size", tr.micro_batch_size,
                f"aggregation 'group_token_mean' needs whole groups: mini-batch ({mini}) and micro-batch "
                f"({self.micro_batch_size}) sizes must be multiples of group_size={G}")
    if tr.share_prompt == "on" and G > 1 and not self._whole_groups():
      raise bad("config.train.share_prompt", "on",
                f"needs whole groups: mini-batch ({mini}) and micro-batch ({self.micro_batch_size}) sizes "
                f"must be multiples of group_size={G}; 'auto' shares only where they are")
    late = [n for n in self.log.dump_steps if n > tr.steps]
    if late:
      raise bad("config.log.dump_steps", self.log.dump_steps, f"steps {late} are past train.steps={tr.steps}: "
                f"allowed [1, {tr.steps}]")
    if self.filters.overlong_buffer >= self.response_len:
      what = "env.max_tokens" if self.env.active else "rollout.max_response_len"
      raise bad("config.filters.overlong_buffer", self.filters.overlong_buffer,
                f"must be < {what}={self.response_len}")
    if obj.kl_target > 0 and obj.kl_horizon < ro.batch_size:
      raise bad("config.objective.kl_horizon", obj.kl_horizon, f"must be >= the step's {ro.batch_size} samples "
                "(rollout.batch_size): the adaptive KL's K_beta = samples / kl_horizon must be <= 1 so that beta "
                "stays > 0 (objectives/kl_control.py)")
    if obj.needs_centering and ro.record_topk < 1:
      raise bad("config.rollout.record_topk", ro.record_topk,
                "Score Centering (objective.kappa=1) needs the sampler's top-k log-probs: set it >= 1")
    if obj.needs_token_kl and (ro.top_k or ro.top_p < 1.0):
      raise bad("config.rollout.top_k", ro.top_k, f"TRM's token KL(mu || pi_theta) is recomputed from the "
                f"sampler's untruncated distribution: needs top_k=0 and top_p=1 (top_p={ro.top_p})")
    self._check_env()
    if self.task.name == "file" and not self.data.path:
      raise bad("config.data.path", self.data.path, "task.name='file' needs a .jsonl or .parquet file")
    if self.task.name == "file" and self.sft.steps > 0:
      raise bad("config.sft.steps", self.sft.steps, "the SFT warm start needs demonstrations, which only the "
                "built-in tasks have: set sft.steps=0 for task.name='file'")

  def _check_env(self) -> None:
    """What multi-turn episodes (training/episodes.py) work with so far."""
    env, ro = self.env, self.rollout
    check_choice("config.env.name", env.name, (NO_ENV,) + env_names())
    if not env.active:
      return
    # rollout.engine: an engine plays episodes where it has a turn sampler (Trainer.rollout_engine checks it
    # once the engine exists: builtin and openai do, a registered engine may)
    if self.teacher.enabled:
      raise bad("config.teacher.source", self.teacher.source, f"env.name={env.name!r}: a teacher does not read "
                "episodes yet (it would not see the environment's tokens): use 'none'")
    if ro.record_topk:
      raise bad("config.rollout.record_topk", ro.record_topk, f"env.name={env.name!r}: episodes record no top-k "
                "of mu yet (Score Centering's top-k form): use 0")
    if env.tools_in_template and not self.data.chat_template:
      raise bad("config.env.tools_in_template", True, "False with data.chat_template=False (no chat template "
                "renders the episodes to take the tools)")

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)


def resolve_objective(method: str, block: dict) -> ObjectiveConfig:
  """The ObjectiveConfig of `method` with the config's knob values."""
  from jaxrl_llm import objectives

  if method not in objectives.PRESETS:
    check_choice("config.method", method, tuple(sorted(objectives.PRESETS)))
  knobs = dict(block)
  source = knobs.pop("name", method)
  if source != method:
    raise bad("config.method", method, f"config.objective holds the knobs of preset {source!r}: choose a "
              f"method by its config file (configs/{method}.py), not by overriding config.method")
  try:
    return objectives.get_preset(method, **knobs)
  except (TypeError, ValueError) as e:
    raise ConfigError(f"config.objective: {e}") from None


def from_config_dict(cd) -> RunConfig:
  """Converts a (locked) ml_collections ConfigDict, or its dict, once into a RunConfig."""
  d = cd.to_dict() if hasattr(cd, "to_dict") else dict(cd)
  init_checkpoint = d.pop("init_checkpoint", "")
  name = d.pop("name", "")
  required = set(SECTIONS) - set(OPTIONAL_SECTIONS)
  check_keys("config", set(d) | set(OPTIONAL_SECTIONS), required | set(OPTIONAL_SECTIONS) |
             {"method", "seed", "workdir_root", "objective"})
  sections = {name: section_from_dict(name, cls, d[name]) for name, cls in SECTIONS.items() if name in d}
  cfg = RunConfig(method=d["method"], seed=d["seed"], workdir_root=d["workdir_root"],
                  objective=resolve_objective(d["method"], d["objective"]), init_checkpoint=init_checkpoint, name=name,
                  **sections)
  return resolve_model_paths(cfg)  # a .gguf checkpoint -> its converted HF directory (training/model_paths.py)
