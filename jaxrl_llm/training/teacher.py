"""Teacher stage: build the teacher, score the student's rollouts with it, and
route its signal into the update (spec 000 sections 5-6, spec 003 on-policy
distillation and self-distillation with hints).

Where the teacher comes from (``teacher.source``):

* ``sft``: an external teacher made by the warm start: the warm-started
  student trained ``sft_steps`` more steps on *correct* demonstrations only
  (a better-trained checkpoint of the same architecture and tokenizer).
* ``checkpoint``: an external teacher from a Hugging Face directory or a
  run's workdir; its vocabulary must be the student's.
* ``self``: the student's own network (SDPO). Its weights follow
  ``teacher.schedule`` (objectives/teacher_schedule.py). With
  ``context=hint`` the teacher sees the reference answer as a hint before the
  prompt; ``hint_sft_steps`` warm-start steps teach the model to read a hint.

How the signal enters (``teacher.signal``), all on the student's own samples:

* ``distill``: the loss form, coef * D(p, q) per token (reverse KL, forward
  KL or JSD over the full vocabulary, eq. 26-30), plus rl_coef times the
  reward policy loss.
* ``gap_advantage``: the sampled-token advantage form: A_t = rl_coef A_i +
  coef tau_t Delta_t with Delta the detached teacher gap (eq. 31-33).
* ``srpo``: GRPO on samples routed z_grpo, coef * D on samples routed z_sdpo
  (eq. 34-35), one shared token normaliser.
* ``rlsd``: reward sets the direction, the clipped teacher gap the magnitude
  (eq. 37-39).

tau is the teacher-confidence weight of eq. 56 (confidence_beta = 0: tau = 1).
"""

from __future__ import annotations

import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import model as model_lib
from jaxrl_llm import objectives as obj_lib
from jaxrl_llm.objectives import distill, teacher as teacher_w, teacher_routing
from jaxrl_llm.objectives.teacher_inputs import build_teacher_inputs, gather_predictions
from jaxrl_llm.objectives.teacher_schedule import KINDS as SCHEDULES, TeacherSchedule, teacher_params_for_step
from jaxrl_llm.tasks.base import Example
from jaxrl_llm.training.data import encode_prompts, prompt_text
from jaxrl_llm.training.logprobs import full_logprobs, response_hidden

SOURCES = ("none", "sft", "checkpoint", "self")
CONTEXTS = ("prompt", "hint")
SIGNALS = ("distill", "gap_advantage", "srpo", "rlsd")
DIVERGENCES = ("reverse_kl", "forward_kl", "jsd")


def _bad(field, value, allowed):
  return ValueError(f"config.teacher.{field}={value!r} is invalid: {allowed}")


@dataclasses.dataclass(frozen=True)
class TeacherConfig:
  """The ``teacher`` section of the run config (keys documented in configs/base.py)."""

  source: str = "none"
  checkpoint: str = ""
  sft_steps: int = 300
  context: str = "prompt"
  hint_template: str = "{answer}|{prompt}"
  hint_sft_steps: int = 0
  schedule: str = "frozen"
  refresh_every: int = 10
  ema_decay: float = 0.9
  signal: str = "distill"
  divergence: str = "reverse_kl"
  jsd_beta: float = 0.5
  coef: float = 1.0
  rl_coef: float = 0.0
  eps_w: float = 0.2
  lam: float = 1.0
  confidence_beta: float = 0.0
  tau_min: float = 0.0
  tau_max: float = 1.0

  def __post_init__(self):
    for field, value, allowed in (("source", self.source, SOURCES), ("context", self.context, CONTEXTS),
                                  ("schedule", self.schedule, SCHEDULES), ("signal", self.signal, SIGNALS),
                                  ("divergence", self.divergence, DIVERGENCES)):
      if value not in allowed:
        raise _bad(field, value, f"allowed {allowed}")
    if self.source == "checkpoint" and not self.checkpoint:
      raise _bad("checkpoint", self.checkpoint, "source='checkpoint' needs a path (HF directory or run workdir)")
    if self.source in ("sft", "checkpoint") and self.schedule != "frozen":
      raise _bad("schedule", self.schedule, "an external teacher is frozen; schedules apply to source='self'")
    if self.source == "self" and self.context == "prompt" and self.schedule == "current":
      raise _bad("context", self.context, "the current student on the student's own context is the "
                 "student itself (zero gap); use context='hint' or another schedule")
    for field in ("sft_steps", "hint_sft_steps"):
      if not isinstance(getattr(self, field), int) or getattr(self, field) < 0:
        raise _bad(field, getattr(self, field), "an int >= 0")
    if "{prompt}" not in self.hint_template or "{answer}" not in self.hint_template:
      raise _bad("hint_template", self.hint_template, "must contain {answer} and {prompt}")
    if not 0.0 <= self.jsd_beta <= 1.0:
      raise _bad("jsd_beta", self.jsd_beta, "allowed [0, 1] (0 = forward KL, 1 = reverse KL)")
    if not self.coef >= 0.0 or not self.rl_coef >= 0.0:
      raise _bad("coef/rl_coef", (self.coef, self.rl_coef), "both must be >= 0")
    if not 0.0 <= self.eps_w < 1.0:
      raise _bad("eps_w", self.eps_w, "allowed [0, 1)")
    if not 0.0 <= self.lam <= 1.0:
      raise _bad("lam", self.lam, "allowed [0, 1]")
    if not self.confidence_beta >= 0.0:
      raise _bad("confidence_beta", self.confidence_beta, "must be >= 0 (0 disables tau)")
    if not 0.0 <= self.tau_min <= self.tau_max:
      raise _bad("tau_min/tau_max", (self.tau_min, self.tau_max), "need 0 <= tau_min <= tau_max")
    if self.schedule != "frozen":  # build the schedule now so its own checks run before training
      TeacherSchedule(self.schedule, self.refresh_every, self.ema_decay)

  @property
  def enabled(self) -> bool:
    return self.source != "none"

  @property
  def needs_full_logprobs(self) -> bool:
    """The loss forms need the teacher's whole next-token distribution."""
    return self.signal in ("distill", "srpo")


