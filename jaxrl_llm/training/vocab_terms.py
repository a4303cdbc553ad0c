"""The policy's per-token sums over the vocabulary in the update.

With p = pi_theta(. | h_t) = softmax(hidden @ w_DV / T) at the sampling
temperature T, per response token:

    logp     = log p(y_t)
    entropy  = -sum_v p(v) log p(v)
    C        = sum_{v in top-k} sg(mu_v W_v - gamma f(1/gamma) p_v) log p(v)
               (Score Centering's top-k drift term, docs/objectives.md
               eq. 8.5; objectives/score_centering.py)
    KL       = KL(mu || p) = sum_v mu(v) (log mu(v) - log p(v))
               (TRM's token divergence, docs/objectives.md eq. 4.4; stop-gradient)

where mu(. | h_t) = softmax(h_mu @ w_mu / T) is the sampler's distribution:
its own final hidden states and output head (sampler params and dtype),
recomputed at the same temperature.

With `kernels.impl != "naive"` every term streams over vocabulary chunks
(`jaxrl_llm.kernels`) and no B x R x V array is held:

- logp, entropy and, for C, log p at mu's K recorded ids come from ONE
  `gather_logprobs` pass over the ids [y | top-k]; `centering_topk` then
  forms C from the K log-probs. (`kernels.vocab_cross_topk(tail="rescale")`
  has the same gradient for W_v = 1 only; this way TIS / MIS + SC's W_v
  apply too.)
- KL is `vocab_cross(hidden, w, h_mu, w_mu).kl_qp` (q = mu), called on
  stop-gradient inputs so no backward pass is traced for it.

`impl = "naive"` is the reference: full [B, R, V] log-probs of both policies,
`gather_topk` and `full_token_kl`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxrl_llm import objectives as obj_lib
from jaxrl_llm.model.logprobs import full_logprobs, head_logprobs, vocab_ops

_sg = jax.lax.stop_gradient


@struct.dataclass
class VocabTerms:
  logp_BR: jax.Array  # f32 [B, R] log pi_theta(y_t) (differentiable)
  entropy_BR: jax.Array  # f32 [B, R] entropy of pi_theta (differentiable)
  centering_BR: jax.Array | None  # f32 [B, R] Score Centering's C (differentiable); None unless needed
  kl_BR: jax.Array | None  # f32 [B, R] KL(mu || pi_theta), stop-gradient, 0 off mask_BR; None unless needed


def _check(obj, topk_ids_BRK, topk_logp_BRK, behav_hidden_BRD, behav_head_DV):
  needs = {"topk_ids_BRK": (topk_ids_BRK, obj.needs_centering),
           "topk_logp_BRK": (topk_logp_BRK, obj.needs_centering),
           "behav_hidden_BRD": (behav_hidden_BRD, obj.needs_token_kl),
           "behav_head_DV": (behav_head_DV, obj.needs_token_kl)}
  for name, (arr, needed) in needs.items():
    if needed and arr is None:
      raise ValueError(f"vocab_terms: {name} is None but ObjectiveConfig(name={obj.name!r}) needs it")


def vocab_terms(hidden_BRD, w_DV, tokens_BR, mask_BR, obj: obj_lib.ObjectiveConfig, *, temperature: float,
                impl: str, topk_ids_BRK=None, topk_logp_BRK=None, behav_hidden_BRD=None,
                behav_head_DV=None) -> VocabTerms:
  """The terms above for one micro-batch.

  hidden_BRD, w_DV: the policy's final hidden states and output head;
  tokens_BR: the sampled tokens; mask_BR: tokens in the loss. Score Centering
  (`obj.needs_centering`) needs mu's top-k `topk_ids_BRK` / `topk_logp_BRK`;
  TRM (`obj.needs_token_kl`) needs the sampler's `behav_hidden_BRD` [B, R, E]
  and output head `behav_head_DV` [E, V]. impl: `kernels.impl`.
  """
  _check(obj, topk_ids_BRK, topk_logp_BRK, behav_hidden_BRD, behav_head_DV)
  B, R, D = hidden_BRD.shape
  h_ND, y_N = hidden_BRD.reshape(B * R, D), tokens_BR.reshape(B * R)
  if impl == "naive":
    return _naive(hidden_BRD, w_DV, tokens_BR, mask_BR, obj, temperature, topk_ids_BRK, topk_logp_BRK,
                  behav_hidden_BRD, behav_head_DV)
  ops = vocab_ops(impl)
  centering_BR, kl_BR = None, None
  if obj.needs_centering:
    K = topk_ids_BRK.shape[-1]
    ids_NJ = jnp.concatenate([y_N[:, None], topk_ids_BRK.reshape(B * R, K)], axis=1)  # J = 1 + K: [y | top-k]
    out = ops.gather_logprobs(h_ND, w_DV, ids_NJ, temperature=temperature)
    logp_N, entropy_N = out.logp[:, 0], out.entropy
    centering_BR = obj_lib.centering_topk(out.logp[:, 1:].reshape(B, R, K), topk_logp_BRK, obj)
  else:
    logp_N, entropy_N = head_logprobs(h_ND, w_DV, y_N, temperature=temperature, impl=impl)
  if obj.needs_token_kl:
    E = behav_hidden_BRD.shape[-1]
    cross = ops.vocab_cross(_sg(h_ND), _sg(w_DV), behav_hidden_BRD.reshape(B * R, E), behav_head_DV,
                            temperature=temperature, temperature_q=temperature, mask_N=mask_BR.reshape(B * R))
    kl_BR = cross.kl_qp.reshape(B, R)
  return VocabTerms(logp_BR=logp_N.reshape(B, R), entropy_BR=entropy_N.reshape(B, R),
                    centering_BR=centering_BR, kl_BR=kl_BR)


def _naive(hidden_BRD, w_DV, tokens_BR, mask_BR, obj, temperature, topk_ids_BRK, topk_logp_BRK,
           behav_hidden_BRD, behav_head_DV) -> VocabTerms:
  B, R, D = hidden_BRD.shape
  logp_N, entropy_N = head_logprobs(hidden_BRD.reshape(B * R, D), w_DV, tokens_BR.reshape(B * R),
                                    temperature=temperature, impl="naive")
  centering_BR, kl_BR = None, None
  if obj.needs_centering or obj.needs_token_kl:
    logq_BRV = full_logprobs(hidden_BRD, w_DV, temperature=temperature)
  if obj.needs_centering:
    centering_BR = obj_lib.centering_topk(obj_lib.gather_topk(logq_BRV, topk_ids_BRK), topk_logp_BRK, obj)
  if obj.needs_token_kl:
    behav_BRV = full_logprobs(behav_hidden_BRD, behav_head_DV, temperature=temperature)
    kl_BR = jnp.where(mask_BR, _sg(obj_lib.full_token_kl(behav_BRV, logq_BRV)), 0.0)
  return VocabTerms(logp_BR=logp_N.reshape(B, R), entropy_BR=entropy_N.reshape(B, R),
                    centering_BR=centering_BR, kl_BR=kl_BR)
