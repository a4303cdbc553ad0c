"""The teacher's loss term in the update: coef * z * tau * D(p, q) per token (docs/objectives.md eq. 11.15).

p = softmax(h @ w / T) is the student at the sampling temperature T, q =
sg[softmax(h_q @ w_q / T)] the teacher on its own context (eq. 11.1). The
update gets the teacher as its final hidden states ``teacher_hidden_BRD``
(``batch.extra_BR``, [B, R, E]) and its output head (``ctx.aux``, [E, V],
see ``head_key``), never as [B, R, V] log-probs. Per divergence and
``kernels.impl``:

* reverse KL(p || q) (eq. 11.4) and forward KL(q || p) (eq. 11.3) are
  ``kernels.vocab_cross``'s ``kl_pq`` and ``kl_qp``: streamed over the
  vocabulary, gradient to the student only;
* JSD_beta needs the mixture M = beta q + (1 - beta) p inside the vocabulary
  sum, which the kernels do not form: it keeps the full-vocabulary path,
  ``distill.generalized_jsd`` on [B, R, V] log-probs built in the update
  (beta = 0 and 1 are forward and reverse KL, so they stream);
* ``impl = "naive"`` is the reference: every divergence on full [B, R, V]
  log-probs with ``distill.token_divergence``.

With ``teacher.topk = K`` the teacher arrives as its top-k ids and log-probs
(``teacher_topk_ids_BRK`` / ``teacher_topk_logp_BRK``); the student's log-probs
at those ids come from ``kernels.gather_logprobs`` and both are projected on
the top-k support (``distill_topk``, tail ``teacher.topk_tail``), where the
divergence is ``distill.token_divergence`` itself.

With several teachers (``teacher.route_by_tag``) ``teacher_index_BR`` says
whose hidden states each row holds; teacher n's head is ``aux[head_key(n)]``
(a top-k row needs no head: it holds its own teacher's ids and log-probs).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jaxrl_llm import model as model_lib
from jaxrl_llm import objectives as obj_lib
from jaxrl_llm.objectives import distill
from jaxrl_llm.objectives.distill_topk import topk_support, topk_support_gathered
from jaxrl_llm.model.logprobs import full_logprobs, vocab_ops

# extra_BR keys of the loss forms.
WEIGHT = "teacher_weight_BR"  # f32 [B, R] coef * z * tau (* sign gate); 0 turns the teacher off
HIDDEN = "teacher_hidden_BRD"  # f32 [B, R, E] the teacher's final hidden states (topk = 0)
INDEX = "teacher_index_BR"  # f32 [B, R] which teacher scored the row (several teachers, topk = 0)
TOPK_IDS = "teacher_topk_ids_BRK"  # int32 [B, R, K] the teacher's top-k ids (topk > 0)
TOPK_LOGP = "teacher_topk_logp_BRK"  # f32 [B, R, K] its log-probs there, normalised over V


def head_key(n: int) -> str:
  """The update's aux key of teacher n's output head [E, V]."""
  return "teacher_head_DV" if n == 0 else f"teacher{n}_head_DV"


def _kernel_kind(divergence: str, beta: float) -> str | None:
  """The vocab_cross term equal to the divergence, or None (needs the full vocabulary)."""
  if divergence == "reverse_kl" or (divergence == "jsd" and beta == 1.0):
    return "kl_pq"
  if divergence == "forward_kl" or (divergence == "jsd" and beta == 0.0):
    return "kl_qp"
  return None


@dataclasses.dataclass(frozen=True)
class DistillTerm:
  """An extra loss term of the update (hashable: a jit static argument).

  Aggregated like the policy loss with the mini-batch's norms
  (``distill.distill_loss``); a token whose weight is 0 keeps counting in the
  normaliser.
  """

  model_cfg: model_lib.ModelConfig
  divergence: str
  beta: float
  temperature: float
  aggregation: str
  impl: str = "auto"  # kernels.impl
  topk: int = 0  # teacher.topk; 0: the full vocabulary
  topk_tail: str = "renormalize"  # teacher.topk_tail
  n_teachers: int = 1

  def __call__(self, ctx) -> obj_lib.WeightedSum:
    extra, mask_BR = ctx.batch.extra_BR, ctx.batch.mask_BR
    weight_BR = extra[WEIGHT]
    # Tokens off the loss or off the teacher get benign inputs and zero gradient.
    active_BR = mask_BR & (weight_BR > 0)
    w_DV = model_lib.lm_head(ctx.params, self.model_cfg)
    if self.topk:  # each row already holds its own teacher's top-k
      div_BR = jnp.where(active_BR, self.topk_divergence(ctx.hidden_BRD, w_DV, extra[TOPK_IDS],
                                                          extra[TOPK_LOGP], active_BR), 0.0)
    else:
      div_BR = jnp.zeros(mask_BR.shape, jnp.float32)
      for n in range(self.n_teachers):
        on_BR = active_BR if self.n_teachers == 1 else active_BR & (extra[INDEX] == n)
        d_BR = self.divergence_BR(ctx.hidden_BRD, w_DV, extra[HIDDEN], ctx.aux[head_key(n)], on_BR)
        div_BR = div_BR + jnp.where(on_BR, d_BR, 0.0)
    return distill.distill_loss(div_BR, mask_BR, aggregation=self.aggregation, norms=ctx.norms,
                                weight_BR=weight_BR)

  def divergence_BR(self, hidden_BRD, w_DV, teacher_hidden_BRE, teacher_head_EV, on_BR):
    """D(p, q) per token against the full teacher distribution; 0 where ``on_BR`` is False."""
    B, R, D = hidden_BRD.shape
    kind = _kernel_kind(self.divergence, self.beta)
    if self.impl == "naive" or kind is None:
      logp_BRV = full_logprobs(hidden_BRD, w_DV, temperature=self.temperature)
      logq_BRV = full_logprobs(teacher_hidden_BRE.astype(jnp.float32), teacher_head_EV,
                               temperature=self.temperature)
      return distill.token_divergence(logp_BRV, logq_BRV, kind=self.divergence, beta=self.beta)
    E = teacher_hidden_BRE.shape[-1]
    out = vocab_ops(self.impl).vocab_cross(
        hidden_BRD.reshape(B * R, D), w_DV, teacher_hidden_BRE.reshape(B * R, E), teacher_head_EV,
        temperature=self.temperature, temperature_q=self.temperature, mask_N=on_BR.reshape(B * R))
    return getattr(out, kind).reshape(B, R)

  def topk_divergence(self, hidden_BRD, w_DV, ids_BRK, teacher_logp_BRK, on_BR):
    """D on the teacher's top-k support (``distill_topk``); 0 where ``on_BR`` is False."""
    B, R, D = hidden_BRD.shape
    K, V = ids_BRK.shape[-1], w_DV.shape[-1]
    ids_BRK = ids_BRK.astype(jnp.int32)
    if self.impl == "naive":
      logp_BRV = full_logprobs(hidden_BRD, w_DV, temperature=self.temperature)
      s_BRJ, t_BRJ = topk_support(logp_BRV, ids_BRK, teacher_logp_BRK, tail=self.topk_tail)
    else:
      lp = vocab_ops(self.impl).gather_logprobs(
          hidden_BRD.reshape(B * R, D), w_DV, ids_BRK.reshape(B * R, K), temperature=self.temperature,
          mask_N=on_BR.reshape(B * R)).logp.reshape(B, R, K)
      # Off tokens: the teacher's own values (p = q there), so the projection stays finite.
      lp = jnp.where(on_BR[..., None], lp, teacher_logp_BRK)
      s_BRJ, t_BRJ = topk_support_gathered(lp, teacher_logp_BRK, vocab=V, tail=self.topk_tail)
    return distill.token_divergence(s_BRJ, t_BRJ, kind=self.divergence, beta=self.beta)