# ---- the teacher's weights ---------------------------------------------------

def _copy(tree):
  return jax.tree.map(jnp.copy, tree)


def load_teacher_checkpoint(path: str, student_params, student_cfg: model_lib.ModelConfig):
  """(params, model_cfg) of an external teacher; same vocabulary as the student or an error."""
  if not os.path.isdir(path):
    raise FileNotFoundError(f"config.teacher.checkpoint={path!r} does not exist: expected a Hugging "
                            "Face directory (config.json + *.safetensors) or a run's workdir")
  from jaxrl_llm.checkpointing import init as ckpt_init
  if ckpt_init.is_hf_dir(path):
    from jaxrl_llm.model import hf_io
    from jaxrl_llm.model.hf_config import config_from_hf
    cfg = config_from_hf(hf_io.read_hf_config(path), param_dtype=student_cfg.param_dtype)
    if cfg.vocab_size != student_cfg.vocab_size:
      raise ValueError(f"config.teacher.checkpoint={path!r} has vocab_size={cfg.vocab_size} but the student "
                       f"has {student_cfg.vocab_size}: the teacher must use the student's tokenizer")
    params, cfg = hf_io.load_hf(path, param_dtype=student_cfg.param_dtype)
    return params, cfg
  try:
    params, _ = ckpt_init.init_params(path, student_params, student_cfg)
  except ValueError as e:  # IncompatibleCheckpointError names the differing fields
    if "vocab_size" in str(e):
      raise ValueError(f"config.teacher.checkpoint={path!r}: vocabulary differs from the student's "
                       f"(the teacher must use the student's tokenizer): {e}") from e
    raise
  return params, student_cfg


def hint_examples(examples, template: str) -> list[Example]:
  """The privileged context: the reference answer as a hint before the prompt, correct demo."""
  return [Example(prompt=template.format(answer=e.answer, prompt=e.prompt), answer=e.answer, demo=e.answer)
          for e in examples]


def build_teacher(cfg: TeacherConfig, student_params, student_cfg, *, sft_fn, train_examples):
  """-> (student_params, teacher_params, teacher_cfg, info) before RL starts.

  ``sft_fn(params, examples, steps) -> params`` runs the warm start's SFT
  (it may donate its input; copies are passed). ``train_examples`` carry
  their (partly wrong) demos; correct demos are their answers.
  """
  if cfg.source == "none":
    return student_params, None, None, {}
  if cfg.source == "checkpoint":
    params, tcfg = load_teacher_checkpoint(cfg.checkpoint, student_params, student_cfg)
    return student_params, params, tcfg, {"teacher_source": cfg.checkpoint}
  if cfg.source == "sft":
    correct = [dataclasses.replace(e, demo=e.answer) for e in train_examples]
    params = sft_fn(_copy(student_params), correct, cfg.sft_steps)
    return student_params, params, student_cfg, {"teacher_source": f"sft+{cfg.sft_steps} correct"}
  # self: optionally teach the model to read a hint, then phi_{-1} = theta_0.
  if cfg.context == "hint" and cfg.hint_sft_steps:
    mixed = hint_examples(train_examples, cfg.hint_template) + list(train_examples)
    student_params = sft_fn(_copy(student_params), mixed, cfg.hint_sft_steps)
  return student_params, _copy(student_params), student_cfg, {"teacher_source": f"self/{cfg.schedule}"}


