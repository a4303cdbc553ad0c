"""The token-weight dump (training/dump.py) and its inspector page (jaxrl_llm/rundir/inspect_page.py).

Four tiny one-step runs (grpo; icepop on an int4 sampler with two passes of two
mini-batches; score_centering; rlsd with its self-teacher) dump their step.
The dumped factors hang together as the loss defines them (W = f T, lambda of
each mini-batch sums to 1, IcePop's mask is exactly c outside its band, A is
the advantage the loss was given), a dump leaves the run's result unchanged,
and every value the page embeds equals the dumped array, bit for bit. A real
headless Chromium loads the icepop page, shows the legend's range and a
token's tooltip with the dump's values, and draws something.
"""

import base64
import json
import os
import re
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from run_helpers import REPO, load_config, make_trainer, shrink
from jaxrl_llm.rundir import inspect_page as inspect_lib
from jaxrl_llm.rundir import token_dump
from jaxrl_llm.checks import ConfigError
from jaxrl_llm.training.config import from_config_dict
from jaxrl_llm.training.step import rl_step

RUNS = {
    "grpo": {},
    # int4 sampler: c != 1; a +-1% band masks some tokens; 2 passes x 2 mini-batches move r.
    "icepop": {"rollout.mismatch.quant": "int4", "objective.band_low": 0.99, "objective.band_high": 1.01,
               "train.epochs": 2, "train.mini_batches": 2, "train.lr": 3e-2, "train.warmup_steps": 0},
    "score_centering": {},
    "rlsd": {},
}


def _one_step(name, workdir, **overrides):
  """Step 1 of a shrunk run of configs/<name>.py, without the run's evaluations and checkpoints."""
  cfg = from_config_dict(shrink(load_config(name), **{"train.steps": 1, **overrides}))
  tr = make_trainer(cfg, workdir, lambda s: None)
  os.makedirs(workdir, exist_ok=True)
  state = tr.start_rl(tr.setup_extensions(tr.init_state(jax.random.key(0))))
  state, metrics = rl_step(tr.context, state)
  return tr, state, metrics


# The module-scoped fixtures run once: the module's tests go to one pytest-xdist worker.
pytestmark = pytest.mark.xdist_group("training.test_dump_inspect")


@pytest.fixture(scope="session")  # once per worker (the module's tests share one: pytestmark)
def dumps(tmp_path_factory):
  out = {}
  for name, overrides in RUNS.items():
    wd = str(tmp_path_factory.mktemp(name))
    tr, state, metrics = _one_step(name, wd, **{"log.dump_steps": (1,), **overrides})
    arrays, info = token_dump.read_dump(wd, 1)
    out[name] = dict(workdir=wd, arrays=arrays, info=info, metrics=metrics, params=jax.device_get(state.params))
  return out


@pytest.mark.slow
def test_dumped_factors_are_the_losses(dumps):
  for name, d in dumps.items():
    a, info = d["arrays"], d["info"]
    K = RUNS[name].get("train.epochs", 1)
    assert info["passes"] == K and a["factor_W_KBR"].shape[0] == K, name
    loss = a["loss_mask_BR"]
    assert loss.any() and not (loss & ~a["sampled_BR"]).any()
    np.testing.assert_allclose(a["factor_W_KBR"], a["factor_T_KBR"] * a["factor_f_KBR"], rtol=1e-6, atol=1e-9)
    # lambda under each mini-batch's own norms: n rows of which all have loss tokens here
    rows = loss.shape[0] // RUNS[name].get("train.mini_batches", 1)
    assert loss.any(axis=1).all()
    lam = a["factor_lambda_KBR"]
    if info["config"]["objective"]["aggregation"] == "seq_mean_token_mean":  # 1 / (|y_i| n_seqs)
      np.testing.assert_allclose((lam * loss.sum(1)[:, None])[:, loss], 1.0 / rows, rtol=1e-5)
    else:  # seq_mean_token_sum: 1 / n_seqs (score_centering)
      assert info["config"]["objective"]["aggregation"] == "seq_mean_token_sum"
      np.testing.assert_allclose(lam[:, loss], 1.0 / rows, rtol=1e-6)
    assert not lam[:, ~loss].any()
    np.testing.assert_allclose(a["factor_lambda_A_W_KBR"], lam * a["factor_A_KBR"] * a["factor_W_KBR"], rtol=1e-5,
                               atol=1e-12)
    if name != "score_centering":  # token-level A: the loss's A is the advantage it was given
      np.testing.assert_array_equal(a["factor_A_KBR"][0][loss], a["adv_in_BR"][loss])
    assert a["factor_C_KBR"].any() == (name == "score_centering")
    assert set(info["pieces"]) == {str(i) for i in np.unique(a["tokens_BR"][a["sampled_BR"]])}


