"""train.share_prompt: each group's prompt runs once in the update's and the recompute's forward
passes, its G responses attending to it (model/logprobs.response_hidden, prompt_group = G).

The reference is the unshared computation, each row [prompt | response] on its own: the hidden
states, the recomputed log-probs and a trainer step's metrics must agree to f32 rounding (the
attention's sums run over another number of masked slots). The update's loss and parameter change
under sharing, for every aggregation mode, ratio level, Score Centering, TRM's token KL and PPO's
value head, are checked with the packed update in test_packed_update.py (unshared = shared = packed).
"""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from run_helpers import load_config, make_trainer, shrink
from jaxrl_llm import model as model_lib
from jaxrl_llm.checks import ConfigError
from jaxrl_llm.model.logprobs import forward_flops, response_hidden, shared_prompt_pays, shared_prompt_rows
from jaxrl_llm.training.config import from_config_dict
from jaxrl_llm.training.recompute import RecomputeSpec, policy_logprobs
from jaxrl_llm.training.step import check_shared_prompts, rl_step

V, G, N, P, R = 47, 4, 2, 5, 6  # N groups of G rows
B = N * G
CFG = model_lib.ModelConfig(vocab_size=V, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=48,
                            init_std=0.4)
# Gemma-style local layers: the window is counted in positions, which the shared layout keeps per row.
LOCAL = model_lib.ModelConfig(vocab_size=V, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=48,
                              init_std=0.4, layer_types=("sliding_attention", "full_attention"), sliding_window=3,
                              rope_local_theta=10000.0)


def _rows(seed=0):
  rng = np.random.default_rng(seed)
  prompt_NP = rng.integers(0, V, (N, P)).astype(np.int32)
  pmask_NP = np.ones((N, P), bool)
  pmask_NP[1, :2] = False  # the second group's prompt is left-padded
  tokens_BR = rng.integers(0, V, (B, R)).astype(np.int32)
  lengths = np.array([6, 3, 1, 5, 2, 6, 4, 1])
  mask_BR = np.arange(R)[None, :] < lengths[:, None]
  return np.repeat(prompt_NP, G, 0), np.repeat(pmask_NP, G, 0), tokens_BR, mask_BR


@pytest.mark.parametrize("cfg", [CFG, LOCAL], ids=["global", "sliding_window"])
def test_shared_hidden_states_equal_each_row_on_its_own(cfg):
  params = model_lib.init_params(cfg, jax.random.key(0))
  prompt_BP, pmask_BP, tokens_BR, mask_BR = _rows()
  want = np.asarray(response_hidden(params, cfg, prompt_BP, pmask_BP, tokens_BR, mask_BR))
  got = np.asarray(response_hidden(params, cfg, prompt_BP, pmask_BP, tokens_BR, mask_BR, prompt_group=G,
                                   always_share=True))
  assert got.shape == want.shape == (B, R, cfg.d_model)
  np.testing.assert_allclose(got[mask_BR], want[mask_BR], rtol=1e-5, atol=1e-5)
  # The layout: one sequence per group, T = P + G R, positions as in each row.
  tokens_nT, mask_nT, pos_nT, seg_nT, slots_GR = shared_prompt_rows(prompt_BP, pmask_BP, tokens_BR, mask_BR, G)
  assert tokens_nT.shape == (N, P + G * R)
  np.testing.assert_array_equal(np.asarray(pos_nT)[1, P + R:P + R + 3], [3, 4, 5])  # 3 real prompt tokens
  np.testing.assert_array_equal(slots_GR[:, 0], P - 1)
  np.testing.assert_array_equal(np.asarray(seg_nT)[0, [0, P - 1, P, P + R, P + G * R - 1]], [0, 0, 1, 2, G])


def test_recompute_with_shared_prompts_equals_unshared():
  params = model_lib.init_params(CFG, jax.random.key(2))
  prompt_BP, pmask_BP, tokens_BR, mask_BR = _rows(3)
  rows = types.SimpleNamespace(prompt_BP=prompt_BP, prompt_mask_BP=pmask_BP, tokens_BR=tokens_BR, mask_BR=mask_BR)
  spec = RecomputeSpec(model_cfg=CFG, temperature=0.7, impl="naive", chunk=G)
  want, _ = policy_logprobs(params, rows, spec)
  got, _ = policy_logprobs(params, rows, RecomputeSpec(**{**spec.__dict__, "prompt_group": G, "always_share": True}))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  assert np.all(want[~mask_BR] == 0) and np.all(want[mask_BR] < 0)


