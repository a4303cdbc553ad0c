"""A tensor-parallel mesh splits the output head over the vocabulary in the update too.

On the 8-device fake mesh, one RL step on (data 2, tensor 4) must equal the
same step on (data 8) -- the vocabulary ops then run per shard of the head
(kernels/sharded.py) and combine exactly -- and the compiled update must hold
no whole [D, V] head: no all-gather of it appears in its HLO, while the same
update with the plain ops (which XLA feeds by gathering the split head) has
one, so the check can fail.
"""

import re

import jax
import numpy as np
import pytest
from run_helpers import load_config, make_trainer, shrink

import jaxrl_llm.model.logprobs as logprobs_lib
from jaxrl_llm.training.config import from_config_dict


def _one_step(name, tmp_path, tensor: int, vocab_multiple: int = 4):
  c = shrink(load_config(name), **{"mesh.tensor": tensor, "mesh.data": 8 // tensor, "train.steps": 1,
                                   "model.vocab_multiple": vocab_multiple})
  c.model.n_heads, c.model.n_kv_heads = 4, 4
  tr = make_trainer(from_config_dict(c), tmp_path / f"t{tensor}", lambda s: None)
  state = tr.start_rl(tr.init_state(jax.random.key(0)))
  calls = []
  updater = tr.context.updater
  real = type(updater).apply

  def recording(self, *args):
    calls.append(args)
    return real(self, *args)

  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(type(updater), "apply", recording)
    state, metrics = tr.step(state)
  return tr, state, metrics, updater, calls[0]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["score_centering", "trm"])
def test_tensor_parallel_step_equals_data_parallel(name, tmp_path):
  _, dp_state, dp_metrics, _, _ = _one_step(name, tmp_path, tensor=1)
  tr, tp_state, tp_metrics, _, _ = _one_step(name, tmp_path, tensor=4)
  assert tr.model_cfg.vocab_size == 100  # the 99 characters, padded to a multiple of 4
  assert tp_state.params["embed_VD"].sharding.spec[0] == "tensor"
  # Per-shard f32 sums over V and tokens in another order. The loss is a mean over ~160 tokens of
  # terms ~A that can cancel to ~3e-4 (TRM), so it needs an atol: ~160 * u * mean|A| ~ 1e-5.
  # Measured <= 1.9e-6 (entropy ~4.6) and, for the loss, 5.5e-8 at a loss of 2.8e-4, which failed
  # rtol=2e-5 alone; 5 seeds
  for key in ("loss/total", "grad/norm", "entropy/mean"):
    np.testing.assert_allclose(float(tp_metrics[key]), float(dp_metrics[key]), rtol=2e-5, atol=1e-5, err_msg=key)
  if name == "trm":
    # KL(mu || pi) is ~0 here (the sampler is the policy): both are the rounding of sum_v mu log mu -
    # sum_v mu log pi, per-shard f32 sums over V = 100 of terms ~log V: bounded by V * u * 2 log V ~ 5e-5;
    # measured <= 1.5e-8 (values <= 1.5e-8) over 5 seeds
    np.testing.assert_allclose(float(tp_metrics["kl/behav_theta"]), float(dp_metrics["kl/behav_theta"]),
                               rtol=1e-4, atol=100 * 2.0 ** -24 * 2 * np.log(100))
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(tp_state.params),
                          jax.tree.leaves(dp_state.params)):
    # Adam's first step moves an entry by ~lr * g / (|g| + eps) ~ 5e-4: per-shard f32 sums round g
    # differently, which moves entries with |g| ~ eps most; measured <= 2.5e-7 over 5 seeds, asserted
    # at 1% of the step
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=5e-6, err_msg=jax.tree_util.keystr(path))


def _head_gathers(tr, update, args) -> list[str]:
  with jax.sharding.use_abstract_mesh(tr.mesh.abstract_mesh):
    hlo = update.lower(*args).compile().as_text()  # update: the run's Updater, args: (state, mini-batch, aux)
  V, D = tr.model_cfg.vocab_size, tr.model_cfg.d_model
  shapes = re.findall(r"= \w+\[(\d+),(\d+)\]\S* all-gather(?:-start)?\(", hlo)
  return [s for s in shapes if sorted(map(int, s)) == sorted((V, D))]


@pytest.mark.slow
def test_compiled_update_gathers_no_whole_head(tmp_path, monkeypatch):
  # V = 16,384 > the chunked loop's 4,096 columns, so the plain ops slice the head and XLA gathers it.
  tr, _, _, update, args = _one_step("trm", tmp_path, tensor=4, vocab_multiple=16384)
  assert args[2]["behav_head_DV"].sharding.spec == jax.sharding.PartitionSpec(None, "tensor")
  assert _head_gathers(tr, update, args) == []
  monkeypatch.setattr(logprobs_lib, "vocab_sharding", lambda: None)
  tr, _, _, update, args = _one_step("trm", tmp_path / "plain", tensor=4, vocab_multiple=16384)
  assert len(_head_gathers(tr, update, args)) >= 1