# ---- the teacher's forward pass on the rollouts ----------------------------------

@functools.partial(jax.jit, static_argnames=("teacher_cfg", "student_cfg", "temperature"))
def _score_chunk(teacher_params, student_params, ctx_BC, ctx_mask_BC, prompt_BP, prompt_mask_BP, tokens_BR,
                 mask_BR, *, teacher_cfg, student_cfg, temperature):
  """(logq_BRV, logp_BRV): teacher and student next-token log-probs at each response token."""
  inp = build_teacher_inputs(ctx_BC, ctx_mask_BC, tokens_BR, mask_BR)
  hidden_BSD, _ = model_lib.forward(teacher_params, teacher_cfg, inp.tokens_BS, inp.positions_BS, inp.mask_BS)
  t_hidden_BRD = gather_predictions(hidden_BSD, inp.predict_index_BR)
  logq_BRV = full_logprobs(t_hidden_BRD, model_lib.lm_head(teacher_params, teacher_cfg), temperature=temperature)
  s_hidden_BRD = response_hidden(student_params, student_cfg, prompt_BP, prompt_mask_BP, tokens_BR, mask_BR)
  logp_BRV = full_logprobs(s_hidden_BRD, model_lib.lm_head(student_params, student_cfg), temperature=temperature)
  return logq_BRV, logp_BRV


@dataclasses.dataclass(frozen=True)
class TeacherSignals:
  """Host arrays for one batch; B samples, R response tokens, V vocabulary."""

  teacher_logp_BR: np.ndarray  # f32 log q(y_t)
  student_logp_BR: np.ndarray  # f32 log p(y_t) (the params that start this step's updates)
  gap_BR: np.ndarray  # f32 Delta = log q(y_t) - log p(y_t) (eq. 33)
  teacher_entropy_BR: np.ndarray  # f32 H(q_t) (eq. 55)
  kl_BR: np.ndarray  # f32 KL(p_t || q_t) over the vocabulary
  teacher_logq_BRV: np.ndarray | None  # f32 full teacher log-probs (loss forms only)
  has_teacher_B: np.ndarray  # bool: usable teacher information (m_i of eq. 34)


