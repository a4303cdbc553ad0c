"""The `openai` engine's test fixtures: the tiny model and tokenizer, a bigram stand-in
server (fake_openai_server.py), prompts, sampling and engine settings. Shared by
test_openai_engine.py (requests, answers, failures, start-time checks),
test_openai_engine_sync.py (weight sync, the server process, the trainer) and
test_openai_sync_check.py and test_openai_sync_previous.py (the check of every sync).
"""

import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxrl_llm.model.config import ModelConfig
from jaxrl_llm.model.logprobs import response_logprobs
from jaxrl_llm.model.params import init_params
from jaxrl_llm.model.tokenizer import CharTokenizer
from jaxrl_llm.sampling.config import SamplingConfig, ServerConfig
from jaxrl_llm.sampling.openai_engine import OpenAIEngine
from jaxrl_llm.tasks.pipeline import PromptBatch

sys.path.insert(0, os.path.dirname(__file__))
import numpy_llama  # noqa: E402
from fake_openai_server import FakeServer  # noqa: E402

FAKE = os.path.join(os.path.dirname(__file__), "fake_openai_server.py")
TOK = CharTokenizer()
V = TOK.vocab_size
MODEL = ModelConfig.tiny(V, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=64)


LR = 3e-4  # train.lr, the RL default (training/defaults.py)


@functools.cache
def policies() -> tuple:
  """P0 and the params after one and two AdamW steps (lr 3e-4) on the negative log-likelihood of a fixed text:
  what consecutive syncs of a run push (test_openai_sync_previous.py, test_llama_cpp_engine.py)."""
  ids = jnp.asarray([[TOK.bos_id] + TOK.encode("12+34=46\n7*6=42\nab")])
  mask = jnp.ones(ids.shape, bool)

  def nll(p):
    return -response_logprobs(p, MODEL, ids[:, :1], mask[:, :1], ids[:, 1:], mask[:, 1:], temperature=1.0,
                              impl="naive").logp_BR.mean()

  tx = optax.adamw(LR)

  @jax.jit
  def step(params, opt):
    updates, opt = tx.update(jax.grad(nll)(params), opt, params)
    return optax.apply_updates(params, updates), opt

  params = init_params(MODEL, jax.random.key(0))
  opt, out = tx.init(params), [params]
  for _ in range(2):
    params, opt = step(params, opt)
    out.append(params)
  return tuple(out)


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


def settings(url, **kw) -> ServerConfig:
  base = dict(url=url, sync="none", on_exit="error", timeout_s=1.0, retries=2, backoff_s=0.01, wait_s=3.0,
              concurrency=4)
  return ServerConfig(**{**base, **kw})


@pytest.fixture
def server():
  srv = FakeServer(bigram(), eos_ids=(TOK.eos_id,), encode=TOK.encode).start()
  yield srv
  srv.stop()


def hf_scorer(path: str):
  """The stand-in's raw logits after a prefix from the Hugging Face checkpoint at `path` (FakeServer.load)."""
  model = numpy_llama.from_hf(path)
  return lambda prefix: numpy_llama.llama_logits(model, prefix)


def engine(srv, scfg=None, **kw) -> OpenAIEngine:
  return OpenAIEngine(model_cfg=MODEL, sampling_cfg=scfg or sampling(), tokenizer=TOK, settings=settings(srv.url, **kw))


def answer_rows(srv) -> dict:
  """(prompt ids, token ids) of every answer the server gave."""
  by_seed = {r["seed"]: r for r in srv.requests}
  return {(tuple(by_seed[s]["prompt"]), tuple(c["id"] for c in a["choices"][0]["logprobs"]["content"])): a
          for s, a in srv.answers.items()}
