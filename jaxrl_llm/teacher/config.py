"""The ``teacher`` section of the run config, validated, and its pre-flight checks.

``TeacherConfig`` checks each field on its own (no files read): a bad value
names the field, the value and what is allowed. ``teacher_preflight`` checks
what needs the file system and the student's vocabulary (teacher paths exist,
teachers share the student's vocabulary, ``topk`` <= V); the entry point runs
it right after the config is read (the extension's ``preflight``), before the teacher is
built, so a bad teacher fails before any RL step.
"""

from __future__ import annotations

import dataclasses
import os

from jaxrl_llm.checks import bad, check_choice
from jaxrl_llm.objectives.distill_topk import TOPK_TAILS
from jaxrl_llm.objectives.teacher_schedule import KINDS as SCHEDULES
from jaxrl_llm.objectives.teacher_schedule import TeacherSchedule

SOURCES = ("none", "sft", "checkpoint", "self")
CONTEXTS = ("prompt", "hint")
SIGNALS = ("distill", "gap_advantage", "srpo", "rlsd")
LOSS_SIGNALS = ("distill", "srpo")  # the signals whose teacher term is a divergence in the loss
DIVERGENCES = ("reverse_kl", "forward_kl", "jsd")


def parse_routes(spec: str) -> tuple[tuple[str, str], ...]:
  """``"tagA=path1,tagB=path2"`` -> ((tagA, path1), (tagB, path2)); "" -> ().

  Tags are the examples' ``tag`` (a built-in task's name, or the row key
  ``data.tag_key`` of a file); each tag appears once, paths may repeat.
  """
  if not spec.strip():
    return ()
  routes, seen = [], set()
  for entry in spec.split(","):
    tag, sep, path = (s.strip() for s in entry.partition("="))
    if not sep or not tag or not path:
      raise bad("config.teacher.route_by_tag", spec, f"entry {entry.strip()!r} must be 'tag=path' (entries separated by ',')")
    if tag in seen:
      raise bad("config.teacher.route_by_tag", spec, f"tag {tag!r} appears twice; each tag has one teacher")
    seen.add(tag)
    routes.append((tag, path))
  return tuple(routes)


