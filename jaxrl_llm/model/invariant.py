"""Batch-invariant per-token log-probs: each row's numbers a function of that row alone.

Why: on XLA:CPU the padded recompute (model/logprobs.response_logprobs over a chunk of rows) gives
a row's log-probs that change in the last bits with what else is in the chunk. Measured on the
default run's tiny model (D 128, 4 layers, V 20, P 8, R 6; tests/training/test_batch_invariance.py):
a row's log-probs move by up to 4.8e-7 between micro-batches of 1, 2, 4, 16 and 64 rows, packed
or padded, a shared prompt or not, one or four devices. The causes, each measured alone:
  - a [N, D] x [D, V] dot with small V (20, 32) rounds differently for N < 96 rows than for more
    (XLA:CPU's small-matrix path vs Eigen's blocked one);
  - a row reduction (the log-softmax's logsumexp over V) rounds differently with the number of
    rows (XLA:CPU's reduction loops vectorise over rows);
  - packing and shared prompts change the attention's key length (other documents' slots, or the
    group's other responses, masked out), so its reductions run over another length.
The formulation here: every row runs alone, as a [1, P + R] padded sequence, in one `lax.map`
whose body is the same program whatever the chunk's size, the row's position in it or the
number of devices (with the rows over the mesh's batch axes, the body takes one row per batch
shard, and each device runs the [1, P + R] program on its own row). Packing and shared prompts
are not used: the padded layout of one row is the reference layout. What it costs is measured in
docs/objectives.md ("Exact log-probs").

What this does not cover: an fsdp or tensor axis > 1 (a matmul's sum is then split over devices
and reduced by a collective whose order XLA chooses), and the update's own log pi_theta (the
update's micro-batches run the batched forward, training/update.py).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxrl_llm.model.heads import value_head
from jaxrl_llm.model.logprobs import response_logprobs


@functools.partial(jax.jit, static_argnames=("model_cfg", "temperature", "impl", "shards"))
def rowwise_logprobs(params, prompt_BP, prompt_mask_BP, tokens_BR, context_BR, mask_BR, *, model_cfg,
                     temperature: float, impl: str, shards: int = 1):
  """-> (logp_BR, hidden_BRD): log pi(y_t | prefix) at `temperature` on the tokens of mask_BR (0
  elsewhere), and the final hidden state that predicts token t, each row computed alone.

  The forward reads the tokens of context_BR (an episode's observations too; mask_BR for single-turn
  rows). `shards`: the batch shards (mesh data x fsdp) the rows are split over; B must be a
  multiple of it. Row b runs in map step b // shards, in slot b % shards of the body's
  [shards, P + R] batch, which the partitioner gives one row per device: the same program per row
  for every B, every row order and every number of shards."""
  B, R = tokens_BR.shape
  if B % shards:
    raise ValueError(f"rowwise_logprobs: {B} rows do not split over {shards} batch shards")

  def one(args):
    p_SP, pm_SP, t_SR, c_SR, m_SR = args  # S = shards rows: one per device
    lp = response_logprobs(params, model_cfg, p_SP, pm_SP, t_SR, c_SR, temperature=temperature, impl=impl)
    return jnp.where(m_SR, lp.logp_BR, 0.0), lp.hidden_BRD

  def steps(x):
    return x.reshape(B // shards, shards, *x.shape[1:])

  logp_nSR, hidden_nSRD = jax.lax.map(one, tuple(steps(x) for x in (prompt_BP, prompt_mask_BP, tokens_BR,
                                                                        context_BR, mask_BR)))
  return logp_nSR.reshape(B, R), hidden_nSRD.reshape(B, R, hidden_nSRD.shape[-1])


@functools.partial(jax.jit, static_argnames=("shards",))
def rowwise_values(vparams, hidden_BRD, mask_BR, *, shards: int = 1):
  """values_BR: the value head on each row's hidden states alone (0 off mask_BR), as rowwise_logprobs
  runs the trunk: its [D, F] matmul would otherwise round with the batch's row count."""
  B, R, D = hidden_BRD.shape

  def one(args):
    h_SRD, m_SR = args
    return jnp.where(m_SR, value_head(vparams, h_SRD), 0.0)

  values_nSR = jax.lax.map(one, (hidden_BRD.reshape(B // shards, shards, R, D),
                                 mask_BR.reshape(B // shards, shards, R)))
  return values_nSR.reshape(B, R)
