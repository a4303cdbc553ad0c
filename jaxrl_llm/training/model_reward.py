"""A trained reward model as the RL reward (`data.reward=model`), joined to the loop as an extension.

    preflight      data.reward_model is a reward model's workdir: a checkpoint with a score head
    setup          its trunk and head on the run's mesh (params sharded as the policy's are)
    score_rewards  each round of samples scored on the device in micro-batch chunks with the run's
                   batch sharding (prompt + response tokens, as sampled: no text round trip, and
                   the hidden states stay on the device; only r_B comes to the host), then the
                   reward of reward_model/rl_reward.py (normalised, mixed with the verifier's; the KL to
                   pi_ref in the reward is the objective's kl_placement=reward)
    checkpoint_trees  the running moments of data.reward_norm=running (exact resume)

The task's verifier still scores every sample: its accuracy (reward/accuracy, and the evaluations)
is the gold measure beside the proxy reward/model_mean, which is how over-optimisation shows.
"""

from __future__ import annotations

import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.checks import ConfigError
from jaxrl_llm.checkpointing.run import ExtraTree
from jaxrl_llm.extension import Extension, SetupEnv
from jaxrl_llm.model import sharding as sharding_lib
from jaxrl_llm.reward_model import rl_reward
from jaxrl_llm.reward_model.scorer import HEAD_KEY, load_reward_model, reward_scores
from jaxrl_llm.tasks.registry import MODEL_REWARD
from jaxrl_llm.training.score import soft_overlong_penalty

FIELD = "config.data.reward_model"
MOMENTS_KEY = "reward_model_moments"  # the checkpoint's tree of the running moments


def check_reward_model_dir(path: str) -> None:
  """A one-line ConfigError unless `path` is a reward model's workdir whose newest checkpoint holds the
  score head (read from the checkpoint's metadata: no arrays are loaded)."""
  from jaxrl_llm.checkpointing.init import checkpoint_dir
  from jaxrl_llm.checkpointing.manager import CheckpointManager

  if not os.path.isdir(path):
    raise ConfigError(f"{FIELD}={path!r}: no such directory; expected the workdir of python -m "
                      "jaxrl_llm.reward_model")
  mngr = CheckpointManager(checkpoint_dir(path), read_only=True)
  step = mngr.latest_step()
  if step is None:
    raise ConfigError(f"{FIELD}={path!r}: {checkpoint_dir(path)} holds no checkpoint; expected the workdir of "
                      "python -m jaxrl_llm.reward_model")
  keys = mngr.saved_keys(step)
  if HEAD_KEY not in keys:
    raise ConfigError(f"{FIELD}={path!r}: {mngr.step_dir(step)} has no field {HEAD_KEY!r} (found {keys}): not a "
                      "reward model (a policy run's workdir?); train one with python -m jaxrl_llm.reward_model")


@functools.partial(jax.jit, static_argnames=("model_cfg",))
def _score_chunk(params, head, prompt_BP, prompt_mask_BP, tokens_BR, context_BR, *, model_cfg):
  """r_B of [left-padded prompt | response]: the positions come from the mask, so the pads between
  and after are skipped and r is read at the last real token (scorer.reward_scores)."""
  tokens_BT = jnp.concatenate([prompt_BP, tokens_BR], axis=1)
  mask_BT = jnp.concatenate([prompt_mask_BP, context_BR], axis=1)
  return reward_scores(params, head, model_cfg, tokens_BT, mask_BT)


