"""The teacher's view of a batch and how it rewrites the update's inputs.

``TeacherStage.signals`` runs the teacher (on its own context, eq. 11.1) and the
student over the rollouts and keeps per token, on the host, only [B, R]
signals from the kernels (``kernels.impl``): log q(y_t), log p(y_t), the gap
Delta_t (eq. 11.7), H(q_t) (eq. 11.16) and KL(p_t || q_t); plus, for the loss
forms, the teacher's final hidden states [B, R, E] (or its top-k ids and
log-probs [B, R, K]), from which the update rebuilds q (loss.py). No
[B, R, V] array leaves the device.

``TeacherStage.apply`` turns the signals into advantages and the loss term's
weights: the route z (SRPO, eq. 11.10; a task tag without a teacher: m_i = 0),
the confidence tau (eq. 11.17) and the sign gate (SG-OPD, eq. 11.18). Equation
numbers are docs/objectives.md's (section 11).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import model as model_lib
from jaxrl_llm.model import sharding as sharding_lib
from jaxrl_llm.objectives import teacher as teacher_w, teacher_routing
from jaxrl_llm.objectives.teacher_inputs import build_teacher_inputs, gather_predictions
from jaxrl_llm.objectives.teacher_schedule import TeacherSchedule, teacher_params_for_step
from jaxrl_llm.tasks.base import Example
from jaxrl_llm.teacher import loss as teacher_loss
from jaxrl_llm.tasks.pipeline import encode_prompts, prompt_text
from jaxrl_llm.model.logprobs import response_hidden, vocab_ops
from jaxrl_llm.teacher.config import TeacherConfig


def hint_examples(examples, template: str) -> list[Example]:
  """The privileged context: the reference answer as a hint before the prompt, correct demo."""
  return [Example(prompt=template.format(answer=e.answer, prompt=e.prompt), answer=e.answer, demo=e.answer,
                  tag=e.tag) for e in examples]


@dataclasses.dataclass(frozen=True)
class ScoreSpec:
  """What stays fixed across one teacher's chunks (a static argument of the jitted pass)."""

  teacher_cfg: model_lib.ModelConfig
  student_cfg: model_lib.ModelConfig
  temperature: float  # both distributions at the sampling temperature
  impl: str  # kernels.impl
  topk: int  # the teacher's top-k ids and log-probs kept per token; 0: none
  keep_hidden: bool  # hand the teacher's final hidden states to the loss forms


@functools.partial(jax.jit, static_argnames=("spec",))
def score_chunk(teacher_params, student_params, ctx_BC, ctx_mask_BC, prompt_BP, prompt_mask_BP, tokens_BR,
                 mask_BR, *, spec: ScoreSpec):
  """{name: [B, R(, ...)]}: the teacher's and the student's per-token terms, streamed over V; the teacher
  reads its context `ctx_BC` + the response, the student its prompt + the response."""
  teacher_cfg, student_cfg, temperature, impl = spec.teacher_cfg, spec.student_cfg, spec.temperature, spec.impl
  topk, keep_hidden = spec.topk, spec.keep_hidden
  inp = build_teacher_inputs(ctx_BC, ctx_mask_BC, tokens_BR, mask_BR)
  hidden_BSE, _ = model_lib.forward(teacher_params, teacher_cfg, inp.tokens_BS, inp.positions_BS, inp.mask_BS)
  t_hidden_BRE = gather_predictions(hidden_BSE, inp.predict_index_BR)
  s_hidden_BRD = response_hidden(student_params, student_cfg, prompt_BP, prompt_mask_BP, tokens_BR, mask_BR)
  B, R, E = t_hidden_BRE.shape
  D = s_hidden_BRD.shape[-1]
  t_NE, s_ND = t_hidden_BRE.reshape(B * R, E), s_hidden_BRD.reshape(B * R, D)
  w_q_EV, w_DV = model_lib.lm_head(teacher_params, teacher_cfg), model_lib.lm_head(student_params, student_cfg)
  y_N, mask_N = tokens_BR.reshape(B * R).astype(jnp.int32), mask_BR.reshape(B * R)
  ops, kw = vocab_ops(impl), dict(temperature=temperature, mask_N=mask_N)
  q = ops.token_logprobs(t_NE, w_q_EV, y_N, **kw)
  p = ops.token_logprobs(s_ND, w_DV, y_N, **kw)
  cross = ops.vocab_cross(s_ND, w_DV, t_NE, w_q_EV, temperature_q=temperature, **kw)
  out = {"teacher_logp": q.logp, "student_logp": p.logp, "teacher_entropy": q.entropy, "kl": cross.kl_pq}
  out = {k: v.reshape(B, R) for k, v in out.items()}
  if keep_hidden:
    out[teacher_loss.HIDDEN] = t_hidden_BRE.astype(jnp.float32)
  if topk:
    top = ops.vocab_topk(t_NE, w_q_EV, k=topk, **kw)
    out[teacher_loss.TOPK_IDS] = top.ids.reshape(B, R, topk)
    out[teacher_loss.TOPK_LOGP] = top.logp.reshape(B, R, topk)
  return out


