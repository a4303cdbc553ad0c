"""The `openai` rollout engine against a pure-Python stand-in of llama.cpp's server (fake_openai_server.py).

What the engine sends (every sampling knob, our sampler order, token-id
prompts), what it makes of the answers (tokens, log mu, top-k, EOS and stop
ids, versions), retries, resampling, dropping, a server that is down, and
its one-line errors (the weight sync: test_openai_engine_sync.py). mu is checked
against our own `process_logits` on the server's logits (the independent
reference for the processing order).
"""

import os
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.checks import ConfigError
from jaxrl_llm.sampling.config import RolloutConfig, ServerConfig
from jaxrl_llm.sampling.engine import RolloutBatch
from jaxrl_llm.sampling.openai_engine import OpenAIEngine
from jaxrl_llm.sampling.openai_request import SAMPLER_ORDER, request_fields
from jaxrl_llm.sampling.processors import process_logits
from jaxrl_llm.sampling.server_process import free_port

sys.path.insert(0, os.path.dirname(__file__))
from openai_stand_in import (  # noqa: E402
    MODEL, TOK, V, FakeServer, answer_rows,
    bigram, engine, prompts, sampling, server, settings)


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


@pytest.mark.slow
def test_batch_holds_the_answers_and_mu_is_our_processing(server):
  scfg = sampling(temperature=0.7, top_k=5, top_p=0.9, record_topk=3)
  eng = engine(server, scfg)
  batch = eng.generate(prompts(), jax.random.key(1))
  answers = answer_rows(server)
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
  assert (batch.version_B == -1).all()  # server.sync='none': no trainer step made these weights
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
  with pytest.raises(RuntimeError, match="does not answer .*config.rollout.server.on_exit='error'"):
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


@pytest.mark.slow
def test_an_unreachable_server_is_a_one_line_error_before_training(tmp_path):
  # A running server (server.sync='none') on a closed loopback port, waited for server.wait_s: the run
  # stops with the URL named, before the warm start (sft.steps > 0 would log its steps) or any checkpoint.
  from run_helpers import load_config, make_trainer, shrink

  from jaxrl_llm.training.config import from_config_dict

  url = f"http://127.0.0.1:{free_port()}"
  c = shrink(load_config("grpo"), **{"rollout.engine": "openai", "rollout.server.sync": "none",
                                     "rollout.server.url": url, "rollout.server.on_exit": "wait",
                                     "rollout.server.wait_s": 1.0, "rollout.server.backoff_s": 0.1,
                                     "sft.steps": 20})
  logs = []
  tr = make_trainer(from_config_dict(c), tmp_path / "run", logs.append)
  t0 = time.monotonic()
  with pytest.raises(ConfigError) as e:
    tr.run()
  waited = time.monotonic() - t0
  msg = str(e.value)
  assert "\n" not in msg and msg.startswith(f"config.rollout.server.url={url!r}: no OpenAI-compatible server "
                                            "answers within config.rollout.server.wait_s=1 s (GET ")
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
  with pytest.raises(ConfigError,
                     match=r"config.rollout.server.model='llama-7b': the server at .* serves \['fake-model'\]"):
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
              top_p=1.0, sampler_dtype="float32", sampler_sharding="fsdp", staleness=0, overlap=False,
              record_topk=0, continuous_slots=0, decode_chunk=16, exact=False)
  server_kw = {k: kw.pop(k) for k in list(kw) if k in ServerConfig.__dataclass_fields__}
  return RolloutConfig(**{**base, **kw}, server=ServerConfig(**server_kw))


@pytest.mark.parametrize("kw,match", [
    (dict(sampler_dtype="bfloat16"), "sampler_dtype='bfloat16' is invalid: engine 'openai' samples at the precision"),
    (dict(url="http://127.0.0.1:1"), r"config.rollout.server.url='http://127.0.0.1:1' is invalid: "
                                     r"server.sync='restart' starts its own llama.cpp server"),
    (dict(sync="none"), r"config.rollout.server.url='' is invalid: server.sync='none' needs the http://HOST:PORT"),
    (dict(sync="none", url="http://x:1"), r"config.rollout.server.on_exit='restart' is invalid: only a server "
                                          r"the engine started"),
    (dict(export="q5_k"), r"config.rollout.server.export='q5_k' is invalid: allowed \('f32', 'f16', 'q8_0', 'q4_0'\)"),
    (dict(on_failure="skip"), r"config.rollout.server.on_failure='skip' is invalid"),
    (dict(sync_every=0), r"config.rollout.server.sync_every=0 is out of range"),
    (dict(retries=-1), r"config.rollout.server.retries=-1 is out of range"),
    (dict(timeout_s=0.0), r"config.rollout.server.timeout_s=0.0 is out of range: allowed \(0.0, 86400.0\]"),
])
def test_rollout_config_refuses(kw, match):
  with pytest.raises(ConfigError, match=match):
    _rollout(**kw)


def test_url_must_be_http():
  with pytest.raises(ConfigError,
                     match="config.rollout.server.url='localhost:8080' is invalid: expected http://HOST:PORT"):
    OpenAIEngine(model_cfg=MODEL, sampling_cfg=sampling(), tokenizer=TOK, settings=settings("localhost:8080"))


def test_an_external_engine_is_a_mismatch_to_measure():
  assert _rollout().mismatched and not _rollout(engine="builtin").mismatched
