"""The `openai` engine against a real llama.cpp server, serving GGUF exports of the built-in tiny model.

llama.cpp comes from the package index: `scripts/build_llama_server.sh`
builds llama.cpp's `llama-server` (the binary the engine starts) from the
llama.cpp that llama-cpp-python 0.3.36's source archive vendors. (pip
installing llama-cpp-python with CMAKE_ARGS="-DLLAMA_BUILD_TOOLS=ON
-DLLAMA_BUILD_SERVER=ON -DLLAVA_BUILD=OFF -DLLAMA_BUILD_UI=OFF
-DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF" builds the same server, and
the binary in its build directory runs; the bin/llama-server it installs
does not, for want of libllama-server-impl.so, which only
-DLLAMA_TOOLS_INSTALL=ON would install: not tried.)
`JAXRL_LLM_LLAMA_SERVER` names another binary. Without one these tests skip,
saying so; the protocol, failures and errors are covered without it by
test_openai_engine.py's stand-in server.

(a) F32 export: greedy tokens equal our sampler's; at temperature 1 the
    recorded log mu equals the trainer's recompute of log pi_prox, and with
    temperature 0.7 and top-k 8 it equals our `process_logits` of our logits
    (llama.cpp's post-sampling probabilities are the processed mu);
(b) RL steps through the engine, a new export and restart every step;
(c) a Q4_0 export: log c = log pi_prox - log mu is far from 0;
(d) the server killed mid-rollout: restarted, no sample lost;
(e) the check of every sync: llama.cpp's /props names the file it loaded, its probe log-probs are the
    trainer's within each export type's tolerance, and another policy's are not; a server holding the
    weights one optimizer step old under the new version's name is caught (q4_0);
bad input: a server with another vocabulary (SmolLM2's), a sampler name llama.cpp ignores (caught by
comparing the settings it reports having applied).
"""

import os
import shutil
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.checks import ConfigError
from jaxrl_llm.model import lora
from jaxrl_llm.model.config import LoraConfig, ModelConfig
from jaxrl_llm.model.logprobs import response_hidden
from jaxrl_llm.model.params import init_params
from jaxrl_llm.model.tokenizer import CharTokenizer
from jaxrl_llm.model.transformer import logits as model_logits
from jaxrl_llm.sampling.config import SamplingConfig, ServerConfig
from jaxrl_llm.sampling.generate import generate
from jaxrl_llm.sampling.openai_engine import OpenAIEngine, make_openai_engine
from jaxrl_llm.sampling.processors import process_logits
from jaxrl_llm.sampling.server_process import LlamaServerProcess
from jaxrl_llm.sampling.sync_check import SYNC_TOLERANCE, Deadline, SyncCheckFailed
from jaxrl_llm.sampling.weight_sync import Exported
from jaxrl_llm.tasks.pipeline import PromptBatch
from jaxrl_llm.training.recompute import RecomputeSpec, policy_logprobs


def _runs(path: str) -> bool:
  try:
    return subprocess.run([path, "--version"], capture_output=True, timeout=30).returncode == 0
  except (OSError, subprocess.TimeoutExpired):
    return False


def _llama_server() -> str | None:
  """llama.cpp's server: $JAXRL_LLM_LLAMA_SERVER, on PATH, built by scripts/build_llama_server.sh, or installed by
  llama-cpp-python (its bin/), the first that runs."""
  if os.environ.get("JAXRL_LLM_LLAMA_SERVER"):
    return os.environ["JAXRL_LLM_LLAMA_SERVER"]
  built = os.environ.get("JAXRL_LLM_LLAMA_CPP") or os.path.expanduser("~/.cache/jaxrl_llm/llama-server-0.3.36")
  cands = [shutil.which("llama-server"), os.path.join(built, "build", "bin", "llama-server")]  # build_llama_server.sh
  try:
    import llama_cpp

    cands.append(os.path.join(os.path.dirname(os.path.dirname(llama_cpp.__file__)), "bin", "llama-server"))
  except ImportError:
    pass
  return next((c for c in cands if c and os.path.isfile(c) and _runs(c)), None)