@dataclasses.dataclass(frozen=True)
class TeacherConfig:
  """The ``teacher`` section of the run config; each field's comment is its documentation."""

  source: str = "none"  # none | sft (warm start + sft_steps on correct demos) | checkpoint | self
  checkpoint: str = ""  # source=checkpoint: HF directory or run workdir; same tokenizer as the student
  # source=checkpoint, one teacher per task tag: "tagA=path1,tagB=path2" (the tag is a built-in task's
  # name, or a file row's data.tag_key); a sample whose tag is not listed gets no teacher (m_i = 0).
  # "": one teacher for every sample (teacher.checkpoint)
  route_by_tag: str = ""
  sft_steps: int = 300  # source=sft: extra SFT steps on correct demonstrations, from the warm start
  context: str = "prompt"  # what the teacher sees before the response: prompt | hint (answer + prompt)
  hint_template: str = "{answer}|{prompt}"  # context=hint: the privileged teacher context
  hint_sft_steps: int = 0  # source=self, context=hint: warm-start steps teaching the model to read hints
  schedule: str = "frozen"  # source=self: teacher weights frozen | current | refresh | ema
  refresh_every: int = 10  # schedule=refresh: RL steps between teacher moves
  ema_decay: float = 0.9  # schedule=ema: decay d of phi = d phi + (1 - d) theta, in [0, 1)
  signal: str = "distill"  # distill (loss form) | gap_advantage | srpo | rlsd
  divergence: str = "reverse_kl"  # distill/srpo: reverse_kl | forward_kl | jsd
  jsd_beta: float = 0.5  # divergence=jsd: beta in [0, 1] (0 = forward KL, 1 = reverse KL)
  topk: int = 0  # distill/srpo: 0 = divergence over the full vocabulary; k in [1, V]: the teacher's top-k
  topk_tail: str = "renormalize"  # topk > 0: renormalize (both on the top-k ids) | bucket (+ the rest)
  coef: float = 1.0  # weight of the teacher term (loss form) or of the gap (gap_advantage)
  rl_coef: float = 0.0  # distill/gap_advantage: weight of the reward advantage (0: pure distillation)
  sign_gate: bool = False  # SG-OPD: teacher term only where sign(log q(y) - log p(y)) = sign(A); not rlsd
  eps_w: float = 0.2  # rlsd: the multiplier is clipped to [1 - eps_w, 1 + eps_w], eps_w in [0, 1)
  lam: float = 1.0  # rlsd: lambda, share of the teacher-modulated advantage, in [0, 1]
  confidence_beta: float = 0.0  # tau = clip(exp(-beta H(q)), tau_min, tau_max); 0: tau = 1
  tau_min: float = 0.0  # lower clip of tau
  tau_max: float = 1.0  # upper clip of tau

  def __post_init__(self):
    for field, value, allowed in (("source", self.source, SOURCES), ("context", self.context, CONTEXTS),
                                  ("schedule", self.schedule, SCHEDULES), ("signal", self.signal, SIGNALS),
                                  ("divergence", self.divergence, DIVERGENCES),
                                  ("topk_tail", self.topk_tail, TOPK_TAILS)):
      check_choice(f"config.teacher.{field}", value, allowed)
    routes = parse_routes(self.route_by_tag)
    if routes and self.source != "checkpoint":
      raise bad("config.teacher.route_by_tag", self.route_by_tag, f"routes name teacher checkpoints: needs source='checkpoint' "
                 f"(source={self.source!r})")
    if routes and self.checkpoint:
      raise bad("config.teacher.checkpoint", self.checkpoint, "leave it empty with route_by_tag (the routes name every teacher)")
    if self.source == "checkpoint" and not (self.checkpoint or routes):
      raise bad("config.teacher.checkpoint", self.checkpoint, "source='checkpoint' needs a path (HF directory or run workdir), "
                 "or teacher.route_by_tag")
    if self.source in ("sft", "checkpoint") and self.schedule != "frozen":
      raise bad("config.teacher.schedule", self.schedule, "an external teacher is frozen; schedules apply to source='self'")
    if self.source == "self" and self.context == "prompt" and self.schedule == "current":
      raise bad("config.teacher.context", self.context, "the current student on the student's own context is the "
                 "student itself (zero gap); use context='hint' or another schedule")
    for field in ("sft_steps", "hint_sft_steps", "topk"):
      value = getattr(self, field)
      if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise bad(f"config.teacher.{field}", value, "an int >= 0")
    if self.topk and self.signal not in LOSS_SIGNALS:
      raise bad("config.teacher.topk", self.topk, f"the teacher's top-k enters the loss forms, signal in {LOSS_SIGNALS} "
                 f"(signal={self.signal!r} uses only the sampled token); 0 = full vocabulary")
    if not isinstance(self.sign_gate, bool):
      raise bad("config.teacher.sign_gate", self.sign_gate, "a bool")
    if self.sign_gate and self.signal == "rlsd":
      raise bad("config.teacher.sign_gate", self.sign_gate, "signal='rlsd' already takes its direction from the reward "
                 "(docs/objectives.md eq. 11.13); the sign gate applies to distill, gap_advantage and srpo")
    if "{prompt}" not in self.hint_template or "{answer}" not in self.hint_template:
      raise bad("config.teacher.hint_template", self.hint_template, "must contain {answer} and {prompt}")
    if not 0.0 <= self.jsd_beta <= 1.0:
      raise bad("config.teacher.jsd_beta", self.jsd_beta, "allowed [0, 1] (0 = forward KL, 1 = reverse KL)")
    if not self.coef >= 0.0 or not self.rl_coef >= 0.0:
      raise bad("config.teacher.coef/rl_coef", (self.coef, self.rl_coef), "both must be >= 0")
    if not 0.0 <= self.eps_w < 1.0:
      raise bad("config.teacher.eps_w", self.eps_w, "allowed [0, 1)")
    if not 0.0 <= self.lam <= 1.0:
      raise bad("config.teacher.lam", self.lam, "allowed [0, 1]")
    if not self.confidence_beta >= 0.0:
      raise bad("config.teacher.confidence_beta", self.confidence_beta, "must be >= 0 (0 disables tau)")
    if not 0.0 <= self.tau_min <= self.tau_max:
      raise bad("config.teacher.tau_min/tau_max", (self.tau_min, self.tau_max), "need 0 <= tau_min <= tau_max")
    if self.schedule != "frozen":  # build the schedule now so its own checks run before training
      TeacherSchedule(self.schedule, self.refresh_every, self.ema_decay)

  @property
  def enabled(self) -> bool:
    return self.source != "none"

  @property
  def loss_form(self) -> bool:
    """The teacher enters as a divergence term of the loss (needs its distribution in the update)."""
    return self.signal in LOSS_SIGNALS

  @property
  def routes(self) -> tuple[tuple[str, str], ...]:
    return parse_routes(self.route_by_tag)

  @property
  def moving_self_teacher(self) -> bool:
    """The teacher's weights depend on the run's history: they go into the run's checkpoints."""
    return self.source == "self" and self.schedule in ("refresh", "ema")

  def checkpoint_paths(self) -> tuple[tuple[str, str], ...]:
    """(config field, path) of every external teacher checkpoint."""
    if self.source != "checkpoint":
      return ()
    if self.routes:
      return tuple((f"route_by_tag[{tag}]", path) for tag, path in self.routes)
    return (("checkpoint", self.checkpoint),)


