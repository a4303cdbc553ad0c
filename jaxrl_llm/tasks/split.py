"""Deterministic train/eval splits for generated tasks.

A problem belongs to the eval split when a seeded hash of its prompt falls in
the eval fraction, so the two splits never share a problem and the split is a
pure function of (seed, prompt), not of sampling order.
"""

from __future__ import annotations

import hashlib

import numpy as np

SPLITS = ("train", "eval")


def in_eval_split(prompt: str, seed: int, eval_fraction: float) -> bool:
  digest = hashlib.blake2b(f"{seed}:{prompt}".encode(), digest_size=8).digest()
  return int.from_bytes(digest, "little") / 2**64 < eval_fraction


def check_split(split: str) -> int:
  if split not in SPLITS:
    raise ValueError(f"split={split!r} is not one of {SPLITS}")
  return SPLITS.index(split)


def split_rng(seed: int, split: str) -> np.random.Generator:
  return np.random.default_rng([seed, check_split(split)])
