"""Building what a run needs from its RunConfig: tokenizer, task, reward
runner, model config and params on the mesh."""

from __future__ import annotations

from jaxrl_llm import model as model_lib
from jaxrl_llm.tasks.arithmetic import ArithmeticTask, arithmetic_format, arithmetic_reward
from jaxrl_llm.tasks.countdown import CountdownTask, countdown_format, countdown_reward
from jaxrl_llm.tasks.files import FileTask
from jaxrl_llm.tasks.math_reward import boxed_format, math_verify_reward
from jaxrl_llm.tasks.rewards import RewardRunner
from jaxrl_llm.tasks.tokenizer import CharTokenizer
from jaxrl_llm.training import mesh as mesh_lib
from jaxrl_llm.training.config import RunConfig

REWARD_FNS = {"arithmetic": (arithmetic_reward, arithmetic_format),
              "countdown": (countdown_reward, countdown_format),
              "math_verify": (math_verify_reward, boxed_format)}


def make_tokenizer(cfg: RunConfig):
  if not cfg.model.hf_path:
    return CharTokenizer()
  from jaxrl_llm.model.tokenizer import load_tokenizer

  return load_tokenizer(cfg.model.hf_path)


def make_task(cfg: RunConfig):
  t = cfg.task
  if t.name == "arithmetic":
    return ArithmeticTask(digits=t.digits, digits2=t.digits2, ops=t.ops, seed=cfg.seed, eval_fraction=t.eval_fraction,
                          wrong_fraction=cfg.sft.wrong_fraction)
  if t.name == "countdown":
    return CountdownTask(n_numbers=t.n_numbers, max_number=t.max_number, seed=cfg.seed,
                         eval_fraction=t.eval_fraction, wrong_fraction=cfg.sft.wrong_fraction)
  reward = "math_verify" if cfg.data.reward == "auto" else cfg.data.reward
  fn, fmt = REWARD_FNS[reward]
  return FileTask(path=cfg.data.path, reward_fn=fn, format_fn=fmt, prompt_key=cfg.data.prompt_key,
                  answer_key=cfg.data.answer_key, tag_key=cfg.data.tag_key, eval_path=cfg.data.eval_path,
                  eval_fraction=t.eval_fraction, seed=cfg.seed)


def make_reward_runner(cfg: RunConfig, task) -> RewardRunner:
  if cfg.data.reward == "auto":
    fn, fmt = task.reward_fn, task.format_fn
  else:
    fn, fmt = REWARD_FNS[cfg.data.reward]
  return RewardRunner(fn, fmt, format_weight=cfg.data.format_weight, timeout_s=cfg.data.reward_timeout_s,
                      workers=cfg.data.reward_workers)


def make_model(cfg: RunConfig, tokenizer, mesh, key):
  """-> (model_cfg, params placed on the mesh)."""
  m = cfg.model
  if m.hf_path:
    from jaxrl_llm.model.hf_io import load_hf

    params, model_cfg = load_hf(
        m.hf_path, shardings=lambda c: mesh_lib.param_shardings(mesh, c),
        param_dtype=m.param_dtype, compute_dtype=m.compute_dtype, remat=m.remat)
    return model_cfg, params
  model_cfg = model_lib.ModelConfig.tiny(
      tokenizer.vocab_size, d_model=m.d_model, n_layers=m.n_layers, n_heads=m.n_heads, n_kv_heads=m.n_kv_heads,
      head_dim=m.d_model // m.n_heads, d_ff=m.d_ff, param_dtype=m.param_dtype, compute_dtype=m.compute_dtype,
      remat=m.remat)
  from jaxrl_llm.model.sharding import init_sharded_params

  return model_cfg, init_sharded_params(model_cfg, key, mesh)
