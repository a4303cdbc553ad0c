"""The run: set up, SFT warm start, evaluate, RL steps, evaluate, summarise.

`Trainer` holds what does not change during a run (configs, mesh, compiled
update, data pipeline); everything that does is in the `TrainState` pytree.
The two checkpoint points are marked in `run`: restore right after the
initial state is built, save at the end of each step.
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from jaxrl_llm.checkpointing.config import CheckpointConfig
from jaxrl_llm.checkpointing.run import RunCheckpoints, plain
from jaxrl_llm.report import write_report_safely
from jaxrl_llm.training import mesh as mesh_lib
from jaxrl_llm.training import setup
from jaxrl_llm.training import teacher as teacher_lib
from jaxrl_llm.training.batch import init_value_head
from jaxrl_llm.training.config import RunConfig
from jaxrl_llm.training.data import PromptPipeline
from jaxrl_llm.training.evaluation import greedy_accuracy
from jaxrl_llm.training.metrics import MetricsWriter, Progress
from jaxrl_llm.training.optim import adamw, warmup_schedule
from jaxrl_llm.training.recompute import behaviour_head
from jaxrl_llm.training.rollout import sampling_config
from jaxrl_llm.training.sft import run_sft
from jaxrl_llm.training.state import TrainState
from jaxrl_llm.training.step import rl_step
from jaxrl_llm.training.update import UpdateSpec, update_step

# hook(trainer, state, metrics) after every RL step (checkpoints, reports, ...).
StepHook = Callable[["Trainer", TrainState, dict], None]
# provider(trainer, state) -> {name: array}: inputs of the update without a batch
# axis (an output head, say), read once per step before the updates; see
# `Trainer.update_aux`. The arrays must not alias the params (they are donated).
AuxProvider = Callable[["Trainer", TrainState], dict]


class Trainer:
  def __init__(self, cfg: RunConfig, workdir: str, *, log: Callable[[str], None] = print,
               extra_terms=(), extra_inputs=None, devices=None):
    self.cfg, self.workdir, self.log = cfg, workdir, log
    self.mesh = mesh_lib.make_mesh(cfg.mesh, devices)
    self.batch_sharding = mesh_lib.batch_sharding(self.mesh)
    shards = mesh_lib.batch_shards(self.mesh)
    for name, size in (("rollout.prompts_per_step", cfg.rollout.prompts_per_step),
                       ("train.micro_batch_size (or the mini-batch)", cfg.micro_batch_size)):
      if size % shards:
        raise ValueError(f"config.{name}={size} must be a multiple of the {shards} batch shards of the mesh "
                         f"(mesh.data x mesh.fsdp)")
    self.eval_pad = shards
    self.tokenizer = setup.make_tokenizer(cfg)
    self.task = setup.make_task(cfg)
    self.runner = setup.make_reward_runner(cfg, self.task)
    self.train_examples = self.task.examples("train", cfg.task.n_train)
    self.eval_examples = self.task.examples("eval", cfg.eval.n_examples)
    self.pipeline = PromptPipeline(self.train_examples, self.tokenizer, batch_size=cfg.rollout.prompts_per_step,
                                   max_prompt_len=cfg.data.max_prompt_len, seed=cfg.seed,
                                   chat_template=cfg.data.chat_template)
    self.sampling_cfg = sampling_config(cfg.rollout, self.tokenizer)
    self._extra_inputs = extra_inputs
    self.hooks: list[StepHook] = []

    tr = cfg.train
    total_updates = tr.steps * tr.epochs * tr.mini_batches
    self.lr_schedule = warmup_schedule(tr.lr, tr.warmup_steps, total_updates, decay_to=tr.lr_decay_to)
    self.tx = adamw(self.lr_schedule, b1=tr.b1, b2=tr.b2, weight_decay=tr.weight_decay, clip_norm=tr.clip_norm)
    self.vtx = adamw(warmup_schedule(tr.value_lr, tr.warmup_steps), b1=tr.b1, b2=tr.b2, weight_decay=0.0,
                     clip_norm=tr.clip_norm)
    self.extra_terms = tuple(extra_terms)
    self.aux_providers: list[AuxProvider] = []
    if cfg.objective.needs_token_kl:
      self.aux_providers.append(behaviour_head)  # TRM's mu: the sampler's output head
    self.model_cfg = None
    self.update_fn = None

  # ---- helpers the step uses ----------------------------------------------------
  def updates_done(self, state: TrainState) -> int:
    return int(state.step) * self.cfg.train.epochs * self.cfg.train.mini_batches

  def snapshot(self, params):
    """A copy of params (the update donates its inputs, a snapshot must outlive them)."""
    return jax.tree.map(jnp.copy, params)

  def ref_params(self, state: TrainState):
    return state.ref_params

  def extra_inputs(self, state: TrainState, samples) -> dict:
    """Extra per-token loss inputs ({name: f32 [B, R]}), e.g. a teacher's log-probs."""
    return self._extra_inputs(self, state, samples) if self._extra_inputs else {}

  def update_aux(self, state: TrainState) -> dict:
    """The update's `aux` ({name: array}, no batch axis): the merged outputs of
    `aux_providers`, replicated over the mesh."""
    aux = {}
    for provider in self.aux_providers:
      part = provider(self, state)
      clash = sorted(set(aux) & set(part))
      if clash:
        raise ValueError(f"Trainer.aux_providers: {provider!r} returns key(s) {clash} that an earlier "
                         "provider already returned; aux keys must be unique")
      aux.update(part)
    return jax.device_put(aux, mesh_lib.replicated(self.mesh))

  # ---- building ------------------------------------------------------------------
  def _opt_init(self, tx, params):
    return mesh_lib.onto_mesh(tx.init(params), self.mesh)

  def init_state(self, key) -> TrainState:
    k_model, k_value, k_run = jax.random.split(key, 3)
    self.model_cfg, params = setup.make_model(self.cfg, self.tokenizer, self.mesh, k_model)
    vparams = jax.device_put(init_value_head(self.model_cfg.d_model, k_value), mesh_lib.replicated(self.mesh))
    # Step and key live replicated on the mesh like every other leaf, so a
    # checkpoint restores them there (a restored leaf committed to one device
    # would not mix with the mesh's arrays).
    step, k_run = jax.device_put((jnp.zeros((), jnp.int32), k_run), mesh_lib.replicated(self.mesh))
    return TrainState(step=step, params=params, opt_state=self._opt_init(self.tx, params),
                      value_params=vparams, value_opt_state=self._opt_init(self.vtx, vparams), ref_params=None,
                      lag_params=(), key=k_run, data_state=self.pipeline.get_state())

  def start_rl(self, state: TrainState) -> TrainState:
    """After the warm start: fresh optimizer, frozen reference, staleness buffer."""
    cfg = self.cfg
    need_ref = cfg.objective.needs_ref or cfg.log.kl_to_ref
    state = state.replace(
        opt_state=self._opt_init(self.tx, state.params),
        ref_params=self.snapshot(state.params) if need_ref else None,
        lag_params=tuple(self.snapshot(state.params) for _ in range(cfg.rollout.staleness)))
    self._compile_update(state)
    return state

  def _compile_update(self, state: TrainState) -> None:
    cfg = self.cfg
    spec = UpdateSpec(model_cfg=self.model_cfg, objective=cfg.objective, group_size=cfg.rollout.group_size,
                      n_micro=cfg.mini_batch_size // cfg.micro_batch_size, temperature=cfg.rollout.temperature,
                      impl=cfg.kernels.impl, use_value=cfg.use_value, extra_terms=self.extra_terms)
    sh = lambda tree: jax.tree.map(lambda a: a.sharding, tree)  # noqa: E731
    shardings = (sh(state.params), sh(state.opt_state), sh(state.value_params), sh(state.value_opt_state))
    # The four state trees are donated: the update replaces them, the old buffers are dead.
    # `aux` (update_aux) is replicated and not donated: the step's updates share it.
    self.update_fn = jax.jit(functools.partial(update_step, spec=spec, tx=self.tx, vtx=self.vtx),
                             in_shardings=shardings + (self.batch_sharding, mesh_lib.replicated(self.mesh)),
                             out_shardings=shardings + (mesh_lib.replicated(self.mesh),),
                             donate_argnums=(0, 1, 2, 3))

  # ---- stages of the run -----------------------------------------------------------
  def warm_start(self, state: TrainState) -> tuple[TrainState, dict]:
    c = self.cfg
    params, info = run_sft(state.params, self.model_cfg, self.train_examples, self.tokenizer, steps=c.sft.steps,
                           batch_size=c.sft.batch_size, lr=c.sft.lr, warmup_steps=c.sft.warmup_steps,
                           max_prompt_len=c.data.max_prompt_len, max_response_len=c.rollout.max_response_len,
                           seed=c.seed, impl=c.kernels.impl, mesh=self.mesh, chat_template=c.data.chat_template,
                           log=self.log)
    return state.replace(params=params), info

  def evaluate(self, state: TrainState) -> dict:
    return greedy_accuracy(state.params, self.model_cfg, self.eval_examples, self.tokenizer, self.runner,
                           self.cfg.rollout, max_prompt_len=self.cfg.data.max_prompt_len,
                           chat_template=self.cfg.data.chat_template, key=jax.random.key(0),
                           batch_sharding=self.batch_sharding, pad_to=self.eval_pad)

  def run(self, state: TrainState | None = None) -> dict:
    cfg, t_start = self.cfg, time.time()
    os.makedirs(self.workdir, exist_ok=True)
    with open(os.path.join(self.workdir, "config.json"), "w") as f:
      json.dump(cfg.to_dict(), f, indent=2, default=str)
    state = self.init_state(jax.random.key(cfg.seed)) if state is None else state
    ckpt = RunCheckpoints(self.workdir, cfg.checkpoint or CheckpointConfig(), run_config=cfg,
                          model_config=self.model_cfg, log=self.log)
    resuming = ckpt.resume_step() is not None
    if cfg.init_checkpoint and not resuming:
      state = ckpt.init_params(state, cfg.init_checkpoint, None)
    if resuming and not getattr(cfg.teacher, "enabled", False):
      sft_info = {}  # the warm-started params are in the checkpoint; a teacher may need the warm start again
    else:
      state, sft_info = self.warm_start(state)
    state = teacher_lib.attach(self, state)  # the teacher (if any) before the update compiles
    state = self.start_rl(state)
    # -- checkpoint restore point: a saved TrainState replaces `state` here, and
    #    the pipeline is put back at state.data_state; the start eval is the saved one.
    if resuming:
      state, saved = ckpt.restore(self, state)
      ev_start, sft_info, history = saved["ev_start"], saved["sft_info"], list(saved.get("history", []))
    else:
      ev_start, history = self.evaluate(state), []
      ckpt.extra.update(ev_start=plain(ev_start), sft_info=plain(sft_info))
    self.log(f"eval (greedy, {ev_start['n']} held-out): accuracy {ev_start['accuracy']:.3f}")
    writer = MetricsWriter(self.workdir, start_step=int(state.step))
    bar = Progress(cfg.train.steps, cfg.log.progress, desc=cfg.method)
    self.hooks.append(ckpt.hook)
    try:
      for _ in range(int(state.step), cfg.train.steps):
        state, metrics = rl_step(self, state)
        step = int(state.step)
        if cfg.eval.every and step % cfg.eval.every == 0 and step < cfg.train.steps:
          metrics.update({f"eval/{k}": v for k, v in self.evaluate(state).items()})
        if step % cfg.log.every == 0 or step == cfg.train.steps:
          writer.write(step, metrics)
        history.append(metrics)
        bar.update(metrics)
        # -- checkpoint save point: hooks see the complete state after each step.
        for hook in self.hooks:
          hook(self, state, metrics)
    finally:
      bar.close()
      writer.close()
      self.runner.close()
      ckpt.mngr.wait()  # a save in flight completes even when a step raised
    ckpt.finish(state, history[-1] if history else None)
    ev_end = self.evaluate(state)
    self.log(f"eval (greedy, {ev_end['n']} held-out): accuracy {ev_end['accuracy']:.3f}")
    summary = {
        "method": cfg.method, "workdir": self.workdir, "rl_steps": int(state.step),
        "eval_accuracy_start": ev_start["accuracy"], "eval_accuracy_end": ev_end["accuracy"],
        "eval_gain": ev_end["accuracy"] - ev_start["accuracy"],
        "eval_response_length_end": ev_end["response_length"],
        "train_reward_first": float(history[0]["reward/mean"]) if history else None,
        "train_reward_last": float(history[-1]["reward/mean"]) if history else None,
        "skipped_updates": float(sum(m["update/skipped_nonfinite"] for m in history)),
        "reward_failures": int(sum(m["reward/failed"] + m["reward/timed_out"] for m in history)),
        **{k: v for k, v in sft_info.items()},
        "run_time_s": time.time() - t_start,
    }
    with open(os.path.join(self.workdir, "summary.json"), "w") as f:
      json.dump(summary, f, indent=2)
    write_report_safely(self.workdir, self.log)
    self.final_state = state
    self.history = history
    return summary