SERVER = _llama_server()
pytestmark = pytest.mark.skipif(
    SERVER is None, reason="no runnable llama.cpp llama-server: run scripts/build_llama_server.sh (it builds the one "
    "llama-cpp-python 0.3.36 vendors), or set JAXRL_LLM_LLAMA_SERVER to a llama-server binary")
COMMAND = f"{SERVER} -t 1"  # one thread: the machine is shared
TOK = CharTokenizer()
V = TOK.vocab_size
# Weights spread wider than the init default (0.02) so that logits differ by more than float error: greedy
# decoding is then decided by the model, not by summation order.
MODEL = ModelConfig.tiny(V, init_std=0.3)
PARAMS = init_params(MODEL, jax.random.key(0))
TEXTS = ("12+34=", "7*8=", "99-1=", "Hello ")


def prompts(texts=TEXTS) -> PromptBatch:
  ids = [[TOK.bos_id] + TOK.encode(t) for t in texts]
  P = max(map(len, ids))
  tokens, mask = np.zeros((len(ids), P), np.int32), np.zeros((len(ids), P), bool)
  for i, row in enumerate(ids):
    tokens[i, P - len(row):], mask[i, P - len(row):] = row, True
  return PromptBatch(tokens_BP=tokens, mask_BP=mask, prompts=tuple(texts), answers=("",) * len(texts),
                     tags=("",) * len(texts))


def sampling(**kw) -> SamplingConfig:
  base = dict(temperature=1.0, max_new_tokens=16, n_samples=2, eos_ids=(TOK.eos_id,), pad_id=TOK.pad_id,
              vocab_limit=V)
  return SamplingConfig(**{**base, **kw})


def managed(scfg, **kw) -> OpenAIEngine:
  s = dict(command=COMMAND, sync="restart", timeout_s=60.0, retries=3, backoff_s=0.05, wait_s=60.0, concurrency=2)
  return make_openai_engine(model_cfg=MODEL, sampling_cfg=scfg, tokenizer=TOK, settings=ServerConfig(**{**s, **kw}),
                            ctx_per_slot=64)


def _recompute(params, batch, temperature=1.0):
  logp, _ = policy_logprobs(params, batch, RecomputeSpec(model_cfg=MODEL, temperature=temperature, impl="naive",
                                                         chunk=batch.tokens_BR.shape[0]))
  return logp


def _sample(scfg, key, **kw):
  """One rollout of PARAMS through a llama.cpp server started for it."""
  eng = managed(scfg, **kw)
  try:
    eng.sync(PARAMS, 0)
    return eng.generate(prompts(), key)
  finally:
    eng.close()


def test_f32_greedy_equals_our_sampler_and_log_mu_equals_the_recompute():
  pb = prompts()
  greedy = _sample(sampling(temperature=0.0, n_samples=1), jax.random.key(0))
  ours = generate(PARAMS, MODEL, jnp.asarray(pb.tokens_BP), jnp.asarray(pb.mask_BP),
                  sampling(temperature=0.0, n_samples=1), jax.random.key(0))
  np.testing.assert_array_equal(greedy.tokens_BR, np.asarray(ours.tokens_BR))
  np.testing.assert_array_equal(greedy.mask_BR, np.asarray(ours.mask_BR))
  assert greedy.mask_BR.sum() >= 16  # real answers, not all EOS at once
  assert (np.asarray(greedy.behav_logp_BR)[greedy.mask_BR] == 0.0).all()  # a point mass, as ours records

  # temperature 1, no truncation: mu = softmax(logits), which the trainer recomputes as pi_prox
  sampled = _sample(sampling(temperature=1.0), jax.random.key(1))
  mu = np.asarray(sampled.behav_logp_BR)[sampled.mask_BR]
  prox = _recompute(PARAMS, sampled)[sampled.mask_BR]
  err = np.abs(mu - prox).max()
  print(f"f32 export, T=1: max |log mu - log pi_prox| = {err:.2e} over {mu.size} tokens")
  assert err < 1e-3  # llama.cpp's f32 CPU kernels against XLA's: float summation order only


