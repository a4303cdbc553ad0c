"""Reward-model training (`python -m jaxrl_llm.reward_model`): from preference pairs, or from
stepwise labels for a process reward model (`objective = "process"`); and Direct Preference
Optimization of the policy from the same pairs (`objective = "dpo"`), on the same run shell and
the same optimizer step.

The run: read and encode the rows (every bad row fails here, before the
workdir exists), build the trunk on the mesh (fresh, `model.hf_path`, or
`init_checkpoint`) and the score head (reward_model/scorer.py), then
`train.steps` AdamW steps on the Bradley-Terry loss (reward_model/loss.py)
or the per-step cross-entropy (reward_model/process.py), scoring the
held-out rows at the start, every `eval.every` steps and at the end. DPO has no
score head: its loss is objectives/preference.py's on the sequence log-probs of the
policy and of the frozen reference pi_ref (the initial params, or `dpo.reference`),
which the step recomputes for each batch without gradient; the pairwise stats are
those of the implicit rewards beta * log(pi / pi_ref). The
workdir holds config.json, metrics.jsonl (+ TensorBoard), checkpoints/ (the
trunk as `params`, so `init_checkpoint` of a later run reads it, and the head
as `reward_head`), summary.json and, with `export`, hf/ (a
Hugging Face sequence- or token-classification folder, reward_model/export.py).

Exact resume: the state is (step, params, head, optimizer state; DPO's reference is saved
beside it as `ref_params`), and the
pairs of step s are a function of (seed, s) alone (`batch_rows`), so a run
restored from step k continues as the uninterrupted run did.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl_llm.checkpointing.init_params import params_from_checkpoint
from jaxrl_llm.checkpointing.run import ExtraTree, plain
from jaxrl_llm.checks import ConfigError
from jaxrl_llm.model import distributed
from jaxrl_llm.model import sharding as sharding_lib
from jaxrl_llm.model.heads import init_reward_head
from jaxrl_llm.model.logprobs import sequence_logprobs
from jaxrl_llm.model.tokenizer import CharTokenizer, check_hf_dir, make_tokenizer
from jaxrl_llm.objectives.aggregation import WeightedSum
from jaxrl_llm.objectives.preference import dpo_loss
from jaxrl_llm.reward_model import data as data_lib
from jaxrl_llm.reward_model import process as process_lib
from jaxrl_llm.reward_model.config import RewardModelConfig, reward_config_from_dict
from jaxrl_llm.reward_model.defaults import reward_model_config
from jaxrl_llm.reward_model.export import check_exportable, save_reward_hf
from jaxrl_llm.reward_model.loss import PairStats, bradley_terry_loss, implicit_reward_summary, pair_stats
from jaxrl_llm.reward_model.scorer import HEAD_KEY, head_shardings, reward_scores, token_scores
from jaxrl_llm.rundir.metrics import write_summary
from jaxrl_llm.checkpointing import provenance
from jaxrl_llm.learn.learner import Group, LearnSpec, LossOut, Slot, make_learner, snapshot
from jaxrl_llm.learn.optim import adamw, warmup_schedule
from jaxrl_llm.learn.shell import RunShell
from jaxrl_llm.model.build import make_model

EXPORT_DIR = "hf"  # <workdir>/hf: the Hugging Face export
REF_KEY = "ref_params"  # DPO's frozen reference in the checkpoint
MODEL = "model"  # the learner's one group: {"params": the trunk, HEAD_KEY: the score head}
LOGPROB_IMPL = "auto"  # DPO's log-probs through the streaming vocabulary kernels (kernels/config.py)


@struct.dataclass
class RewardState:
  step: jax.Array  # int32 [] optimizer steps done
  params: dict  # the trunk (model params, shapes per model.param_shapes)
  reward_head: dict  # {"w_D": f32 [D]} (reward_model/scorer.py), {} for DPO; saved under scorer.HEAD_KEY
  opt_state: tuple  # AdamW state of {"params", "reward_head"}
  data_state: dict = struct.field(pytree_node=False, default_factory=dict)  # empty: the pair order is (seed, step)

  def trees(self) -> dict:
    """What the optimizer updates."""
    return {"params": self.params, HEAD_KEY: self.reward_head}


@dataclasses.dataclass(frozen=True)
class RewardData:
  """The run's rows, encoded once before any model exists: preference pairs (data_lib.PairArrays)
  or, for a process reward model, stepwise solutions (process.StepArrays)."""

  tokenizer: object
  train_rows: list  # data.PreferencePair or process.StepRow
  eval_rows: list
  train: data_lib.PairArrays | process_lib.StepArrays
  eval: data_lib.PairArrays | process_lib.StepArrays
  max_len: int  # T of every sequence
  unit: str  # what a row is: "pairs" or "solutions" (console, summary keys)


def _tokenizer(cfg: RewardModelConfig):
  if cfg.model.hf_path:
    check_hf_dir(cfg.model.hf_path, chat_template=cfg.data.chat_template)
  return make_tokenizer(cfg.model.hf_path)


def preference_data(cfg: RewardModelConfig) -> RewardData:
  """Reads, checks and encodes the train and held-out pairs (ConfigErrors name the file, line and field)."""
  d = cfg.data
  tokenizer = _tokenizer(cfg)
  if cfg.builtin:
    kw = dict(seed=cfg.seed, eval_fraction=d.eval_fraction, label_noise=d.label_noise)
    if d.task == "word_problems":
      pairs = functools.partial(data_lib.word_problem_pairs, max_number=d.max_number, **kw)
    else:
      pairs = functools.partial(data_lib.arithmetic_pairs, digits=d.digits, digits2=d.digits2, ops=d.ops, **kw)
    train_pairs, eval_pairs = pairs("train", d.n_train), pairs("eval", d.n_eval)
  else:
    kw = dict(seed=cfg.seed, eval_fraction=d.eval_fraction)
    train_pairs = data_lib.file_pairs(d.path, d.eval_path, "train", **kw)
    eval_pairs = data_lib.file_pairs(d.path, d.eval_path, "eval", **kw)
  train_ids = data_lib.pair_ids(tokenizer, train_pairs, d.chat_template)
  eval_ids = data_lib.pair_ids(tokenizer, eval_pairs, d.chat_template)
  max_len = d.max_len or data_lib.longest(train_ids + eval_ids)
  enc = lambda pairs, ids: data_lib.encode_pairs(  # noqa: E731
      pairs, ids, max_len=max_len, pad_id=tokenizer.pad_id, default_margin=cfg.train.margin,
      starts=data_lib.response_starts(tokenizer, pairs, ids, d.chat_template))
  return RewardData(tokenizer=tokenizer, train_rows=train_pairs, eval_rows=eval_pairs,
                    train=enc(train_pairs, train_ids), eval=enc(eval_pairs, eval_ids), max_len=max_len, unit="pairs")


def stepwise_data(cfg: RewardModelConfig) -> RewardData:
  """Reads, checks and encodes the train and held-out stepwise rows of a process reward model."""
  d = cfg.data
  tokenizer = _tokenizer(cfg)
  if cfg.builtin:
    kw = dict(n_terms=d.n_terms, digits=d.digits, seed=cfg.seed, eval_fraction=d.eval_fraction,
              label_noise=d.label_noise, truncated_fraction=d.truncated_fraction, step_errors=d.step_errors)
    train_rows = process_lib.chain_rows("train", d.n_train, **kw)
    eval_rows = process_lib.chain_rows("eval", d.n_eval, **kw)
  else:
    kw = dict(seed=cfg.seed, eval_fraction=d.eval_fraction)
    train_rows = process_lib.file_rows(d.path, d.eval_path, "train", **kw)
    eval_rows = process_lib.file_rows(d.path, d.eval_path, "eval", **kw)
  enc = functools.partial(process_lib.encode_rows, tokenizer=tokenizer, separator=d.step_separator,
                          chat_template=d.chat_template, end_step=d.end_step)
  max_len = d.max_len or enc(train_rows + eval_rows, max_len=0).tokens_NT.shape[1]
  return RewardData(tokenizer=tokenizer, train_rows=train_rows, eval_rows=eval_rows,
                    train=enc(train_rows, max_len=max_len, last_step_only=cfg.train.last_step_only),
                    eval=enc(eval_rows, max_len=max_len), max_len=max_len, unit="solutions")


def reward_data(cfg: RewardModelConfig) -> RewardData:
  return stepwise_data(cfg) if cfg.process else preference_data(cfg)


def reward_defaults() -> dict:
  """The reward-model config's flattened defaults (reward_model/defaults.py): a key that a workdir's
  saved config lacks and the new config holds at its default is no change on resume."""
  return provenance.flatten(provenance.plain_config(reward_config_from_dict(reward_model_config())))


def batch_arrays(arrays) -> tuple[np.ndarray, ...]:
  """The arrays of a PairArrays / StepArrays in field order: what the jitted steps take."""
  return tuple(getattr(arrays, f.name) for f in dataclasses.fields(arrays))


def batch_rows(n: int, batch_size: int, seed: int, step: int) -> np.ndarray:
  """Rows of step `step`'s batch: consecutive draws from per-epoch permutations of the n pairs,
  epoch e's permutation seeded by (seed, e): a function of the step alone."""
  q = np.arange(step * batch_size, (step + 1) * batch_size)
  out = np.empty(batch_size, np.int64)
  for epoch in np.unique(q // n):
    at = q // n == epoch
    out[at] = np.random.default_rng([seed, int(epoch)]).permutation(n)[q[at] % n]
  return out


def dpo_objective(params, ref_params, model_cfg, batch, weight_B, dpo) -> tuple[WeightedSum, PairStats]:
  """DPO's loss (objectives/preference.py) on a batch of PairArrays fields (chosen in slot 0, rejected in
  slot 1) and the stats of its implicit rewards; pi_ref's log-probs are recomputed here without gradient.
  `dpo`: the config's DPOConfig."""
  tokens_B2T, mask_B2T, _, response_B2T = batch
  B, _, T = tokens_B2T.shape
  seqs = [a.reshape(2 * B, T) for a in (tokens_B2T, mask_B2T, response_B2T)]
  pi_B2 = sequence_logprobs(params, model_cfg, *seqs, impl=LOGPROB_IMPL).reshape(B, 2)
  ref_B2 = jax.lax.stop_gradient(sequence_logprobs(ref_params, model_cfg, *seqs, impl=LOGPROB_IMPL).reshape(B, 2))
  out = dpo_loss(pi_B2[:, 0], pi_B2[:, 1], ref_B2[:, 0], ref_B2[:, 1], weight_B, beta=dpo.beta,
                 loss_type=dpo.loss_type, label_smoothing=dpo.label_smoothing)
  r_c, r_r = jax.lax.stop_gradient((out.reward_chosen_B, out.reward_rejected_B))
  return out.loss, pair_stats(r_c, r_r, weight_B)


def reward_loss(trees: dict, mb, ref: dict, norm, *, model_cfg, center_coef: float, process: bool, dpo) -> LossOut:
  """The configured objective on one micro-batch, a `LossFn` of the learner (learn/learner.py): the
  Bradley-Terry loss (loss.py), the process reward model's per-step cross-entropy (process.py) or DPO
  (`dpo`: the config's DPOConfig; `ref`: pi_ref's params). mb = (the PairArrays / StepArrays fields,
  weight_B); `norm`: the loss's denominator on the whole batch (`pair_norm` / `process_norm`), which
  makes the objective this micro-batch's exact share; sums: the batch's PairStats / StepStats."""
  batch, weight_B = mb
  params, head = trees[MODEL]["params"], trees[MODEL][HEAD_KEY]
  if dpo is not None:
    loss, stats = dpo_objective(params, ref, model_cfg, batch, weight_B, dpo)
  elif process:  # process.py: a score at every token, the loss and stats at the step ends
    tokens_BT, mask_BT, label_BT, step_BT = batch
    s_BT = token_scores(params, head, model_cfg, tokens_BT, mask_BT)
    loss = process_lib.process_bce_loss(s_BT, label_BT, step_BT, weight_B)
    stats = process_lib.step_stats(jax.lax.stop_gradient(s_BT), label_BT, step_BT, weight_B)
  else:  # loss.py: a score per sequence, chosen (slot 0) against rejected (slot 1)
    tokens_B2T, mask_B2T, margin_B, _ = batch
    B, _, T = tokens_B2T.shape
    r_B2 = reward_scores(params, head, model_cfg, tokens_B2T.reshape(2 * B, T),
                         mask_B2T.reshape(2 * B, T)).reshape(B, 2)
    loss = bradley_terry_loss(r_B2[:, 0], r_B2[:, 1], margin_B, weight_B, center_coef=center_coef)
    r_B2 = jax.lax.stop_gradient(r_B2)
    stats = pair_stats(r_B2[:, 0], r_B2[:, 1], weight_B)
  return LossOut(objective=WeightedSum(loss.numerator, norm).value(), loss=loss, sums=stats)


def pair_norm(mb) -> jax.Array:
  """The pair losses' denominator on the whole batch: the pairs' total weight."""
  return jnp.sum(mb[1].astype(jnp.float32))


def process_norm(mb) -> jax.Array:
  """The process loss's denominator on the whole batch: the weighted count of labelled step ends."""
  (_, _, _, step_NT), weight_N = mb
  return jnp.sum(step_NT.astype(jnp.float32) * weight_N.astype(jnp.float32)[:, None])


def reward_optimizer(cfg: RewardModelConfig):
  """(the learning-rate schedule, the AdamW transformation) of the run's `train` section."""
  tr = cfg.train
  schedule = warmup_schedule(tr.lr, tr.warmup_steps, tr.steps, decay_to=tr.lr_decay_to)
  return schedule, adamw(schedule, b1=tr.b1, b2=tr.b2, weight_decay=tr.weight_decay, clip_norm=tr.clip_norm)


def micro_batch_size(cfg: RewardModelConfig) -> int:
  """Rows per micro-batch: train.micro_batch_size, or where it is 0 the whole batch (train.batch_size)."""
  return cfg.train.micro_batch_size or cfg.train.batch_size


def reward_steps(cfg: RewardModelConfig, model_cfg, tx, batch_shardings, rows_sharding, slots: dict, ref_sharding):
  """(the learner's optimizer step, the jitted held-out step) of the configured objective for a state
  placed like `slots` ({MODEL: Slot(trees, opt_state)}, arrays or shapes) and DPO's reference like
  `ref_sharding`: what `RewardModelRun` runs and the compile command lowers (tpu/reward_programs.py)."""
  loss_fn = functools.partial(reward_loss, model_cfg=model_cfg, center_coef=cfg.train.center_coef,
                              process=cfg.process, dpo=cfg.dpo if cfg.dpo_run else None)
  norms_fn = process_norm if cfg.process else pair_norm
  spec = LearnSpec(loss_fn=loss_fn, norms_fn=norms_fn, groups=(Group(MODEL, tx),),
                   n_micro=cfg.train.batch_size // micro_batch_size(cfg),
                   report=lambda out: {"loss": out.loss, "stats": out.sums, "grad_norm": out.grad_norm[MODEL],
                                       "skipped": out.skipped[MODEL]})
  learner = make_learner(spec, slots, {MODEL: None}, (batch_shardings, rows_sharding), aux_sharding=ref_sharding)

  @functools.partial(jax.jit, in_shardings=(jax.tree.map(lambda a: a.sharding, slots[MODEL].params),
                                            (batch_shardings, rows_sharding), ref_sharding))
  def eval_step(trees, batch, ref):
    out = loss_fn({MODEL: trees}, batch, ref, norms_fn(batch))
    return out.loss, out.sums

  return learner, eval_step


class RewardModelRun:
  """One reward-model run in `workdir`: `run()` does everything (see the module docstring)."""

  def __init__(self, cfg: RewardModelConfig, workdir: str, *, log: Callable[[str], None] = print, devices=None,
               allow_config_change: bool = False):
    self.cfg, self.workdir, self.log = cfg, workdir, log
    self.mesh = sharding_lib.make_mesh(cfg.mesh, devices)
    shards = sharding_lib.batch_shards(self.mesh)
    self.micro_batch_size = micro_batch_size(cfg)
    if self.micro_batch_size % shards:
      field = "micro_batch_size" if cfg.train.micro_batch_size else "batch_size"
      raise ConfigError(f"config.train.{field}={getattr(cfg.train, field)} must be a multiple of the {shards} batch "
                        "shards of the mesh (mesh.data x mesh.fsdp)")
    self.shell = RunShell(workdir, cfg, checkpoint_cfg=cfg.checkpoint, log=log,
                          allow_config_change=allow_config_change, defaults=reward_defaults)
    self.shell.check_workdir("a reward model's workdir")
    for field, path in (("init_checkpoint", cfg.init_checkpoint), ("dpo.reference", cfg.dpo.reference)):
      if path and not os.path.isdir(path):
        raise ConfigError(f"config.{field}={path!r} is not a directory: expected a run's workdir or a Hugging Face "
                          "directory")
    self.data = reward_data(cfg)
    if cfg.export:
      check_exportable(cfg, self.data)
    self.schedule, self.tx = reward_optimizer(cfg)
    self.batch_shardings = tuple(sharding_lib.batch_sharding(self.mesh, ndim=a.ndim)
                                 for a in batch_arrays(self.data.train))
    self.rows1 = sharding_lib.batch_sharding(self.mesh, ndim=1)
    self.model_cfg = None
    self.ref_params = {}  # DPO's frozen pi_ref (`reference`); {} otherwise

  # ---- state -----------------------------------------------------------------------
  def init_state(self) -> RewardState:
    k_model, k_head = jax.random.split(jax.random.key(self.cfg.seed))
    self.model_cfg, params = make_model(self.cfg.model, self.data.tokenizer, self.mesh, k_model)
    head = {} if self.cfg.dpo_run else jax.jit(functools.partial(init_reward_head, self.model_cfg.d_model),
                                               out_shardings=head_shardings(self.mesh))(k_head)
    step = sharding_lib.put(jnp.zeros((), jnp.int32), sharding_lib.replicated(self.mesh))
    opt_state = sharding_lib.onto_mesh(self.tx.init({"params": params, HEAD_KEY: head}), self.mesh)
    return RewardState(step=step, params=params, reward_head=head, opt_state=opt_state)

  def reference(self, state: RewardState, resuming: bool) -> dict:
    """DPO's pi_ref: `dpo.reference`'s params, else a copy of the initial ones (a resumed run restores the
    saved reference into this copy's structure)."""
    path = self.cfg.dpo.reference
    if path and not resuming:
      params, source = params_from_checkpoint(path, state.params, self.model_cfg)
      self.log(f"dpo.reference: params from {source}")
      return params
    return snapshot(state.params)

  def _compile(self, state: RewardState) -> None:
    ref_sh = jax.tree.map(lambda a: a.sharding, self.ref_params)
    self.learner, self.eval_step = reward_steps(self.cfg, self.model_cfg, self.tx, self.batch_shardings,
                                                self.rows1, {MODEL: Slot(state.trees(), state.opt_state)}, ref_sh)

  def _device_batch(self, arrays, weight_B: np.ndarray):
    """(the arrays of `arrays` on the mesh, weight_B on the mesh)."""
    batch = tuple(sharding_lib.put(a, sh) for a, sh in zip(batch_arrays(arrays), self.batch_shardings))
    return batch, sharding_lib.put(weight_B.astype(np.float32), self.rows1)

  # ---- stages -------------------------------------------------------------------
  def evaluate(self, state: RewardState) -> dict:
    """Loss and the stats' summary (loss.PairStats / process.StepStats) on the held-out rows (padding
    rows weigh 0)."""
    arrays, B = self.data.eval, self.cfg.train.batch_size
    loss_num = loss_den = 0.0
    stats = None
    for start in range(0, len(arrays), B):
      idx = np.arange(start, start + B)
      weight = (idx < len(arrays)).astype(np.float32)
      batch = arrays.take(np.where(idx < len(arrays), idx, 0))
      with jax.sharding.use_abstract_mesh(self.mesh.abstract_mesh):  # the attention and vocabulary kernels
        loss, s = self.eval_step(state.trees(), self._device_batch(batch, weight), self.ref_params)
      loss, s = sharding_lib.fetch((loss, s))  # whole in every process (a collective where rows span processes)
      loss_num, loss_den = loss_num + float(loss.numerator), loss_den + float(loss.denominator)
      stats = s if stats is None else stats + s
    return {"loss": loss_num / max(loss_den, 1.0), **self._summary(stats), "n": len(arrays)}

  def _summary(self, stats) -> dict:
    """The stats' host summary; DPO's adds the mean chosen and rejected implicit rewards."""
    return implicit_reward_summary(stats) if self.cfg.dpo_run else stats.summary()

  def train_batch(self, state: RewardState) -> tuple[RewardState, dict]:
    """One optimizer step on step `state.step`'s pairs; -> (state, the step's metrics)."""
    t0 = time.time()
    step = int(state.step)
    rows = batch_rows(len(self.data.train), self.cfg.train.batch_size, self.cfg.seed, step)
    batch = self._device_batch(self.data.train.take(rows), np.ones(len(rows), np.float32))
    with jax.sharding.use_abstract_mesh(self.mesh.abstract_mesh):  # as the RL step: kernels see the mesh
      slots, out = self.learner.apply({MODEL: Slot(state.trees(), state.opt_state)}, {MODEL: None}, batch,
                                      self.ref_params)
    trees = slots[MODEL].params
    state = state.replace(params=trees["params"], reward_head=trees[HEAD_KEY], opt_state=slots[MODEL].opt_state,
                          step=state.step + 1)
    out = sharding_lib.fetch(out)  # the step's loss and stats, whole in every process
    s = self._summary(out["stats"])
    metrics = {"train/loss": float(out["loss"].value()), **{f"train/{k}": v for k, v in s.items()},
               "update/grad_norm": float(out["grad_norm"]), "update/skipped_nonfinite": float(out["skipped"]),
               "update/lr": float(self.schedule(step)), "time/step_s": time.time() - t0}
    return state, metrics

  def run(self, stop_after: int | None = None) -> dict:
    """The whole run -> summary.json's dict. `stop_after` (tests of resume): return after that many steps
    of this call, saved as an interrupted run would be, with {"stopped_at_step": k} and no summary."""
    cfg, t_start = self.cfg, time.time()
    state = self.init_state()
    ckpt, resuming = self.shell.open(self.model_cfg)
    if cfg.init_checkpoint and not resuming:
      state = ckpt.init_params(state, cfg.init_checkpoint, None)
    if cfg.dpo_run:
      self.ref_params = self.reference(state, resuming)
      ckpt.add_trees({REF_KEY: ExtraTree(get=lambda: self.ref_params,
                                         set=functools.partial(setattr, self, "ref_params"))})
    self._compile(state)
    # -- checkpoint restore point: the saved state replaces the fresh one; the start eval is the saved one.
    if resuming:
      state, saved = ckpt.restore(state, lambda _: None)
      ev_start = saved["ev_start"]
    else:
      ev_start = self.evaluate(state)
      ckpt.extra.update(ev_start=plain(ev_start))
    self.log(f"{cfg.name}: {len(self.data.train)} training {self.data.unit}, {len(self.data.eval)} held-out, "
             f"{self.data.max_len} tokens per sequence; held-out accuracy {ev_start['accuracy']:.3f} at step "
             f"{int(state.step)}" + (" (saved)" if resuming else ""))
    last_eval = {}  # the held-out evaluation of the loop's last evaluated step

    def evaluate(state):
      last_eval.update(step=int(state.step), ev=self.evaluate(state))
      return {k: v for k, v in last_eval["ev"].items() if k != "n"}

    def after_step(state, metrics, written):
      if written:
        ev = " ".join(f"{k} {metrics[f'eval/{k}']:.3f}" for k in ("accuracy", "ece") if f"eval/{k}" in metrics)
        self.log(f"step {int(state.step)}/{cfg.train.steps}: loss {metrics['train/loss']:.4f} accuracy "
                 f"{metrics['train/accuracy']:.3f}" + (f"; held-out {ev}" if ev else ""))

    state, stopped = self.shell.steps(state, total=cfg.train.steps, step_fn=self.train_batch, evaluate=evaluate,
                                      eval_every=cfg.eval.every, eval_last=True, log_every=cfg.log.every,
                                      after_step=after_step, stop_after=stop_after)
    if stopped is not None:
      ckpt.mngr.close()
      return {"stopped_at_step": stopped, "workdir": self.workdir}
    ckpt.finish(state)
    ev_end = last_eval["ev"] if last_eval.get("step") == int(state.step) else self.evaluate(state)
    export_dir = self.export(state) if cfg.export else ""
    history = ckpt.extra.get("history", [])
    summary = {
        "name": cfg.name, "objective": cfg.objective, "workdir": self.workdir, "steps": int(state.step),
        f"train_{self.data.unit}": len(self.data.train), f"eval_{self.data.unit}": len(self.data.eval),
        "max_len": self.data.max_len,
        "label_noise": cfg.data.label_noise if cfg.builtin else None,
        "eval_accuracy_start": ev_start["accuracy"], "eval_accuracy_end": ev_end["accuracy"],
        "eval_ece_end": ev_end["ece"], "eval_loss_end": ev_end["loss"],
        **({"eval_first_error_accuracy_end": ev_end["first_error_accuracy"],
            "eval_processbench_f1_end": ev_end["processbench_f1"]} if cfg.process else
           {"eval_margin_end": ev_end["margin"]}),
        **({"eval_margin_start": ev_start["margin"], "eval_chosen_end": ev_end["chosen"],
            "eval_rejected_end": ev_end["rejected"]} if cfg.dpo_run else {}),
        "train_loss_first": history[0]["train/loss"] if history else None,
        "train_loss_last": history[-1]["train/loss"] if history else None,
        "skipped_updates": float(sum(m["update/skipped_nonfinite"] for m in history)),
        "export_dir": export_dir, "run_time_s": time.time() - t_start,
    }
    if distributed.is_primary():  # the run's files are process 0's (every process holds the same values)
      write_summary(self.workdir, summary)
    self.final_state = state
    return summary

  def export(self, state: RewardState) -> str:
    """<workdir>/hf as a Hugging Face sequence-classification folder (reward_model/export.py); -> its path."""
    out = os.path.join(self.workdir, EXPORT_DIR)
    tok, hf_path = self.data.tokenizer, self.cfg.model.hf_path
    if isinstance(tok, CharTokenizer):
      # the tokenizer files (process 0's) and the special ids config.json keeps
      base = (tok.save_pretrained(out) if distributed.is_primary() else
              {"pad_token_id": tok.pad_id, "eos_token_id": tok.eos_id, "bos_token_id": tok.bos_id})
    else:
      from jaxrl_llm.model.io.hf_io import read_hf_config

      base = read_hf_config(hf_path)
    save_reward_hf(state.params, state.reward_head, self.model_cfg, out, pad_id=tok.pad_id, base_config=base,
                   tokenizer_dir=hf_path or None, process=self.cfg.process)
    kind = "AutoModelForTokenClassification" if self.cfg.process else "AutoModelForSequenceClassification"
    self.log(f"exported the reward model to {out} (transformers' {kind})")
    return out
