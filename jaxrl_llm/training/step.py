"""One RL step, stage by stage:

    prompts -> rollout engine (n per prompt, refilled by dynamic sampling)
    -> score -> filters -> recompute pi_prox / pi_ref / values -> advantages
    -> extensions rewrite the batch -> K passes of mini-batch updates -> metrics.

Every stage is a function of the `StepContext` (training/context.py) and the
`TrainState`; `rl_step(ctx, state)` runs them in order. With `rollout.overlap`
the step's first stage, its samples, was done ahead in a background thread
(training/async_rollout.py), with the same policy version, key and prompts.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from typing import Callable

import jax
import numpy as np

from jaxrl_llm import faults
from jaxrl_llm import objectives as obj_lib
from jaxrl_llm.model import sharding as sharding_lib
from jaxrl_llm.sampling.engine import RolloutBatch
from jaxrl_llm.sampling.mismatch import mismatch_metrics
from jaxrl_llm.training import dump as dump_lib
from jaxrl_llm.training import kl_controller
from jaxrl_llm.training.batch import TrainBatch
from jaxrl_llm.learn.learner import snapshot
from jaxrl_llm.training.context import StepContext
from jaxrl_llm.training.episodes import episode_metrics
from jaxrl_llm.training.metrics import mean_over_updates
from jaxrl_llm.training.pack import balanced_order, fill as pack_fill
from jaxrl_llm.training.recompute import RecomputeSpec, behaviour_head, behaviour_hidden, policy_logprobs
from jaxrl_llm.training.score import (Scores, choose_groups, concat_scores, informative_groups, overlong_keep, score,
                                      select_scores, step_rewards)
from jaxrl_llm.training.state import TrainState


def sampler_version(step: int, staleness: int) -> int:
  """The policy version step `step` (0-based) samples with: theta_{max(s - k, 0)}, theta_v being the
  params after v steps (the first k steps all sample with theta_0)."""
  return max(step - staleness, 0)


@dataclasses.dataclass(frozen=True)
class Generated:
  """One step's first round of samples, as the engine returned them (before scoring)."""

  samples: RolloutBatch
  rollout_s: float  # seconds in engine.generate (time/rollout_s)
  sync_s: float  # seconds in engine.sync before it (time/sync_s)
  data_state: dict  # the prompt pipeline's position right after this round's prompts
  engine_stats: dict  # the engine's own counters right after it (engine/*), {} for one without metrics()


def _sample_round(ctx: StepContext, key, round_no: int) -> tuple[RolloutBatch, float]:
  """The pipeline's next prompts through the (synced) engine: (samples, seconds)."""
  t0 = time.time()
  smp = ctx.engine.generate(next(ctx.pipeline), jax.random.fold_in(key, round_no))
  faults.point("rollout")
  return smp, time.time() - t0


def generate_step(ctx: StepContext, step: int, sampler_params, key) -> Generated:
  """Syncs the engine to step `step`'s policy (`sampler_params`, version `sampler_version`) and samples
  the step's first round with `key` (step `step`'s sampling key). The synchronous step calls it, and
  so does the background generation of `rollout.overlap` (training/async_rollout.py), in step order."""
  t0 = time.time()
  ctx.engine.sync(sampler_params, sampler_version(step, ctx.cfg.rollout.staleness))
  sync_s = time.time() - t0
  smp, rollout_s = _sample_round(ctx, key, 0)
  stats = ctx.engine.metrics()
  return Generated(samples=smp, rollout_s=rollout_s, sync_s=sync_s, data_state=copy.deepcopy(ctx.pipeline.get_state()),
                   engine_stats=dict(stats))


@dataclasses.dataclass(frozen=True)
class ScoredBatch:
  """A step's samples with their rewards, after the filters: what the batch is built from."""

  samples: RolloutBatch  # the rows the step trains on (dynamic sampling chose its groups)
  scores: Scores  # their rewards
  keep_B: np.ndarray  # bool [B]: the row is in the loss and its group's baseline (not filtered, not dropped)
  stats: dict  # the step's reward / rollout / filter metrics
  data_state: dict  # the prompt pipeline's position after the step's last round (the checkpoint's)