def test_processed_mu_is_our_processing_of_our_logits():
  pb = prompts()
  batch = _sample(sampling(temperature=0.7, top_k=8, top_p=0.95, record_topk=4), jax.random.key(2))
  hidden = response_hidden(PARAMS, MODEL, jnp.asarray(batch.prompt_BP), jnp.asarray(batch.prompt_mask_BP),
                           jnp.asarray(batch.tokens_BR), jnp.asarray(batch.mask_BR))
  B, R = batch.tokens_BR.shape
  logits = model_logits(PARAMS, MODEL, hidden).reshape(B * R, V)
  ref = np.asarray(process_logits(logits, temperature=0.7, top_k=8, top_p=0.95)).reshape(B, R, V)
  ids = batch.tokens_BR
  expected = np.take_along_axis(ref, ids[..., None], -1)[..., 0][batch.mask_BR]
  got = np.asarray(batch.behav_logp_BR)[batch.mask_BR]
  err = np.abs(got - expected).max()
  print(f"f32 export, T=0.7 top-k 8 top-p 0.95: max |log mu(server) - log mu(ours)| = {err:.2e}")
  assert err < 1e-3
  top = np.asarray(batch.topk_ids_BRK)[batch.mask_BR]
  ref_top = np.argsort(-ref[batch.mask_BR], axis=-1, kind="stable")[:, :4]
  finite = np.isfinite(np.take_along_axis(ref[batch.mask_BR], ref_top, -1))
  np.testing.assert_array_equal(top[finite], ref_top[finite])


def test_rl_steps_through_llama_cpp_with_a_sync_every_step(tmp_path, quiet_log):
  from run_helpers import load_config, make_trainer, shrink

  from jaxrl_llm.training.config import from_config_dict

  c = shrink(load_config("grpo"), **{"rollout.engine": "openai", "rollout.server.command": COMMAND,
                                     "rollout.server.concurrency": 2, "rollout.server.sync_every": 1, "train.steps": 3})
  tr = make_trainer(from_config_dict(c), tmp_path / "run", quiet_log)
  state = tr.start_rl(tr.setup_extensions(tr.init_state(jax.random.key(0))))
  eng = tr.context.engine
  try:
    syncs = []
    for step in range(3):
      state, metrics = tr.step(state)
      m = eng.metrics()
      syncs.append((m["engine/export_s"], m["engine/reload_s"], m["engine/sync_s"]))
      assert eng.version == step and m["engine/syncs"] == step + 1
      assert np.isfinite(metrics["loss/total"]) and metrics["mismatch/log_c_abs_mean"] < 1e-3  # f32: mu ~ pi_prox
    print("sync per step (export s, restart s, total s):", [tuple(round(x, 3) for x in s) for s in syncs])
  finally:
    eng.close()


def test_async_rl_steps_through_llama_cpp_sample_with_the_previous_policy(tmp_path, quiet_log):
  # rollout.overlap with staleness 1: llama.cpp's server gets theta_{max(s-1, 0)} (exported and restarted in the
  # background thread) before step s's batch: versions 0, 0, 1, so two exports, and lag 0, 1, 1.
  from run_helpers import load_config, make_trainer, shrink

  from jaxrl_llm.training.async_rollout import AsyncRollouts
  from jaxrl_llm.training.config import from_config_dict

  c = shrink(load_config("grpo"), **{"rollout.engine": "openai", "rollout.server.command": COMMAND,
                                     "rollout.server.concurrency": 2, "rollout.server.sync_every": 1,
                                     "rollout.staleness": 1, "rollout.overlap": True, "train.steps": 3})
  tr = make_trainer(from_config_dict(c), tmp_path / "run", quiet_log)
  state = tr.start_rl(tr.setup_extensions(tr.init_state(jax.random.key(0))))
  rollouts = AsyncRollouts(tr.context, state, steps=3)
  rows = []
  try:
    for _ in range(3):
      state, metrics = tr.step(state, rollouts)
      rows.append(metrics)
  finally:
    rollouts.close()
    tr.context.engine.close()
  assert [r["rollout/version_lag_max"] for r in rows] == [0.0, 1.0, 1.0]
  assert [r["rollout/version_lag_min"] for r in rows] == [0.0, 1.0, 1.0]
  assert [r["engine/syncs"] for r in rows] == [1.0, 1.0, 2.0]
  assert all(np.isfinite(r["loss/total"]) for r in rows) and rows[-1]["engine/dropped"] == 0.0
  assert not rollouts.running and not tr.engine.process.alive()


