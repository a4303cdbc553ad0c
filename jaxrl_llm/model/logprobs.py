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
from flax import struct

from jaxrl_llm import model as model_lib


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


def response_hidden(params, model_cfg, prompt_BP, prompt_mask_BP, response_BR, response_mask_BR):
  """hidden_BRD: the final hidden state that predicts response token t."""
  P, R = prompt_BP.shape[1], response_BR.shape[1]
  tokens_BT = jnp.concatenate([prompt_BP, response_BR], axis=1)
  mask_BT = jnp.concatenate([prompt_mask_BP, response_mask_BR], axis=1)
  hidden_BTD, _ = model_lib.forward(params, model_cfg, tokens_BT, positions_from_mask(mask_BT), mask_BT)
  return hidden_BTD[:, P - 1:P - 1 + R]


def full_logprobs(hidden_BRD, w_DV, *, temperature: float):
  """log pi(v | prefix) over the whole vocabulary, [B, R, V] f32. Materialises
  B x R x V: the `naive` reference (`jaxrl_llm.kernels` streams instead)."""
  logits_BRV = jnp.einsum("BRD,DV->BRV", hidden_BRD, w_DV.astype(hidden_BRD.dtype),
                          preferred_element_type=jnp.float32) / temperature
  return jax.nn.log_softmax(logits_BRV, axis=-1)


def response_logprobs(params, model_cfg, prompt_BP, prompt_mask_BP, response_BR, response_mask_BR,
                      *, temperature: float, impl: str) -> ResponseLogprobs:
  hidden_BRD = response_hidden(params, model_cfg, prompt_BP, prompt_mask_BP, response_BR, response_mask_BR)
  B, R, D = hidden_BRD.shape
  logp_N, entropy_N = head_logprobs(hidden_BRD.reshape(B * R, D), model_lib.lm_head(params, model_cfg),
                                    response_BR.reshape(B * R), temperature=temperature, impl=impl)
  return ResponseLogprobs(logp_BR=logp_N.reshape(B, R), entropy_BR=entropy_N.reshape(B, R),
                       hidden_BRD=hidden_BRD)
