"""Aggregation (the master equation's lambda_{i,t}) as (numerator, denominator).

docs/objectives.md section 5 and eq. 9.1: every method is

    grad J = E[ sum_{i,t} lambda_{i,t} A_{i,t} (W_{i,t} s_y - kappa sum_v mu_v W_v s_v) ]

and lambda is the token-accounting rule. Modes (m = response mask, |y_i| =
sum_t m_{i,t}, a *sequence* is a row with at least one valid token, so rows
that are pure padding never count; rows rejected by a weight, e.g. TRM's
mask, still count and contribute zero):

| mode                  | lambda_{i,t}                 | used by                         |
|-----------------------|------------------------------|---------------------------------|
| `token_mean`          | 1 / sum_i |y_i|              | DAPO, CISPO, ScaleRL            |
| `seq_mean_token_mean` | 1 / (B_seq |y_i|)            | GRPO, GSPO, decoupled PPO       |
| `seq_mean_token_sum`  | 1 / B_seq                    | REINFORCE, TRM (1/N), PipelineRL|
|                       |                              | (1/G per group, mean over groups)|
| `constant`            | 1 / (B_seq L_max)            | Dr. GRPO                        |
| `group_token_mean`    | 1 / (n_groups sum_{j in g}|y_j|) | PipelineRL group normalisation |

Exact micro-batching. The normalisers (token count, sequence count, group
count, L_max) are properties of the *whole* mini-batch, so they are computed
once on it with `batch_norms` and passed to every micro-batch (and every
host). With global norms, a micro-batch's `WeightedSum` has

* `numerator`   = its exact share of the full-batch loss (lambda already
  divides by the global normaliser), so `jax.grad` of the numerator summed
  over micro-batches is the full-batch gradient, and
* `denominator` = its fraction of the normaliser (local count / global
  count), which sums to 1 over the micro-batches of the batch.

Hence `sum(numerators) / sum(denominators)` over micro-batches and hosts is
the full-batch loss, as docs/architecture.md requires, and `num / den` of one
micro-batch is that micro-batch's own average (useful for logging).
`group_token_mean` additionally needs every group whole inside a
micro-batch (rows of a group contiguous, micro-batch rows a multiple of G).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

AGGREGATIONS = (
    "token_mean",
    "seq_mean_token_mean",
    "seq_mean_token_sum",
    "constant",
    "group_token_mean",
)


@struct.dataclass
class WeightedSum:
  """A reduction kept as (numerator, denominator); value = num / den.

  Sum numerators and denominators across micro-batches and hosts, then
  divide once (`WeightedSum.total`). A zero denominator gives value 0.
  """

  numerator: jax.Array  # [] float32
  denominator: jax.Array  # [] float32

  def value(self) -> jax.Array:
    den = self.denominator
    safe = jnp.where(den != 0, den, 1.0)
    return jnp.where(den != 0, self.numerator / safe, 0.0)

  def __add__(self, other: "WeightedSum") -> "WeightedSum":
    return WeightedSum(self.numerator + other.numerator, self.denominator + other.denominator)

  @staticmethod
  def total(items) -> "WeightedSum":
    items = list(items)
    if not items:
      raise ValueError("WeightedSum.total needs at least one item, got an empty sequence")
    out = items[0]
    for item in items[1:]:
      out = out + item
    return out


def masked_mean(x, mask) -> WeightedSum:
  """Additive masked mean: (sum m x, sum m)."""
  m = mask.astype(jnp.float32)
  return WeightedSum(jnp.sum(m * x), jnp.sum(m))


@struct.dataclass
class BatchNorms:
  """Normalisers of the whole mini-batch, computed once by `batch_norms`."""

  n_tokens: jax.Array  # [] valid tokens in the whole batch
  n_seqs: jax.Array  # [] rows with >= 1 valid token
  n_groups: jax.Array  # [] groups with >= 1 valid token
  max_len: jax.Array  # [] L_max of the constant normaliser
  group_size: int = struct.field(pytree_node=False, default=1)


def _check_mask(mask_BR):
  if mask_BR.ndim != 2:
    raise ValueError(f"mask_BR must have shape [B, R], got shape {mask_BR.shape}")


def _check_group_size(n_rows: int, group_size: int, what: str = "batch rows"):
  if not isinstance(group_size, int) or group_size < 1:
    raise ValueError(f"group_size={group_size!r} is invalid: must be a positive integer")
  if n_rows % group_size != 0:
    raise ValueError(
        f"group_size={group_size} does not divide the {what} ({n_rows}): "
        f"allowed group sizes divide {n_rows}")


def batch_norms(mask_BR, group_size: int = 1, cfg=None, *, max_len: int | None = None) -> BatchNorms:
  """Global normalisers for `cfg.aggregation`, computed on the FULL mini-batch.

  `max_len` (or `cfg.norm_max_len`) is Dr. GRPO's constant L_max; when both
  are None the padded length T of this batch is used (verl's default).
  """
  _check_mask(mask_BR)
  n_rows, n_tok = mask_BR.shape
  _check_group_size(n_rows, group_size)
  if max_len is None and cfg is not None:
    max_len = cfg.norm_max_len
  if max_len is None:
    max_len = n_tok
  if not isinstance(max_len, int) or max_len < 1:
    raise ValueError(f"max_len={max_len!r} is invalid: must be a positive integer (L_max)")
  m = mask_BR.astype(jnp.float32)
  len_B = jnp.sum(m, axis=1)
  group_len = jnp.sum(len_B.reshape(n_rows // group_size, group_size), axis=1)
  return BatchNorms(
      n_tokens=jnp.sum(m),
      n_seqs=jnp.sum((len_B > 0).astype(jnp.float32)),
      n_groups=jnp.sum((group_len > 0).astype(jnp.float32)),
      max_len=jnp.asarray(max_len, jnp.float32),
      group_size=group_size,
  )


def _safe(x):
  """Counts are >= 0; an empty batch divides 0 by 1 instead of by 0."""
  return jnp.maximum(x, 1.0)


def token_weights(mask_BR, mode: str, norms: BatchNorms):
  """lambda_{i,t} (zero on padding) and this batch's share of the normaliser.

  Returns (lambda_BR, share) where share = local count / global count.
  """
  _check_mask(mask_BR)
  if mode not in AGGREGATIONS:
    raise ValueError(f"aggregation={mode!r} is invalid: allowed values are {AGGREGATIONS}")
  m = mask_BR.astype(jnp.float32)
  len_B = jnp.sum(m, axis=1)
  nonempty = jnp.sum((len_B > 0).astype(jnp.float32))
  if mode == "token_mean":
    return m / _safe(norms.n_tokens), jnp.sum(m) / _safe(norms.n_tokens)
  if mode == "seq_mean_token_mean":
    lam_B = 1.0 / (_safe(len_B) * _safe(norms.n_seqs))
    return m * lam_B[:, None], nonempty / _safe(norms.n_seqs)
  if mode == "seq_mean_token_sum":
    return m / _safe(norms.n_seqs), nonempty / _safe(norms.n_seqs)
  if mode == "constant":
    return m / (_safe(norms.n_seqs) * norms.max_len), nonempty / _safe(norms.n_seqs)
  # group_token_mean
  n_rows = mask_BR.shape[0]
  _check_group_size(n_rows, norms.group_size, what="micro-batch rows")
  g = norms.group_size
  group_len = jnp.sum(len_B.reshape(n_rows // g, g), axis=1)
  row_group_len = jnp.repeat(group_len, g)
  lam_B = 1.0 / (_safe(row_group_len) * _safe(norms.n_groups))
  local_groups = jnp.sum((group_len > 0).astype(jnp.float32))
  return m * lam_B[:, None], local_groups / _safe(norms.n_groups)


def aggregate(loss_BR, mask_BR, mode: str, norms: BatchNorms | None = None) -> WeightedSum:
  """sum_{i,t} lambda_{i,t} loss_{i,t} as a WeightedSum (see module docstring).

  norms=None means this call sees the whole batch (norms from mask_BR,
  group size 1, L_max = T).
  """
  if loss_BR.shape != mask_BR.shape:
    raise ValueError(f"loss_BR shape {loss_BR.shape} must equal mask_BR shape {mask_BR.shape}")
  if norms is None:
    norms = batch_norms(mask_BR)
  lam_BR, share = token_weights(mask_BR, mode, norms)
  # where(): padded positions may hold inf/nan garbage; they never leak.
  return WeightedSum(jnp.sum(jnp.where(lam_BR > 0, lam_BR * loss_BR, 0.0)), share)