def test_q4_export_makes_log_c_far_from_zero():
  gaps = {}
  for qtype in ("f32", "q4_0"):
    batch = _sample(sampling(n_samples=4), jax.random.key(3), export=qtype)
    log_c = (_recompute(PARAMS, batch) - np.asarray(batch.behav_logp_BR))[batch.mask_BR]
    gaps[qtype] = float(np.abs(log_c).mean())
  print(f"mean |log c| over sampled tokens: f32 {gaps['f32']:.2e}, q4_0 {gaps['q4_0']:.2e}")
  assert gaps["f32"] < 1e-4
  assert gaps["q4_0"] > 0.02 and gaps["q4_0"] > 100 * gaps["f32"]


def test_killed_server_is_restarted_and_no_sample_is_lost():
  pb = prompts(TEXTS * 2)
  eng = managed(sampling(max_new_tokens=48, n_samples=2), concurrency=2)
  try:
    eng.sync(PARAMS, 0)
    first_pid = eng.process.proc.pid

    def kill_after_first_answers():
      while eng.counters["requests"] < 4:
        time.sleep(0.005)
      eng.process.proc.kill()

    killer = threading.Thread(target=kill_after_first_answers)
    killer.start()
    batch = eng.generate(pb, jax.random.key(4))
    killer.join()
    m = eng.metrics()
    assert m["engine/server_exits"] == 1.0 and m["engine/server_restarts"] == 1.0
    assert eng.process.proc.pid != first_pid and eng.process.alive()
    assert batch.mask_BR.any(axis=1).all() and m["engine/dropped"] == 0.0  # all 16 samples arrived
    # and each is a proper answer of this policy: mu matches the recompute (the restart loaded the same weights)
    log_c = (_recompute(PARAMS, batch) - np.asarray(batch.behav_logp_BR))[batch.mask_BR]
    assert np.abs(log_c).max() < 1e-3
  finally:
    eng.close()


def test_each_export_passes_the_sync_check_and_another_policy_fails_it():
  cfg = ModelConfig.tiny(V, init_std=0.1)  # a scale inside what the tolerances were measured on
  params, other = init_params(cfg, jax.random.key(0)), init_params(cfg, jax.random.key(1))
  gaps = {}
  for export in ("f32", "f16", "q8_0", "q4_0"):
    s = ServerConfig(command=COMMAND, sync="restart", export=export, timeout_s=60.0, wait_s=60.0, concurrency=1)
    eng = make_openai_engine(model_cfg=cfg, sampling_cfg=sampling(), tokenizer=TOK, settings=s, ctx_per_slot=64)
    try:
      eng.sync(params, 0)  # restarted on policy-v0.<export>.gguf, verified
      m = eng.metrics()
      assert m["engine/sync_version"] == 0.0 and m["engine/sync_check_failures"] == 0.0
      gaps[export] = m["engine/sync_probe_max_abs_dlogp"]
      assert gaps[export] < SYNC_TOLERANCE[export]
      if export == "f32":  # the server's file, checked against another policy's log-probs: refused
        served = eng.weight_sync.current
        with pytest.raises(SyncCheckFailed, match=rf"reports serving it \({served}\), but its log-probs"):
          eng.verify(other, Exported(path=served, version=0, tag=served, export_s=0.0), Deadline(60.0, 0))
    finally:
      eng.close()
  print("sync check, max |delta log p| on the probe:", {k: f"{v:.2e}" for k, v in gaps.items()})
  assert gaps["f32"] < 1e-4


