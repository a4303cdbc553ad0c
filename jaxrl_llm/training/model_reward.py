"""A trained reward model as the RL reward (`data.reward=model`), joined to the loop as an extension.

    preflight      data.reward_model is a reward model's workdir: a checkpoint with a score head (or
                   several, comma-separated: an ensemble of outcome reward models)
    setup          its trunk and head on the run's mesh (params sharded as the policy's are), each
                   member's for an ensemble
    score_rewards  each round of samples scored on the device in micro-batch chunks with the run's
                   batch sharding (prompt + response tokens, as sampled: no text round trip, and
                   the hidden states stay on the device; only r_B comes to the host), then the
                   reward of reward_model/rl_reward.py (an ensemble's mean - k std, normalised, clipped,
                   mixed with the verifier's; the KL to pi_ref in the reward is the objective's
                   kl_placement=reward)
    checkpoint_trees  the running moments of data.reward_norm=running (exact resume)

A process reward model (a reward model trained with objective="process", reward_model/process.py)
scores each response's steps instead: p_k = sigmoid(s_t) at the token t that ends step k
(`process.response_step_ends`, with the separator the PRM was trained with). Under
`objective.advantage = "grpo_process"` step k's reward is w_rm * p_k at t, and the verifier's
(w_v * v) and the overlong penalty go to the last step; any other advantage takes the solution's
reward w_rm * norm(reduce_k p_k) + w_v * v + s, reduce = data.process_reduce (min or prod).
A PRM trained with an end step (its data.end_step) has one more step, read at the response's EOS; a
response the length limit cut has no end, and its last step (or last token) scores 0 there.

The task's verifier still scores every sample: its accuracy (reward/accuracy, and the evaluations)
is the gold measure beside the proxy reward/model_mean, which is how over-optimisation shows.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.checks import ConfigError
from jaxrl_llm.checkpointing.run import ExtraTree
from jaxrl_llm.envs.config import NO_ENV
from jaxrl_llm.extension import Extension, SetupEnv
from jaxrl_llm.model import sharding as sharding_lib
from jaxrl_llm.reward_model import process as process_lib
from jaxrl_llm.reward_model import rl_reward
from jaxrl_llm.reward_model.scorer import HEAD_KEY, load_reward_model, reward_scores, token_scores
from jaxrl_llm.tasks.registry import MODEL_REWARD
from jaxrl_llm.training.score import policy_budget, soft_overlong_penalty

FIELD = "config.data.reward_model"
MOMENTS_KEY = "reward_model_moments"  # the checkpoint's tree of the running moments


def reward_model_kind(path: str) -> dict:
  """What the reward model's run recorded (<workdir>/config.json): {"objective", "step_separator"}
  (a workdir from before process reward models: bradley_terry)."""
  with open(os.path.join(path, "config.json")) as f:
    saved = json.load(f)
  return {"objective": saved.get("objective", "bradley_terry"),
          "step_separator": saved.get("data", {}).get("step_separator", "\n"),
          "end_step": bool(saved.get("data", {}).get("end_step", False))}


def check_reward_model_dir(path: str) -> None:
  """A one-line ConfigError unless `path` is a reward model's workdir whose newest checkpoint holds the
  score head (read from the checkpoint's metadata: no arrays are loaded)."""
  from jaxrl_llm.checkpointing.init_params import checkpoint_dir
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


@functools.partial(jax.jit, static_argnames=("model_cfg", "per_token"))
def _score_chunk(params, head, prompt_BP, prompt_mask_BP, tokens_BR, context_BR, *, model_cfg, per_token):
  """r_B of [left-padded prompt | response]: the positions come from the mask, so the pads between
  and after are skipped and r is read at the last real token (scorer.reward_scores); `per_token`:
  s_BR, the head at every response token (scorer.token_scores)."""
  tokens_BT = jnp.concatenate([prompt_BP, tokens_BR], axis=1)
  mask_BT = jnp.concatenate([prompt_mask_BP, context_BR], axis=1)
  if per_token:
    return token_scores(params, head, model_cfg, tokens_BT, mask_BT)[:, prompt_BP.shape[1]:]
  return reward_scores(params, head, model_cfg, tokens_BT, mask_BT)


class RewardModelExtension(Extension):
  """data.reward=model: the reward model's score, normalised and mixed (reward_model/rl_reward.py), is the reward."""

  name = "reward_model"

  def __init__(self, data_cfg):
    self.cfg = data_cfg  # tasks.config.DataConfig
    self.moments = rl_reward.Moments()
    self.params = self.head = self.rm_cfg = None
    self.members = []
    self.kind = {"objective": "bradley_terry", "step_separator": "\n", "end_step": False}

  def preflight(self, run_cfg) -> None:
    paths = run_cfg.data.reward_models
    for path in paths:
      check_reward_model_dir(path)
    self.kind = reward_model_kind(paths[0])
    if len(paths) > 1:
      kinds = [reward_model_kind(p)["objective"] for p in paths]
      if any(k != "bradley_terry" for k in kinds):
        raise ConfigError(f"{FIELD}={run_cfg.data.reward_model!r}: an ensemble combines outcome reward models' "
                          f"scores; its members' objectives are {kinds} (allowed: bradley_terry for each)")
    if self.process and run_cfg.env.name != NO_ENV:
      raise ConfigError(f"{FIELD}={run_cfg.data.reward_model!r} is a process reward model, which scores the steps "
                        f"of single-turn responses: env.name={run_cfg.env.name!r} is not allowed with it "
                        f"(allowed {NO_ENV!r})")
    if self.process and run_cfg.data.reward_clip > 0 and run_cfg.objective.advantage == "grpo_process":
      raise ConfigError(f"config.data.reward_clip={run_cfg.data.reward_clip!r} clips the normalised outcome "
                        "reward, which objective.advantage='grpo_process' does not read (its advantages come from "
                        "the process reward model's step rewards): use 0 with it")

  @property
  def process(self) -> bool:
    return self.kind["objective"] == "process"

  def setup(self, env: SetupEnv, params):
    self.run_cfg, self.model_cfg = env.run_cfg, env.model_cfg
    self.kind = reward_model_kind(self.cfg.reward_models[0])
    self.tokenizer = env.tokenizer
    self.members = []  # (params, head, model config) of each reward model, in data.reward_model's order
    for path in self.cfg.reward_models:
      params_m, head_m, cfg_m = load_reward_model(path, env.mesh)
      if cfg_m.vocab_size < env.tokenizer.vocab_size:
        raise ConfigError(f"{FIELD}={path!r}: its vocabulary ({cfg_m.vocab_size}) is smaller than the policy's "
                          f"tokenizer's ({env.tokenizer.vocab_size}); it must read the same tokens")
      self.members.append((params_m, head_m, cfg_m))
      env.log(f"reward model: {path} (d_model {cfg_m.d_model}, {cfg_m.n_layers} layers)")
    self.params, self.head, self.rm_cfg = self.members[0]
    self.batch_sharding = sharding_lib.batch_sharding(env.mesh, ndim=1)
    self.replicated = sharding_lib.replicated(env.mesh)
    return params

  # ---- the score -------------------------------------------------------------------
  def member_scores(self, samples, member: int = 0, per_token: bool = False) -> np.ndarray:
    """r_B (host f32) of `samples` by reward model `member`, micro-batch rows at a time on the mesh;
    `per_token`: s_BR."""
    params, head, rm_cfg = self.members[member]
    chunk = self.run_cfg.micro_batch_size
    arrays = (samples.prompt_BP, samples.prompt_mask_BP, samples.tokens_BR, samples.context_BR)
    outs = []
    for s in range(0, samples.tokens_BR.shape[0], chunk):
      args = sharding_lib.put(tuple(np.asarray(a[s:s + chunk]) for a in arrays), self.batch_sharding)
      outs.append(_score_chunk(params, head, *args, model_cfg=rm_cfg, per_token=per_token))
    return np.asarray(sharding_lib.fetch(jnp.concatenate(outs)), np.float32)

  def model_scores(self, samples, per_token: bool = False) -> np.ndarray:
    """r_B (host f32) of `samples`: the reward model's score, or an ensemble's mean - k * std over its
    members (rl_reward.ensemble_reward); `per_token` (a process reward model, one member): s_BR."""
    if len(self.members) == 1:
      return self.member_scores(samples, 0, per_token)
    r_MB = np.stack([self.member_scores(samples, m) for m in range(len(self.members))])
    self.last_member_std_B = r_MB.std(axis=0)
    return rl_reward.ensemble_reward(r_MB, self.cfg.reward_model_uncertainty_k)

  def step_scores(self, samples) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(p_BR, step_end_BR, solution_B) of a process reward model: P(step good) at each step end (0
    elsewhere), the step ends, and each solution's reduced score (module docstring)."""
    s_BR = self.model_scores(samples, per_token=True)
    tokens_BR, mask_BR = np.asarray(samples.tokens_BR), np.asarray(samples.mask_BR, bool)
    end_BR = np.stack([process_lib.response_step_ends(tokens_BR[b], mask_BR[b], self.tokenizer,
                                                      self.kind["step_separator"]) for b in range(len(tokens_BR))])
    sig_BR = 1.0 / (1.0 + np.exp(-s_BR.astype(np.float64)))
    p_BR = np.where(end_BR, sig_BR, 0.0).astype(np.float32)
    if self.kind["end_step"]:  # the end step (module docstring)
      for b in range(len(p_BR)):
        eos = process_lib.response_eos(tokens_BR[b], mask_BR[b], self.tokenizer)
        if eos is not None:
          end_BR[b, eos], p_BR[b, eos] = True, sig_BR[b, eos]
        else:
          last = (np.flatnonzero(end_BR[b]) if end_BR[b].any() else np.flatnonzero(mask_BR[b]))[-1:]
          end_BR[b, last], p_BR[b, last] = True, 0.0
    solution_B = np.array([process_lib.solution_score(p_BR[b, end_BR[b]], self.cfg.process_reduce)
                           for b in range(len(p_BR))], np.float32)
    return p_BR, end_BR, solution_B

  def score_rewards(self, state, samples, scores):
    del state  # the reward model is frozen: nothing of the policy's state enters its score
    c, f = self.cfg, self.run_cfg.filters
    if self.process:
      p_BR, end_BR, model_B = self.step_scores(samples)
    else:
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
    normed_B = rl_reward.clip_reward(normed_B, c.reward_clip)
    shaping_B = soft_overlong_penalty(samples.length_B, policy_budget(samples, self.run_cfg.response_len),
                                      f.overlong_buffer, f.overlong_penalty)  # as score() shaped it
    verifier_B = scores.reward_B - shaping_B
    reward_B = rl_reward.mixed_reward(normed_B, verifier_B, shaping_B, w_rm=c.reward_model_weight,
                                      w_v=c.verifier_weight)
    got = samples.sampled_B if samples.sampled_B.any() else np.ones_like(samples.sampled_B)
    stats = {"reward/model_mean": float(model_B[got].mean()), "reward/model_std": float(model_B[got].std()),
             "reward/verifier_mean": float(verifier_B[got].mean())}
    if len(self.members) > 1:  # the members' disagreement, the ensemble's uncertainty
      stats["reward/model_ensemble_std"] = float(self.last_member_std_B[got].mean())
    if c.reward_clip > 0:
      stats["reward/model_clipped_frac"] = float((np.abs(normed_B[got]) >= c.reward_clip).mean())
    if not self.process:
      return dataclasses.replace(scores, reward_B=reward_B), stats
    # Step k's reward w_rm * p_k where it ends; the verifier's part and the shaping at the last step end
    # (the last sampled token when the response has no step; the step statistics count real steps only).
    stats.update({"reward/steps_mean": float(end_BR[got].sum(axis=1).mean()),
                  "reward/step_p_mean": float(p_BR[end_BR & got[:, None]].mean()) if (end_BR & got[:, None]).any()
                  else 0.0})
    step_reward_BR = (c.reward_model_weight * p_BR).astype(np.float32)
    rest_B = rl_reward.mixed_reward(np.zeros_like(model_B), verifier_B, shaping_B, w_rm=0.0, w_v=c.verifier_weight)
    mask_BR = np.asarray(samples.mask_BR, bool)
    for b in range(len(step_reward_BR)):
      ends = np.flatnonzero(end_BR[b]) if end_BR[b].any() else np.flatnonzero(mask_BR[b])[-1:]
      if ends.size:
        end_BR[b, ends[-1]] = True
        step_reward_BR[b, ends[-1]] += rest_B[b]
    return dataclasses.replace(scores, reward_B=reward_B, step_reward_BR=step_reward_BR, step_end_BR=end_BR), stats

  # ---- resume ------------------------------------------------------------------------
  def checkpoint_trees(self) -> dict:
    if self.cfg.reward_norm != "running":
      return {}
    return {MOMENTS_KEY: ExtraTree(get=self._moments_tree, set=self._set_moments)}

  def _moments_tree(self) -> dict:
    m = self.moments
    return {k: sharding_lib.put(jnp.asarray(getattr(m, k), jnp.float32), self.replicated)
            for k in ("count", "mean", "m2")}

  def _set_moments(self, tree) -> None:
    self.moments = rl_reward.Moments(**{k: float(sharding_lib.fetch(v)) for k, v in tree.items()})

  def summary(self) -> dict:
    out = {"reward_model": self.cfg.reward_model, "reward_norm": self.cfg.reward_norm,
           "reward_model_objective": self.kind["objective"], "reward_clip": self.cfg.reward_clip}
    if len(self.cfg.reward_models) > 1:
      out["reward_model_uncertainty_k"] = self.cfg.reward_model_uncertainty_k
    if self.process:
      out["process_reduce"] = self.cfg.process_reduce
    return out


def enabled(data_cfg) -> bool:
  """The data section turns the extension on with data.reward=model."""
  return data_cfg.reward == MODEL_REWARD
