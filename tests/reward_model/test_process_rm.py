"""Process reward models: TRL's stepwise layout, the per-step cross-entropy and its gradient written
out, the metrics by hand, a separable set learned, the transformers token-classifier export, the
rows' one-line errors, and an RL step whose process advantages are those of the PRM's step scores,
recomputed here independently."""

import collections
import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from run_helpers import load_config, shrink

from jaxrl_llm.checks import ConfigError
from jaxrl_llm.model.tokenizer import CharTokenizer
from jaxrl_llm.reward_model import process
from jaxrl_llm.reward_model.config import reward_config_from_dict
from jaxrl_llm.reward_model.defaults import reward_model_config
from jaxrl_llm.reward_model.scorer import load_reward_model, token_scores
from jaxrl_llm.training.config import from_config_dict
from jaxrl_llm.training.loop import Trainer
from jaxrl_llm.reward_model.trainer import RewardModelRun
from jaxrl_llm.tasks import chain
from jaxrl_llm.training.step import build_batch, rollout_and_score
from jaxrl_llm.training.tiny import TINY_MODEL, apply_settings

TOK = CharTokenizer()


def prm_config(**overrides):
  return reward_config_from_dict(apply_settings(reward_model_config(), {
      **TINY_MODEL, "objective": "process", "train.batch_size": 16, "train.warmup_steps": 1, "data.digits": 1,
      "data.n_terms": 3, "data.n_train": 64, "data.n_eval": 16, "eval.every": 0, "log.every": 100,
      "checkpoint.every_steps": 100, "export": False, **overrides}))


# ---- layout, loss, metrics -------------------------------------------------------------------------

def test_rows_are_laid_out_as_trl_does():
  row = process.StepRow(prompt="1+2+3=", completions=("3", "16"), labels=(True, False))
  ids, ends = process.step_ids(TOK, row, "\n", chat_template=False)
  # [BOS] prompt, then each step followed by the separator; a label on each separator.
  want = [TOK.bos_id] + TOK.encode("1+2+3=") + TOK.encode("3\n") + TOK.encode("16\n")
  assert ids == want and ends == [8, 11]
  a = process.encode_rows([row], TOK, separator="\n", chat_template=False, max_len=0)
  assert a.tokens_NT.shape == (1, 16) and a.mask_NT.sum() == 12
  assert np.flatnonzero(a.step_NT[0]).tolist() == [8, 11] and a.label_NT[0, [8, 11]].tolist() == [1.0, 0.0]
  last = process.encode_rows([row], TOK, separator="\n", chat_template=False, max_len=16, last_step_only=True)
  assert np.flatnonzero(last.step_NT[0]).tolist() == [11]  # TRL's train_on_last_step_only
  two = process.step_ids(TOK, row, "\n\n", chat_template=False)[1]
  assert two == [9, 13]  # the LAST token of a multi-token separator


def test_bce_loss_and_gradient_are_the_formula():
  rng = np.random.default_rng(0)
  s = rng.normal(size=(3, 6)).astype(np.float32)
  y = (rng.random((3, 6)) < 0.5).astype(np.float32)
  e = rng.random((3, 6)) < 0.5
  w = np.array([1.0, 1.0, 0.0], np.float32)  # the third row is padding

  def loss(s_):
    return process.process_bce_loss(s_, y, e, w).value()

  p = 1 / (1 + np.exp(-s.astype(np.float64)))
  ew = e * w[:, None]
  want = -(ew * (y * np.log(p) + (1 - y) * np.log(1 - p))).sum() / ew.sum()
  np.testing.assert_allclose(loss(jnp.asarray(s)), want, rtol=1e-5)
  # dL/ds_t = e_t (sigmoid(s_t) - y_t) / sum e
  np.testing.assert_allclose(jax.grad(loss)(jnp.asarray(s)), ew * (p - y) / ew.sum(), rtol=1e-5, atol=1e-7)