@dataclasses.dataclass(frozen=True)
class TeacherSignals:
  """Host arrays for one batch; B samples, R response tokens (0 off the mask and off the teacher)."""

  teacher_logp_BR: np.ndarray  # f32 log q(y_t)
  student_logp_BR: np.ndarray  # f32 log p(y_t) (the params that start this step's updates)
  gap_BR: np.ndarray  # f32 Delta = log q(y_t) - log p(y_t) (eq. 11.7)
  teacher_entropy_BR: np.ndarray  # f32 H(q_t) (eq. 11.16)
  kl_BR: np.ndarray  # f32 KL(p_t || q_t) over the vocabulary
  has_teacher_B: np.ndarray  # bool: usable teacher information (m_i of eq. 11.10)
  loss_inputs: dict = dataclasses.field(default_factory=dict)  # teacher_loss keys (loss forms only)


class TeacherStage:
  """Holds the teacher's weights; scores rollouts; rewrites advantages; supplies the loss term.

  One teacher: ``teacher_params`` / ``teacher_cfg``. Several (``route_by_tag``):
  tuples of both, and ``tag_teacher`` maps a task tag to its index.
  """

  def __init__(self, cfg: TeacherConfig, teacher_params, teacher_cfg, student_cfg, tokenizer, *,
               temperature: float, max_prompt_len: int, chat_template: bool = False, chunk: int = 256,
               impl: str = "auto", tag_teacher: dict | None = None):
    params = tuple(teacher_params) if isinstance(teacher_cfg, tuple) else (teacher_params,)
    cfgs = teacher_cfg if isinstance(teacher_cfg, tuple) else (teacher_cfg,)
    for n, tcfg in enumerate(cfgs):
      if tcfg.vocab_size != student_cfg.vocab_size:
        raise ValueError(f"teacher {n} vocab_size={tcfg.vocab_size} differs from the student's "
                         f"{student_cfg.vocab_size}: the teacher must use the student's tokenizer")
    if cfg.topk > student_cfg.vocab_size:
      raise ValueError(f"config.teacher.topk={cfg.topk} is invalid: allowed [0, {student_cfg.vocab_size}] "
                       "(at most the vocabulary)")
    self.cfg, self.teachers, self.teacher_cfgs, self.student_cfg = cfg, params, cfgs, student_cfg
    self.tag_teacher = dict(tag_teacher or {})
    self.tokenizer, self.temperature, self.impl = tokenizer, temperature, impl
    self.max_prompt_len, self.chat_template, self.chunk = max_prompt_len, chat_template, chunk
    self.schedule = TeacherSchedule(cfg.schedule, cfg.refresh_every, cfg.ema_decay)
    self.width = max(c.d_model for c in cfgs)  # E of teacher_hidden_BRD (narrower teachers zero-padded)
    self._moved_for_step = None
    self.diagnostics: dict = {}  # the last `apply`'s per-token signals, trust weights and gates (host arrays)

  # ---- the teacher's weights --------------------------------------------------------
  @property
  def params(self):
    """The (first) teacher's weights; a self-teacher's move with ``advance``."""
    return self.teachers[0]

  @params.setter
  def params(self, value):
    self.teachers = (value,) + self.teachers[1:]

  def advance(self, student_params, step: int) -> None:
    """phi_step from phi_{step-1} and theta_step (a self-teacher; once per step, whoever asks first)."""
    if self.cfg.source == "self" and self._moved_for_step != step:
      self.params = teacher_params_for_step(self.params, student_params, step, self.schedule)
    self._moved_for_step = step

  def restore_params(self, params) -> None:
    """A resumed run's teacher: phi of the last completed step (the next ``advance`` moves it)."""
    self.params = params
    self._moved_for_step = None

  def heads(self, state) -> dict:
    """The update's aux: each teacher's output head [E, V] (the extension's `aux`).

    Moves a self-teacher first, so the head is the one that scores this step
    whichever runs first. A copy: a ``current`` teacher's head is the
    policy's own buffer, which the update donates. Narrower teachers get
    zero rows up to E (same logits on the zero-padded hidden states).
    """
    self.advance(state.params, int(state.step))
    out = {}
    for n, (params, tcfg) in enumerate(zip(self.teachers, self.teacher_cfgs)):
      w_EV = jnp.array(model_lib.lm_head(params, tcfg), copy=True)
      out[teacher_loss.head_key(n)] = jnp.pad(w_EV, ((0, self.width - w_EV.shape[0]), (0, 0)))
    return out

  # ---- scoring ----------------------------------------------------------------------
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

  def route(self, tags) -> tuple[np.ndarray, np.ndarray]:
    """(teacher_index_B, has_teacher_B) from the samples' task tags (teacher_routing.teacher_for_tasks)."""
    B = len(tags)
    if not self.tag_teacher:
      return np.zeros(B, np.int32), np.ones(B, bool)
    known = list(self.tag_teacher)
    task_id_B = np.asarray([known.index(t) if t in self.tag_teacher else len(known) for t in tags], np.int32)
    table = [self.tag_teacher[t] for t in known] + [-1]  # the last id: a tag without a teacher
    idx_B, has_B = teacher_routing.teacher_for_tasks(jnp.asarray(task_id_B), table, len(self.teachers))
    return np.asarray(idx_B, np.int32), np.asarray(has_B, bool)

  def signals(self, samples, student_params, step: int) -> TeacherSignals:
    """The teacher's view of this batch; moves a self-teacher first (teacher-move timing)."""
    self.advance(student_params, step)
    ctx_BC, ctx_mask_BC = self._contexts(samples)
    B, R = samples.tokens_BR.shape
    idx_B, has_B = self.route(samples.tags)
    k, keep_hidden = self.cfg.topk, self.cfg.loss_form and not self.cfg.topk
    out = {n: np.zeros((B, R), np.float32) for n in ("teacher_logp", "student_logp", "teacher_entropy", "kl")}
    if keep_hidden:
      out[teacher_loss.HIDDEN] = np.zeros((B, R, self.width), np.float32)
    if k:  # benign values off the teacher: k distinct ids at probability 1/V each
      out[teacher_loss.TOPK_IDS] = np.broadcast_to(np.arange(k, dtype=np.int32), (B, R, k)).copy()
      out[teacher_loss.TOPK_LOGP] = np.full((B, R, k), -np.log(self.student_cfg.vocab_size), np.float32)
    args = (ctx_BC, ctx_mask_BC, samples.prompt_BP, samples.prompt_mask_BP, samples.tokens_BR, samples.mask_BR)
    chunk = min(self.chunk, B)
    for n, (params, tcfg) in enumerate(zip(self.teachers, self.teacher_cfgs)):
      rows = np.flatnonzero(has_B & (idx_B == n))
      for s in range(0, len(rows), chunk):
        r = rows[s:s + chunk]
        padded = np.concatenate([r, np.full(chunk - len(r), r[0])])  # one shape per teacher
        spec = ScoreSpec(teacher_cfg=tcfg, student_cfg=self.student_cfg, temperature=self.temperature,
                          impl=self.impl, topk=k, keep_hidden=bool(keep_hidden))
        res = sharding_lib.fetch(score_chunk(params, student_params, *(a[padded] for a in args), spec=spec))
        for name, v in res.items():
          v = np.asarray(v)[:len(r)]
          if name == teacher_loss.HIDDEN:
            out[name][r, :, :v.shape[-1]] = v
          elif name in (teacher_loss.TOPK_IDS, teacher_loss.TOPK_LOGP):
            keep = samples.mask_BR[r][..., None]  # masked tokens keep the benign values
            out[name][r] = np.where(keep, v, out[name][r])
          else:
            out[name][r] = v
    on = samples.mask_BR & has_B[:, None]
    zero = lambda a: np.where(on, a, 0.0).astype(np.float32)
    t_BR, s_BR = out.pop("teacher_logp"), out.pop("student_logp")
    ent_BR, kl_BR = zero(out.pop("teacher_entropy")), zero(out.pop("kl"))
    loss_inputs = out if self.cfg.loss_form else {}  # what is left: the teacher's hidden states or top-k
    if keep_hidden and len(self.teachers) > 1:  # whose head goes with each row's hidden states
      loss_inputs[teacher_loss.INDEX] = np.broadcast_to(idx_B[:, None], (B, R)).astype(np.float32)
    return TeacherSignals(
        teacher_logp_BR=zero(t_BR), student_logp_BR=zero(s_BR), gap_BR=zero(t_BR - s_BR),
        teacher_entropy_BR=ent_BR, kl_BR=kl_BR, has_teacher_B=has_B, loss_inputs=loss_inputs)

  # ---- rewriting the update's inputs --------------------------------------------------
  def weights(self, sig: TeacherSignals, adv_BR, correct_B):
    """-> (adv_BR, weight_BR, routed_B, tau_BR, gate_BR) as jnp arrays (before the mask).

    ``adv_BR`` is the reward advantage. ``weight_BR`` = coef * z * tau * gate
    multiplies D(p, q) in the loss forms; ``routed_B`` is z_sdpo (srpo) or
    m_i (distill, gap_advantage).
    """
    cfg = self.cfg
    m_B = jnp.asarray(sig.has_teacher_B).astype(jnp.float32)
    adv, gap = jnp.asarray(adv_BR), jnp.asarray(sig.gap_BR) * m_B[:, None]  # no teacher: no gap
    tau_BR = teacher_w.confidence_weight(jnp.asarray(sig.teacher_entropy_BR), beta=cfg.confidence_beta,
                                         tau_min=cfg.tau_min, tau_max=cfg.tau_max)
    gate_BR = teacher_w.sign_gate(gap, adv) if cfg.sign_gate else jnp.ones(adv.shape)
    trust_BR = tau_BR * gate_BR
    weight_BR = jnp.zeros(adv.shape)
    if cfg.signal == "distill":
      adv, weight_BR, routed = cfg.rl_coef * adv, cfg.coef * trust_BR * m_B[:, None], m_B
    elif cfg.signal == "gap_advantage":
      adv, routed = cfg.rl_coef * adv + cfg.coef * trust_BR * gap * m_B[:, None], m_B
    elif cfg.signal == "srpo":
      z_grpo, routed = teacher_routing.srpo_routes(jnp.asarray(correct_B) > 0.5, jnp.asarray(sig.has_teacher_B))
      adv = adv * z_grpo[:, None]  # routed-away tokens keep counting in the normaliser (eq. 11.11)
      weight_BR = cfg.coef * trust_BR * routed[:, None]
    else:  # rlsd; no teacher: Delta = 0, u = 1, the reward advantage unchanged
      adv, routed = teacher_w.rlsd_advantage(adv, gap, eps_w=cfg.eps_w, lam=cfg.lam), jnp.zeros(adv.shape[:1])
    return adv, weight_BR, routed, tau_BR, gate_BR

  def apply(self, sig: TeacherSignals, adv_BR: np.ndarray, mask_BR: np.ndarray, correct_B: np.ndarray):
    """-> (adv_BR, extra_BR, metrics): advantages for the policy loss, inputs of the loss term."""
    adv, weight_BR, routed, tau_BR, gate_BR = self.weights(sig, adv_BR, correct_B)
    mask = jnp.asarray(mask_BR)
    extra = {}
    if self.cfg.loss_form:
      extra = {teacher_loss.WEIGHT: np.asarray(jnp.where(mask, weight_BR, 0.0), np.float32), **sig.loss_inputs}
    metrics = self.metrics(sig, mask_BR, routed, tau_BR, gate_BR)
    f32 = lambda a: np.asarray(a, np.float32)  # noqa: E731
    # What the token-weight dump shows: [B, R] per token (0 off the mask), [B] per sample.
    self.diagnostics = {
        "teacher_logp": sig.teacher_logp_BR, "student_logp": sig.student_logp_BR, "gap": sig.gap_BR,
        "teacher_entropy": sig.teacher_entropy_BR, "kl_student_teacher": sig.kl_BR,
        "tau": f32(jnp.where(mask, tau_BR, 0.0)), "gate": f32(jnp.where(mask, gate_BR, 0.0)),
        "weight": f32(jnp.where(mask, weight_BR, 0.0)), "reward_adv": f32(np.where(mask_BR, adv_BR, 0.0)),
        "routed_B": f32(routed), "has_teacher_B": np.asarray(sig.has_teacher_B, bool)}
    return np.asarray(jnp.where(mask, adv, 0.0), np.float32), extra, metrics

  def metrics(self, sig: TeacherSignals, mask_BR, routed_B, tau_BR, gate_BR=None) -> dict:
    """Teacher diagnostics: gap statistics, routed fraction, teacher entropy, tau, gate, coverage."""
    m = np.asarray(mask_BR, bool)
    n = max(int(m.sum()), 1)
    gap = sig.gap_BR[m] if m.any() else np.zeros(1, np.float32)
    out = {
        "teacher/gap_mean": float(gap.sum() / n), "teacher/gap_std": float(gap.std()),
        "teacher/gap_min": float(gap.min()), "teacher/gap_max": float(gap.max()),
        "teacher/gap_pos_frac": float((gap > 0).sum() / n),
        "teacher/kl_student_teacher": float(sig.kl_BR[m].sum() / n),
        "teacher/entropy": float(sig.teacher_entropy_BR[m].sum() / n),
        "teacher/tau_mean": float(np.asarray(tau_BR)[m].sum() / n),
        "teacher/routed_frac": float(np.asarray(routed_B).mean()) if len(routed_B) else 0.0,
        "teacher/has_teacher_frac": float(np.asarray(sig.has_teacher_B).mean()) if len(routed_B) else 0.0,
    }
    if self.cfg.sign_gate and gate_BR is not None:
      out["teacher/gate_open_frac"] = float(np.asarray(gate_BR)[m].sum() / n)
    return out

  def extra_terms(self, aggregation: str) -> tuple:
    """UpdateSpec.extra_terms for the loss forms (empty for the advantage forms)."""
    if not self.cfg.loss_form:
      return ()
    return (("teacher", teacher_loss.DistillTerm(
        self.student_cfg, self.cfg.divergence, self.cfg.jsd_beta, self.temperature, aggregation, impl=self.impl,
        topk=self.cfg.topk, topk_tail=self.cfg.topk_tail, n_teachers=len(self.teachers))),)
