"""DPO (objectives/preference.py, the `objective="dpo"` run of reward_model/trainer.py): the loss, its
variants and its gradient against the formulas written out here, per pair; the same through the tiny
model against log-probs of each unpadded sequence computed here from the logits; a short run on the
built-in pairs whose implicit reward margin rises; one-line config errors."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from run_helpers import load_config
from jaxrl_llm import model as model_lib
from jaxrl_llm.checks import ConfigError
from jaxrl_llm.model.tokenizer import CharTokenizer
from jaxrl_llm.objectives.preference import dpo_loss
from jaxrl_llm.reward_model import data as data_lib
from jaxrl_llm.reward_model.config import DPOConfig, reward_config_from_dict
from jaxrl_llm.reward_model.defaults import reward_model_config
from jaxrl_llm.reward_model.trainer import RewardModelRun, dpo_objective
from jaxrl_llm.training.tiny import TINY_MODEL, apply_settings

CASES = [("sigmoid", 0.0), ("sigmoid", 0.1), ("robust", 0.2), ("ipo", 0.0)]
BETA = 0.3


def _log_sigmoid(x: float) -> float:
  return -math.log1p(math.exp(-x))


def _sigmoid(x: float) -> float:
  return 1.0 / (1.0 + math.exp(-x))


def pair_loss(m: float, loss_type: str, eps: float, beta: float) -> float:
  """One pair's loss at margin m, written out (Rafailov 2023 eq. 7, cDPO, rDPO, IPO)."""
  if loss_type == "sigmoid":
    return -(1 - eps) * _log_sigmoid(m) - eps * _log_sigmoid(-m)
  if loss_type == "robust":
    return ((1 - eps) * -_log_sigmoid(m) - eps * -_log_sigmoid(-m)) / (1 - 2 * eps)
  return (m / beta - 1 / (2 * beta)) ** 2


def pair_dloss_dm(m: float, loss_type: str, eps: float, beta: float) -> float:
  """d pair_loss / d m by hand: d(-log sig(m))/dm = sig(m) - 1, d(-log sig(-m))/dm = sig(m)."""
  s = _sigmoid(m)
  if loss_type == "sigmoid":
    return (1 - eps) * (s - 1) + eps * s
  if loss_type == "robust":
    return ((1 - eps) * (s - 1) - eps * s) / (1 - 2 * eps)
  return 2 * (m / beta - 1 / (2 * beta)) / beta


