"""The token-weight dump: a chosen step's batch with every factor its loss used.

Each step listed in `log.dump_steps` runs its updates through
`Updater.apply_with_factors` (the same compiled update, after a forward-only
program that gives the policy loss's `objectives.TokenFactors` at the update's
starting params) and then writes
<workdir>/dumps/step_N.npz + step_N.json (file format: jaxrl_llm/rundir/token_dump.py),
which `python -m jaxrl_llm.inspect` renders. B samples, R response tokens,
P prompt slots, K passes over the batch (train.epochs); every row is in one
mini-batch per pass, and its factors are those of that mini-batch's update.

Arrays (.npz):
  prompt_BP, prompt_mask_BP     the left-padded prompts
  tokens_BR, sampled_BR         response tokens and which were sampled (EOS included)
  loss_mask_BR                  tokens in the loss (sampled minus filtered samples)
  behav_logp_BR, prox_logp_BR, ref_logp_BR
                                log mu, log pi_prox, log pi_ref (the last two 0 unless recomputed)
  measured_log_c_BR             log pi_prox - log mu on the sampled tokens (0 without a recompute)
  adv_in_BR                     the advantages the loss was given (after the extensions)
  reward_B, correct_B, truncated_B, length_B, group_B, seq_adv_B, log_c_seq_B
                                per sample: reward, verifier's verdict, cut at max length,
                                tokens, group, mean advantage, log c_i = sum_t measured log c
  overlong_masked_B, filler_B   out of the loss: the overlong filter, or a dynamic-sampling filler group
  factor_<name>_KBR             `TokenFactors.arrays()` per pass: r c rho log_r log_c log_rho T f W A
                                lambda lambda_A_W C (float32)
  flag_<key>_KBR                the loss's mask / clip flags per pass (bool; key's "/" written "__")
  ext_<extension>__<name>       an extension's `token_diagnostics()` ([B, R] or [B])
  context_BR, turn_BR           multi-turn episodes only: every response token (the policy's and the
                                environment's observations; sampled_BR is the policy's) and its turn

An episode's observation tokens are in tokens_BR and context_BR but not in sampled_BR or
loss_mask_BR: every factor of the loss is 0 there (the inspector shows them greyed).

The JSON holds the run's name, method and config summary (objective knobs,
rollout, train, filters, teacher, env), the step's metrics, the texts, the
episodes' statuses, and the text of every token id that occurs.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from jaxrl_llm.model import sharding as sharding_lib
from jaxrl_llm.model import distributed
from jaxrl_llm.rundir import token_dump

FLAG_SEP = "__"  # a flag key's "/" in the array names (trust/clip_low -> flag_trust__clip_low_KBR)


class FactorRecorder:
  """Gathers the update's per-token factors of one step: pass k, rows -> [K, B, R] in batch order."""

  def __init__(self, n_rows: int, n_passes: int):
    self.n_rows, self.n_passes = n_rows, n_passes
    self._passes: list[dict] = [{} for _ in range(n_passes)]

  def add(self, pass_index: int, rows: np.ndarray, factors: dict) -> None:
    """factors: {name: [len(rows), R]} of the mini-batch holding `rows` (device or host arrays)."""
    into = self._passes[pass_index]
    for name, value in sharding_lib.fetch(factors).items():
      value = np.asarray(value)
      if name not in into:
        into[name] = np.zeros((self.n_rows,) + value.shape[1:], value.dtype)
      into[name][np.asarray(rows)] = value

  def stacked(self) -> dict:
    """{name: [K, B, R]}."""
    names = self._passes[0].keys()
    return {n: np.stack([p[n] for p in self._passes]) for n in names}


def wanted(cfg, step: int) -> bool:
  """Whether RL step `step` (1-based, as metrics.jsonl counts) is dumped."""
  return step in cfg.log.dump_steps


def _piece(tokenizer, token_id: int) -> str:
  """The text of one token id (special tokens by name)."""
  if token_id == getattr(tokenizer, "eos_id", None):
    return "<eos>"
  if token_id == getattr(tokenizer, "pad_id", None):
    return "<pad>"
  try:
    text = tokenizer.decode([token_id], skip_special_tokens=False)
  except TypeError:  # the character tokenizer decodes without the option
    text = tokenizer.decode([token_id])
  return text if text else f"<{token_id}>"


def _number(v):
  """A metric as JSON: a float, or its text when not finite (JSON has no inf / nan)."""
  v = float(np.asarray(v))
  return v if math.isfinite(v) else str(v)