def test_step_stats_by_hand():
  e = np.zeros((3, 5), bool)
  e[:, [1, 3]] = True  # two steps per solution
  y = np.zeros((3, 5), np.float32)
  y[0, [1, 3]] = [1, 0]  # first error at step 2
  y[1, [1, 3]] = [1, 1]  # no error
  y[2, [1, 3]] = [0, 0]  # first error at step 1
  s = np.zeros((3, 5), np.float32)
  s[0, [1, 3]] = [2.0, -1.0]  # right, right: first error found
  s[1, [1, 3]] = [1.0, -0.5]  # right, wrong: an error where there is none
  s[2, [1, 3]] = [-3.0, 0.5]  # right, wrong; but the first error (step 1) is found
  st = process.step_stats(s, y, e, np.ones(3, np.float32)).summary()
  assert st["accuracy"] == pytest.approx(4 / 6)
  assert st["first_error_accuracy"] == pytest.approx(2 / 3)
  sig = 1 / (1 + np.exp(-np.array([2.0, -1.0, 1.0, -0.5, -3.0, 0.5])))
  assert st["p_good"] == pytest.approx(sig.mean(), rel=1e-6)
  assert st["good_share"] == pytest.approx(3 / 6)
  # ProcessBench: rows 0 and 2 have an error, both found (1.0); row 1 has none and an error was
  # predicted (0.0); F1 = 2 * 1 * 0 / (1 + 0) = 0.
  assert (st["error_accuracy"], st["correct_accuracy"], st["processbench_f1"]) == (1.0, 0.0, 0.0)
  s[1, 3] = 0.5  # row 1: no error predicted now
  st = process.step_stats(s, y, e, np.ones(3, np.float32)).summary()
  assert (st["error_accuracy"], st["correct_accuracy"], st["processbench_f1"]) == (1.0, 1.0, 1.0)
  s[0, 1] = -1.0  # row 0: the error predicted one step early
  st = process.step_stats(s, y, e, np.ones(3, np.float32)).summary()
  assert st["error_accuracy"] == pytest.approx(1 / 2) and st["correct_accuracy"] == 1.0
  assert st["processbench_f1"] == pytest.approx(2 * 0.5 * 1.0 / 1.5)


def test_step_ends_of_a_sampled_response():
  def ends(text, sep="\n"):
    ids = np.array(TOK.encode(text) + [TOK.eos_id, TOK.pad_id])
    return np.flatnonzero(process.response_step_ends(ids, ids != TOK.pad_id, TOK, sep)).tolist()

  assert ends("31\n46\n") == [2, 5]
  assert ends("31\n46") == [2, 4]  # a final step without its separator ends at the last token
  assert ends("31\n  ") == [2]  # whitespace after the last separator is no step
  assert ends("") == []
  assert ends("a;;b;;", ";;") == [2, 5]
  assert process.solution_score(np.array([0.9, 0.2, 0.5]), "min") == pytest.approx(0.2)
  assert process.solution_score(np.array([0.9, 0.2, 0.5]), "prod") == pytest.approx(0.09)
  assert process.solution_score(np.zeros(0), "min") == 0.0


# ---- rows and their errors ---------------------------------------------------------------------------

