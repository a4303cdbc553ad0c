"""What the update-equality tests share (test_shared_prompt.py, test_packed_update.py): a scored
mini-batch with every input the presets read, and one SGD update whose parameter change is minus
the gradient. Not a test module."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxrl_llm import model as model_lib
from jaxrl_llm.model.heads import init_value_head
from jaxrl_llm.model.logprobs import response_hidden
from jaxrl_llm.training.batch import AUX_BEHAV_HEAD, TrainBatch
from jaxrl_llm.training.update import UpdateSpec, UpdateState, update_step


def scored_batch(cfg, obj, params, rows, *, K: int, seed: int, prox_noise: float, ref_noise: float | None):
  """(TrainBatch, aux) of `rows` = (prompt_BP, prompt_mask_BP, tokens_BR, mask_BR): mu is the params
  nudged by 0.01 N(0, 1) (its log-probs, top-K and hidden states), log pi_prox and log pi_ref are
  log mu plus `prox_noise` and `ref_noise` N(0, 1) (log pi_ref zeros for None), advantages and
  returns N(0, 1)."""
  prompt_BP, pmask_BP, tokens_BR, mask_BR = rows
  B, R = tokens_BR.shape
  sampler = jax.tree.map(lambda x: x + 0.01 * jax.random.normal(jax.random.key(7), x.shape, x.dtype), params)
  head = model_lib.lm_head(sampler, cfg)
  mu_hidden = response_hidden(sampler, cfg, prompt_BP, pmask_BP, tokens_BR, mask_BR)
  mu_logp_BRV = np.asarray(jax.nn.log_softmax(mu_hidden @ head, axis=-1))
  take = lambda lp, ids: np.take_along_axis(lp, ids, axis=-1).astype(np.float32)  # noqa: E731
  topk_BRK = np.argsort(-mu_logp_BRV, axis=-1)[..., :K].astype(np.int32)
  behav = take(mu_logp_BRV, tokens_BR[..., None])[..., 0]
  rng = np.random.default_rng(seed)
  noise = lambda: rng.standard_normal((B, R)).astype(np.float32)  # noqa: E731
  return TrainBatch(
      prompt_BP=prompt_BP, prompt_mask_BP=pmask_BP, tokens_BR=tokens_BR, mask_BR=mask_BR,
      behav_logp_BR=behav, prox_logp_BR=behav + prox_noise * noise(),
      ref_logp_BR=np.zeros((B, R), np.float32) if ref_noise is None else behav + ref_noise * noise(),
      adv_BR=noise(), returns_BR=noise(), old_values_BR=np.zeros((B, R), np.float32),
      topk_ids_BRK=topk_BRK if obj.needs_centering else np.zeros((B, R, 0), np.int32),
      topk_logp_BRK=take(mu_logp_BRV, topk_BRK) if obj.needs_centering else np.zeros((B, R, 0), np.float32),
      behav_hidden_BRD=np.asarray(mu_hidden) if obj.needs_token_kl else np.zeros((B, R, 0), np.float32),
      extra_BR={}), ({AUX_BEHAV_HEAD: head} if obj.needs_token_kl else {})


def sgd_update(cfg, obj, params, batch, aux, *, group_size: int, n_micro: int, prompt_group: int, use_value: bool):
  """One update under SGD at lr 1 (the parameter change is minus the gradient), a value head whose
  output depends on the hidden states: -> (the change of (params, value head), metrics)."""
  spec = UpdateSpec(model_cfg=cfg, objective=obj, group_size=group_size, n_micro=n_micro, temperature=1.0,
                    impl="naive", use_value=use_value, prompt_group=prompt_group, always_share=True)
  tx = optax.sgd(1.0)
  vparams = init_value_head(cfg.d_model, jax.random.key(3), 8)
  vparams["w2_F"] = jnp.linspace(-1.0, 1.0, 8)
  state = UpdateState(params=params, opt_state=tx.init(params), value_params=vparams, value_opt_state=tx.init(vparams))
  new, metrics = jax.jit(update_step, static_argnames=("spec", "tx", "vtx"))(state, batch, aux, spec=spec, tx=tx,
                                                                             vtx=tx)
  delta = jax.tree.map(lambda a, b: np.asarray(a - b), (new.params, new.value_params), (params, vparams))
  return delta, jax.device_get(metrics)