@dataclasses.dataclass(frozen=True)
class _Rounds:
  """The rounds of samples one step drew (one, or more with dynamic sampling's refills)."""

  samples: list  # RolloutBatch per round
  scores: list  # Scores per round
  refills: int  # rounds after the first
  rollout_s: float  # seconds in engine.generate, all rounds
  score_s: float  # seconds scoring, all rounds
  data_state: dict  # the pipeline's position after the last round
  ext_stats: dict = dataclasses.field(default_factory=dict)  # the extensions' score_rewards metrics, first round


def _rescored(ctx: StepContext, state: TrainState, smp: RolloutBatch, scores: Scores) -> tuple[Scores, dict]:
  """`scores` after each extension's `score_rewards` (a reward model's reward), and their metrics."""
  stats = {}
  for ext in ctx.extensions:
    scores, ext_stats = ext.score_rewards(state, smp, scores)
    stats.update(ext_stats)
  return scores, stats


def _sample_rounds(ctx: StepContext, key, first: Generated, state: TrainState | None = None) -> _Rounds:
  """Scores `first`, then samples more rounds until the batch is full of informative groups
  (dynamic sampling) or the refill budget is spent."""
  cfg = ctx.cfg
  G, n_prompts = cfg.rollout.group_size, cfg.rollout.prompts_per_step
  parts_s, parts_r, rounds, t_score, ext_stats = [], [], 0, 0.0, {}
  smp, t_roll, data_state = first.samples, first.rollout_s, first.data_state
  while True:
    t1 = time.time()
    parts_s.append(smp)
    r, r_stats = _rescored(ctx, state, smp, score(smp, ctx.runner, cfg.filters, cfg.response_len,
                                                     cfg.data.format_weight))
    parts_r.append(r)
    ext_stats = ext_stats if rounds else r_stats
    t_score += time.time() - t1
    if not cfg.filters.dynamic_sampling:
      break
    n_informative = sum(int(informative_groups(r.reward_B, G).sum()) for r in parts_r)
    if n_informative >= n_prompts or rounds >= cfg.filters.max_refill_rounds:
      break
    rounds += 1
    smp, dt = _sample_round(ctx, key, rounds)
    t_roll += dt
    data_state = copy.deepcopy(ctx.pipeline.get_state())
  return _Rounds(samples=parts_s, scores=parts_r, refills=rounds, rollout_s=t_roll, score_s=t_score,
                 data_state=data_state, ext_stats=ext_stats)


def _reward_stats(first: RolloutBatch, first_r: Scores, G: int) -> dict:
  """The first round's reward statistics: the unfiltered on-policy sample. Rows the engine
  dropped (`RolloutBatch.sampled_B`) are no samples and stay out of the reward's moments."""
  got = first.sampled_B
  if not got.any():  # (the engine raises before: a rollout whose every request failed is an error)
    got = np.ones_like(got)
  return {"reward/mean": first_r.reward_B[got].mean(), "reward/std": first_r.reward_B[got].std(),
          "reward/accuracy": first_r.correct_B[got].mean(),
          "reward/pass_at_group": first_r.correct_B.reshape(-1, G).max(axis=1).mean()}