def _jsonl(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return str(path)


@pytest.mark.parametrize("row,field", [
    ({"prompt": "p", "labels": [True]}, "'completions' is missing"),
    ({"prompt": "p", "completions": ["a", "b"], "labels": [True]}, "'labels' has 1 entries for 2 completions"),
    ({"prompt": "p", "completions": ["a"], "labels": ["yes"]}, "field 'labels'=\\['yes'\\] is invalid"),
    ({"prompt": "p", "completions": [], "labels": []}, "field 'completions'=\\[\\] is invalid"),
    ({"prompt": "p", "completions": ["a"], "labels": [True], "complete": "no"}, "field 'complete'='no' is invalid"),
])
def test_a_bad_row_is_one_line_naming_file_line_and_field(tmp_path, row, field):
  good = {"prompt": "1+1=", "completions": ["2"], "labels": [True]}
  path = _jsonl(tmp_path / "steps.jsonl", [good, good, row])
  workdir = tmp_path / "run"
  with pytest.raises(ConfigError, match=f"steps.jsonl:3: field {field}" if "is missing" in field or "has" in field
                     else f"steps.jsonl:3: {field}") as e:
    RewardModelRun(prm_config(**{"data.path": path}), str(workdir), log=lambda s: None)
  assert "\n" not in str(e.value) and not workdir.exists()


def test_process_only_keys_are_refused_with_bradley_terry():
  with pytest.raises(ConfigError, match=r"config\.train\.last_step_only=True.*objective='process'"):
    reward_config_from_dict(apply_settings(reward_model_config(), {"train.last_step_only": True}))
  with pytest.raises(ConfigError, match=r"config\.train\.margin=0\.5.*objective='process'"):
    prm_config(**{"train.margin": 0.5})
  with pytest.raises(ConfigError, match=r"config\.data\.end_step=True.*objective='process'"):
    reward_config_from_dict(apply_settings(reward_model_config(), {"data.end_step": True}))
  with pytest.raises(ConfigError, match=r"config\.data\.truncated_fraction=0\.2 .*data\.end_step=True"):
    prm_config(**{"data.truncated_fraction": 0.2})
  with pytest.raises(ConfigError, match=r"config\.data\.step_errors='any' is invalid.*'carry', 'varied'"):
    prm_config(**{"data.step_errors": "any"})


# ---- training and export ----------------------------------------------------------------------------

@pytest.mark.slow
def test_a_separable_set_is_learned_and_exports_to_transformers(tmp_path):
  import torch
  import transformers

  # A step is good exactly when it is "7": what the label depends on is in the step itself.
  rng = np.random.default_rng(0)
  rows = []
  for i in range(96):
    steps = [str(int(d)) for d in rng.integers(0, 10, size=3)]
    rows.append({"prompt": f"{i}:", "completions": steps, "labels": [s == "7" for s in steps]})
  for r in rows[::4]:
    r["completions"][1], r["labels"][1] = "7", True  # enough good steps
  path = _jsonl(tmp_path / "steps.jsonl", rows)
  run = RewardModelRun(prm_config(**{"data.path": path, "data.eval_fraction": 0.25, "train.steps": 60,
                                     "train.lr": 1e-2, "export": True}), str(tmp_path / "prm"), log=lambda s: None)
  summary = run.run()
  assert summary["eval_accuracy_start"] < 0.95
  assert summary["eval_accuracy_end"] == 1.0 and summary["eval_first_error_accuracy_end"] == 1.0
  # The export: transformers' token classifier, P(good) = softmax(logits)[..., 1] = sigmoid(s_t) at every token.
  model = transformers.AutoModelForTokenClassification.from_pretrained(summary["export_dir"],
                                                                       dtype=torch.float32).eval()
  assert type(model).__name__ == "LlamaForTokenClassification" and model.config.num_labels == 2
  batch = run.data.eval
  with torch.no_grad():
    logits = model(input_ids=torch.from_numpy(batch.tokens_NT).long(),
                   attention_mask=torch.from_numpy(batch.mask_NT).long()).logits.numpy()
  ref = torch.softmax(torch.from_numpy(logits), -1).numpy()[..., 1]
  st = run.final_state
  s = np.asarray(token_scores(st.params, st.reward_head, run.model_cfg, batch.tokens_NT, batch.mask_NT))
  m = batch.mask_NT
  # Torch's and XLA's f32 kernels run the whole forward in other summation orders (over D, heads,
  # positions, layers); measured 1.3e-6 (3 runs; the trained model does not change with the keys)
  np.testing.assert_allclose(1 / (1 + np.exp(-s[m])), ref[m], atol=2e-5)


# ---- the PRM in the RL step -------------------------------------------------------------------------

def test_the_end_step_reads_eos_and_labels_the_outcome():
  """data.end_step: the EOS after the last separator is one more labelled step, good when the solution is
  complete and every step good (a solution stopped early is bad there, though its steps are good)."""
  right = process.StepRow(prompt="1+2+3=", completions=("3", "6"), labels=(True, True))
  wrong = process.StepRow(prompt="1+2+3=", completions=("3", "16"), labels=(True, False))
  cut = process.StepRow(prompt="1+2+3=", completions=("3",), labels=(True,), complete=False)
  ids, ends = process.step_ids(TOK, right, "\n", chat_template=False, end_step=True)
  assert ids == process.step_ids(TOK, right, "\n", chat_template=False)[0] + [TOK.eos_id]
  assert ends == [8, 10, 11]
  a = process.encode_rows([right, wrong, cut], TOK, separator="\n", chat_template=False, max_len=0, end_step=True)
  assert [np.flatnonzero(a.step_NT[n]).tolist() for n in range(3)] == [[8, 10, 11], [8, 11, 12], [8, 9]]
  assert a.label_NT[0, [8, 10, 11]].tolist() == [1, 1, 1] and a.label_NT[1, [8, 11, 12]].tolist() == [1, 0, 0]
  assert a.label_NT[2, [8, 9]].tolist() == [1, 0]  # cut: its step good, its end bad
  assert a.tokens_NT[2, 9] == TOK.eos_id
  last = process.encode_rows([cut], TOK, separator="\n", chat_template=False, max_len=0, end_step=True,
                             last_step_only=True)
  assert np.flatnonzero(last.step_NT[0]).tolist() == [9]  # the end step is the last one


def test_built_in_rows_cut_early_are_prefixes_of_the_uncut_rows():
  kw = dict(n_terms=4, digits=1, seed=0, eval_fraction=0.1, label_noise=0.0)
  whole = process.chain_rows("train", 400, **kw)
  cut = process.chain_rows("train", 400, **kw, truncated_fraction=0.3)
  assert process.chain_rows("train", 400, **kw, truncated_fraction=0.0) == whole
  short = [c for c in cut if not c.complete]
  assert 0.25 < len(short) / 400 < 0.35
  assert {len(c.completions) for c in short} == {1, 2}  # 1 .. n_terms - 2 of the 3 steps
  for w, c in zip(whole, cut):
    assert c.prompt == w.prompt and c.completions == w.completions[:len(c.completions)]
    assert c.labels == w.labels[:len(c.labels)] and c.complete == (len(c.completions) == 3)
  assert sum(c.end_label() for c in short) == 0 and any(all(c.labels) for c in short)


def test_varied_step_errors_are_wrong_steps_of_three_kinds():
  kw = dict(n_terms=4, digits=1, seed=0, eval_fraction=0.1, label_noise=0.0)
  carry = process.chain_rows("train", 600, **kw)
  varied = process.chain_rows("train", 600, **kw, step_errors="varied")
  kinds = collections.Counter()
  for c, v in zip(carry, varied):
    assert c.prompt == v.prompt and all(c.labels) == all(v.labels)  # the same rows are wrong
    if all(v.labels):
      assert v == c
      continue
    k = v.labels.index(False)  # the first wrong step: a wrong number after right ones
    assert v.completions[:k] == c.completions[:k] and c.labels.index(False) == k
    sums = chain.partial_sums(v.prompt)
    acc = sums[k - 1] if k else chain.terms(v.prompt)[0]
    got, right = int(v.completions[k]), sums[k]
    assert got != right and got >= 0
    later = [int(x) for x in v.completions[k + 1:]]  # continued from the wrong value
    assert later == [got + sum(chain.terms(v.prompt)[k + 2:k + 2 + j + 1]) for j in range(len(later))]
    kinds["carry" if got == chain.wrong_step(acc, right - acc) else "units" if abs(got - right) < 10 else "other"] += 1
  assert min(kinds.values()) > 0.2 * sum(kinds.values()), kinds  # a third each (a few coincide with a carry error)


def test_an_end_step_prm_scores_the_eos_and_a_cut_response_zero():
  """The RL side (training/model_reward.py's step_scores) on given scores s: the EOS is the last step;
  a response without EOS (the length limit) scores 0 at its last step, so its solution scores 0."""
  from jaxrl_llm.training.model_reward import RewardModelExtension

  cfg = from_config_dict(shrink(load_config("rlhf_process"), **{"data.reward_model": "unused"}))
  ext = RewardModelExtension(cfg.data)
  ext.kind, ext.tokenizer = {"objective": "process", "step_separator": "\n", "end_step": True}, TOK
  rows = [TOK.encode("31\n46\n") + [TOK.eos_id, TOK.pad_id], TOK.encode("31\n") + [TOK.eos_id] + [TOK.pad_id] * 4,
          TOK.encode("31\n46\n71")]
  tokens = np.array(rows)
  s = np.linspace(-2.0, 2.0, tokens.size).reshape(tokens.shape)
  ext.model_scores = lambda samples, per_token=False: s
  samples = type("S", (), {"tokens_BR": tokens, "mask_BR": tokens != TOK.pad_id})()
  p, end, solution = ext.step_scores(samples)
  sig = 1 / (1 + np.exp(-s))
  assert [np.flatnonzero(end[b]).tolist() for b in range(3)] == [[2, 5, 6], [2, 3], [2, 5, 7]]
  np.testing.assert_allclose(p[0, [2, 5, 6]], sig[0, [2, 5, 6]], rtol=1e-6)
  np.testing.assert_allclose(p[1, [2, 3]], sig[1, [2, 3]], rtol=1e-6)
  np.testing.assert_allclose(p[2, [2, 5, 7]], [sig[2, 2], sig[2, 5], 0.0], rtol=1e-6)  # no EOS: 0 at its end
  ext.cfg = dataclasses.replace(ext.cfg, process_reduce="min")
  np.testing.assert_allclose(ext.step_scores(samples)[2], [sig[0, [2, 5, 6]].min(), sig[1, [2, 3]].min(), 0.0],
                             rtol=1e-6)
  assert solution.shape == (3,)


# The module-scoped fixtures run once: the module's tests go to one pytest-xdist worker.
pytestmark = pytest.mark.xdist_group("reward_model.test_process_rm")


@pytest.fixture(scope="module")
def prm_dir(tmp_path_factory):
  """A process reward model trained for a few steps on the built-in chained sums (its scores vary)."""
  workdir = str(tmp_path_factory.mktemp("prm"))
  RewardModelRun(prm_config(**{"train.steps": 4, "checkpoint.every_steps": 4}), workdir, log=lambda s: None).run()
  return workdir


@pytest.mark.slow
def test_process_advantages_are_those_of_the_prms_step_scores(prm_dir, tmp_path):
  cfg = from_config_dict(shrink(load_config("rlhf_process"), **{
      "data.reward_model": prm_dir, "task.digits": 1, "task.n_numbers": 3, "rollout.max_response_len": 8,
      "sft.steps": 40, "sft.lr": 1e-2, "data.verifier_weight": 0.5}))
  tr = Trainer(cfg, str(tmp_path), log=lambda s: None)
  state, _, _ = tr._begin(None)  # pylint: disable=protected-access
  with jax.sharding.use_abstract_mesh(tr.mesh.abstract_mesh):
    sb = rollout_and_score(tr.context, state, jax.random.key(3))
    batch, _ = build_batch(tr.context, state, sb)
  smp = sb.samples
  params, head, rm_cfg = load_reward_model(prm_dir, tr.mesh)
  params, head = jax.device_get((params, head))
  B, R = smp.tokens_BR.shape
  want_r = np.zeros((B, R))
  want_end = np.zeros((B, R), bool)
  n_steps = 0
  for b in range(B):
    # One right-padded row per sample: its real prompt tokens, then its response (an independent layout).
    prompt = list(np.asarray(smp.prompt_BP[b])[np.asarray(smp.prompt_mask_BP[b])])
    resp = list(np.asarray(smp.tokens_BR[b])[np.asarray(smp.context_BR[b])])
    s = np.asarray(token_scores(params, head, rm_cfg, np.array([prompt + resp]), np.ones((1, len(prompt + resp)),
                                                                                           bool)))[0, len(prompt):]
    text = TOK.decode(resp)  # one character per token: char i is response token i
    ends = [i for i, ch in enumerate(text) if ch == "\n"]
    if text[text.rfind("\n") + 1:].strip():
      ends.append(len(text) - 1)
    for i in ends:
      want_r[b, i] = 1 / (1 + np.exp(-s[i]))  # w_rm = 1
      want_end[b, i] = True
    n_steps += len(ends)
    last = ends[-1] if ends else int(np.flatnonzero(np.asarray(smp.mask_BR[b]))[-1])
    want_end[b, last] = True
    want_r[b, last] += 0.5 * sb.scores.correct_B[b]  # w_v * the verifier's reward, on the last step
  assert n_steps > B // 2  # the warm-started policy writes lines: a real test
  np.testing.assert_array_equal(sb.scores.step_end_BR, want_end)
  np.testing.assert_allclose(sb.scores.step_reward_BR, want_r, rtol=1e-4, atol=1e-5)
  # DeepSeekMath's process advantages written out: normalise over the group's steps (ddof 1), then sum the
  # normalised rewards of the steps ending at or after each token.
  G = cfg.rollout.group_size
  adv = np.zeros((B, R))
  for g in range(B // G):
    rows = slice(g * G, (g + 1) * G)
    r = want_r[rows][want_end[rows]]
    norm = np.where(want_end[rows], (want_r[rows] - r.mean()) / (r.std(ddof=1) + 1e-6), 0.0)
    adv[rows] = np.flip(np.cumsum(np.flip(norm, 1), 1), 1)
  mask = np.asarray(batch.mask_BR)
  np.testing.assert_allclose(np.where(mask, batch.adv_BR, 0.0), np.where(mask, adv, 0.0), rtol=1e-3, atol=1e-3)
  assert sb.stats["reward/steps_mean"] > 0.5


def test_a_process_reward_model_is_refused_for_multi_turn_episodes(prm_dir):
  from jaxrl_llm.training.model_reward import RewardModelExtension

  cfg = from_config_dict(shrink(load_config("rlhf_process"), **{"data.reward_model": prm_dir,
                                                                "env.name": "calculator"}))
  with pytest.raises(ConfigError, match=r"is a process reward model.*env\.name='calculator' is not allowed") as e:
    RewardModelExtension(cfg.data).preflight(cfg)
  assert "\n" not in str(e.value)
  ext = RewardModelExtension(cfg.data)
  ext.preflight(from_config_dict(shrink(load_config("rlhf_process"), **{"data.reward_model": prm_dir})))
  assert ext.process and ext.kind == {"objective": "process", "step_separator": "\n", "end_step": False}


def test_reward_clip_is_refused_where_the_advantages_read_the_step_rewards(prm_dir):
  from jaxrl_llm.training.model_reward import RewardModelExtension

  cfg = from_config_dict(shrink(load_config("rlhf_process"), **{"data.reward_model": prm_dir, "data.reward_clip": 2.0,
                                                                "objective.advantage": "grpo_process"}))
  with pytest.raises(ConfigError, match=r"config\.data\.reward_clip=2\.0 clips the normalised outcome reward, which "
                                        r"objective\.advantage='grpo_process' does not read"):
    RewardModelExtension(cfg.data).preflight(cfg)
