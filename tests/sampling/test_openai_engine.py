"""The `openai` rollout engine against a pure-Python stand-in of llama.cpp's server (fake_openai_server.py).

What the engine sends (every sampling knob, our sampler order, token-id
prompts), what it makes of the answers (tokens, log mu, top-k, EOS and stop
ids, versions), retries, resampling, dropping, a server that is down or
crashes, the weight-sync hooks, and its one-line errors. mu is checked
against our own `process_logits` on the server's logits (the independent
reference for the processing order).
"""

import errno
import json
import os
import re
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.checks import ConfigError
from jaxrl_llm.model.config import ModelConfig
from jaxrl_llm.model.params import init_params
from jaxrl_llm.model.tokenizer import CharTokenizer
from jaxrl_llm.sampling.config import RolloutConfig, SamplingConfig
from jaxrl_llm.sampling.engine import RolloutBatch
from jaxrl_llm.sampling.openai_engine import OpenAIEngine, make_openai_engine
from jaxrl_llm.sampling.openai_request import SAMPLER_ORDER, ServerEngineConfig, request_fields
from jaxrl_llm.sampling.processors import process_logits
from jaxrl_llm.sampling.rollout import FINISH_EOS, FINISH_LENGTH, FINISH_STOP
from jaxrl_llm.sampling.server_process import free_port
from jaxrl_llm.sampling.weight_sync import SGLangDiskSync
from jaxrl_llm.tasks.pipeline import PromptBatch

sys.path.insert(0, os.path.dirname(__file__))
from fake_openai_server import FakeServer  # noqa: E402

FAKE = os.path.join(os.path.dirname(__file__), "fake_openai_server.py")
TOK = CharTokenizer()
V = TOK.vocab_size
MODEL = ModelConfig.tiny(V, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=64)


def bigram(seed: int = 0) -> np.ndarray:
  logits = np.random.default_rng(seed).normal(size=(V, V)) * 3.0
  logits[:, 1] += 2.0  # EOS likely enough that some answers end early
  return logits


def prompts(texts=("12+3=", "7*6=", "ab")) -> PromptBatch:
  ids = [[TOK.bos_id] + TOK.encode(t) for t in texts]
  P = max(map(len, ids))
  tokens = np.zeros((len(ids), P), np.int32)
  mask = np.zeros((len(ids), P), bool)
  for i, row in enumerate(ids):
    tokens[i, P - len(row):], mask[i, P - len(row):] = row, True
  return PromptBatch(tokens_BP=tokens, mask_BP=mask, prompts=tuple(texts), answers=("15", "42", "c"),
                     tags=("a", "b", "c"))


def sampling(**kw) -> SamplingConfig:
  base = dict(temperature=1.0, max_new_tokens=6, n_samples=2, eos_ids=(TOK.eos_id,), pad_id=TOK.pad_id,
              vocab_limit=V)
  return SamplingConfig(**{**base, **kw})


def settings(url, **kw) -> ServerEngineConfig:
  base = dict(url=url, sync="none", on_exit="error", timeout_s=1.0, retries=2, backoff_s=0.01, wait_s=3.0,
              concurrency=4)
  return ServerEngineConfig(**{**base, **kw})


@pytest.fixture
def server():
  srv = FakeServer(bigram(), eos_ids=(TOK.eos_id,), encode=TOK.encode).start()
  yield srv
  srv.stop()


def engine(srv, scfg=None, **kw) -> OpenAIEngine:
  return OpenAIEngine(model_cfg=MODEL, sampling_cfg=scfg or sampling(), tokenizer=TOK, settings=settings(srv.url, **kw))


def _answer_rows(srv) -> dict:
  """(prompt ids, token ids) of every answer the server gave."""
  by_seed = {r["seed"]: r for r in srv.requests}
  return {(tuple(by_seed[s]["prompt"]), tuple(c["id"] for c in a["choices"][0]["logprobs"]["content"])): a
          for s, a in srv.answers.items()}


