"""Packed rows: the real tokens of a batch's rows laid end to end in fixed-size buffers, so that
padding costs nothing in the forward passes of the update and the recompute.

A padded batch runs every row as [prompt_BP | response_BR], P + R slots, however short its
prompt (left-padded) and its response (cut at EOS). A packed batch runs n buffers of S slots; each
holds whole *units* back to back, a unit being one row (`group` = 1) or a group of G rows that
share one prompt (`group` = G: the prompt once, then the G responses, as
model/logprobs.shared_prompt_rows lays one group out). Each unit is a document of its buffer: the
attention's segment ids (model.forward's `segments_BT`, `segment_id(doc, part)`) let a token see
only earlier tokens of its own document, and within it the prompt (part 0) and its own response
(part g + 1). Every token keeps the RoPE position it has in its own padded row. So the packed
forward is the same function of the params as the padded one, token for token, to float
rounding: only the slots differ.

The placement is planned on the host (`pack_rows`, numpy, from the masks) and travels with the batch as
a `Packing` of int32 arrays: which source slot fills each buffer slot, its position and segment,
and which buffer slot's hidden state predicts each response token. On the device `gather_inputs`
and `response_hidden`'s packed path only gather; the gradient of the gather sums a shared prompt's
activations over its group as the padded computation's does.

Shapes stay static: S is one of at most 3 lengths for a run (training/pack.py), and the number of
buffers per chunk (a micro-batch or a recompute chunk) is rounded up to one of at most 8 steps of
`units / 8` (`buffer_ladder`), so a run compiles at most 24 packed programs per function, in
practice the few its length distribution hits (`train.pack`, training/pack.py).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl_llm.model.visibility import PART_BITS, segment_id

LADDER_STEPS = 8  # buffer counts per chunk: ceil(k * units / 8), k = 1..8


@struct.dataclass
class Packing:
  """Where a batch's tokens sit in n buffers of S slots (int32 host or device arrays). The source
  of a slot is an index into the chunk's rows flattened as [prompt_BP | response_BR], (P + R)
  slots each; indices are local to the chunk (micro-batch) the slot belongs to."""

  src_nS: jax.Array  # int32 [n, S]: the source slot, -1 for an empty slot
  positions_nS: jax.Array  # int32 [n, S]: its RoPE position (the one it has in its padded row)
  segments_nS: jax.Array  # int32 [n, S]: segment_id(document, part); 0 for an empty slot
  dst_BR: jax.Array  # int32 [B, R]: the buffer slot (flattened over the chunk's n_c x S) predicting token t
  # rows per unit (static): 1 makes every document one part (no shared prompt), so the forward may
  # run the splash attention kernel on it (model/splash.py, forward's documents_only)
  group: int = struct.field(pytree_node=False, default=1)

  @property
  def length(self) -> int:
    return self.src_nS.shape[1]


def unit_extents(prompt_mask_BP: np.ndarray, attend_BR: np.ndarray, group: int):
  """Per row: where its prompt starts (the first real slot; the prompt runs to P - 1) and how many
  response slots it reads (up to its last attended token; holes inside stay masked). -> (start_B,
  ext_B, unit_len_U) with units of `group` consecutive rows (the first row's prompt, every row's
  response)."""
  B, P = prompt_mask_BP.shape
  if B % group:
    raise ValueError(f"packing: {B} rows are not whole groups of {group}")
  has_prompt = prompt_mask_BP.any(axis=1)
  if not has_prompt.all():
    raise ValueError(f"packing: row {int(np.argmin(has_prompt))} has no prompt token; a response needs "
                     "a prompt slot to be predicted from")
  start_B = np.argmax(prompt_mask_BP, axis=1)
  R = attend_BR.shape[1]
  ext_B = np.where(attend_BR.any(axis=1), R - np.argmax(attend_BR[:, ::-1], axis=1), 0)
  unit_len_U = (P - start_B[::group]) + ext_B.reshape(-1, group).sum(axis=1)
  return start_B, ext_B, unit_len_U


def first_fit(lengths: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray, int]:
  """First-fit decreasing: -> (buffer_U, offset_U, buffers) placing items of `lengths` in
  buffers of `capacity` (every length must fit one)."""
  order = np.argsort(-lengths, kind="stable")
  free: list[int] = []
  buffer_U = np.zeros(len(lengths), np.int64)
  offset_U = np.zeros(len(lengths), np.int64)
  for u in order:
    n = int(lengths[u])
    if n > capacity:
      raise ValueError(f"packing: a unit of {n} tokens does not fit a buffer of {capacity}")
    for b, room in enumerate(free):
      if room >= n:
        break
    else:
      b = len(free)
      free.append(capacity)
    buffer_U[u], offset_U[u] = b, capacity - free[b]
    free[b] -= n
  return buffer_U, offset_U, len(free)


def buffer_ladder(units: int, shards: int = 1) -> list[int]:
  """The buffer counts a chunk of `units` units may be given: ceil(k units / 8) for k = 1..8, each
  rounded up to a multiple of `shards` (the mesh's batch shards), ascending without repeats."""
  steps = {-(-math.ceil(k * units / LADDER_STEPS) // shards) * shards for k in range(1, LADDER_STEPS + 1)}
  return sorted(steps)


def needed_buffers(prompt_mask_BP: np.ndarray, attend_BR: np.ndarray, *, group: int, length: int,
                   chunks: int = 1) -> int:
  """The most buffers of `length` slots any of the `chunks` equal chunks of rows needs."""
  _, _, unit_len_U = unit_extents(prompt_mask_BP, attend_BR, group)
  return max(first_fit(part, length)[2] for part in np.split(unit_len_U, chunks))


def pack_rows(prompt_mask_BP: np.ndarray, attend_BR: np.ndarray, *, group: int, length: int, buffers: int,
              chunks: int = 1) -> Packing:
  """The packing of a batch (numpy masks) into `chunks` equal chunks of rows, each packed on its
  own into `buffers` buffers of `length` slots (chunk c's buffers are rows c * buffers.. of the
  arrays, so splitting every array of the result into `chunks` along its first axis gives each
  chunk its own packing). `group`: rows per unit (the rows of a unit share their first row's
  prompt; the caller checks that they do). Raises where a chunk needs more buffers."""
  prompt_mask_BP = np.asarray(prompt_mask_BP, bool)
  attend_BR = np.asarray(attend_BR, bool)
  B, P = prompt_mask_BP.shape
  R = attend_BR.shape[1]
  if B % chunks or (B // chunks) % group:
    raise ValueError(f"packing: {B} rows do not split into {chunks} chunks of whole groups of {group}")
  if group + 1 >= 1 << PART_BITS:
    raise ValueError(f"packing: groups of {group} rows exceed the {(1 << PART_BITS) - 2} parts a segment id holds")
  start_B, ext_B, unit_len_U = unit_extents(prompt_mask_BP, attend_BR, group)
  mask_BT = np.concatenate([prompt_mask_BP, attend_BR], axis=1)
  pos_BT = np.maximum(np.cumsum(mask_BT, axis=1) - 1, 0).astype(np.int32)
  rows_c, units_c, S, T = B // chunks, B // chunks // group, length, P + R
  src = np.full((chunks * buffers, S), -1, np.int32)
  positions = np.zeros((chunks * buffers, S), np.int32)
  segments = np.zeros((chunks * buffers, S), np.int32)
  dst_BR = np.zeros((B, R), np.int32)
  for c in range(chunks):
    buffer_U, offset_U, used = first_fit(unit_len_U[c * units_c:(c + 1) * units_c], S)
    if used > buffers:
      raise ValueError(f"packing: chunk {c} needs {used} buffers of {S} slots, {buffers} given")
    docs = np.zeros(buffers, np.int64)  # documents placed so far per buffer
    for u in range(units_c):
      b0 = c * rows_c + u * group  # the unit's first row (global), its prompt's
      buf = c * buffers + int(buffer_U[u])
      docs[buffer_U[u]] += 1
      doc = int(docs[buffer_U[u]])
      at = int(offset_U[u])
      n_p = P - int(start_B[b0])
      sl = slice(at, at + n_p)
      src[buf, sl] = (b0 - c * rows_c) * T + np.arange(start_B[b0], P)
      positions[buf, sl] = pos_BT[b0, start_B[b0]:P]
      segments[buf, sl] = segment_id(doc, 0)
      last_prompt = int(buffer_U[u]) * S + at + n_p - 1  # predicts every response's token 0
      at += n_p
      for g in range(group):
        b = b0 + g
        e = int(ext_B[b])
        sl = slice(at, at + e)
        src[buf, sl] = (b - c * rows_c) * T + P + np.arange(e)
        positions[buf, sl] = pos_BT[b, P:P + e]
        segments[buf, sl] = segment_id(doc, g + 1)
        # Token t is predicted by the slot before it: the prompt's last for t = 0, else response
        # slot t - 1; tokens past the extent read nothing (masked in every loss) and take slot 0.
        t_R = np.arange(R)
        resp = int(buffer_U[u]) * S + at + t_R - 1
        dst_BR[b] = np.where(t_R == 0, last_prompt, np.where(t_R <= e, resp, 0))
        at += e
  return Packing(src_nS=src, positions_nS=positions, segments_nS=segments, dst_BR=dst_BR, group=group)


def gather_inputs(packing: Packing, prompt_BP, prompt_mask_BP, response_BR, attend_BR):
  """The packed buffers' tokens and mask [n, S] from a chunk's padded rows (on the device)."""
  tokens_F = jnp.concatenate([prompt_BP, response_BR], axis=1).reshape(-1)
  mask_F = jnp.concatenate([prompt_mask_BP, attend_BR], axis=1).reshape(-1)
  valid_nS = packing.src_nS >= 0
  idx_nS = jnp.maximum(packing.src_nS, 0)
  tokens_nS = jnp.where(valid_nS, jnp.take(tokens_F, idx_nS), 0)
  mask_nS = valid_nS & jnp.take(mask_F, idx_nS)
  return tokens_nS, mask_nS


def padded_slots(rows: int, P: int, R: int, group: int) -> tuple[int, int]:
  """(sequences, slots per sequence) of the padded layout: one per row, or one per group when
  the prompt is shared."""
  return (rows, P + R) if group == 1 else (rows // group, P + group * R)
