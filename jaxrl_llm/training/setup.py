"""Building what a run needs from its RunConfig: reward runner, model config
and params on the mesh (tokenizers: model/tokenizer.py; tasks: tasks/registry.py)."""

from __future__ import annotations

from jaxrl_llm.model import sharding as sharding_lib
from jaxrl_llm.tasks import registry
from jaxrl_llm.tasks.rewards import RewardRunner


def make_reward_runner(cfg, task) -> RewardRunner:
  fn, fmt = registry.reward_fns(cfg.data.reward, task)
  return RewardRunner(fn, fmt, format_weight=cfg.data.format_weight, timeout_s=cfg.data.reward_timeout_s,
                      workers=cfg.data.reward_workers)


def make_model(cfg, tokenizer, mesh, key):
  """-> (model_cfg, params placed on the mesh)."""
  m = cfg.model
  if m.hf_path:
    from jaxrl_llm.model.hf_io import load_hf

    params, model_cfg = load_hf(
        m.hf_path, shardings=lambda c: sharding_lib.param_shardings(c, mesh),
        param_dtype=m.param_dtype, compute_dtype=m.compute_dtype, remat=m.remat_policy)
    return model_cfg, params
  model_cfg = m.build(tokenizer.vocab_size)
  return model_cfg, sharding_lib.init_sharded_params(model_cfg, key, mesh)
