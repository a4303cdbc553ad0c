"""The extension protocol: how a subsystem joins the RL loop without the loop knowing it.

A teacher, a reward model or a process reward model adds work to some
stages of a step. The loop (training/loop.py) calls every extension it was
given at fixed points, in order:

    preflight(run_cfg)              before any workdir or model exists: checks
                                    that need files (paths, vocabularies)
    setup(env, params) -> params    after the warm start, before the update
                                    compiles: build what the extension needs;
                                    may return new policy params (a warm start
                                    of its own)
    extra_terms() -> ((name, fn),)  loss terms added to the update:
                                    fn(LossContext) -> WeightedSum, static
    aux(state) -> {name: array}     the update's inputs without a batch axis
                                    (an output head), read once per step
    score_rewards(state, samples, scores) -> (scores, metrics)
                                    after the verifier scored a round of
                                    samples, before the filters: new rewards
                                    (a reward model's), diagnostics (the
                                    step logs the first round's)
    rewrite_batch(state, samples, scores, adv_BR, mask_BR)
        -> (adv_BR, extra_BR, metrics)
                                    after the advantages: new advantages,
                                    extra per-token loss inputs, diagnostics
    token_diagnostics() -> {name: array}
                                    the last rewrite_batch's per-token [B, R]
                                    (or per-sample [B]) signals, for the
                                    token-weight dump (training/dump.py)
    checkpoint_trees() -> {name: ExtraTree}
                                    pytrees outside the TrainState that a
                                    resumed run needs (saved with every
                                    checkpoint, handed back on restore)
    summary() -> dict               what the run's summary.json should say
                                    about the extension

A resumed run calls the same points again (after the warm start, which it
reruns only when an extension sets `rebuild_from_warm_start`), then restores
the checkpoint, trees included.

`Extension` implements each as a no-op, so an extension overrides only the
points it uses. Nothing here receives the Trainer: `setup` gets a
`SetupEnv` with what a builder may read, the other points get the state and
the batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class SetupEnv:
  """What an extension may use to build itself (`Extension.setup`)."""

  run_cfg: Any  # training.config.RunConfig
  model_cfg: Any  # model.ModelConfig of the policy
  tokenizer: Any
  mesh: Any  # jax.sharding.Mesh
  train_examples: Sequence[Any]  # tasks.base.Example of the training split
  # sft(params, examples, steps, max_prompt_len=None, label="") -> params: the
  # warm start's supervised trainer (seed + 1, so its batches differ from the
  # warm start's; it may donate its input: pass a copy). max_prompt_len: None
  # is data.max_prompt_len; label prefixes its log lines.
  sft: Callable[..., Any]
  log: Callable[[str], None]


class Extension:
  """Base class of an extension: every hook of the protocol, as a no-op."""

  name = "extension"
  # True: a resumed run reruns the SFT warm start before `setup`, because the
  # extension builds from the warm-started params (a teacher made by SFT).
  rebuild_from_warm_start = False

  def preflight(self, run_cfg) -> None:
    del run_cfg

  def setup(self, env: SetupEnv, params):
    del env
    return params

  def extra_terms(self) -> tuple:
    return ()

  def aux(self, state) -> dict:
    del state
    return {}

  def score_rewards(self, state, samples, scores):
    del state, samples
    return scores, {}

  def rewrite_batch(self, state, samples, scores, adv_BR, mask_BR):
    del state, samples, scores, mask_BR
    return adv_BR, {}, {}

  def token_diagnostics(self) -> dict:
    return {}

  def checkpoint_trees(self) -> dict:
    return {}

  def summary(self) -> dict:
    return {}