def _summary(cfg, extensions) -> dict:
  out = {"objective": dataclasses.asdict(cfg.objective), "rollout": dataclasses.asdict(cfg.rollout),
         "train": dataclasses.asdict(cfg.train), "filters": dataclasses.asdict(cfg.filters),
         "seed": cfg.seed, "model": dataclasses.asdict(cfg.model)}
  if any(ext.name == "teacher" for ext in extensions):
    out["teacher"] = dataclasses.asdict(cfg.teacher)
  if cfg.env.active:
    out["env"] = dataclasses.asdict(cfg.env)
  return out


def step_arrays(ctx, sb, batch, factors_KBR: dict) -> dict:
  """The dump's arrays (module docstring) for one step: `sb` the step's `ScoredBatch`, `batch` its TrainBatch."""
  cfg = ctx.cfg
  samples, scores, keep_B, prox_recomputed = sb.samples, sb.scores, sb.keep_B, cfg.prox.forward
  G = cfg.rollout.group_size
  sampled = np.asarray(samples.mask_BR, bool)
  behav = np.asarray(sharding_lib.fetch(samples.behav_logp_BR), np.float32)
  prox = np.asarray(batch.prox_logp_BR, np.float32)
  log_c = np.where(sampled, prox - behav, 0.0).astype(np.float32) if prox_recomputed else np.zeros_like(behav)
  adv = np.asarray(batch.adv_BR, np.float32)
  n = np.maximum(sampled.sum(axis=1), 1)
  overlong = np.asarray(samples.truncated_B, bool) & cfg.filters.overlong_filter
  arrays = {
      "prompt_BP": np.asarray(samples.prompt_BP, np.int32), "prompt_mask_BP": np.asarray(samples.prompt_mask_BP),
      "tokens_BR": np.asarray(samples.tokens_BR, np.int32), "sampled_BR": sampled,
      "loss_mask_BR": np.asarray(batch.mask_BR, bool), "behav_logp_BR": behav, "prox_logp_BR": prox,
      "ref_logp_BR": np.asarray(batch.ref_logp_BR, np.float32), "measured_log_c_BR": log_c, "adv_in_BR": adv,
      "reward_B": np.asarray(scores.reward_B, np.float32), "correct_B": np.asarray(scores.correct_B, np.float32),
      "truncated_B": np.asarray(samples.truncated_B, bool), "length_B": np.asarray(samples.length_B, np.int32),
      "group_B": (np.arange(sampled.shape[0]) // G).astype(np.int32),
      "seq_adv_B": (np.where(sampled, adv, 0.0).sum(axis=1) / n).astype(np.float32),
      "log_c_seq_B": log_c.sum(axis=1).astype(np.float32),
      "overlong_masked_B": overlong, "filler_B": ~np.asarray(keep_B, bool) & ~overlong,
  }
  for name, value in factors_KBR.items():
    if value.dtype == bool:
      arrays[f"flag_{name.replace('/', FLAG_SEP)}_KBR"] = value
    else:
      arrays[f"factor_{name}_KBR"] = value.astype(np.float32)
  for ext in ctx.extensions:
    for name, value in ext.token_diagnostics().items():
      arrays[f"ext_{ext.name}{FLAG_SEP}{name}"] = np.asarray(value)
  if samples.episodic:
    arrays["context_BR"] = np.asarray(samples.context_BR, bool)
    arrays["turn_BR"] = np.asarray(samples.turn_BR, np.int32)
  return arrays


def write_step(ctx, step: int, sb, batch, recorder: FactorRecorder, metrics: dict) -> str:
  """Writes step `step`'s dump into <ctx.workdir>/dumps; -> the JSON's path ("" in a process other than 0)."""
  cfg = ctx.cfg
  samples, prox_recomputed = sb.samples, cfg.prox.forward
  factors = recorder.stacked()
  arrays = step_arrays(ctx, sb, batch, factors)  # every process: its fetches are collectives
  if not distributed.is_primary():  # the file is process 0's
    return ""
  ids = np.unique(np.asarray(samples.tokens_BR)[np.asarray(samples.context_BR, bool)])
  info = {
      "run_name": cfg.run_name, "method": cfg.method, "config": _summary(cfg, ctx.extensions),
      "extensions": [ext.name for ext in ctx.extensions], "passes": recorder.n_passes,
      "group_size": cfg.rollout.group_size, "prox_recomputed": bool(prox_recomputed),
      "factors": sorted(k for k, v in factors.items() if v.dtype != bool),
      "flags": sorted(k for k, v in factors.items() if v.dtype == bool),
      "prompts": list(samples.prompts), "responses": list(samples.responses), "answers": list(samples.answers),
      "tags": list(samples.tags), "pieces": {str(int(i)): _piece(ctx.tokenizer, int(i)) for i in ids},
      "metrics": {k: _number(v) for k, v in sorted(metrics.items())},
  }
  if samples.episodic:
    info["statuses"] = list(samples.statuses)
  return token_dump.write_dump(ctx.workdir, step, arrays, info)