# ---- requests and answers -------------------------------------------------------------

def test_request_carries_every_sampling_knob_in_our_order(server):
  scfg = sampling(temperature=0.7, top_k=5, top_p=0.9, min_p=0.05, record_topk=3)
  eng = engine(server, scfg)
  batch = eng.generate(prompts(), jax.random.key(0))
  assert batch.tokens_BR.shape == (6, 6)
  reqs = server.requests
  assert len(reqs) == 6  # G = 2 requests of one completion per prompt
  pb = prompts()
  for r in reqs:
    assert r["max_tokens"] == 6 and r["temperature"] == 0.7 and r["top_k"] == 5 and r["top_p"] == 0.9
    assert r["min_p"] == 0.05 and r["n"] == 1 and r["n_probs"] == 3 and r["post_sampling_probs"] is True
    assert r["samplers"] == ["temperature", "top_k", "top_p", "min_p"] == list(SAMPLER_ORDER)
    # llama.cpp's other samplers and penalties are sent switched off, not left at its defaults
    assert r["repeat_penalty"] == 1.0 and r["dry_multiplier"] == 0.0 and r["xtc_probability"] == 0.0
    assert r["typical_p"] == 1.0 and r["mirostat"] == 0 and r["presence_penalty"] == 0.0
    assert r["model"] == "fake-model" and "logit_bias" not in r  # vocab_limit == V: nothing to ban
  # the prompt goes as its real token ids (left padding dropped, our <bos> kept), each row its own seed
  sent = sorted(tuple(r["prompt"]) for r in reqs)
  expected = sorted(tuple(pb.tokens_BP[i][pb.mask_BP[i]].tolist()) for i in range(3) for _ in range(2))
  assert sent == expected
  assert len({r["seed"] for r in reqs}) == 6


