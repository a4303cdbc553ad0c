"""Per-token log-probs of a response under a policy (the trainer's side of
pi_theta, pi_prox and pi_ref).

The prompt and response are run as one sequence [prompt_BP | response_BR];
the hidden state at slot P - 1 + t predicts response token t. The product
with the output head and the log-softmax go through `jaxrl_llm.kernels`'
`token_logprobs` (chosen by `kernels.impl`; `naive` is a plain log_softmax
over the full vocabulary).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl_llm import model as model_lib
from jaxrl_llm.model.packing import gather_inputs


@struct.dataclass
class ResponseLogprobs:
  logp_BR: jax.Array  # f32 [B, R], log pi(y_t | prefix) at the sampling temperature
  entropy_BR: jax.Array  # f32 [B, R], entropy of pi(. | prefix)
  hidden_BRD: jax.Array  # [B, R, D], the final hidden state that predicts token t (value head input)


def positions_from_mask(mask_BT: jax.Array) -> jax.Array:
  """RoPE positions for left-padded rows: 0 at the first real token."""
  return jnp.maximum(jnp.cumsum(mask_BT.astype(jnp.int32), axis=1) - 1, 0)


def _naive(hidden_ND, w_DV, targets_N, temperature):
  logits_NV = jnp.einsum("ND,DV->NV", hidden_ND, w_DV.astype(hidden_ND.dtype),
                         preferred_element_type=jnp.float32) / temperature
  logq_NV = jax.nn.log_softmax(logits_NV, axis=-1)
  logp_N = jnp.take_along_axis(logq_NV, targets_N[:, None], axis=-1)[:, 0]
  entropy_N = -jnp.sum(jnp.exp(logq_NV) * logq_NV, axis=-1)
  return logp_N, entropy_N


def vocab_sharding():
  """How the mesh in context (`jax.sharding.use_abstract_mesh` or `jax.set_mesh`;
  the trainer sets it around its steps) splits the output head and the rows: the head's columns over the
  mesh axis of the logical "vocab" axis, the rows (tokens) over the batch axes. None without a mesh.
  `kernels.VocabOps` runs the plain op where the vocabulary axis has size 1, except the Pallas kernels
  on more than one device, which it runs per row shard (XLA cannot partition a kernel)."""
  from jaxrl_llm.kernels import VocabSharding
  from jaxrl_llm.model.sharding import BATCH_AXES, LOGICAL_RULES

  mesh = jax.sharding.get_abstract_mesh()
  axis = LOGICAL_RULES["vocab"]
  if mesh.empty or axis not in mesh.axis_names:
    return None
  embed = LOGICAL_RULES["embed"]  # the policy head's D rows (fsdp): gathered inside the ops' shard_map
  return VocabSharding(mesh, vocab_axis=axis, row_axes=tuple(a for a in BATCH_AXES if a in mesh.axis_names),
                       embed_axis=embed if embed in mesh.axis_names else None)


def vocab_ops(impl: str):
  """The `jaxrl_llm.kernels` ops for `kernels.impl` (a `kernels.VocabOps`) on the mesh in context
  (`vocab_sharding`): split over the vocabulary when the mesh shards it.

  The Pallas kernels compile for GPU (Triton) and TPU (Mosaic), the platform of the mesh's devices
  (`kernels.target`: a compile for a TPU topology from a CPU machine gets the Mosaic kernels); on a CPU
  target `impl="pallas"` runs the Triton ones in interpret mode (slow: for tests of the kernels inside
  the trainer).
  """
  from jaxrl_llm.kernels import VocabOps
  from jaxrl_llm.kernels.target import target_platform

  return VocabOps(impl=impl, interpret=impl == "pallas" and target_platform() not in ("gpu", "tpu"),
                  sharding=vocab_sharding())


def head_logprobs(hidden_ND, w_DV, targets_N, *, temperature: float, impl: str):
  """(logp_N, entropy_N) of `targets_N` under softmax(hidden @ w / temperature)."""
  if impl == "naive":
    return _naive(hidden_ND, w_DV, targets_N, temperature)
  out = vocab_ops(impl).token_logprobs(hidden_ND, w_DV, targets_N, temperature=temperature)
  return out.logp, out.entropy


def forward_flops(cfg, n_seqs: int, length: int) -> float:
  """The decoder's forward FLOPs over n_seqs sequences of `length` slots (the dense attention
  computes every (query, key) pair, masked or not; embedding and output head left out): per layer
  2 x (D (N + 2K) H + N H D + 3 D F) per slot for the projections and the MLP, 4 N H per pair."""
  per_slot = 2 * (cfg.d_model * (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim
                  + cfg.n_heads * cfg.head_dim * cfg.d_model + 3 * cfg.d_model * cfg.d_ff)
  per_pair = 4 * cfg.n_heads * cfg.head_dim
  return cfg.n_layers * n_seqs * (length * per_slot + length * length * per_pair)


def shared_prompt_pays(cfg, P: int, R: int, G: int, rows: int | None = None) -> bool:
  """Whether one sequence per group (P + G R slots) costs fewer forward FLOPs than G rows of P + R
  (`forward_flops`): it saves (G - 1) P slots of projections and MLP and pays for a longer attention
  (G responses in one sequence), so long prompts before short responses win. With `rows` (the
  batch) on a mesh in context, the rows / G sequences must also split evenly over its batch axes
  (else some devices would idle or the compiler would replicate them)."""
  if rows is not None:
    from jaxrl_llm.model.sharding import BATCH_AXES  # pylint: disable=import-outside-toplevel
    mesh = jax.sharding.get_abstract_mesh()
    shards = 1 if mesh.empty else int(np.prod([mesh.shape[a] for a in BATCH_AXES if a in mesh.axis_names]))
    if (rows // G) % shards:
      return False
  return forward_flops(cfg, 1, P + G * R) < forward_flops(cfg, G, P + R)


def response_hidden(params, model_cfg, prompt_BP, prompt_mask_BP, response_BR, response_mask_BR,
                    *, prompt_group: int = 1, always_share: bool = False, packing=None):
  """hidden_BRD: the final hidden state that predicts response token t.

  packing (a model/packing.Packing of these rows, planned on the host): the rows' real tokens run
  packed in its buffers, and the hidden states are gathered back to [B, R]; it lays out shared
  prompts itself (planned with group = G), so prompt_group and always_share are then unused.
  Tokens past a row's last attended one get another slot's state (they weigh zero in every loss).

  prompt_group = G > 1: the rows come in groups of G consecutive rows that share one prompt (a
  GRPO group; the caller guarantees it, training/step.py checks it), and each group may run as one
  sequence, its prompt once and its G responses after it (`shared_prompt_rows`): the same function
  of the params (each response attends to the prompt and to itself, at the positions of its own
  row), with the prompt's activations computed once and its gradient the sum over the group. It
  does where that costs fewer FLOPs for these shapes and the groups split evenly over the mesh
  (`shared_prompt_pays`, decided when tracing), or always with `always_share`.
  """
  P, R = prompt_BP.shape[1], response_BR.shape[1]
  if packing is not None:
    tokens_nS, mask_nS = gather_inputs(packing, prompt_BP, prompt_mask_BP, response_BR, response_mask_BR)
    hidden_nSD, _ = model_lib.forward(params, model_cfg, tokens_nS, packing.positions_nS, mask_nS,
                                      segments_BT=packing.segments_nS, documents_only=packing.group == 1)
    return jnp.take(hidden_nSD.reshape(-1, hidden_nSD.shape[-1]), packing.dst_BR, axis=0)
  if prompt_group > 1 and (always_share or shared_prompt_pays(model_cfg, P, R, prompt_group, prompt_BP.shape[0])):
    G = prompt_group
    B = prompt_BP.shape[0]
    if B % G:
      raise ValueError(f"response_hidden: {B} rows are not whole groups of prompt_group={G}")
    tokens_nT, mask_nT, positions_nT, segments_nT, slots_GR = shared_prompt_rows(
        prompt_BP, prompt_mask_BP, response_BR, response_mask_BR, G)
    hidden_nTD, _ = model_lib.forward(params, model_cfg, tokens_nT, positions_nT, mask_nT,
                                      segments_BT=segments_nT)
    return hidden_nTD[:, slots_GR].reshape(B, R, hidden_nTD.shape[-1])
  tokens_BT = jnp.concatenate([prompt_BP, response_BR], axis=1)
  mask_BT = jnp.concatenate([prompt_mask_BP, response_mask_BR], axis=1)
  hidden_BTD, _ = model_lib.forward(params, model_cfg, tokens_BT, positions_from_mask(mask_BT), mask_BT)
  return hidden_BTD[:, P - 1:P - 1 + R]


def shared_prompt_rows(prompt_BP, prompt_mask_BP, response_BR, response_mask_BR, G: int):
  """The n = B / G groups of G rows sharing a prompt, each as one sequence of T = P + G R slots:
  [prompt | response 1 | ... | response G]. -> (tokens_nT, mask_nT, positions_nT, segments_nT,
  slots_GR): the prompt is segment 0 and response g segment g + 1 (so response g sees the prompt
  and its own earlier tokens, model.forward's segments_BT); a response token's position is the one
  it has in its own row [prompt | response g] (positions_from_mask); slots_GR[g, t] is the slot
  whose hidden state predicts response g's token t (the prompt's last slot for t = 0). The group's
  prompt is its first row's."""
  B, P = prompt_BP.shape
  R = response_BR.shape[1]
  n = B // G
  prompt_nP, pmask_nP = prompt_BP[::G], prompt_mask_BP[::G]
  rmask_nGR = response_mask_BR.reshape(n, G, R)
  tokens_nT = jnp.concatenate([prompt_nP, response_BR.reshape(n, G * R)], axis=1)
  mask_nT = jnp.concatenate([pmask_nP, rmask_nGR.reshape(n, G * R)], axis=1)
  n_prompt_n = jnp.sum(pmask_nP.astype(jnp.int32), axis=1)
  resp_pos_nGR = n_prompt_n[:, None, None] + jnp.cumsum(rmask_nGR.astype(jnp.int32), axis=2) - 1
  positions_nT = jnp.maximum(jnp.concatenate([jnp.cumsum(pmask_nP.astype(jnp.int32), axis=1) - 1,
                                              resp_pos_nGR.reshape(n, G * R)], axis=1), 0)
  segments_T = np.concatenate([np.zeros(P, np.int32), np.repeat(np.arange(1, G + 1, dtype=np.int32), R)])
  segments_nT = jnp.broadcast_to(jnp.asarray(segments_T), (n, P + G * R))
  t_R = np.arange(R)
  slots_GR = np.where(t_R[None, :] == 0, P - 1, P + np.arange(G)[:, None] * R + t_R[None, :] - 1)
  return tokens_nT, mask_nT, positions_nT, segments_nT, slots_GR


