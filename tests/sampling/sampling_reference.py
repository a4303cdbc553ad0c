"""Naive numpy references for the sampler tests (independent of the library)."""

import numpy as np


def processed_probs(logits_V, temperature, top_k=0, top_p=1.0, min_p=0.0):
  """mu over the vocabulary, written out token by token in numpy float64."""
  logits_V = np.asarray(logits_V, np.float64)
  vocab = logits_V.shape[0]
  if temperature == 0:
    out = np.zeros(vocab)
    out[int(np.argmax(logits_V))] = 1.0
    return out
  z = logits_V / temperature
  order = sorted(range(vocab), key=lambda i: (-z[i], i))
  kept = order[:top_k] if top_k > 0 else list(order)
  if top_p < 1.0:
    p = np.exp(z[kept] - z[kept].max())
    p /= p.sum()
    nucleus, mass = [], 0.0
    for i, pi in zip(kept, p):
      if mass >= top_p:
        break
      nucleus.append(i)
      mass += pi
    kept = nucleus
  if min_p > 0.0:
    full = np.exp(z - z.max())
    full /= full.sum()
    kept = [i for i in kept if full[i] >= min_p * full.max()]
  out = np.zeros(vocab)
  e = np.exp(z[kept] - z[kept].max())
  out[kept] = e / e.sum()
  return out
