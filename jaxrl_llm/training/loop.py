"""The run: set up, SFT warm start, extensions, evaluate, RL steps, evaluate, summarise.

`Trainer` builds what does not change during a run (configs, mesh, data
pipeline, rollout engine, compiled update) and hands it to the stages as one
frozen `StepContext` (training/context.py); everything that changes is in the
`TrainState` pytree. Extensions (jaxrl_llm/extension.py) join at fixed
points: the ones passed to the constructor, then the ones the config's
sections turn on (training/extensions.py). The two checkpoint points: restore
in `_begin`, right after the initial state is built; save at the end of each
step, in the step loop of the run shell (learn/shell.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import optax

from jaxrl_llm.model import distributed, lora
from jaxrl_llm.model.heads import init_value_head
from jaxrl_llm.checkpointing.run import RunCheckpoints, plain
from jaxrl_llm.checks import ConfigError
from jaxrl_llm.extension import Extension, SetupEnv
from jaxrl_llm.model import sharding as sharding_lib
from jaxrl_llm.rundir.metrics import write_summary
from jaxrl_llm.rundir.report_figure import write_report_safely
from jaxrl_llm.sampling.engine import make_engine
from jaxrl_llm.sampling.exact import ExactEngine
from jaxrl_llm.tasks.pipeline import PromptPipeline, check_prompts
from jaxrl_llm.tasks.rewards import RewardRunner
from jaxrl_llm.training import inputs, provenance
from jaxrl_llm.training.async_rollout import AsyncRollouts, InlineRollouts
from jaxrl_llm.training.config import RunConfig
from jaxrl_llm.learn.learner import snapshot
from jaxrl_llm.model.build import make_model
from jaxrl_llm.training.context import StepContext
from jaxrl_llm.training.episodes import EpisodeEngine, episode_player
from jaxrl_llm.training.evaluation import Evaluator
from jaxrl_llm.training.extensions import extensions_for
from jaxrl_llm.training.guards import SignalGuard
from jaxrl_llm.training.metrics import Progress
from jaxrl_llm.training.optimizers import run_optimizers
from jaxrl_llm.learn.shell import RunShell
from jaxrl_llm.training.sft import run_sft, sft_plan
from jaxrl_llm.training.state import TrainState
from jaxrl_llm.training.step import rl_step
from jaxrl_llm.training.pack import PackPolicy
from jaxrl_llm.training.update import Updater, UpdateSpec, make_updater

# hook(trainer, state, metrics) after every RL step (checkpoints, reports, ...).
StepHook = Callable[["Trainer", TrainState, dict], None]


@dataclasses.dataclass(frozen=True)
class _Start:
  """Where the RL steps begin: the start evaluation, the warm start's info and, on resume, the steps' metrics."""

  ev_start: dict  # the greedy evaluation before RL (the saved one on resume)
  sft_info: dict  # the warm start's summary entries
  history: tuple  # metrics of the steps already taken (resume)


class Trainer:
  def __init__(self, cfg: RunConfig, workdir: str, *, log: Callable[[str], None] = print,
               extensions: Sequence[Extension] = (), devices=None, allow_config_change: bool = False,
               reward: RewardRunner | None = None, optimizer: optax.GradientTransformation | None = None):
    """`reward` replaces the config's reward runner and `optimizer` the policy's AdamW (both: tests,
    experiments); the rest comes from `cfg`."""
    self.workdir, self.log = workdir, log
    data = inputs.run_data(cfg, devices)
    cfg = data.cfg  # data.max_prompt_len resolved
    self.data, self.mesh, self.batch_sharding = data, data.mesh, data.batch_sharding
    shards = data.batch_shards
    inputs.check_batch_shards(cfg, shards)
    self.extensions: tuple[Extension, ...] = tuple(extensions) + extensions_for(cfg)
    names = [e.name for e in self.extensions]
    if len(set(names)) != len(names):
      raise ValueError(f"Trainer: extensions {names} hold a name twice (is one passed and also turned on "
                       "by the config?)")
    self.tokenizer, self.task = data.tokenizer, data.task
    self.runner = reward if reward is not None else inputs.make_reward_runner(cfg, self.task)
    self.train_examples, self.eval_examples = data.train_examples, data.eval_examples
    cfg = self.cfg = cfg.with_micro_batch(cfg.data.max_prompt_len, shards)  # 0: from train.micro_batch_tokens
    cfg.check_pack_length()
    # The workdir, its config record (the resolved config), checkpoints and the step loop (learn/shell.py);
    # allow_config_change: resume a workdir whose saved config differs (recorded).
    self.shell = RunShell(workdir, cfg, checkpoint_cfg=cfg.checkpoint, log=log, allow_config_change=allow_config_change,
                          defaults=lambda: provenance.run_defaults(cfg.method))
    self.pipeline = PromptPipeline(self.train_examples, self.tokenizer, batch_size=cfg.rollout.prompts_per_step,
                                   max_prompt_len=cfg.data.max_prompt_len, seed=cfg.seed,
                                   chat_template=cfg.data.chat_template)
    self.sampling_cfg = cfg.rollout.sampling(self.tokenizer)
    # With an environment: what plays its episodes (and owns the tool workers), for the rollouts and
    # the evaluations (training/episodes.py); None for single-turn samples.
    self.episodes = episode_player(cfg, self.task, self.tokenizer)
    self.hooks: list[StepHook] = []

    opts = run_optimizers(cfg)
    self.lr_schedule, self.tx, self.vtx = opts.lr_schedule, optimizer or opts.tx, opts.vtx
    self.model_cfg = None
    self.engine = None  # the rollout engine, made once the model config is known (rollout_engine)
    self.context: StepContext | None = None  # built by start_rl

  # ---- views -------------------------------------------------------------------------
  @property
  def evaluator(self) -> Evaluator:
    return dataclasses.replace(self.data, cfg=self.cfg).evaluator(self.model_cfg, self.runner, self.episodes)

  def extension(self, name: str) -> Extension:
    """The extension called `name` (an error naming the ones there are)."""
    for ext in self.extensions:
      if ext.name == name:
        return ext
    raise KeyError(f"no extension {name!r}; this run has {[e.name for e in self.extensions]}")

  # ---- building ------------------------------------------------------------------
  def _opt_init(self, tx, params):
    return sharding_lib.onto_mesh(tx.init(params), self.mesh)

  def init_state(self, key) -> TrainState:
    k_model, k_value, k_run = jax.random.split(key, 3)
    self.model_cfg, params = make_model(self.cfg.model, self.tokenizer, self.mesh, k_model)
    replicated = sharding_lib.replicated(self.mesh)
    vparams = sharding_lib.put(init_value_head(self.model_cfg.d_model, k_value), replicated)
    # Step and key live replicated on the mesh like every other leaf, so a
    # checkpoint restores them there (a restored leaf committed to one device
    # would not mix with the mesh's arrays).
    step, k_run = sharding_lib.put((jnp.zeros((), jnp.int32), k_run), replicated)
    return TrainState(step=step, params=params, opt_state=self._opt_init(self.tx, lora.trainable(params)),
                      value_params=vparams, value_opt_state=self._opt_init(self.vtx, vparams), ref_params=None,
                      lag_params=(), key=k_run, data_state=self.pipeline.get_state())

  def _extension_sft(self, params, examples, steps: int, max_prompt_len: int | None = None, label: str = ""):
    """SetupEnv.sft: the warm start's SFT on other examples (seed + 1); its log lines start with `label`."""
    c = self.cfg
    log = (lambda s: self.log(f"{label}: {s}")) if label else self.log
    plan = dataclasses.replace(sft_plan(c), steps=steps, warmup_steps=min(c.sft.warmup_steps, steps),
                               max_prompt_len=max_prompt_len or c.data.max_prompt_len, seed=c.seed + 1)
    params, _ = run_sft(params, self.model_cfg, examples, self.tokenizer, plan, mesh=self.mesh, log=log)
    return params

  def setup_extensions(self, state: TrainState) -> TrainState:
    """After the warm start, before the update compiles: each extension builds itself."""
    env = SetupEnv(run_cfg=self.cfg, model_cfg=self.model_cfg, tokenizer=self.tokenizer, mesh=self.mesh,
                   train_examples=self.train_examples, sft=self._extension_sft, log=self.log)
    params = state.params
    for ext in self.extensions:
      params = ext.setup(env, params)
    return state.replace(params=params)

  def start_rl(self, state: TrainState) -> TrainState:
    """After the warm start and the extensions' setup: fresh optimizer, frozen
    reference, staleness buffer, the compiled update and the step context."""
    cfg = self.cfg
    need_ref = cfg.objective.needs_ref or cfg.log.kl_to_ref
    state = state.replace(
        opt_state=self._opt_init(self.tx, lora.trainable(state.params)),
        ref_params=snapshot(state.params) if need_ref else None,
        lag_params=tuple(snapshot(state.params) for _ in range(cfg.rollout.staleness)))
    engine = self.rollout_engine()
    self.context = StepContext(
        cfg=cfg, model_cfg=self.model_cfg, mesh=self.mesh, batch_sharding=self.batch_sharding,
        replicated=sharding_lib.replicated(self.mesh), tokenizer=self.tokenizer, runner=self.runner,
        pipeline=self.pipeline, sampling_cfg=self.sampling_cfg, engine=engine,
        updater=self.make_updater(state), lr_schedule=self.lr_schedule, extensions=self.extensions,
        workdir=self.workdir, pack=self.pack_policy())
    return state

  def pack_policy(self) -> PackPolicy:
    """When the update and the recompute run rows packed (`train.pack`, training/pack.py)."""
    return PackPolicy.from_run(self.cfg, self.model_cfg, self.data.batch_shards)

  def rollout_engine(self):
    """The rollout engine, made on the first call (after `init_state`: it needs the model config). `run`
    makes it before the warm start, so that what it checks (a server that does not answer, another
    vocabulary, a sampling setting the server does not apply) is an error before any training."""
    if self.engine is None:
      engine = sampler = make_engine(self.cfg.rollout.engine, model_cfg=self.model_cfg,
                                     sampling_cfg=self.sampling_cfg, tokenizer=self.tokenizer,
                                     batch_sharding=self.batch_sharding, run_cfg=self.cfg)
      if self.episodes is not None:  # each sample an episode of the environment (training/episodes.py)
        if not callable(getattr(sampler, "turn_sampler", None)):
          sampler.close()
          raise ConfigError(f"config.rollout.engine={self.cfg.rollout.engine!r} cannot play the episodes of "
                            f"env.name={self.cfg.env.name!r}: its {type(sampler).__name__} has no turn_sampler "
                            "(sampling/engine.py's RolloutEngine); allowed: an engine with one, or env.name='none'")
        engine = EpisodeEngine(engine, self.episodes, self.sampling_cfg)
      if self.cfg.rollout.exact:  # log mu by the recompute's own row-wise program (sampling/exact.py)
        engine = ExactEngine(engine, sampler, impl=self.cfg.kernels.impl, chunk=self.cfg.micro_batch_size)
      self.engine = engine
    return self.engine

  def make_updater(self, state: TrainState) -> Updater:
    """The run's update (training/update.py), with the extensions' loss terms, for `state`'s placement."""
    cfg = self.cfg
    extra_terms = tuple(term for ext in self.extensions for term in ext.extra_terms())
    return make_updater(UpdateSpec.from_run(cfg, self.model_cfg, extra_terms), self.tx, self.vtx,
                        state.update_state(), self.batch_sharding, sharding_lib.replicated(self.mesh))

  # ---- stages of the run -----------------------------------------------------------
  def warm_start(self, state: TrainState) -> tuple[TrainState, dict]:
    c = self.cfg
    with jax.sharding.use_abstract_mesh(self.mesh.abstract_mesh):  # as in `step`: the vocabulary ops see the mesh
      params, info = run_sft(state.params, self.model_cfg, self.train_examples, self.tokenizer, sft_plan(c),
                             mesh=self.mesh, log=self.log)
    return state.replace(params=params), info

  def evaluate(self, state: TrainState) -> dict:
    return self.evaluator.greedy_accuracy(state.params, self.eval_examples)

  def step(self, state: TrainState, rollouts: AsyncRollouts | InlineRollouts | None = None) -> tuple[TrainState, dict]:
    """One RL step (training/step.py) on the context `start_rl` built; with `rollouts`
    (`rollout.overlap`, training/async_rollout.py) its samples were generated ahead.

    The mesh's shape is in context for the step (`use_abstract_mesh`: what
    functions traced in it see, without tying eager arrays to the mesh), so
    the vocabulary ops, when it splits the vocabulary, run per shard of the
    output head (`model.logprobs.vocab_ops`) instead of gathering it whole."""
    with jax.sharding.use_abstract_mesh(self.mesh.abstract_mesh):
      return rl_step(self.context, state, rollouts)

  def preflight(self) -> None:
    """What the config and the data can tell before a workdir or a model exists."""
    cfg = self.cfg
    self.shell.check_workdir("a run's workdir")
    if cfg.init_checkpoint and not os.path.isdir(cfg.init_checkpoint):
      raise ConfigError(f"config.init_checkpoint={cfg.init_checkpoint!r} is not a directory: expected a run's "
                        "workdir or a Hugging Face directory")
    for what, examples in (("training", self.train_examples), ("held-out", self.eval_examples)):
      check_prompts(self.tokenizer, examples, cfg.data.max_prompt_len, cfg.data.chat_template, what)
    for ext in self.extensions:
      ext.preflight(cfg)

  def run(self, state: TrainState | None = None) -> dict:
    """The whole run: preflight, warm start (or restore), RL steps, end evaluation, summary."""
    t_start = time.time()
    try:
      state, ckpt, start = self._begin(state)
      state, history = self._rl_steps(state, list(start.history))
      ckpt.finish(state, history[-1] if history else None)
      ev_end = self.evaluate(state)
    finally:
      if self.episodes is not None:  # the tool workers: the last evaluation was their last use
        self.episodes.close()
    self.log(f"eval (greedy, {ev_end['n']} held-out): accuracy {ev_end['accuracy']:.3f}")
    summary = self._summary(state, start, ev_end, history, time.time() - t_start)
    if distributed.is_primary():  # the run's files: process 0's (the others hold the same values)
      write_summary(self.workdir, summary)
      write_report_safely(self.workdir, self.log)
    self.final_state = state
    self.history = history
    return summary

  def _begin(self, state: TrainState | None) -> tuple[TrainState, RunCheckpoints, "_Start"]:
    """Everything before the first RL step: checks, the workdir and its provenance, the initial
    state, the warm start and the extensions' setup (or a checkpoint's state), the start evaluation."""
    cfg = self.cfg
    self.preflight()
    state = self.init_state(jax.random.key(cfg.seed)) if state is None else state
    self.rollout_engine()  # its checks (a server that answers, its model and vocabulary) before the warm start
    ckpt, resuming = self.shell.open(self.model_cfg)
    if cfg.init_checkpoint and not resuming:
      state = ckpt.init_params(state, cfg.init_checkpoint, None)
    if resuming and not any(ext.rebuild_from_warm_start for ext in self.extensions):
      sft_info = {}  # the warm-started params are in the checkpoint
    else:
      state, sft_info = self.warm_start(state)
    state = self.setup_extensions(state)  # before the update compiles: their loss terms join it
    for ext in self.extensions:
      ckpt.add_trees(ext.checkpoint_trees())
    state = self.start_rl(state)
    # -- checkpoint restore point: a saved TrainState replaces `state` here, and
    #    the pipeline is put back at state.data_state; the start eval is the saved one.
    if resuming:
      state, saved = ckpt.restore(state, self.pipeline.set_state)
      ev_start, sft_info, history = saved["ev_start"], saved["sft_info"], list(saved.get("history", []))
    else:
      ev_start, history = self.evaluate(state), []
      ckpt.extra.update(ev_start=plain(ev_start), sft_info=plain(sft_info))
    self.log(f"eval (greedy, {ev_start['n']} held-out): accuracy {ev_start['accuracy']:.3f}")
    if cfg.rollout.staleness > 0 and cfg.objective.correction == "none":
      self.log(f"note: rollout.staleness={cfg.rollout.staleness}: the samples are off-policy and objective "
               f"{cfg.objective.name!r} corrects nothing against mu; objectives that do: scalerl_gspo, "
               "token_tis (docs/lab.md, 'Staleness 1', compares them)")
    return state, ckpt, _Start(ev_start=ev_start, sft_info=sft_info, history=tuple(history))

  def _rl_steps(self, state: TrainState, history: list) -> tuple[TrainState, list]:
    """The RL steps from state.step to train.steps: metrics, evaluations, checkpoints, SIGTERM.
    -> (the final state, every step's metrics: a resumed run's earlier steps first)."""
    cfg = self.cfg
    guard = SignalGuard(cfg.guard, self.log)
    guard.replay(history)  # a resumed run's earlier steps: the consecutive counts go on
    rollouts = None

    def step_fn(state):
      state, metrics = self.step(state, rollouts)
      guard.update(int(state.step), metrics)
      return state, metrics

    def after_step(state, metrics, written):
      del written
      history.append(metrics)
      bar.update(metrics)
      for hook in self.hooks:  # before the checkpoint's save point: hooks see the complete state
        hook(self, state, metrics)

    # Closed when the steps end, whether or not one raised, in reverse order: the background thread
    # first (it uses the engine, the pipeline and the devices), the engine last.
    with contextlib.ExitStack() as stack:
      stack.callback(self.context.engine.close)
      stack.callback(self.runner.close)
      bar = Progress(cfg.train.steps, cfg.log.progress, desc=cfg.run_name, initial=int(state.step))
      stack.callback(bar.close)
      if cfg.rollout.overlap and int(state.step) < cfg.train.steps:
        # The batches of the steps ahead are generated in the background from here on; with several
        # processes in the trainer's thread during each step's update (training/async_rollout.py).
        ahead = InlineRollouts if jax.process_count() > 1 else AsyncRollouts
        rollouts = ahead(self.context, state, steps=cfg.train.steps)
        stack.callback(rollouts.close)
      state, _ = self.shell.steps(state, total=cfg.train.steps, step_fn=step_fn, evaluate=self.evaluate,
                                  eval_every=cfg.eval.every, eval_last=False, log_every=cfg.log.every,
                                  after_step=after_step)
    return state, history

  def _summary(self, state: TrainState, start: "_Start", ev_end: dict, history: list, run_time_s: float) -> dict:
    """summary.json: the run's evaluations, rewards, failures, warm start and extensions."""
    cfg, ev_start, sft_info = self.cfg, start.ev_start, start.sft_info
    return {
        "method": cfg.run_name, "objective": cfg.method, "workdir": self.workdir, "rl_steps": int(state.step),
        "eval_accuracy_start": ev_start["accuracy"], "eval_accuracy_end": ev_end["accuracy"],
        "eval_gain": ev_end["accuracy"] - ev_start["accuracy"],
        "eval_response_length_end": ev_end["response_length"],
        "train_reward_first": float(history[0]["reward/mean"]) if history else None,
        "train_reward_last": float(history[-1]["reward/mean"]) if history else None,
        "skipped_updates": float(sum(m["update/skipped_nonfinite"] for m in history)),
        "reward_failures": int(sum(m["reward/failed"] + m["reward/timed_out"] for m in history)),
        **{k: v for k, v in sft_info.items()},
        "extensions": [ext.name for ext in self.extensions],
        **{k: v for ext in self.extensions for k, v in ext.summary().items()},
        "run_time_s": run_time_s,
    }