def rollout_and_score(ctx: StepContext, state: TrainState, key, first: Generated | None = None) -> ScoredBatch:
  """The step's samples, scored and filtered.

  `first` is the step's first round when it was generated ahead (overlapped rollouts, which exclude
  dynamic sampling); None: generated here, with theta_{s-k} (k = staleness: lag_params[0], or the
  policy itself)."""
  cfg = ctx.cfg
  G, n_prompts = cfg.rollout.group_size, cfg.rollout.prompts_per_step
  step = int(state.step)
  if first is None:
    first = generate_step(ctx, step, state.sampler_params(), key)
  rounds = _sample_rounds(ctx, key, first, state)
  samples, scores = RolloutBatch.concat(rounds.samples), concat_scores(rounds.scores)
  first_s, first_r = rounds.samples[0], rounds.scores[0]
  stats = _reward_stats(first_s, first_r, G)
  stats.update(rounds.ext_stats)
  stats.update({"reward/failed": scores.failed_B.sum(), "reward/timed_out": scores.timed_out_B.sum(),
                "response/length_mean": first_s.length_B.mean(),
                "response/truncated_frac": first_s.truncated_B.mean(),
                "signal/failure_rate": float(np.mean(first_r.failed_B | first_r.timed_out_B)),
                "signal/zero_adv_groups": 1.0 - float(informative_groups(first_r.reward_B, G).mean()),
                "filter/refill_rounds": rounds.refills, "time/rollout_s": rounds.rollout_s,
                "time/score_s": rounds.score_s, "time/sync_s": first.sync_s,
                "perf/sampled_tokens": sum(int(s.length_B.sum()) for s in rounds.samples)})
  versions = np.asarray(samples.version_B)
  if (versions >= 0).all():  # steps between the policy updated now and the one that sampled each row
    lag = step - versions
    stats.update({"rollout/version_lag_mean": float(np.mean(lag)), "rollout/version_lag_min": float(lag.min()),
                  "rollout/version_lag_max": float(lag.max())})
  engine_stats = first.engine_stats  # an engine's own counters (requests, retries, restarts, sync seconds)
  if rounds.refills:  # refilled here: the counters after the last round
    engine_stats = dict(ctx.engine.metrics())
  stats.update(engine_stats)
  if samples.episodic:  # every episode the step ran, the refill rounds' too
    stats.update(episode_metrics(samples))
  if cfg.filters.dynamic_sampling:
    rows, keep = choose_groups(scores.reward_B, G, n_prompts)
    samples, scores = samples.select(rows), select_scores(scores, rows)
    stats["filter/kept_group_frac"] = keep.reshape(-1, G)[:, 0].mean()
  else:
    keep = np.ones(scores.reward_B.shape, bool)
  over = overlong_keep(samples.truncated_B, cfg.filters.overlong_filter)
  stats["filter/overlong_masked_frac"] = 1.0 - over.mean()
  stats["rollout/dropped_frac"] = 1.0 - float(samples.sampled_B.mean())
  return ScoredBatch(samples=samples, scores=scores, keep_B=keep & over & samples.sampled_B, stats=stats,
                     data_state=rounds.data_state)


def check_shared_prompts(prompt_BP, prompt_mask_BP, G: int) -> None:
  """Raise where a group of G consecutive rows does not hold one prompt (train.share_prompt runs each
  group's prompt once: model/logprobs.response_hidden). The sampler writes a group's G samples of
  one prompt as consecutive rows; this guards that layout."""
  p_nGP = np.asarray(prompt_BP).reshape(-1, G, np.shape(prompt_BP)[1])
  m_nGP = np.asarray(prompt_mask_BP).reshape(p_nGP.shape)
  same = (p_nGP == p_nGP[:, :1]) | ~m_nGP  # padding slots may hold anything
  bad_n = ~(np.all(same, axis=(1, 2)) & np.all(m_nGP == m_nGP[:, :1], axis=(1, 2)))
  if bad_n.any():
    raise ValueError(f"train.share_prompt: the rows of group {int(np.argmax(bad_n))} do not share one prompt "
                     f"(groups of rollout.group_size={G} consecutive rows); set train.share_prompt=off")