def full_logprobs(hidden_BRD, w_DV, *, temperature: float):
  """log pi(v | prefix) over the whole vocabulary, [B, R, V] f32. Materialises
  B x R x V: the `naive` reference (`jaxrl_llm.kernels` streams instead)."""
  logits_BRV = jnp.einsum("BRD,DV->BRV", hidden_BRD, w_DV.astype(hidden_BRD.dtype),
                          preferred_element_type=jnp.float32) / temperature
  return jax.nn.log_softmax(logits_BRV, axis=-1)


def response_logprobs(params, model_cfg, prompt_BP, prompt_mask_BP, response_BR, response_mask_BR,
                      *, temperature: float, impl: str, prompt_group: int = 1,
                      always_share: bool = False, packing=None) -> ResponseLogprobs:
  """log pi(y_t | prefix), its entropy and hidden state per response token (prompt_group,
  always_share, packing: see response_hidden)."""
  hidden_BRD = response_hidden(params, model_cfg, prompt_BP, prompt_mask_BP, response_BR, response_mask_BR,
                               prompt_group=prompt_group, always_share=always_share, packing=packing)
  B, R, D = hidden_BRD.shape
  logp_N, entropy_N = head_logprobs(hidden_BRD.reshape(B * R, D), model_lib.lm_head(params, model_cfg),
                                    response_BR.reshape(B * R), temperature=temperature, impl=impl)
  return ResponseLogprobs(logp_BR=logp_N.reshape(B, R), entropy_BR=entropy_N.reshape(B, R),
                       hidden_BRD=hidden_BRD)


def sequence_logprobs(params, model_cfg, tokens_BT, mask_BT, score_BT, *, impl: str) -> jax.Array:
  """f32 [B]: sum over the tokens t marked in `score_BT` of log pi(token_t | tokens_<t) at temperature 1,
  for right-padded whole sequences (prompt and response in one row, `mask_BT` the real tokens): DPO's
  log pi(y|x) with `score_BT` the response's tokens. The row's first token has no prefix and is never
  scored (score_BT[:, 0] is ignored)."""
  lp = response_logprobs(params, model_cfg, tokens_BT[:, :1], mask_BT[:, :1], tokens_BT[:, 1:], mask_BT[:, 1:],
                         temperature=1.0, impl=impl)
  score_BR = score_BT[:, 1:].astype(bool) & mask_BT[:, 1:].astype(bool)
  return jnp.sum(jnp.where(score_BR, lp.logp_BR, 0.0), axis=1)
