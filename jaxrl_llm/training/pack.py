"""When the update and the recompute run a batch packed (`train.pack`, model/packing.py), and how.

The decision is taken on the host per micro-batch set (the update's mini-batch, split into its
micro-batches) or per recompute chunk, from the rows' masks: the rows go into buffers of
`train.pack_length` slots (0: whichever of 1, 1.5 and 2 padded sequences costs the fewest FLOPs for
these rows), their number rounded up to `packing.buffer_ladder`'s steps. "auto" packs where that costs
fewer forward FLOPs (logprobs.forward_flops, dense attention over each buffer counted) than the
padded layout the run would otherwise use, by more than `AUTO_MARGIN`, "on" wherever the rows fit,
"off" never. The padded layout is one sequence per row, or per group where the prompt is shared
(`train.share_prompt`); packed units are then the groups too.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from jaxrl_llm.model import ModelConfig
from jaxrl_llm.model import packing as packing_lib
from jaxrl_llm.model.logprobs import forward_flops, shared_prompt_pays

AUTO_MARGIN = 0.9  # auto packs where the packed forward costs < 0.9 x the padded one's FLOPs
# train.pack_length = 0: the buffer lengths tried, in padded units (P + G R slots). Units that fill about
# half their padded length pair up in 1.5 units; shorter ones fill 2 units more tightly (the attention
# over a buffer grows with its square, so longer buffers are not tried).
AUTO_LENGTHS = (1.0, 1.5, 2.0)


@dataclasses.dataclass(frozen=True)
class PackPolicy:
  """A run's packing rule (hashable; held by the step context and the recompute's spec)."""

  model_cfg: ModelConfig
  mode: str = "off"  # train.pack
  length: int = 0  # train.pack_length: slots per buffer; 0: the cheapest of AUTO_LENGTHS padded sequences
  group: int = 1  # rows per unit: cfg.prompt_group (a group's rows share its prompt)
  always_share: bool = False  # train.share_prompt = on: the padded layout always shares
  shards: int = 1  # the mesh's batch shards: buffer counts are multiples of it

  def buffer_lengths(self, P: int, R: int) -> tuple[int, ...]:
    """The slots per buffer `plan` may use for rows of P prompt and R response slots (every unit must
    fit one): `train.pack_length`, or with 0 each of AUTO_LENGTHS padded units."""
    unit = P + self.group * R
    if self.length and self.length < unit:
      raise ValueError(f"train.pack_length={self.length} is shorter than one unit of {unit} slots (prompt {P} + "
                       f"{self.group} x response {R}): allowed 0 (auto) or >= {unit}")
    return (self.length,) if self.length else tuple(math.ceil(f * unit) for f in AUTO_LENGTHS)

  def padded_flops(self, rows: int, P: int, R: int) -> float:
    """The padded forward's FLOPs over `rows` rows, sharing the prompt where it would."""
    G = self.group
    if G > 1 and (self.always_share or shared_prompt_pays(self.model_cfg, P, R, G)):
      return forward_flops(self.model_cfg, rows // G, P + G * R)
    return forward_flops(self.model_cfg, rows, P + R)

  @classmethod
  def from_run(cls, cfg, model_cfg: ModelConfig, shards: int) -> "PackPolicy":
    """The packing rule of the run config `cfg` on a mesh of `shards` batch shards: what the trainer
    runs (Trainer.pack_policy) and the compile command plans (tpu/programs.py)."""
    return cls(model_cfg=model_cfg, mode=cfg.train.pack, length=cfg.train.pack_length, group=cfg.prompt_group,
               always_share=cfg.always_share, shards=shards)

  def _choose(self, need, rows: int, P: int, R: int, chunks: int) -> tuple[int, int] | None:
    """(S, buffers per chunk) of the cheapest packing of chunks of `rows` rows, where `need(S)` is the
    most buffers of S slots a chunk needs; None where the padded layout runs them."""
    if self.mode == "off" or rows % self.group:
      return None  # (config: share_prompt gives group > 1 only with whole groups per micro-batch)
    shards = self.shards // np.gcd(self.shards, chunks)  # chunks x buffers must split over the shards
    ladder = packing_lib.buffer_ladder(rows // self.group, shards)
    best = None  # (forward FLOPs of a chunk, S, buffers): the cheapest buffer length for these rows
    for S in self.buffer_lengths(P, R):
      n_need = need(S)
      fits = [n for n in ladder if n >= n_need]
      n = fits[0] if fits else -(-n_need // shards) * shards
      cost = forward_flops(self.model_cfg, n, S)
      if best is None or cost < best[0]:
        best = (cost, S, n)
    cost, S, n = best
    if self.mode == "auto" and cost >= AUTO_MARGIN * self.padded_flops(rows, P, R):
      return None
    return S, n

  def plan(self, prompt_mask_BP, attend_BR, chunks: int = 1) -> packing_lib.Packing | None:
    """The packing of these rows split into `chunks` equal chunks (micro-batches), or None where
    the padded layout runs them (off; auto where packing does not pay)."""
    if self.mode == "off":
      return None
    prompt_mask_BP, attend_BR = np.asarray(prompt_mask_BP, bool), np.asarray(attend_BR, bool)
    B, P = prompt_mask_BP.shape
    R = attend_BR.shape[1]
    need = lambda S: packing_lib.needed_buffers(prompt_mask_BP, attend_BR, group=self.group,  # noqa: E731
                                                length=S, chunks=chunks)
    chosen = self._choose(need, B // chunks, P, R, chunks)
    if chosen is None:
      return None
    S, n = chosen
    return packing_lib.pack_rows(prompt_mask_BP, attend_BR, group=self.group, length=S, buffers=n, chunks=chunks)

  def largest(self, rows: int, P: int, R: int, chunks: int = 1) -> tuple[int, int] | None:
    """(S, buffers per chunk): a bound on the packings `plan` may choose for `chunks` chunks of `rows`
    rows of P prompt and R response slots, whatever their lengths; None where it never packs. What the
    compile command plans beside the padded layout (tpu/programs.py).

    "on": the shortest buffer length at the ladder's top step. Every batch's packing costs at most that
    many forward FLOPs (`plan` takes the cheapest length, and the shortest, one padded unit or
    `train.pack_length`, fits any unit, so no chunk needs more buffers than the ladder's top), and a
    batch of full rows is given it. "auto": the most expensive (length, ladder step) whose forward
    costs less than AUTO_MARGIN x the padded one's: `plan` packs nothing costlier, though no batch may
    be given that one."""
    if self.mode == "off" or rows % self.group:
      return None
    shards = self.shards // np.gcd(self.shards, chunks)
    ladder = packing_lib.buffer_ladder(rows // self.group, shards)
    lengths = self.buffer_lengths(P, R)
    if self.mode == "on":
      return int(lengths[0]), int(ladder[-1])
    limit = AUTO_MARGIN * self.padded_flops(rows, P, R)
    fits = [(forward_flops(self.model_cfg, n, S), S, n) for S in lengths for n in ladder
            if forward_flops(self.model_cfg, n, S) < limit]
    if not fits:
      return None
    _, S, n = max(fits)
    return int(S), int(n)


def balanced_order(prompt_mask_BP, attend_BR, *, chunks: int, unit: int) -> np.ndarray:
  """A permutation of the rows (whole units of `unit` consecutive rows kept together and in order)
  that deals the units to `chunks` equal chunks so that their token counts are balanced: the
  longest first, each to the chunk with the fewest tokens that still has room (longest processing
  time first). Packed chunks then need about the same number of buffers, so the buffer count all
  micro-batches share (the largest) is smaller. The update's loss is a sum over rows with the
  mini-batch's normalisers, so the order of rows within a mini-batch changes it by rounding only."""
  mask_BT = np.concatenate([np.asarray(prompt_mask_BP, bool), np.asarray(attend_BR, bool)], axis=1)
  B = mask_BT.shape[0]
  if chunks == 1 or B % (chunks * unit):
    return np.arange(B)
  tokens_U = mask_BT.sum(axis=1).reshape(-1, unit).sum(axis=1)
  per_chunk = B // unit // chunks
  load, members = np.zeros(chunks), [[] for _ in range(chunks)]
  for u in np.argsort(-tokens_U, kind="stable"):
    open_c = [c for c in range(chunks) if len(members[c]) < per_chunk]
    c = min(open_c, key=lambda c: load[c])
    members[c].append(int(u))
    load[c] += tokens_U[u]
  units = np.concatenate([sorted(m) for m in members])
  return (units[:, None] * unit + np.arange(unit)[None, :]).reshape(-1)


def fill(packing: packing_lib.Packing | None) -> float:
  """The fraction of a packing's slots that hold a token (nan for None)."""
  return float("nan") if packing is None else float(np.mean(np.asarray(packing.src_nS) >= 0))