def test_a_server_with_another_vocabulary_is_refused(tmp_path):
  from jaxrl_llm.model.io.pretrained import models_dir

  gguf = os.path.join(models_dir(), "smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf")
  if not os.path.isfile(gguf):
    pytest.skip(f"{gguf} is not fetched (python -m jaxrl_llm.convert fetch --model=smollm2-135m)")
  proc = LlamaServerProcess(COMMAND, alias="smollm2", slots=1, ctx_per_slot=256, wait_s=120.0, log_dir=str(tmp_path))
  proc.start(gguf)
  try:
    s = ServerConfig(url=proc.url, sync="none", on_exit="error", timeout_s=30.0)
    with pytest.raises(ConfigError, match=r"serves 'smollm2' with a vocabulary of 49152 tokens; the trainer's "
                                          rf"model has {V}: another vocabulary") as e:
      OpenAIEngine(model_cfg=MODEL, sampling_cfg=sampling(), tokenizer=TOK, settings=s)
    assert "\n" not in str(e.value)
  finally:
    proc.stop()


def test_a_setting_llama_cpp_ignores_is_caught():
  # llama.cpp answers 200 to options it does not know and drops sampler names it does not know: the engine
  # compares the settings the server reports having applied with what it asked for
  eng = managed(sampling(n_samples=1))
  try:
    eng.sync(PARAMS, 0)  # the start-time check passed on the real settings
    eng.fields = dict(eng.fields, samplers=["temperature", "top_k", "top_p", "min_p", "tail_free"])
    with pytest.raises(ConfigError, match=r"applies samplers=\['temperature', 'top_k', 'top_p', 'min_p'\] where the "
                                          r"engine asked for \['temperature', 'top_k', 'top_p', 'min_p', 'tail_free'\]"):
      eng.check_applied_settings([TOK.bos_id])
  finally:
    eng.close()


def _lora_policy(scale: float):
  """A tiny LoRA policy (rank 4 on every projection) whose adapters B are `scale` x N(0, 1): what
  training made of them (0: the base model, exactly)."""
  cfg = ModelConfig.tiny(V, init_std=0.1, lora=LoraConfig(rank=4, alpha=8.0))
  params = lora.attach(init_params(lora.base_config(cfg), jax.random.key(0)), cfg, jax.random.key(1))
  layers = {k: (scale * jax.random.normal(jax.random.key(i), v.shape, v.dtype) if "_lora_b_" in k else v)
            for i, (k, v) in enumerate(sorted(params["layers"].items()))}
  return cfg, {**params, "layers": layers}


def test_a_lora_policy_reaches_the_server_merged_and_a_server_left_on_the_base_is_refused():
  """The engine exports a LoRA policy merged (W + s A B) and the sync check passes at the f32
  tolerance; the adapters move the probe's log-probs by far more than that tolerance, so a server
  that kept the base (an adapter never delivered) fails the check instead of passing as staleness."""
  cfg, trained = _lora_policy(0.5)
  _, untrained = _lora_policy(0.0)
  s = ServerConfig(command=COMMAND, sync="restart", export="f32", timeout_s=60.0, wait_s=60.0, concurrency=1)
  eng = make_openai_engine(model_cfg=cfg, sampling_cfg=sampling(), tokenizer=TOK, settings=s, ctx_per_slot=64)
  try:
    eng.sync(trained, 0)
    m = eng.metrics()
    assert m["engine/sync_check_failures"] == 0.0 and m["engine/sync_probe_max_abs_dlogp"] < 1e-4
    eng.sync(untrained, 1)  # the server now holds the base model (B = 0)
    served = eng.weight_sync.current
    with pytest.raises(SyncCheckFailed, match="but its log-probs"):
      eng.verify(trained, Exported(path=served, version=1, tag=served, export_s=0.0), Deadline(60.0, 0))
    assert eng.last_check.max_abs_dlogp > 100 * SYNC_TOLERANCE["f32"]
  finally:
    eng.close()