def test_icepop_dump_shows_the_int4_mismatch_and_its_masks(dumps):
  a, m = dumps["icepop"]["arrays"], dumps["icepop"]["metrics"]
  loss = a["loss_mask_BR"]
  # the loss's log c is the measured log pi_prox - log mu (both passes: c does not move)
  for k in range(2):
    np.testing.assert_allclose(a["factor_log_c_KBR"][k][loss], a["measured_log_c_BR"][loss], atol=1e-6)
  c = a["factor_c_KBR"][0]
  outside = loss & ((c < 0.99) | (c > 1.01))
  assert outside.any() and (loss & ~outside).any()
  np.testing.assert_array_equal(a["flag_correction__masked_KBR"][0], outside)
  assert not a["factor_W_KBR"][0][outside].any()
  # the second pass's updates moved r; the first mini-batch of pass 1 starts at pi_prox
  assert np.abs(a["factor_r_KBR"][1][loss] - 1).max() > 1e-4
  assert m["mismatch/log_c_abs_mean"] > 1e-3
  np.testing.assert_allclose(m["mismatch/log_c_abs_mean"], np.abs(a["measured_log_c_BR"][a["sampled_BR"]]).mean(),
                             rtol=1e-4)
  assert abs(dumps["grpo"]["metrics"]["mismatch/log_c_mean"]) < 1e-5  # no mismatch: log c ~ 0