def test_batch_holds_the_answers_and_mu_is_our_processing(server):
  scfg = sampling(temperature=0.7, top_k=5, top_p=0.9, record_topk=3)
  eng = engine(server, scfg)
  batch = eng.generate(prompts(), jax.random.key(1))
  answers = _answer_rows(server)
  assert len(server.answers) == 6  # one answer per seed (two of a prompt may coincide)
  pb = prompts()
  logits = bigram()
  for b in range(6):
    L = int(batch.length_B[b])
    ids = batch.tokens_BR[b, :L].tolist()
    prompt = tuple(pb.tokens_BP[b // 2][pb.mask_BP[b // 2]].tolist())
    assert (prompt, tuple(ids)) in answers  # row b is one of its prompt's answers
    assert batch.mask_BR[b].tolist() == [True] * L + [False] * (6 - L)
    assert (batch.tokens_BR[b, L:] == TOK.pad_id).all()
    ends_with_eos = bool(ids) and ids[-1] == TOK.eos_id
    assert batch.truncated_B[b] == (not ends_with_eos) and (ends_with_eos or L == 6)
    # log mu of each token = our process_logits (temperature, top-k, top-p) on the server's logits
    prev = [prompt[-1]] + ids[:-1]
    ref = np.asarray(process_logits(jnp.asarray(logits[prev], jnp.float32), temperature=0.7, top_k=5, top_p=0.9))
    np.testing.assert_allclose(np.asarray(batch.behav_logp_BR)[b, :L], ref[np.arange(L), ids], atol=2e-5)
    top = np.argsort(-ref, axis=-1, kind="stable")[:, :3]
    kept = np.isfinite(np.take_along_axis(ref, top, -1))  # top-p may keep fewer than 3: ids there are padding
    np.testing.assert_array_equal(np.asarray(batch.topk_ids_BRK)[b, :L][kept], top[kept])
    np.testing.assert_allclose(np.asarray(batch.topk_logp_BRK)[b, :L], np.take_along_axis(ref, top, -1),
                               atol=2e-5)
  assert batch.prompts == ("12+3=", "12+3=", "7*6=", "7*6=", "ab", "ab")
  assert batch.answers[2] == "42" and batch.tags[5] == "c"
  assert batch.responses[0] == TOK.decode(batch.tokens_BR[0])
  assert (batch.version_B == -1).all()  # server_sync='none': no trainer step made these weights
  np.testing.assert_array_equal(batch.prompt_BP, np.repeat(pb.tokens_BP, 2, axis=0))
  # the batch joins others like the built-in engine's
  both = RolloutBatch.concat([batch, batch.select(np.array([1, 0]))])
  assert both.tokens_BR.shape == (8, 6) and both.version_B.shape == (8,)


def test_top_k_shorter_than_record_topk_is_padded_with_minus_inf(server):
  eng = engine(server, sampling(top_k=2, record_topk=4))
  batch = eng.generate(prompts(("1",)), jax.random.key(2))
  L = int(batch.length_B[0])
  logp = np.asarray(batch.topk_logp_BRK)[0, :L]
  assert np.isfinite(logp[:, :2]).all() and (logp[:, 2:] == -np.inf).all()
  assert (np.asarray(batch.topk_ids_BRK)[0, :L, 2:] == TOK.pad_id).all()
  # the two kept candidates hold all of mu's mass
  np.testing.assert_allclose(np.exp(logp[:, :2]).sum(-1), 1.0, atol=1e-6)


def test_greedy_is_the_argmax_walk_with_log_mu_zero(server):
  eng = engine(server, sampling(temperature=0.0, n_samples=1, max_new_tokens=5))
  batch = eng.generate(prompts(("12",)), jax.random.key(3))
  logits, last, walk = bigram(), TOK.encode("2")[0], []
  for _ in range(5):
    last = int(np.argmax(logits[last]))
    walk.append(last)
    if last == TOK.eos_id:
      break
  assert batch.tokens_BR[0, :len(walk)].tolist() == walk
  assert (np.asarray(batch.behav_logp_BR)[batch.mask_BR] == 0.0).all()  # log 1: a point mass
  assert server.requests[0]["temperature"] == 0.0


def test_stop_ids_the_server_does_not_know_cut_the_answer(server):
  # a stop id the server never stops on: the engine cuts after its first occurrence (the tokens before it were
  # drawn exactly as if the server had stopped there)
  logits = bigram()
  stop = int(np.argmax(logits[TOK.encode("=")[0]]))  # the likeliest token after '='
  eng = engine(server, sampling(temperature=0.0, n_samples=1, stop_ids=(stop,)))
  batch = eng.generate(prompts(("12+3=",)), jax.random.key(4))
  assert batch.tokens_BR[0, 0] == stop and batch.length_B[0] == 1
  assert not batch.truncated_B[0] and batch.mask_BR[0].tolist() == [True] + [False] * 5
  full = server.answers[server.requests[0]["seed"]]["choices"][0]["logprobs"]["content"]
  assert len(full) > 1  # the server went on; its extra tokens are not in the batch


def test_padded_vocabulary_rows_are_banned():
  fields = request_fields(sampling(vocab_limit=V - 2), V)
  assert fields["logit_bias"] == [[V - 2, False], [V - 1, False]]


# ---- failures ---------------------------------------------------------------------------

def test_transient_failures_are_retried_and_counted(server):
  server.script = ["500", "reset", "garbage", "timeout", "503"]
  eng = engine(server, timeout_s=0.5, retries=5, concurrency=1)
  batch = eng.generate(prompts(), jax.random.key(5))
  assert batch.mask_BR.any(axis=1).all()  # every sample arrived
  m = eng.metrics()
  assert m["engine/retries"] == 5.0 and m["engine/failed_requests"] == 0.0 and m["engine/requests"] == 11.0


def test_a_request_that_keeps_failing_is_resampled(server):
  server.script = ["500"] * 3  # retries=2: the first sample fails 1 + 2 times, then its resample succeeds
  eng = engine(server, concurrency=1)
  batch = eng.generate(prompts(), jax.random.key(6))
  assert batch.mask_BR.any(axis=1).all()
  m = eng.metrics()
  assert m["engine/failed_requests"] == 1.0 and m["engine/resampled"] == 1.0 and m["engine/dropped"] == 0.0
  seeds = [r["seed"] for r in server.requests]
  assert seeds[0] == seeds[1] == seeds[2] and seeds[-1] not in seeds[:3]  # retried as is, resampled anew


def test_drop_masks_the_sample_out(server):
  server.script = ["500"] * 3
  eng = engine(server, concurrency=1, on_failure="drop")
  batch = eng.generate(prompts(), jax.random.key(7))
  empty = ~batch.mask_BR.any(axis=1)
  assert empty.sum() == 1 and batch.length_B[empty][0] == 0 and not batch.truncated_B[empty][0]
  assert eng.metrics()["engine/dropped"] == 1.0


def test_a_rollout_whose_every_request_fails_is_an_error(server):
  server.script = ["500"] * 100
  eng = engine(server, on_failure="drop", retries=1)
  with pytest.raises(RuntimeError, match=r"all 6 requests of the rollout failed; the last: .*HTTP 500 \(injected"):
    eng.generate(prompts(), jax.random.key(13))


def test_a_server_that_is_down_is_waited_for(server):
  eng = engine(server, on_exit="wait", wait_s=10.0)
  server.down = True
  threading.Timer(0.4, lambda: setattr(server, "down", False)).start()
  batch = eng.generate(prompts(), jax.random.key(8))
  assert batch.mask_BR.any(axis=1).all()  # nothing lost
  assert eng.metrics()["engine/server_exits"] >= 1.0


def test_a_server_that_is_down_is_an_error_when_configured(server):
  eng = engine(server, on_exit="error")
  server.down = True
  with pytest.raises(RuntimeError, match="does not answer .*server_on_exit='error'"):
    eng.generate(prompts(), jax.random.key(9))


def test_http_400_is_a_config_error_not_retried(server):
  server.script = ["400"]
  eng = engine(server, concurrency=1)
  with pytest.raises(ConfigError, match=r"refused the request \(HTTP 400: Unsupported param: injected\)"):
    eng.generate(prompts(), jax.random.key(10))


# ---- start-time checks and bad input ----------------------------------------------------

def test_unreachable_server_is_one_line_error():
  url = f"http://127.0.0.1:{free_port()}"
  with pytest.raises(ConfigError, match="no OpenAI-compatible server answers") as e:
    OpenAIEngine(model_cfg=MODEL, sampling_cfg=sampling(), tokenizer=TOK, settings=settings(url))
  assert "\n" not in str(e.value) and url in str(e.value)


def test_an_unreachable_server_is_a_one_line_error_before_training(tmp_path):
  # A running server (server_sync='none') on a closed loopback port, waited for server_wait_s: the run
  # stops with the URL named, before the warm start (sft.steps > 0 would log its steps) or any checkpoint.
  from run_helpers import load_config, make_trainer, shrink

  from jaxrl_llm.training.config import from_config_dict

  url = f"http://127.0.0.1:{free_port()}"
  c = shrink(load_config("grpo"), **{"rollout.engine": "openai", "rollout.server_sync": "none",
                                     "rollout.server_url": url, "rollout.server_on_exit": "wait",
                                     "rollout.server_wait_s": 1.0, "rollout.server_backoff_s": 0.1,
                                     "sft.steps": 20})
  logs = []
  tr = make_trainer(from_config_dict(c), tmp_path / "run", logs.append)
  t0 = time.monotonic()
  with pytest.raises(ConfigError) as e:
    tr.run()
  waited = time.monotonic() - t0
  msg = str(e.value)
  assert "\n" not in msg and msg.startswith(f"config.rollout.server_url={url!r}: no OpenAI-compatible server "
                                            "answers within config.rollout.server_wait_s=1 s (GET ")
  assert waited >= 1.0  # it did wait for the server
  assert not any(line.startswith("sft step") for line in logs) and not any("eval" in line for line in logs)
  assert not (tmp_path / "run" / "checkpoints").exists() and not (tmp_path / "run" / "metrics.jsonl").exists()


def test_other_vocabulary_is_refused():
  bigger = FakeServer(np.zeros((V + 5, V + 5)), encode=TOK.encode).start()
  shifted = FakeServer(bigram(), encode=lambda text: [i + 1 for i in TOK.encode(text)]).start()
  try:
    with pytest.raises(ConfigError, match=f"vocabulary of {V + 5} tokens; the trainer's model has {V}"):
      engine(bigger)
    with pytest.raises(ConfigError, match="tokenizes .* differently from the trainer .* another vocabulary"):
      engine(shifted)
  finally:
    bigger.stop()
    shifted.stop()


def test_other_model_is_refused(server):
  with pytest.raises(ConfigError, match=r"server_model='llama-7b': the server at .* serves \['fake-model'\]"):
    engine(server, model="llama-7b")


def test_a_setting_the_server_does_not_apply_is_refused(server):
  server.override = {"top_k": 40}  # as llama.cpp's default would be, had the field been dropped
  with pytest.raises(ConfigError, match="applies top_k=40 where the engine asked for 0: it would sample from "
                                        "another distribution"):
    engine(server)
  server.override = {}
  eng = engine(server)
  eng.fields = dict(eng.fields, samplers=["temperature", "top_k", "top_p", "min_p", "tail_free"])
  with pytest.raises(ConfigError, match=r"applies samplers=\['temperature', 'top_k', 'top_p', 'min_p'\] where"):
    eng.check_applied_settings([TOK.bos_id])


def test_long_prompt_for_the_server_context_is_refused(server):
  server.n_ctx = 8
  eng = engine(server)
  with pytest.raises(ConfigError, match="exceeds the server's context of 8 tokens"):
    eng.generate(prompts(), jax.random.key(11))


def test_server_stopping_on_an_unknown_token_is_refused(server):
  server.eos_ids = {TOK.encode("5")[0], TOK.eos_id}
  server.logits_VV = np.full((V, V), -10.0)
  server.logits_VV[:, TOK.encode("5")[0]] = 10.0
  eng = engine(server, sampling(temperature=0.0, n_samples=1))
  with pytest.raises(ConfigError, match="end-of-generation tokens differ from the trainer's"):
    eng.generate(prompts(("1",)), jax.random.key(12))


@pytest.mark.parametrize("kw,match", [
    (dict(dtype="bfloat16"), "sampler_dtype='bfloat16' is invalid for engine 'openai'"),
    (dict(record_raw_logp=True), "record_raw_logp=True is invalid"),
    (dict(cache_len=64), "cache_len=64 is invalid"),
])
def test_what_the_server_cannot_express_is_an_error(kw, match):
  with pytest.raises(ConfigError, match=match):
    request_fields(sampling(**kw), V)


def _rollout(**kw) -> RolloutConfig:
  base = dict(engine="openai", prompts_per_step=2, group_size=2, max_response_len=4, temperature=1.0, top_k=0,
              top_p=1.0, sampler_dtype="float32", staleness=0, record_topk=0)
  return RolloutConfig(**{**base, **kw})


@pytest.mark.parametrize("kw,match", [
    (dict(sampler_dtype="bfloat16"), "sampler_dtype='bfloat16' is invalid: engine 'openai' samples at the precision"),
    (dict(server_url="http://127.0.0.1:1"), "server_sync='restart' starts its own llama.cpp server"),
    (dict(server_sync="none"), "server_sync='none' needs the http://HOST:PORT"),
    (dict(server_sync="none", server_url="http://x:1"), "only a server the engine started"),
    (dict(server_export="q5_k"), r"server_export='q5_k' is invalid: allowed \('f32', 'f16', 'q8_0', 'q4_0'\)"),
    (dict(server_on_failure="skip"), "server_on_failure='skip' is invalid"),
    (dict(sync_every=0), "sync_every=0 is out of range"),
    (dict(server_retries=-1), "server_retries=-1 is out of range"),
])
def test_rollout_config_refuses(kw, match):
  with pytest.raises(ConfigError, match=match):
    _rollout(**kw)


def test_url_must_be_http():
  with pytest.raises(ConfigError, match="server_url='localhost:8080' is invalid: expected http://HOST:PORT"):
    OpenAIEngine(model_cfg=MODEL, sampling_cfg=sampling(), tokenizer=TOK, settings=settings("localhost:8080"))


def test_an_external_engine_is_a_mismatch_to_measure():
  assert _rollout().mismatched and not _rollout(engine="builtin").mismatched


# ---- weights: the server process the engine starts, and the SGLang hook ------------------

def _managed(tmp_path, **kw) -> OpenAIEngine:
  cmd = f"{sys.executable} {FAKE} " + kw.pop("flags", "")
  s = ServerEngineConfig(command=cmd, sync="restart", timeout_s=5.0, retries=2, backoff_s=0.01, wait_s=60.0,
                         concurrency=2, **kw)
  return make_openai_engine(model_cfg=MODEL, sampling_cfg=sampling(max_new_tokens=4), tokenizer=TOK, settings=s)


def test_sync_exports_restarts_and_versions_the_samples(tmp_path):
  eng = _managed(tmp_path, sync_every=2)
  try:
    p0 = init_params(MODEL, jax.random.key(0))
    with pytest.raises(RuntimeError, match="before sync"):
      eng.generate(prompts(), jax.random.key(0))
    eng.sync(p0, 0)
    first = eng.generate(prompts(), jax.random.key(0))
    assert (first.version_B == 0).all() and first.mask_BR.any(axis=1).all()
    m = eng.metrics()
    assert m["engine/syncs"] == 1.0 and m["engine/export_s"] > 0 and m["engine/reload_s"] > 0
    assert m["engine/sync_s"] >= m["engine/export_s"] + m["engine/reload_s"] * 0.99
    pid = eng.process.proc.pid
    eng.sync(init_params(MODEL, jax.random.key(1)), 1)  # sync_every=2: not yet
    assert eng.process.proc.pid == pid and eng.metrics()["engine/syncs"] == 1.0
    p2 = init_params(MODEL, jax.random.key(2))
    eng.sync(p2, 2)
    assert eng.process.proc.pid != pid and eng.process.model_path.endswith("policy-v2.f32.gguf")
    second = eng.generate(prompts(), jax.random.key(0))
    assert (second.version_B == 2).all()
    # the stand-in samples from the exported embedding: new weights, other answers for the same seeds
    assert not np.array_equal(first.tokens_BR, second.tokens_BR)
    assert sorted(os.listdir(eng.weight_sync.out_dir)) == ["llama-server.log", "policy-v2.f32.gguf"]
  finally:
    eng.close()
  assert not eng.process.alive() and not os.path.exists(eng.weight_sync.out_dir)


def test_a_crashed_server_is_restarted_and_nothing_is_lost(tmp_path):
  marker = tmp_path / "crashed"
  eng = _managed(tmp_path, flags=f"--die-after 3 --die-marker {marker}")
  try:
    eng.sync(init_params(MODEL, jax.random.key(0)), 0)
    batch = eng.generate(prompts(), jax.random.key(0))
    assert marker.exists()  # it did crash, after 3 answers
    assert batch.mask_BR.any(axis=1).all()  # and every sample arrived
    m = eng.metrics()
    assert m["engine/server_exits"] == 1.0 and m["engine/server_restarts"] == 1.0 and m["engine/dropped"] == 0.0
  finally:
    eng.close()


def test_a_crashed_server_is_an_error_when_configured(tmp_path):
  eng = _managed(tmp_path, flags=f"--die-after 1 --die-marker {tmp_path / 'm'}", on_exit="error")
  try:
    eng.sync(init_params(MODEL, jax.random.key(0)), 0)
    with pytest.raises(RuntimeError, match=r"llama.cpp server on .* exited \(code 9\)"):
      eng.generate(prompts(), jax.random.key(0))
  finally:
    eng.close()


def _fill_the_disk(out_dir, seen):
  """A GGUFWriter.write_tensors_to_file that writes part of the file, then finds the disk full."""
  def write(self, *args, **kwargs):
    del args, kwargs
    for fout in self.fout:
      fout.write(b"\0" * 4096)
      fout.flush()
    seen.extend(f for f in os.listdir(out_dir) if ".partial-" in f)  # the partial file is on disk
    raise OSError(errno.ENOSPC, "No space left on device")
  return write


def test_a_full_disk_at_the_sync_export_is_an_error_and_the_server_keeps_its_weights(tmp_path, monkeypatch):
  # Decision (weight_sync.RestartSync.push): an OSError(ENOSPC) naming the file and the free space; the
  # partial file removed; the server not restarted, still serving the previous export.
  import gguf

  eng = _managed(tmp_path)
  try:
    eng.sync(init_params(MODEL, jax.random.key(0)), 0)
    before = eng.generate(prompts(), jax.random.key(0))
    pid, out_dir = eng.process.proc.pid, eng.weight_sync.out_dir
    partial = []
    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", _fill_the_disk(out_dir, partial))
    with pytest.raises(OSError) as e:
      eng.sync(init_params(MODEL, jax.random.key(1)), 1)
    msg = str(e.value)
    assert e.value.errno == errno.ENOSPC and "\n" not in msg
    target, previous = os.path.join(out_dir, "policy-v1.f32.gguf"), os.path.join(out_dir, "policy-v0.f32.gguf")
    assert re.search(rf"policy version 1 to {re.escape(target)} \(\d+\.\d MiB free in {re.escape(out_dir)}\); the "
                     rf"partial file is removed and the server still serves {re.escape(previous)}\.", msg), msg
    assert partial and sorted(os.listdir(out_dir)) == ["llama-server.log", "policy-v0.f32.gguf"]
    assert eng.process.alive() and eng.process.proc.pid == pid and eng.process.model_path == previous
    assert eng.metrics()["engine/syncs"] == 1.0 and eng.version == 0
    after = eng.generate(prompts(), jax.random.key(0))  # the previous weights: the same answers to the same seeds
    assert (after.version_B == 0).all()
    np.testing.assert_array_equal(after.tokens_BR, before.tokens_BR)
  finally:
    eng.close()


def test_a_full_disk_at_a_sync_stops_the_run_and_the_last_checkpoint_resumes(tmp_path, monkeypatch, quiet_log):
  # In a run: the step whose sync fails raises (before its update); the step before it is saved, the
  # engine's server and export folder are gone; the same command, with space again, resumes.
  import gguf
  from run_helpers import load_config, make_trainer, shrink

  from jaxrl_llm.training import loop
  from jaxrl_llm.training.config import from_config_dict

  monkeypatch.setattr(loop, "write_report_safely", lambda workdir, log: None)  # not under test: seconds saved
  c = shrink(load_config("grpo"), **{"rollout.engine": "openai", "rollout.server_command": f"{sys.executable} {FAKE}",
                                     "rollout.server_concurrency": 4, "rollout.server_backoff_s": 0.01,
                                     "train.steps": 2, "checkpoint.every_steps": 1})
  cfg, wd = from_config_dict(c), tmp_path / "run"
  real, exports = gguf.GGUFWriter.write_tensors_to_file, []

  def second_export_fills_the_disk(self, *args, **kwargs):
    exports.append(self.path)
    if len(exports) == 2:
      raise OSError(errno.ENOSPC, "No space left on device")
    return real(self, *args, **kwargs)

  monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", second_export_fills_the_disk)
  tr = make_trainer(cfg, wd, quiet_log)
  with pytest.raises(OSError, match=r"no space left on device for the weight sync of policy version 1 to \S+"
                                    r"policy-v1\.f32\.gguf \(\d+\.\d MiB free"):
    tr.run()
  assert not tr.engine.process.alive() and not os.path.exists(tr.engine.weight_sync.out_dir)
  assert sorted(int(d) for d in os.listdir(wd / "checkpoints") if d.isdigit()) == [1]
  monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", real)
  logs = []
  summary = make_trainer(cfg, wd, logs.append).run()
  assert any("resumed from checkpoint step 1" in line for line in logs) and summary["rl_steps"] == 2
  assert [json.loads(line)["step"] for line in open(wd / "metrics.jsonl")] == [1, 2]


def test_missing_server_binary_is_one_line_error():
  s = ServerEngineConfig(command="no-such-llama-server -t 1", sync="restart")
  with pytest.raises(ConfigError, match="'no-such-llama-server' is not an executable on PATH"):
    make_openai_engine(model_cfg=MODEL, sampling_cfg=sampling(), tokenizer=TOK, settings=s)


def test_a_tokenizer_the_export_cannot_write_is_refused_before_any_sync():
  class OtherTokenizer:  # e.g. a Hugging Face tokenizer of a checkpoint not converted from a GGUF file
    vocab_size = V

  s = ServerEngineConfig(command=f"{sys.executable} {FAKE}", sync="restart", hf_path="/some/hf/dir")
  with pytest.raises(ConfigError, match="model.hf_path='/some/hf/dir' cannot be written as GGUF metadata"):
    make_openai_engine(model_cfg=MODEL, sampling_cfg=sampling(), tokenizer=OtherTokenizer(), settings=s)


def test_sglang_hook_writes_a_checkpoint_and_asks_the_server_to_load_it(server, tmp_path):
  eng = OpenAIEngine(model_cfg=MODEL, sampling_cfg=sampling(), tokenizer=TOK,
                     settings=settings(server.url, sync="sglang"),
                     weight_sync=SGLangDiskSync(model_cfg=MODEL, out_dir=str(tmp_path / "w")))
  eng.sync(init_params(MODEL, jax.random.key(0)), 3)
  assert server.loaded == [str(tmp_path / "w" / "policy-v3")]
  assert os.path.isfile(tmp_path / "w" / "policy-v3" / "config.json")
  assert (eng.generate(prompts(), jax.random.key(0)).version_B == 3).all()


# ---- the trainer through the engine ---------------------------------------------------------

def test_rl_steps_through_the_engine_sync_every_step(tmp_path, quiet_log):
  from run_helpers import load_config, make_trainer, shrink

  from jaxrl_llm.training.config import from_config_dict

  c = shrink(load_config("grpo"), **{"rollout.engine": "openai", "rollout.server_command": f"{sys.executable} {FAKE}",
                                     "rollout.server_concurrency": 4, "rollout.server_backoff_s": 0.01,
                                     "train.steps": 2})
  tr = make_trainer(from_config_dict(c), tmp_path / "run", quiet_log)
  state = tr.start_rl(tr.setup_extensions(tr.init_state(jax.random.key(0))))
  eng = tr.context.engine
  try:
    assert isinstance(eng, OpenAIEngine)
    for step in range(2):
      state, metrics = tr.step(state)
      assert eng.version == step and eng.metrics()["engine/syncs"] == step + 1  # a new export every step
      assert np.isfinite(metrics["loss/total"])
      # mu is the stand-in's bigram, not the policy: an external engine always gets pi_prox recomputed and
      # log c = log pi_prox - log mu measured (both near uniform at init, so the gap is small but not zero)
      assert 0.0 < metrics["mismatch/log_c_abs_mean"] < np.inf
      # The engine's counters and the samples' policy version reach the step's metrics.
      assert metrics["engine/syncs"] == step + 1 and metrics["rollout/version_lag_mean"] == 0.0
    assert eng.metrics()["engine/dropped"] == 0.0
  finally:
    eng.close()