@pytest.mark.parametrize("loss_type,eps", CASES)
def test_loss_and_gradient_equal_the_formula_per_pair(loss_type, eps):
  k = jax.random.split(jax.random.key(0), 4)
  lw, ll, rw, rl = (-5.0 + 2.0 * jax.random.normal(key, (6,)) for key in k)
  w = jnp.array([1.0, 1.0, 0.0, 1.0, 1.0, 1.0])  # row 2 is padding
  f = lambda a, b: dpo_loss(a, b, rw, rl, w, beta=BETA, loss_type=loss_type, label_smoothing=eps)  # noqa: E731
  out = f(lw, ll)
  lw_, ll_, rw_, rl_, w_ = (np.asarray(x, np.float64) for x in (lw, ll, rw, rl, w))
  m = [BETA * ((lw_[b] - rw_[b]) - (ll_[b] - rl_[b])) for b in range(6)]
  expected = sum(w_[b] * pair_loss(m[b], loss_type, eps, BETA) for b in range(6)) / 5.0
  np.testing.assert_allclose(float(out.loss.value()), expected, rtol=2e-6)
  np.testing.assert_allclose(out.reward_chosen_B, BETA * (lw_ - rw_), rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(out.reward_rejected_B, BETA * (ll_ - rl_), rtol=1e-6, atol=1e-6)
  g_w, g_l = jax.grad(lambda a, b: f(a, b).loss.value(), argnums=(0, 1))(lw, ll)
  dm = np.array([w_[b] * pair_dloss_dm(m[b], loss_type, eps, BETA) / 5.0 for b in range(6)])
  np.testing.assert_allclose(g_w, BETA * dm, rtol=1e-5, atol=1e-7)  # dm/d log pi(y_w) = beta
  np.testing.assert_allclose(g_l, -BETA * dm, rtol=1e-5, atol=1e-7)  # dm/d log pi(y_l) = -beta
  assert g_w[2] == 0.0


def test_label_smoothing_endpoints():
  """eps -> the plain loss at 0; cDPO at eps is the plain loss of each label weighted 1 - eps, eps."""
  z = jnp.zeros(3)
  lw = jnp.array([0.5, -1.0, 2.0])
  one = jnp.ones(3)
  plain = lambda lt, eps, a=lw, b=z: float(dpo_loss(a, b, z, z, one, beta=1.0, loss_type=lt,  # noqa: E731
                                                     label_smoothing=eps).loss.value())
  flipped = plain("sigmoid", 0.0, z, lw)
  np.testing.assert_allclose(plain("sigmoid", 0.25), 0.75 * plain("sigmoid", 0.0) + 0.25 * flipped, rtol=1e-6)
  np.testing.assert_allclose(plain("robust", 0.0), plain("sigmoid", 0.0), rtol=1e-7)
  np.testing.assert_allclose(plain("robust", 0.25), (0.75 * plain("sigmoid", 0.0) - 0.25 * flipped) / 0.5, rtol=1e-6)


TOK = CharTokenizer()
CFG = model_lib.ModelConfig(vocab_size=TOK.vocab_size, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1,
                            head_dim=16, d_ff=64)


def _independent_logp(params, seq_1n, n_prompt: int):
  """log pi(seq[n_prompt:] | seq[:n_prompt]) of one unpadded sequence: a log-softmax of the logits, the
  response's tokens picked one by one."""
  n = seq_1n.shape[1]
  hidden, _ = model_lib.forward(params, CFG, seq_1n, jnp.arange(n)[None], jnp.ones((1, n), bool))
  logq_nV = jax.nn.log_softmax(hidden[0].astype(jnp.float32) @ model_lib.lm_head(params, CFG).astype(jnp.float32))
  return sum(logq_nV[t - 1, seq_1n[0, t]] for t in range(n_prompt, n))


_logp_and_grad = jax.jit(jax.value_and_grad(_independent_logp), static_argnums=(2,))


def test_model_loss_and_gradient_equal_the_independent_formula():
  """Through the tiny model: the loss from each sequence's log-prob computed alone, and the gradient by the
  chain rule, sum_b dL/dm_b (beta grad log pi(y_w|x) - beta grad log pi(y_l|x)), dL/dm_b written out."""
  pairs = data_lib.arithmetic_pairs("train", 8, digits=2, digits2=1, ops="+", seed=0, eval_fraction=0.2,
                                    label_noise=0.0)
  ids = data_lib.pair_ids(TOK, pairs, False)
  arrays = data_lib.encode_pairs(pairs, ids, max_len=16, pad_id=TOK.pad_id, default_margin=0.0,
                                 starts=data_lib.response_starts(TOK, pairs, ids, False))
  batch = tuple(jnp.asarray(a) for a in (arrays.tokens_N2T, arrays.mask_N2T, arrays.margin_N, arrays.response_N2T))
  # Two models (the margins are not 0), drawn on the host: any params do, and init_params would compile.
  rng = np.random.default_rng(1)
  shapes = jax.eval_shape(lambda k: model_lib.init_params(CFG, k), jax.random.key(0))
  params, ref = (jax.tree.map(lambda x: jnp.asarray(rng.normal(0.0, 0.2, x.shape), x.dtype), shapes) for _ in "pr")
  w = np.ones(8, np.float64)
  w[5] = 0.0  # a padding row
  # Each sequence on its own, [BOS] prompt response EOS, the prompt's length counted here.
  logp, grad, ref_logp = np.zeros((8, 2)), [[None, None] for _ in range(8)], np.zeros((8, 2))
  for b, pair in enumerate(pairs):
    prompt = [TOK.bos_id] + TOK.encode(pair.prompt)
    for i, y in enumerate((pair.chosen, pair.rejected)):
      seq = jnp.asarray([prompt + TOK.encode(y) + [TOK.eos_id]], jnp.int32)
      value, g = _logp_and_grad(params, seq, len(prompt))
      logp[b, i], grad[b][i] = float(value), jax.tree.map(lambda x: np.asarray(x, np.float64), g)
      ref_logp[b, i] = float(_logp_and_grad(ref, seq, len(prompt))[0])
  m = BETA * ((logp[:, 0] - ref_logp[:, 0]) - (logp[:, 1] - ref_logp[:, 1]))
  weight_B = jnp.asarray(w, jnp.float32)
  configs = [DPOConfig(beta=BETA, loss_type=lt, label_smoothing=eps, reference="") for lt, eps in CASES]
  # One program for the four cases (one compile; the forward passes they share are computed once).
  objective = lambda q, c: dpo_objective(q, ref, CFG, batch, weight_B, c)[0].value()  # noqa: E731
  code = jax.jit(lambda p: [jax.value_and_grad(objective)(p, c) for c in configs])(params)
  for (loss_type, eps), (value, got) in zip(CASES, code):
    want_value = sum(w[b] * pair_loss(m[b], loss_type, eps, BETA) for b in range(8)) / w.sum()
    np.testing.assert_allclose(float(value), want_value, rtol=1e-5, err_msg=loss_type)
    coef = [w[b] * pair_dloss_dm(m[b], loss_type, eps, BETA) * BETA / w.sum() for b in range(8)]
    want = jax.tree.map(lambda *g: sum(coef[b] * (g[2 * b] - g[2 * b + 1]) for b in range(8)),
                        *[g for sides in grad for g in sides])
    for g, h in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_allclose(g, h, rtol=2e-4, atol=2e-6, err_msg=f"{loss_type} eps={eps}")


def _config(**settings):
  base = {**TINY_MODEL, "name": "dpo", "objective": "dpo", "export": False, "dpo.beta": 0.5,
          "train.steps": 8, "train.batch_size": 32, "train.warmup_steps": 0, "train.lr": 1e-2,
          "train.weight_decay": 0.0, "data.n_train": 32, "data.n_eval": 16, "eval.every": 0, "log.every": 1,
          "checkpoint.every_steps": 100}
  return reward_config_from_dict(apply_settings(reward_model_config(), {**base, **settings}))


def test_short_run_raises_the_implicit_reward_margin(tmp_path, quiet_log):
  run = RewardModelRun(_config(), str(tmp_path), log=quiet_log, devices=jax.devices()[:1])  # compiles faster
  summary = run.run()
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  margin = [r["train/margin"] for r in rows]
  acc = [r["train/accuracy"] for r in rows]
  # Step 1's stats are those of the initial params: pi = pi_ref, every margin 0 up to the rounding of
  # two programs' sums of log-probs (the update's forward and the reference's recompute; bitwise 0 on a
  # CPU with AVX-512, -1.5e-8 on one without). The accuracy of such ties is a coin toss: not asserted.
  assert abs(margin[0]) < 1e-6 and abs(summary["eval_margin_start"]) < 1e-6
  assert margin[-1] > margin[len(margin) // 2] > 0.0, margin
  assert acc[-1] >= 0.9, acc
  np.testing.assert_allclose(rows[-1]["train/chosen"] - rows[-1]["train/rejected"], margin[-1], rtol=1e-6)
  assert summary["eval_accuracy_end"] == rows[-1]["eval/accuracy"]
  assert rows[0]["train/loss"] == pytest.approx(math.log(2.0), rel=1e-6)  # -log sigmoid(0)
  assert rows[-1]["train/loss"] < 0.5 * math.log(2.0)


def test_the_config_file_resolves():
  cfg = reward_config_from_dict(load_config("dpo"))
  assert (cfg.objective, cfg.export, cfg.builtin, cfg.dpo.loss_type, cfg.dpo.reference) == ("dpo", False, True,
                                                                                         "sigmoid", "")


@pytest.mark.parametrize("key,value,match", [
    ("dpo.beta", 0.0, r"config\.dpo\.beta=0\.0"),
    ("dpo.loss_type", "hinge", r"config\.dpo\.loss_type='hinge'"),
    ("dpo.label_smoothing", 0.5, r"config\.dpo\.label_smoothing=0\.5"),
    ("export", True, r"config\.export=True .*objective='dpo'"),
    ("train.margin", 0.5, r"config\.train\.margin=0\.5 .*objective='dpo'"),
])
def test_bad_values_are_one_line_errors(key, value, match):
  with pytest.raises(ConfigError, match=match) as e:
    _config(**{key: value})
  assert "\n" not in str(e.value)


def test_ipo_takes_no_label_smoothing_and_other_objectives_no_reference():
  with pytest.raises(ConfigError, match=r"config\.dpo\.label_smoothing=0\.1 .*loss_type='ipo'"):
    _config(**{"dpo.loss_type": "ipo", "dpo.label_smoothing": 0.1})
  with pytest.raises(ConfigError, match=r"config\.dpo\.reference='/x' .*objective='dpo'"):
    _config(**{"objective": "bradley_terry", "dpo.reference": "/x"})