def test_rlsd_dump_holds_the_teacher_signals(dumps):
  a, info = dumps["rlsd"]["arrays"], dumps["rlsd"]["info"]
  assert info["extensions"] == ["teacher"] and info["config"]["teacher"]["signal"] == "rlsd"
  loss = a["loss_mask_BR"]
  np.testing.assert_allclose(a["ext_teacher__gap"][loss], (a["ext_teacher__teacher_logp"] -
                                                          a["ext_teacher__student_logp"])[loss], atol=1e-6)
  # RLSD: A = A_reward * clip(exp(sign(A) gap), 1 - eps_w, 1 + eps_w) with lam = 1 (docs/objectives.md eqs. 11.13-11.14)
  a_r, gap = a["ext_teacher__reward_adv"], a["ext_teacher__gap"]
  u = np.clip(np.exp(np.sign(a_r) * gap), 0.8, 1.2)
  np.testing.assert_allclose(a["factor_A_KBR"][0][loss], (a_r * u)[loss], rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_a_dump_leaves_the_result_unchanged(dumps, tmp_path):
  _, state, metrics = _one_step("grpo", str(tmp_path))
  jax.tree.map(np.testing.assert_array_equal, dumps["grpo"]["params"], jax.device_get(state.params))
  assert metrics["loss/total"] == dumps["grpo"]["metrics"]["loss/total"]
  assert not os.path.exists(tmp_path / token_dump.DUMP_DIR)


def _embedded(html_text):
  m = re.search(r'<script type="application/json" id="data">(.*?)</script>', html_text, re.S)
  return json.loads(m.group(1).replace("<\\/", "</"))


def _decode(buf, n):
  if "const" in buf:
    return np.full(n, buf["const"])
  dtype = {"f32": np.float32, "u8": np.uint8, "u16": np.uint16, "i32": np.int32}[buf["dtype"]]
  return np.frombuffer(base64.b64decode(buf["b64"]), dtype)


@pytest.mark.parametrize("name", sorted(RUNS))
def test_the_page_embeds_exactly_the_dumped_values(dumps, name):
  d = dumps[name]
  path = inspect_lib.write_page(d["workdir"], 1)
  assert path == os.path.join(d["workdir"], token_dump.DUMP_DIR, "step_1.html")
  text = open(path, encoding="utf-8").read()
  assert "http://" not in text and "https://" not in text and "<script src" not in text  # self-contained
  data, a = _embedded(text), d["arrays"]
  sampled = a["sampled_BR"]
  n = int(sampled.sum())
  assert data["meta"]["n_tokens"] == n and data["offsets"][-1] == n
  np.testing.assert_array_equal(_decode(data["tokens"], n), a["tokens_BR"][sampled])
  np.testing.assert_array_equal(_decode(data["in_loss"], n).astype(bool), a["loss_mask_BR"][sampled])
  fields = {f["key"]: f for f in data["fields"]}
  sources = {k: f"factor_{k}_KBR" for k in ("W", "T", "f", "A", "lambda", "lambda_A_W", "r", "c", "rho", "log_c", "C")}
  sources.update(log_c_measured="measured_log_c_BR", logp_mu="behav_logp_BR", logp_prox="prox_logp_BR")
  sources.update({f"teacher.{k[len('ext_teacher__'):]}": k for k in a if k.startswith("ext_teacher__")
                  and a[k].ndim == 2})
  if name != "score_centering":
    assert "C" not in fields  # kappa = 0: no centering term to show
    del sources["C"]
  for key, src in sources.items():
    want = a[src] if a[src].ndim == 3 else a[src][None]
    got = [_decode(p, n) for p in fields[key]["passes"]]
    for k in range(want.shape[0]):
      np.testing.assert_array_equal(got[min(k, len(got) - 1)].astype(np.float32), want[k][sampled], err_msg=key)
  for fl in data["flags"]:
    want = a[f"flag_{fl['key'].replace('/', '__')}_KBR"]
    for k in range(want.shape[0]):
      np.testing.assert_array_equal(_decode(fl["passes"][min(k, len(fl["passes"]) - 1)], n).astype(bool),
                                    want[k][sampled])
  np.testing.assert_array_equal(np.asarray(data["seq"]["reward"], np.float32), a["reward_B"])
  np.testing.assert_array_equal(np.asarray(data["seq"]["length"]), a["length_B"])
  colours = dict(data["colours"])
  assert {"W", "T", "f", "A", "lambda A W", "log c"} <= set(colours)
  assert ("teacher gap" in colours) == (name == "rlsd")
  if name == "icepop":
    assert [f["key"] for f in data["flags"]] == ["correction/masked"] or "correction/masked" in \
        [f["key"] for f in data["flags"]]
    assert "c outside [0.99, 1.01]" in {f["key"]: f["reason"] for f in data["flags"]}["correction/masked"]


def test_missing_dumps_are_one_line_errors_naming_what_exists(dumps, tmp_path):
  wd = dumps["grpo"]["workdir"]
  with pytest.raises(FileNotFoundError, match=r"step 7 was not dumped in .*: the dumped steps are 1$"):
    token_dump.read_dump(wd, 7)
  with pytest.raises(FileNotFoundError, match=r"holds no token-weight dumps .*log\.dump_steps"):
    token_dump.read_dump(str(tmp_path), 1)
  with pytest.raises(FileNotFoundError, match="does not exist"):
    token_dump.read_dump(str(tmp_path / "nope"), 1)
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  res = subprocess.run([sys.executable, "-m", "jaxrl_llm.inspect", f"--workdir={wd}", "--step=7"], cwd=REPO,
                       capture_output=True, text=True, env=env, timeout=120)
  assert res.returncode == 2, res.stderr
  assert res.stderr.splitlines()[0] == f"error: step 7 was not dumped in {wd!r}: the dumped steps are 1"


def test_dump_steps_are_validated():
  def cfg(**o):
    return from_config_dict(shrink(load_config("grpo"), **o))
  assert cfg(**{"log.dump_steps": (3, 1, 3)}).log.dump_steps == (1, 3)
  with pytest.raises(ConfigError, match=r"config\.log\.dump_steps=\(1, 5\) is invalid: steps \[5\] are past "
                                        r"train\.steps=3: allowed \[1, 3\]"):
    cfg(**{"log.dump_steps": (1, 5)})
  with pytest.raises(ConfigError, match=r"config\.log\.dump_steps \(an entry\)=0 is out of range"):
    cfg(**{"log.dump_steps": (0,)})
  # which steps are dumped does not change the result: a resume may change it
  from jaxrl_llm.training import provenance
  assert provenance.result_changes(provenance.plain_config(cfg()),
                                   provenance.plain_config(cfg(**{"log.dump_steps": (2,)}))) == {}


# ---- the page in a real browser --------------------------------------------------------------
CHROMIUM = "/usr/bin/chromium"


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"Chromium is not installed at {CHROMIUM} "
                    "(apt-get install -y chromium chromium-driver)")