def build_batch(ctx: StepContext, state: TrainState, sb: ScoredBatch) -> tuple[TrainBatch, dict]:
  """The update's batch: the recomputes (pi_prox and values, pi_ref, the sampler's hidden states),
  the advantages, then each extension's rewrite. -> (batch, the stage's metrics)."""
  cfg, obj = ctx.cfg, ctx.cfg.objective
  samples, scores, keep_B = sb.samples, sb.scores, sb.keep_B
  t0 = time.time()
  # The loss's tokens: those the policy sampled (an episode's observations are context only, in
  # context_BR), in the rows that stay in the loss.
  mask_BR = samples.mask_BR & keep_B[:, None]
  context_BR = samples.context_BR & keep_B[:, None]
  B, R = mask_BR.shape
  zeros = np.zeros((B, R), np.float32)
  spec = RecomputeSpec.from_run(cfg, ctx.model_cfg, sharding=ctx.batch_sharding, pack=ctx.pack)
  if cfg.prompt_group > 1:
    check_shared_prompts(samples.prompt_BP, samples.prompt_mask_BP, cfg.prompt_group)
  prox_logp, values = zeros, zeros
  need_prox = cfg.prox.forward  # training/prox.py
  if need_prox:
    prox_logp, values = policy_logprobs(state.params, samples, spec, vparams=state.value_params,
                                        with_values=cfg.use_value)
  ref_logp = zeros
  if obj.needs_ref or cfg.log.kl_to_ref:
    ref_logp, _ = policy_logprobs(state.ref_params, samples, spec, vparams=state.value_params)
  behav_hidden = np.zeros((B, R, 0), np.float32)
  if obj.needs_token_kl:
    behav_hidden = behaviour_hidden(state.sampler_params(), ctx.sampling_cfg, samples, spec,
                                    mismatch=cfg.rollout.mismatch)
  t1 = time.time()
  steps = {}
  if obj.advantage == "grpo_process":  # rewards where each step ends: a process reward model's, or an episode's turns
    placed = ((scores.step_reward_BR, scores.step_end_BR) if scores.step_reward_BR is not None
              else step_rewards(samples, scores.reward_B, cfg.data.format_weight))
    steps = dict(zip(("step_reward_BR", "step_end_BR"), placed))
  kl_ctl = kl_controller.find(ctx.extensions)  # objective.kl_target > 0: this step's adaptive beta
  if kl_ctl is not None:
    obj = kl_ctl.objective(obj)
  adv_BR, returns_BR = obj_lib.batch_advantages(scores.reward_B, keep_B, mask_BR, obj, cfg.rollout.group_size,
                                                prox_logp_BR=prox_logp, ref_logp_BR=ref_logp, values_BR=values,
                                                **steps)
  adv_BR, returns_BR = np.asarray(adv_BR, np.float32), np.asarray(returns_BR, np.float32)
  if faults.point("advantage"):
    adv_BR = adv_BR * np.nan
  stats = {"time/recompute_s": t1 - t0, "time/advantage_s": time.time() - t1}
  if kl_ctl is not None:  # KL_t of this step's samples sets beta_{t+1}
    stats.update(kl_ctl.observe(prox_logp, ref_logp, samples.mask_BR))
  if need_prox:  # log c = log pi_prox - log mu over every sampled token (sampling/mismatch.py)
    stats.update(mismatch_metrics(prox_logp, sharding_lib.fetch(samples.behav_logp_BR), samples.mask_BR))
  extra_BR = {}
  for ext in ctx.extensions:  # in order: each sees the advantages the previous one wrote
    t2 = time.time()
    adv_BR, ext_extra, ext_stats = ext.rewrite_batch(state, samples, scores, adv_BR, mask_BR)
    clash = sorted(set(extra_BR) & set(ext_extra))
    if clash:
      raise ValueError(f"extension {ext.name!r} writes extra_BR keys {clash} that an earlier extension wrote")
    extra_BR.update(ext_extra)
    stats.update(ext_stats)
    stats[f"time/{ext.name}_s"] = time.time() - t2
  stats["adv/abs_mean"] = float(np.abs(adv_BR)[mask_BR].mean()) if mask_BR.any() else 0.0
  if need_prox and (obj.needs_ref or cfg.log.kl_to_ref):
    k3 = np.asarray(obj_lib.kl_penalty(prox_logp, ref_logp, "k3"))
    stats["kl/ref"] = float(k3[samples.mask_BR].mean())
  if cfg.use_value:
    stats["value/mean"] = float(values[samples.mask_BR].mean())
  batch = TrainBatch(
      prompt_BP=samples.prompt_BP, prompt_mask_BP=samples.prompt_mask_BP, tokens_BR=samples.tokens_BR,
      mask_BR=mask_BR, behav_logp_BR=samples.behav_logp_BR, prox_logp_BR=prox_logp, ref_logp_BR=ref_logp,
      adv_BR=adv_BR, returns_BR=returns_BR, old_values_BR=values, topk_ids_BRK=samples.topk_ids_BRK,
      topk_logp_BRK=samples.topk_logp_BRK, behav_hidden_BRD=behav_hidden,
      extra_BR=extra_BR, context_BR=context_BR)
  return batch, stats


