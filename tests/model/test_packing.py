"""Packed rows (model/packing.py): the planner's layout against hand-written golden arrays, and the
packed forward against the padded one, row by row, for single rows and for groups sharing a prompt,
with full and sliding-window attention. The reference is model/logprobs.response_hidden without a
packing: each row [prompt | response] padded on its own."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import model as model_lib
from jaxrl_llm.model import packing as packing_lib
from jaxrl_llm.model.logprobs import response_hidden, response_logprobs
from jaxrl_llm.model.visibility import segment_id

V = 47
CFG = model_lib.ModelConfig(vocab_size=V, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=48,
                            init_std=0.4)
LOCAL = model_lib.ModelConfig(vocab_size=V, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=48,
                              init_std=0.4, layer_types=("sliding_attention", "full_attention"), sliding_window=3,
                              rope_local_theta=10000.0)


def test_plan_golden_layout():
  """Two rows, P = R = 3, one buffer of 8 slots, worked out by hand: row 0 has 2 prompt tokens
  (left-padded) and reads 2 response tokens, row 1 has 3 and reads 1."""
  pmask = np.array([[0, 1, 1], [1, 1, 1]], bool)
  attend = np.array([[1, 1, 0], [1, 0, 0]], bool)
  pk = packing_lib.pack_rows(pmask, attend, group=1, length=8, buffers=1)
  # Sources index the rows flattened as [prompt | response], 6 slots each.
  np.testing.assert_array_equal(pk.src_nS, [[1, 2, 3, 4, 6, 7, 8, 9]])
  np.testing.assert_array_equal(pk.positions_nS, [[0, 1, 2, 3, 0, 1, 2, 3]])
  d1, d2 = segment_id(1, 0), segment_id(2, 0)
  np.testing.assert_array_equal(pk.segments_nS, [[d1, d1, d1 + 1, d1 + 1, d2, d2, d2, d2 + 1]])
  # Token t is predicted by the slot before it; row 1's token 2 lies past what it reads (slot 0).
  np.testing.assert_array_equal(pk.dst_BR, [[1, 2, 3], [6, 7, 0]])
  with pytest.raises(ValueError, match="needs 2 buffers of 5 slots, 1 given"):
    packing_lib.pack_rows(pmask, attend, group=1, length=5, buffers=1)
  with pytest.raises(ValueError, match="row 1 has no prompt token"):
    packing_lib.pack_rows(np.array([[1, 1, 1], [0, 0, 0]], bool), attend, group=1, length=8, buffers=2)


def test_first_fit_and_buffer_ladder():
  buf, off, n = packing_lib.first_fit(np.array([3, 5, 2, 4]), 7)
  # Decreasing: 5 -> buffer 0, 4 -> buffer 1, 3 -> buffer 1 (room 3), 2 -> buffer 0 (room 2).
  np.testing.assert_array_equal(buf, [1, 0, 0, 1])
  np.testing.assert_array_equal(off, [4, 0, 5, 0])
  assert n == 2
  assert packing_lib.buffer_ladder(16) == [2, 4, 6, 8, 10, 12, 14, 16]
  assert packing_lib.buffer_ladder(5) == [1, 2, 3, 4, 5]
  assert packing_lib.buffer_ladder(16, shards=4) == [4, 8, 12, 16]


def _rows(B, P, R, G, seed):
  """Groups of G rows sharing a left-padded prompt; responses cut at random lengths, one empty,
  and one with a hole (an unattended token inside what the row reads)."""
  rng = np.random.default_rng(seed)
  n = B // G
  prompt = np.repeat(rng.integers(0, V, (n, P)), G, 0).astype(np.int32)
  starts = np.repeat(rng.integers(0, P - 1, n), G)
  pmask = np.arange(P)[None, :] >= starts[:, None]
  tokens = rng.integers(0, V, (B, R)).astype(np.int32)
  lengths = rng.integers(1, R + 1, B)
  lengths[1] = 0
  attend = np.arange(R)[None, :] < lengths[:, None]
  attend[0, :] = True
  attend[0, R // 2] = False
  return prompt, pmask, tokens, attend


@pytest.mark.parametrize("cfg", [CFG, LOCAL], ids=["global", "sliding_window"])
@pytest.mark.parametrize("group", [1, 3])
def test_packed_hidden_states_equal_the_padded_rows(cfg, group):
  B, P, R = 12, 7, 6
  params = model_lib.init_params(cfg, jax.random.key(0))
  prompt, pmask, tokens, attend = _rows(B, P, R, 3, seed=group)
  want = np.asarray(response_hidden(params, cfg, prompt, pmask, tokens, attend))
  unit = P + group * R
  length = 2 * unit
  chunks = 2
  n_buf = packing_lib.needed_buffers(pmask, attend, group=group, length=length, chunks=chunks)
  pk = packing_lib.pack_rows(pmask, attend, group=group, length=length, buffers=n_buf, chunks=chunks)
  assert n_buf < B // chunks // group  # more than one unit per buffer: documents really share buffers
  got = []
  for c in range(chunks):  # each chunk packed on its own, as the update's micro-batches are
    rows = slice(c * B // chunks, (c + 1) * B // chunks)
    part = jax.tree.map(lambda x: x[c * n_buf:(c + 1) * n_buf] if x.shape[0] == chunks * n_buf else x[rows], pk)
    got.append(np.asarray(response_hidden(params, cfg, prompt[rows], pmask[rows], tokens[rows], attend[rows],
                                          packing=part)))
  got = np.concatenate(got)
  assert got.shape == want.shape
  np.testing.assert_allclose(got[attend], want[attend], rtol=1e-5, atol=1e-5)
  # The first response token is predicted from the prompt's last slot even where the row reads nothing.
  np.testing.assert_allclose(got[1, 0], want[1, 0], rtol=1e-5, atol=1e-5)


def test_packed_logprobs_and_gradient_equal_the_padded():
  B, P, R, G = 6, 5, 4, 3
  params = model_lib.init_params(CFG, jax.random.key(1))
  prompt, pmask, tokens, attend = _rows(B, P, R, G, seed=5)
  pk = packing_lib.pack_rows(pmask, attend, group=G, length=P + G * R, buffers=2)

  def loss(p, packing):
    lp = response_logprobs(p, CFG, prompt, pmask, tokens, attend, temperature=0.7, impl="naive", packing=packing)
    return jnp.sum(jnp.where(attend, lp.logp_BR + 0.1 * lp.entropy_BR, 0.0))

  want, g_want = jax.value_and_grad(loss)(params, None)
  got, g_got = jax.value_and_grad(loss)(params, jax.tree.map(jnp.asarray, pk))
  np.testing.assert_allclose(got, want, rtol=1e-5)
  scale = max(float(jnp.abs(x).max()) for x in jax.tree.leaves(g_want))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * scale), g_got, g_want)


def test_documents_do_not_see_each_other():
  """Two documents in one buffer: the second's hidden states do not change when the first's tokens do."""
  B, P, R = 2, 4, 3
  params = model_lib.init_params(CFG, jax.random.key(2))
  prompt, pmask, tokens, attend = _rows(B, P, R, 1, seed=9)
  attend[1, :2] = True
  pk = packing_lib.pack_rows(pmask, attend, group=1, length=2 * (P + R), buffers=1)
  a = np.asarray(response_hidden(params, CFG, prompt, pmask, tokens, attend, packing=pk))
  prompt2, tokens2 = prompt.copy(), tokens.copy()
  prompt2[0] = (prompt2[0] + 1) % V
  tokens2[0] = (tokens2[0] + 1) % V
  b = np.asarray(response_hidden(params, CFG, prompt2, pmask, tokens2, attend, packing=pk))
  np.testing.assert_array_equal(a[1][attend[1]], b[1][attend[1]])
  assert not np.allclose(a[0][attend[0]], b[0][attend[0]])