def test_trainer_step_with_shared_prompts_equals_unshared(tmp_path, quiet_log):
  out = {}
  for share in ("off", "on"):
    c = shrink(load_config("grpo"), **{"train.share_prompt": share, "train.micro_batch_size": 8})
    tr = make_trainer(from_config_dict(c), tmp_path / share, quiet_log)
    assert tr.cfg.prompt_group == (4 if share == "on" else 1)
    state = tr.start_rl(tr.init_state(jax.random.key(0)))
    state, metrics = rl_step(tr.context, state)
    out[share] = (jax.device_get(state.params), metrics)
  (p_off, m_off), (p_on, m_on) = out["off"], out["on"]
  assert m_off["grad/norm"] > 0
  for key in ("loss/total", "grad/norm", "entropy/mean", "reward/mean"):
    np.testing.assert_allclose(m_on[key], m_off[key], rtol=1e-4, atol=1e-6, err_msg=key)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), p_on, p_off)


def test_share_prompt_settings_and_layout_checks():
  c = shrink(load_config("grpo"), **{"train.share_prompt": "on", "train.micro_batch_size": 2})
  with pytest.raises(ConfigError, match=r"config.train.share_prompt=.on. .*multiples of group_size=4"):
    from_config_dict(c)
  auto = from_config_dict(shrink(load_config("grpo"), **{"train.micro_batch_size": 2}))
  assert auto.prompt_group == 1  # auto: micro-batches of 2 rows cannot hold a group of 4
  assert from_config_dict(shrink(load_config("grpo"))).prompt_group == 4
  with pytest.raises(ConfigError, match="config.train.share_prompt"):
    from_config_dict(shrink(load_config("grpo"), **{"train.share_prompt": "yes"}))
  prompt_BP, pmask_BP, _, _ = _rows()
  check_shared_prompts(prompt_BP, pmask_BP, G)
  prompt_BP[G + 1, -1] += 1
  with pytest.raises(ValueError, match="rows of group 1 do not share one prompt"):
    check_shared_prompts(prompt_BP, pmask_BP, G)


def test_auto_shares_where_the_forward_costs_fewer_flops_as_xla_counts_them():
  """forward_flops against XLA's own count of the compiled forward (dense attention included), and
  the decision it drives: long prompts before short responses share, the reverse does not."""
  params = model_lib.init_params(CFG, jax.random.key(0))

  def xla_flops(P, R, share):
    args = (jnp.zeros((B, P), jnp.int32), jnp.ones((B, P), bool), jnp.zeros((B, R), jnp.int32),
            jnp.ones((B, R), bool))
    fn = jax.jit(lambda p, *a: response_hidden(p, CFG, *a, prompt_group=G if share else 1, always_share=share))
    return fn.lower(params, *args).compile().cost_analysis()["flops"]

  for P, R in ((24, 3), (3, 24)):
    model = forward_flops(CFG, N, P + G * R) / forward_flops(CFG, B, P + R)
    xla = xla_flops(P, R, True) / xla_flops(P, R, False)
    assert abs(xla / model - 1) < 0.15, (P, R, model, xla)
  assert shared_prompt_pays(CFG, 24, 3, G) and not shared_prompt_pays(CFG, 3, 24, G)
  # Per layer: 2 (D (N + 2K) H + N H D + 3 D F) per slot and 4 N H per (query, key) pair.
  D, F, NH, KH = 32, 48, 4 * 8, 2 * 8
  assert forward_flops(CFG, 1, 10) == 2 * (10 * 2 * (D * (NH + 2 * KH) + NH * D + 3 * D * F) + 100 * 4 * NH)


def test_auto_does_not_share_where_the_groups_do_not_split_over_the_mesh():
  mesh = jax.sharding.AbstractMesh((4, 2), ("data", "fsdp"))  # 8 batch shards
  with jax.sharding.use_abstract_mesh(mesh):
    assert not shared_prompt_pays(CFG, 24, 3, G, rows=16)  # 4 sequences over 8 shards
    assert shared_prompt_pays(CFG, 24, 3, G, rows=32)  # 8 sequences