class RewardModelExtension(Extension):
  """data.reward=model: the reward model's score, normalised and mixed (reward_model/rl_reward.py), is the reward."""

  name = "reward_model"

  def __init__(self, data_cfg):
    self.cfg = data_cfg  # tasks.config.DataConfig
    self.moments = rl_reward.Moments()
    self.params = self.head = self.rm_cfg = None

  def preflight(self, run_cfg) -> None:
    check_reward_model_dir(run_cfg.data.reward_model)

  def setup(self, env: SetupEnv, params):
    self.run_cfg, self.model_cfg = env.run_cfg, env.model_cfg
    self.params, self.head, self.rm_cfg = load_reward_model(self.cfg.reward_model, env.mesh)
    if self.rm_cfg.vocab_size < env.tokenizer.vocab_size:
      raise ConfigError(f"{FIELD}={self.cfg.reward_model!r}: its vocabulary ({self.rm_cfg.vocab_size}) is smaller "
                        f"than the policy's tokenizer's ({env.tokenizer.vocab_size}); it must read the same tokens")
    self.batch_sharding = sharding_lib.batch_sharding(env.mesh, ndim=1)
    self.replicated = sharding_lib.replicated(env.mesh)
    env.log(f"reward model: {self.cfg.reward_model} (d_model {self.rm_cfg.d_model}, {self.rm_cfg.n_layers} layers)")
    return params

  # ---- the score -------------------------------------------------------------------
  def model_scores(self, samples) -> np.ndarray:
    """r_B (host f32) of `samples`, micro-batch rows at a time on the mesh."""
    chunk = self.run_cfg.micro_batch_size
    arrays = (samples.prompt_BP, samples.prompt_mask_BP, samples.tokens_BR, samples.context_BR)
    outs = []
    for s in range(0, samples.tokens_BR.shape[0], chunk):
      args = jax.device_put(tuple(np.asarray(a[s:s + chunk]) for a in arrays), self.batch_sharding)
      outs.append(_score_chunk(self.params, self.head, *args, model_cfg=self.rm_cfg))
    return np.asarray(jax.device_get(jnp.concatenate(outs)), np.float32)

  def score_rewards(self, state, samples, scores):
    del state  # the reward model is frozen: nothing of the policy's state enters its score
    c, f = self.cfg, self.run_cfg.filters
    model_B = self.model_scores(samples)
    if c.reward_norm == "running":
      m = rl_reward.update_moments(self.moments, model_B[samples.sampled_B])
      # Rounded to f32 as the checkpoint holds them, so a resumed run continues exactly.
      self.moments = rl_reward.Moments(*(float(np.float32(x)) for x in (m.count, m.mean, m.m2)))
      normed_B = rl_reward.running_normalise(model_B, self.moments)
    elif c.reward_norm == "group":
      normed_B = rl_reward.group_normalise(model_B, self.run_cfg.rollout.group_size)
    else:
      normed_B = model_B
    shaping_B = soft_overlong_penalty(samples.length_B, self.run_cfg.response_len, f.overlong_buffer,
                                      f.overlong_penalty)
    verifier_B = scores.reward_B - shaping_B
    reward_B = rl_reward.mixed_reward(normed_B, verifier_B, shaping_B, w_rm=c.reward_model_weight,
                                      w_v=c.verifier_weight)
    got = samples.sampled_B if samples.sampled_B.any() else np.ones_like(samples.sampled_B)
    stats = {"reward/model_mean": float(model_B[got].mean()), "reward/model_std": float(model_B[got].std()),
             "reward/verifier_mean": float(verifier_B[got].mean())}
    return dataclasses.replace(scores, reward_B=reward_B), stats

  # ---- resume ------------------------------------------------------------------------
  def checkpoint_trees(self) -> dict:
    if self.cfg.reward_norm != "running":
      return {}
    return {MOMENTS_KEY: ExtraTree(get=self._moments_tree, set=self._set_moments)}

  def _moments_tree(self) -> dict:
    m = self.moments
    return {k: jax.device_put(jnp.asarray(getattr(m, k), jnp.float32), self.replicated)
            for k in ("count", "mean", "m2")}

  def _set_moments(self, tree) -> None:
    self.moments = rl_reward.Moments(**{k: float(jax.device_get(v)) for k, v in tree.items()})

  def summary(self) -> dict:
    return {"reward_model": self.cfg.reward_model, "reward_norm": self.cfg.reward_norm}


def enabled(data_cfg) -> bool:
  """The data section turns the extension on with data.reward=model."""
  return data_cfg.reward == MODEL_REWARD