def test_the_page_in_headless_chromium(dumps, tmp_path):
  from playwright.sync_api import sync_playwright

  d = dumps["icepop"]
  a = d["arrays"]
  path = inspect_lib.write_page(d["workdir"], 1, str(tmp_path / "page.html"))
  sampled, loss = a["sampled_BR"], a["loss_mask_BR"]
  with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    problems = []
    page.on("console", lambda msg: problems.append(msg.text) if msg.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.goto("file://" + path)
    page.wait_for_selector("#seqs .t")
    # the legend: W's range, exp(-s) .. exp(s) with s = max |log W| over the sampled tokens (pass 1)
    w = a["factor_W_KBR"][0][sampled]
    s = np.abs(np.log(w[w > 0])).max()
    assert page.inner_text("#legend .name") == "W = f T"
    np.testing.assert_allclose(float(page.inner_text("#legend .hi")), np.exp(s), rtol=1e-3)
    np.testing.assert_allclose(float(page.inner_text("#legend .lo")), np.exp(-s), rtol=1e-3)
    # a masked token of the first visible sequence: its tooltip shows the dump's values and the reason
    b, t = np.argwhere(a["flag_correction__masked_KBR"][0])[0]
    assert b < 20  # on the first page
    offsets = np.concatenate([[0], np.cumsum(sampled.sum(1))])
    span = page.locator(f'#seqs .t[data-i="{offsets[b] + t}"]')
    assert "mk" in span.get_attribute("class")
    span.hover()
    page.wait_for_selector("#tip:not([hidden])")
    for key, src in (("W", "factor_W_KBR"), ("c", "factor_c_KBR"), ("r", "factor_r_KBR"),
                     ("lambda", "factor_lambda_KBR"), ("A", "factor_A_KBR")):
      shown = page.inner_text(f'#tip tr[data-key="{key}"] td.v')
      np.testing.assert_allclose(float(shown), a[src][0][b, t], rtol=1e-5, atol=1e-12, err_msg=key)
    assert "correction mask: c outside [0.99, 1.01] (masked)" in page.inner_text("#tip .why")
    # pass 2 shows pass 2's r
    page.select_option("#pass", index=1)  # option "2" (a value "1" would also match the label "1")
    page.mouse.move(0, 0)
    page.locator(f'#seqs .t[data-i="{offsets[b] + t}"]').hover()
    page.wait_for_selector("#tip:not([hidden])")
    np.testing.assert_allclose(float(page.inner_text('#tip tr[data-key="r"] td.v')), a["factor_r_KBR"][1][b, t],
                               rtol=1e-5)
    # histograms count the loss's tokens; the group filter keeps one group
    counts = [int(c) for c in page.eval_on_selector_all("#hist-W rect", "els => els.map(e => e.dataset.count)")]
    assert sum(counts) == int(loss.sum())
    page.select_option("#group", value="1")
    assert page.eval_on_selector_all("#seqs .seq", "els => els.map(e => Number(e.dataset.b))") == \
        list(np.flatnonzero(a["group_B"] == 1))
    page.select_option("#colour", value="log_c_measured")
    assert page.inner_text("#legend .name").startswith("log c = log pi_prox - log mu")
    shot = tmp_path / "page.png"
    page.screenshot(path=str(shot))
    browser.close()
  assert not problems, problems
  import matplotlib.image

  img = matplotlib.image.imread(str(shot))[..., :3]
  assert img.shape[0] > 500 and img.std() > 0.05  # not blank
  assert len(np.unique((img * 255).astype(np.uint8).reshape(-1, 3), axis=0)) > 50  # text and colours drawn
  shutil.copy(shot, tmp_path / "kept.png")


def test_every_preset_renders_with_its_own_reasons(dumps):
  # The page depends on the method only through its knobs: every preset's page renders, and each flag
  # the loss can raise gets a reason naming that method's bounds.
  import dataclasses

  from jaxrl_llm.objectives import PRESETS, get_preset

  a, info = dumps["grpo"]["arrays"], dumps["grpo"]["info"]
  for name in sorted(PRESETS):
    obj = dataclasses.asdict(get_preset(name))
    reasons = inspect_lib.flag_reasons(obj)
    assert set(reasons) == set(info["flags"]) and all(reasons.values()), name
    page = inspect_lib.render(a, {**info, "method": name, "config": {**info["config"], "objective": obj}})
    assert _embedded(page)["meta"]["objective"]["name"] == name
  assert "A > 0 and s_i (the answer's geometric mean of r) > 1.0004" in \
      inspect_lib.flag_reasons(dataclasses.asdict(get_preset("gspo")))["trust/clip_high"]
  assert inspect_lib.flag_reasons(dataclasses.asdict(get_preset("cispo")))["trust/clip_high"] == \
      "trust region: r > 1.28, weight capped at 1.28 (truncated)"
  assert "c_i (product over the answer) > 2" in \
      inspect_lib.flag_reasons(dataclasses.asdict(get_preset("seq_mis")))["correction/masked"]