def test_lora_rl_steps_through_llama_cpp_pass_the_sync_check_every_step(tmp_path, quiet_log):
  from run_helpers import load_config, make_trainer, shrink

  from jaxrl_llm.training.config import from_config_dict

  c = shrink(load_config("grpo"), **{"rollout.engine": "openai", "rollout.server.command": COMMAND,
                                     "rollout.server.concurrency": 2, "rollout.server.sync_every": 1, "train.steps": 3,
                                     "model.lora.rank": 4, "model.lora.alpha": 8.0, "train.lr": 0.05})
  tr = make_trainer(from_config_dict(c), tmp_path / "run", quiet_log)
  state = tr.start_rl(tr.setup_extensions(tr.init_state(jax.random.key(0))))
  eng = tr.context.engine
  try:
    for step in range(3):
      state, metrics = tr.step(state)
      m = eng.metrics()
      assert eng.version == step and m["engine/syncs"] == step + 1 and m["engine/sync_check_failures"] == 0
      assert metrics["mismatch/log_c_abs_mean"] < 1e-3  # the server samples the merged policy: mu ~ pi_prox
    b_norm = max(float(jnp.abs(v).max()) for k, v in state.params["layers"].items() if "_lora_b_" in k)
    assert b_norm > 0  # the adapters trained, and what the server scored was the adapted model
  finally:
    eng.close()


def test_a_server_one_optimizer_step_behind_is_caught():
  """llama.cpp serving a q4_0 export of the weights one AdamW step old under the new version's file name (the
  export is handed the previous params): inside the q4_0 tolerance, but closer to the previous sync's exported
  weights than to the new ones (sync_check.py, point 3). The sync before it, honest, passes."""
  sys.path.insert(0, os.path.dirname(__file__))
  from openai_stand_in import MODEL as SMALL, policies

  p0, p1, p2 = policies()  # the stand-in tests' model (D 32, 1 layer) and two AdamW steps of it
  s = ServerConfig(command=COMMAND, sync="restart", export="q4_0", timeout_s=60.0, wait_s=60.0, concurrency=1)
  eng = make_openai_engine(model_cfg=SMALL, sampling_cfg=sampling(), tokenizer=TOK, settings=s, ctx_per_slot=64)
  try:
    eng.sync(p0, 0)
    eng.sync(p1, 1)
    honest = eng.last_check
    export = eng.weight_sync.export
    eng.weight_sync.export = lambda params, version: export(p1, version)  # version 2's file, version 1's weights
    with pytest.raises(SyncCheckFailed, match=r"policy version 2 is not verified: the server reports serving it "
                                              r"\(\S+policy-v2.q4_0.gguf\), but its log-probs .* are those of the "
                                              r"previous sync's weights \(version 1\)"):
      eng.sync(p2, 2)
    stale = eng.last_check
    print(f"q4_0, one AdamW step: honest dist_new {honest.dist_new:.2e} dist_prev {honest.dist_prev:.2e}; "
          f"one step behind dist_new {stale.dist_new:.2e} dist_prev {stale.dist_prev:.2e} gap {stale.gap:.2e}")
    assert stale.max_abs_dlogp < SYNC_TOLERANCE["q4_0"]  # the tolerance alone would pass it
    # with room: llama.cpp's q4_0 arithmetic error (dist_new honest, dist_prev behind) is ~5e-4, the step ~7e-3
    assert honest.dist_prev > 4 * honest.dist_new and stale.gap > 4 * (2 * stale.dist_prev)
  finally:
    eng.close()
