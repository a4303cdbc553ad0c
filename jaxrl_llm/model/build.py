"""The model a run trains, from its config's `model` section: a fresh tiny decoder or a
checkpoint (`model.hf_path`), on the mesh, with LoRA adapters where `model.lora.rank` asks."""

from __future__ import annotations

import jax

from jaxrl_llm.model import lora
from jaxrl_llm.model import sharding as sharding_lib


def make_model(m, tokenizer, mesh, key):
  """-> (model_cfg, params placed on the mesh); with `model.lora.rank`, the adapters attached
  (model/lora.py) and the base quantised as `model.lora.quant` says. m: the run config's `model`
  section (model/config.py's ModelSpec)."""
  lora_cfg = m.lora if m.lora.active else None
  if m.hf_path:
    from jaxrl_llm.model.io.hf_io import load_hf

    params, model_cfg = load_hf(
        m.hf_path, shardings=lambda c: sharding_lib.param_shardings(c, mesh),
        param_dtype=m.param_dtype, compute_dtype=m.compute_dtype, remat=m.remat_policy,
        attention_impl=m.attention_impl)
    if lora_cfg is None:
      return model_cfg, params
    model_cfg = model_cfg.replace(lora=lora_cfg)
    shardings = sharding_lib.param_shardings(model_cfg, mesh)
    return model_cfg, jax.jit(lora.attach, static_argnums=1, out_shardings=shardings, donate_argnums=0)(params, model_cfg, key)
  model_cfg = m.build(tokenizer.vocab_size).replace(lora=lora_cfg)
  return model_cfg, sharding_lib.init_sharded_params(model_cfg, key, mesh)