class TeacherStage:
  """Holds the teacher's weights; scores rollouts; rewrites advantages; supplies the loss term."""

  def __init__(self, cfg: TeacherConfig, teacher_params, teacher_cfg, student_cfg, tokenizer, *,
               temperature: float, max_prompt_len: int, chat_template: bool = False, chunk: int = 256):
    if teacher_cfg.vocab_size != student_cfg.vocab_size:
      raise ValueError(f"teacher vocab_size={teacher_cfg.vocab_size} differs from the student's "
                       f"{student_cfg.vocab_size}: the teacher must use the student's tokenizer")
    self.cfg, self.params, self.teacher_cfg, self.student_cfg = cfg, teacher_params, teacher_cfg, student_cfg
    self.tokenizer, self.temperature = tokenizer, temperature
    self.max_prompt_len, self.chat_template, self.chunk = max_prompt_len, chat_template, chunk
    self.schedule = TeacherSchedule(cfg.schedule, cfg.refresh_every, cfg.ema_decay)

  def _contexts(self, samples):
    if self.cfg.context == "prompt":
      return samples.prompt_BP, samples.prompt_mask_BP
    exs = hint_examples([Example(prompt=p, answer=a) for p, a in zip(samples.prompts, samples.answers)],
                        self.cfg.hint_template)
    # The hint lengthens the context beyond data.max_prompt_len; pad to a multiple of 8 above it so
    # the teacher's forward compiles for few shapes.
    longest = 1 + max(len(self.tokenizer.encode(prompt_text(self.tokenizer, e.prompt, self.chat_template)))
                      for e in exs)  # + BOS
    width = max(self.max_prompt_len, -(-longest // 8) * 8)
    pb = encode_prompts(self.tokenizer, exs, width, self.chat_template)
    return pb.tokens_BP, pb.mask_BP

  def signals(self, samples, student_params, step: int) -> TeacherSignals:
    """The teacher's view of this batch; moves a self-teacher first (teacher-move timing)."""
    if self.cfg.source == "self":
      self.params = teacher_params_for_step(self.params, student_params, step, self.schedule)
    ctx_BC, ctx_mask_BC = self._contexts(samples)
    B = samples.tokens_BR.shape[0]
    logq, logp = [], []
    for s in range(0, B, self.chunk):
      sl = slice(s, s + self.chunk)
      q, p = _score_chunk(self.params, student_params, ctx_BC[sl], ctx_mask_BC[sl], samples.prompt_BP[sl],
                          samples.prompt_mask_BP[sl], samples.tokens_BR[sl], samples.mask_BR[sl],
                          teacher_cfg=self.teacher_cfg, student_cfg=self.student_cfg,
                          temperature=self.temperature)
      logq.append(np.asarray(q))
      logp.append(np.asarray(p))
    logq_BRV, logp_BRV = np.concatenate(logq), np.concatenate(logp)
    mask = samples.mask_BR
    take = lambda a: np.take_along_axis(a, samples.tokens_BR[..., None].astype(np.int64), axis=-1)[..., 0]
    t_BR, s_BR = take(logq_BRV), take(logp_BRV)
    ent_BR = np.asarray(teacher_w.teacher_entropy(jnp.asarray(logq_BRV)))
    kl_BR = np.asarray(distill.reverse_kl(jnp.asarray(logp_BRV), jnp.asarray(logq_BRV)))
    zero = lambda a: np.where(mask, a, 0.0).astype(np.float32)
    return TeacherSignals(
        teacher_logp_BR=zero(t_BR), student_logp_BR=zero(s_BR), gap_BR=zero(t_BR - s_BR),
        teacher_entropy_BR=zero(ent_BR), kl_BR=zero(kl_BR),
        teacher_logq_BRV=logq_BRV.astype(np.float32) if self.cfg.needs_full_logprobs else None,
        has_teacher_B=np.ones(B, bool))

  def apply(self, sig: TeacherSignals, adv_BR: np.ndarray, mask_BR: np.ndarray, correct_B: np.ndarray):
    """-> (adv_BR, extra_BR, metrics): advantages for the policy loss, inputs of the loss term."""
    cfg, mask = self.cfg, jnp.asarray(mask_BR)
    adv, gap = jnp.asarray(adv_BR), jnp.asarray(sig.gap_BR)
    tau_BR = teacher_w.confidence_weight(jnp.asarray(sig.teacher_entropy_BR), beta=cfg.confidence_beta,
                                         tau_min=cfg.tau_min, tau_max=cfg.tau_max)
    weight_BR = jnp.zeros(adv.shape)
    routed = jnp.zeros(adv.shape[:1])
    if cfg.signal == "distill":
      adv, weight_BR, routed = cfg.rl_coef * adv, cfg.coef * tau_BR, jnp.ones(adv.shape[:1])
    elif cfg.signal == "gap_advantage":
      adv, routed = cfg.rl_coef * adv + cfg.coef * tau_BR * gap, jnp.ones(adv.shape[:1])
    elif cfg.signal == "srpo":
      z_grpo, routed = teacher_routing.srpo_routes(jnp.asarray(correct_B) > 0.5, jnp.asarray(sig.has_teacher_B))
      adv = adv * z_grpo[:, None]  # routed-away tokens keep counting in the normaliser (eq. 35)
      weight_BR = cfg.coef * tau_BR * routed[:, None]
    else:  # rlsd
      adv = teacher_w.rlsd_advantage(adv, gap, eps_w=cfg.eps_w, lam=cfg.lam)
    extra = {}
    if cfg.needs_full_logprobs:
      extra = {"teacher_logq_BRV": sig.teacher_logq_BRV, "teacher_weight_BR": np.asarray(weight_BR, np.float32)}
    return np.asarray(jnp.where(mask, adv, 0.0), np.float32), extra, self.metrics(sig, mask_BR, routed, tau_BR)

  def metrics(self, sig: TeacherSignals, mask_BR, routed_B, tau_BR) -> dict:
    """Teacher diagnostics: gap statistics, routed fraction, teacher entropy, tau."""
    m = np.asarray(mask_BR, bool)
    n = max(int(m.sum()), 1)
    gap = sig.gap_BR[m] if m.any() else np.zeros(1, np.float32)
    return {
        "teacher/gap_mean": float(gap.sum() / n), "teacher/gap_std": float(gap.std()),
        "teacher/gap_min": float(gap.min()), "teacher/gap_max": float(gap.max()),
        "teacher/gap_pos_frac": float((gap > 0).sum() / n),
        "teacher/kl_student_teacher": float(sig.kl_BR[m].sum() / n),
        "teacher/entropy": float(sig.teacher_entropy_BR[m].sum() / n),
        "teacher/tau_mean": float(np.asarray(tau_BR)[m].sum() / n),
        "teacher/routed_frac": float(np.asarray(routed_B).mean()) if len(routed_B) else 0.0,
    }

  def extra_terms(self, aggregation: str) -> tuple:
    """UpdateSpec.extra_terms for the loss forms (empty for the advantage forms)."""
    if not self.cfg.needs_full_logprobs:
      return ()
    return (("teacher", DistillTerm(self.student_cfg, self.cfg.divergence, self.cfg.jsd_beta,
                                    self.temperature, aggregation)),)


@dataclasses.dataclass(frozen=True)
class DistillTerm:
  """coef * tau * z * D(p, q) per token, aggregated like the policy loss (eq. 26, 35, 41, 57).

  Hashable (a jit static argument of the update); the weight z * tau * coef
  and the teacher's log-probs arrive in ``batch.extra_BR``.
  """

  model_cfg: model_lib.ModelConfig
  divergence: str
  beta: float
  temperature: float
  aggregation: str

  def __call__(self, ctx) -> obj_lib.WeightedSum:
    w_DV = model_lib.lm_head(ctx.params, self.model_cfg)
    logp_BRV = full_logprobs(ctx.hidden_BRD, w_DV, temperature=self.temperature)
    logq_BRV = ctx.batch.extra_BR["teacher_logq_BRV"]
    div_BR = distill.token_divergence(logp_BRV, logq_BRV, kind=self.divergence, beta=self.beta)
    return distill.distill_loss(div_BR, ctx.batch.mask_BR, aggregation=self.aggregation, norms=ctx.norms,
                                weight_BT=ctx.batch.extra_BR["teacher_weight_BR"])


# ---- the trainer's hooks ---------------------------------------------------------

def attach(tr, state):
  """After the warm start, before the update compiles: build the teacher on ``tr``.

  Sets ``tr.teacher_stage`` (None when no teacher) and appends the loss term;
  a self-teacher's hint warm start may replace the student's params.
  """
  cfg = getattr(tr.cfg, "teacher", None)
  tr.teacher_stage = None
  if cfg is None or not cfg.enabled:
    return state
  from jaxrl_llm.training.sft import run_sft

  c = tr.cfg

  def sft_fn(params, examples, steps):
    longest = 1 + max(len(tr.tokenizer.encode(prompt_text(tr.tokenizer, e.prompt, c.data.chat_template)))
                      for e in examples)  # + BOS; hinted prompts are longer than data.max_prompt_len
    width = max(c.data.max_prompt_len, -(-longest // 8) * 8)
    params, info = run_sft(params, tr.model_cfg, examples, tr.tokenizer, steps=steps, batch_size=c.sft.batch_size,
                           lr=c.sft.lr, warmup_steps=min(c.sft.warmup_steps, steps),
                           max_prompt_len=width, max_response_len=c.rollout.max_response_len,
                           seed=c.seed + 1, impl=c.kernels.impl, mesh=tr.mesh, chat_template=c.data.chat_template,
                           log=tr.log)
    return params

  params, t_params, t_cfg, info = build_teacher(cfg, state.params, tr.model_cfg, sft_fn=sft_fn,
                                                train_examples=tr.train_examples)
  tr.log(f"teacher: {info.get('teacher_source')}, signal {cfg.signal}")
  tr.teacher_stage = TeacherStage(cfg, t_params, t_cfg, tr.model_cfg, tr.tokenizer,
                                  temperature=c.rollout.temperature, max_prompt_len=c.data.max_prompt_len,
                                  chat_template=c.data.chat_template, chunk=c.micro_batch_size)
  tr.extra_terms = tuple(tr.extra_terms) + tr.teacher_stage.extra_terms(c.objective.aggregation)
  return state.replace(params=params)


def rewrite_batch(tr, state, samples, scores, adv_BR, mask_BR):
  """In the step, after the advantages: -> (adv_BR, extra_BR, metrics) with the teacher's signal."""
  stage = getattr(tr, "teacher_stage", None)
  if stage is None:
    return adv_BR, {}, {}
  sig = stage.signals(samples, state.params, int(state.step))
  return stage.apply(sig, adv_BR, mask_BR, scores.correct_B)