# ---- pre-flight: what needs the file system ------------------------------------------

def student_vocab_size(model_spec) -> int:
  """V of the student's output head, as the trainer will build it (no weights read)."""
  if model_spec.hf_path:
    from jaxrl_llm.model.io import hf_io
    from jaxrl_llm.model.io.hf_config import config_from_hf
    return config_from_hf(hf_io.read_hf_config(model_spec.hf_path)).vocab_size
  from jaxrl_llm.model.tokenizer import CharTokenizer
  return CharTokenizer().vocab_size


def saved_vocab_size(path: str) -> int:
  """V of a teacher checkpoint (a HF directory or a run's workdir), read from its config only."""
  from jaxrl_llm.checkpointing import init_params as ckpt_init
  if ckpt_init.is_hf_dir(path):
    from jaxrl_llm.model.io import hf_io
    from jaxrl_llm.model.io.hf_config import config_from_hf
    return config_from_hf(hf_io.read_hf_config(path)).vocab_size
  from jaxrl_llm.checkpointing.manager import CheckpointManager
  mngr = CheckpointManager(ckpt_init.checkpoint_dir(path), read_only=True)
  step = mngr.latest_step()
  if step is None:
    raise FileNotFoundError(f"{path!r} holds no checkpoint: expected a Hugging Face directory "
                            "(config.json + *.safetensors) or a run's workdir")
  return int(mngr.restore_meta(step)["model_config"]["vocab_size"])


def teacher_preflight(run_cfg) -> None:
  """Errors before training for a teacher that cannot work with this student.

  Missing teacher checkpoint paths, a teacher vocabulary other than the
  student's (the divergences compare distributions over the same token ids),
  ``topk`` larger than the vocabulary.
  """
  cfg = run_cfg.teacher
  if cfg is None or not cfg.enabled:
    return
  vocab = student_vocab_size(run_cfg.model)
  if cfg.topk > vocab:
    raise bad("config.teacher.topk", cfg.topk, f"allowed [0, {vocab}] (at most the student's vocabulary V={vocab}; "
               "0 = full vocabulary)")
  for field, path in cfg.checkpoint_paths():
    if not os.path.isdir(path):
      raise FileNotFoundError(f"config.teacher.{field}={path!r} does not exist: expected a Hugging Face "
                              "directory (config.json + *.safetensors) or a run's workdir")
    found = saved_vocab_size(path)
    if found != vocab:
      raise ValueError(f"config.teacher.{field}={path!r} has vocab_size={found} but the student has {vocab}: "
                       "the teacher must use the student's tokenizer")
