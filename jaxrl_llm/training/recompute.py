"""Recompute stage: log pi_prox (the params as this batch's updates begin),
log pi_ref (the frozen warm-started model) and the value head's predictions,
without gradient, in chunks of the micro-batch size."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.training.batch import value_head
from jaxrl_llm.training.logprobs import response_logprobs


@functools.partial(jax.jit, static_argnames=("model_cfg", "temperature", "impl", "with_values"))
def _chunk(params, vparams, prompt_BP, prompt_mask_BP, tokens_BR, mask_BR, *, model_cfg, temperature, impl,
           with_values):
  lp = response_logprobs(params, model_cfg, prompt_BP, prompt_mask_BP, tokens_BR, mask_BR,
                         temperature=temperature, impl=impl)
  logp_BR = jnp.where(mask_BR, lp.logp_BR, 0.0)
  values_BR = value_head(vparams, lp.hidden_BRD) if with_values else jnp.zeros_like(logp_BR)
  return logp_BR, jnp.where(mask_BR, values_BR, 0.0)


def policy_logprobs(params, vparams, prompt_BP, prompt_mask_BP, tokens_BR, mask_BR, *, model_cfg,
                    temperature: float, impl: str, chunk: int, with_values: bool = False, sharding=None):
  """-> (logp_BR, values_BR) as host f32 arrays (values zero unless with_values)."""
  B = tokens_BR.shape[0]
  outs = []
  for s in range(0, B, chunk):
    args = (prompt_BP[s:s + chunk], prompt_mask_BP[s:s + chunk], tokens_BR[s:s + chunk], mask_BR[s:s + chunk])
    if sharding is not None:
      args = jax.device_put(args, sharding)
    outs.append(jax.device_get(_chunk(params, vparams, *args, model_cfg=model_cfg, temperature=temperature,
                                      impl=impl, with_values=with_values)))
  return (np.concatenate([o[0] for o in outs]).astype(np.float32),
          np.concatenate([o[1] for o in outs]).astype(np.float32))