def _row_order(rng: np.random.Generator, B: int, G: int, mini: int) -> np.ndarray:
  """A shuffled row order; whole groups stay together when mini-batches hold whole groups."""
  if mini % G == 0:
    groups = rng.permutation(B // G)
    return (groups[:, None] * G + np.arange(G)[None, :]).reshape(-1)
  return rng.permutation(B)


def update_aux(ctx: StepContext, state: TrainState) -> dict:
  """The update's `aux` ({name: array}, no batch axis): the sampler's head for
  TRM's token KL, then each extension's `aux(state)`. Output heads (keys
  ending in `_DV`, [D, V]) are split over the vocabulary like the policy's
  own head (`sharding.head_sharding`); the rest is replicated over the mesh.
  The arrays must not alias the params (the update donates them)."""
  parts = ([behaviour_head(ctx.model_cfg, ctx.sampling_cfg, state, ctx.cfg.rollout.mismatch)]
           if ctx.cfg.objective.needs_token_kl else [])
  parts += [ext.aux(state) for ext in ctx.extensions]
  aux = {}
  for part in parts:
    clash = sorted(set(aux) & set(part))
    if clash:
      raise ValueError(f"update aux: key(s) {clash} returned twice; aux keys must be unique")
    aux.update(part)
  head = sharding_lib.head_sharding(ctx.mesh)
  return {k: sharding_lib.put(v, head if k.endswith("_DV") and sharding_lib.fits(head, v.shape) else ctx.replicated)
          for k, v in aux.items()}


def run_updates(ctx: StepContext, state: TrainState, batch: TrainBatch,
                recorder: dump_lib.FactorRecorder | None = None,
                while_updating: Callable[[], None] | None = None) -> tuple[TrainState, dict]:
  """K passes over the batch, `mini_batches` optimizer updates per pass (`ctx.updater`, training/update.py).

  With a `recorder` (a step of `log.dump_steps`) the updates also return the loss's per-token
  factors, which go to it. `while_updating` runs once every update is launched, before their
  results are read (`rollout.overlap` in a multi-process run: training/async_rollout.py).
  """
  cfg = ctx.cfg
  B = batch.tokens_BR.shape[0]
  mini = cfg.mini_batch_size
  rng = np.random.default_rng([cfg.seed, int(state.step)])
  aux = update_aux(ctx, state)  # before the first update donates the params it may be read from
  ustate = state.update_state()
  per_update, fills, t0 = [], [], time.time()
  n_micro = mini // cfg.micro_batch_size
  prompt_mask, attend = np.asarray(batch.prompt_mask_BP, bool), np.asarray(batch.attend_BR, bool)
  G = cfg.rollout.group_size  # rows dealt to micro-batches in whole groups where they hold whole groups
  unit = G if mini % G == 0 and cfg.micro_batch_size % G == 0 else 1
  for epoch in range(cfg.train.epochs):
    order = _row_order(rng, B, cfg.rollout.group_size, mini) if cfg.train.mini_batches > 1 else np.arange(B)
    for j in range(cfg.train.mini_batches):
      rows = order[j * mini:(j + 1) * mini]
      packing = None
      if ctx.pack is not None and ctx.pack.mode != "off":
        # Packed: micro-batches of balanced token counts, each packed on its own (training/pack.py);
        # None where the padded layout runs them (the rows keep their order then).
        balanced = rows[balanced_order(prompt_mask[rows], attend[rows], chunks=n_micro, unit=unit)]
        packing = ctx.pack.plan(prompt_mask[balanced], attend[balanced], chunks=n_micro)
        rows = balanced if packing is not None else rows
        fills.append(pack_fill(packing))
      mb = sharding_lib.put(jax.tree.map(lambda x: x[rows], batch).replace(packing=packing), ctx.batch_sharding)
      if recorder is None:
        ustate, m = ctx.updater.apply(ustate, mb, aux)
      else:
        ustate, m, factors = ctx.updater.apply_with_factors(ustate, mb, aux)
        recorder.add(epoch, rows, factors)
      per_update.append(m)
      faults.point("update")
  ahead_s = 0.0
  if while_updating is not None:
    t1 = time.time()
    while_updating()
    ahead_s = time.time() - t1
  per_update = sharding_lib.fetch(per_update)
  metrics = mean_over_updates(per_update)
  metrics["update/count"] = len(per_update)
  if fills:  # the share of updates run packed, and their buffers' fill
    packed = [f for f in fills if not np.isnan(f)]
    metrics["pack/update_frac"] = len(packed) / len(fills)
    metrics["pack/fill"] = float(np.mean(packed)) if packed else 0.0
  metrics["update/skipped_nonfinite"] = float(sum(float(m["update/skipped_nonfinite"]) for m in per_update))
  metrics["time/update_s"] = time.time() - t0 - ahead_s
  if while_updating is not None:  # the next step's batch, made here (InlineRollouts) or not (the thread's)
    metrics["time/rollout_ahead_s"] = ahead_s
  return state.with_update(ustate), metrics


def rl_step(ctx: StepContext, state: TrainState, rollouts=None) -> tuple[TrainState, dict]:
  """Step s = state.step: its rollouts, scores, batch and updates.

  `rollouts` (training/async_rollout.AsyncRollouts, `rollout.overlap`) hands over the step's samples,
  generated in the background with the same policy version, key and prompts as here; None: they are
  generated here. Either way the step is the same computation."""
  t0 = time.time()
  lr = float(ctx.lr_schedule(ctx.updates_done(state)))  # this step's first update's rate, before the count moves
  key, k_sample = jax.random.split(state.key)
  # theta_s joins the lag buffer once this step's updates have replaced it, so
  # step s samples with theta_{s-k} (k = staleness); the update donates
  # state.params, hence the copy before it (async: at once, it is step s + k's weights).
  theta_s, first, idle = None, None, 0.0
  if rollouts is not None:
    theta_s = snapshot(state.params)
    rollouts.publish(theta_s)  # step s + k's batch may start now
    first, idle = rollouts.take(int(state.step))
  sb = rollout_and_score(ctx, state, k_sample, first)
  stats = dict(sb.stats)
  # How long the step waited for its samples: generating them here, or blocked on the background thread.
  stats["time/rollout_wait_s"] = stats["time/sync_s"] + stats["time/rollout_s"] if rollouts is None else idle
  stats["time/idle_s"] = idle
  batch, b_stats = build_batch(ctx, state, sb)
  if theta_s is None and state.lag_params:
    theta_s = snapshot(state.params)
  step_no = int(state.step) + 1  # as metrics.jsonl and log.dump_steps count
  recorder = None
  if dump_lib.wanted(ctx.cfg, step_no):
    recorder = dump_lib.FactorRecorder(batch.tokens_BR.shape[0], ctx.cfg.train.epochs)
  state, u_stats = run_updates(ctx, state, batch, recorder,
                               rollouts.while_updating if rollouts is not None else None)
  if theta_s is not None:
    state = state.push_lag(theta_s)
  state = state.replace(step=state.step + 1, key=key, data_state=sb.data_state)
  metrics = {**stats, **b_stats, **u_stats}
  metrics["trust/clip_frac"] = metrics.get("trust/clip_low_frac", 0.0) + metrics.get("trust/clip_high_frac", 0.0)
  metrics["lr"] = lr
  metrics["time/step_s"] = time.time() - t0
  metrics["perf/tokens_per_s"] = metrics["perf/sampled_tokens"] / max(metrics["time/step_s"], 1e-9)
  if recorder is not None:  # the token-weight dump of this step (training/dump.py)
    t1 = time.time()
    dump_lib.write_step(ctx, step_no, sb, batch, recorder, metrics)
    metrics["time/dump_s"] = time.time() - t1
  return state, metrics
