"""Scoring a batch of responses, with failures contained.

A reward function that raises gives that sample reward 0 and is counted
(`failed`); one that runs past `timeout_s` is interrupted and counted
(`timed_out`). The run goes on either way.

Two modes:
- `workers=0`: in the trainer process. The timeout is a SIGALRM timer, which
  interrupts pure-Python hangs (loops, sleeps, sympy); it needs the main thread.
- `workers>0`: a pool of spawned processes (math-verify is slow and pulls in
  sympy). Each worker applies the same per-call timer; a batch that still
  overruns its deadline (a hang inside C code) kills the pool, scores the
  missing samples 0 as timed out and starts a fresh pool.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import signal
import threading
import time
from collections.abc import Sequence

import numpy as np

from jaxrl_llm import faults

from jaxrl_llm.tasks.base import FormatFn, RewardFn


class _Timeout(Exception):
  pass


def _raise_timeout(signum, frame):
  raise _Timeout()


def score_one(reward_fn: RewardFn, format_fn: FormatFn | None, format_weight: float,
              timeout_s: float, prompt: str, response: str, answer: str) -> tuple[float, float, int]:
  """-> (reward, correctness, status) with status 0 ok, 1 raised, 2 timed out."""
  in_main = threading.current_thread() is threading.main_thread()
  old = signal.signal(signal.SIGALRM, _raise_timeout) if in_main else None
  if in_main:
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
  try:
    correct = float(reward_fn(prompt, response, answer))
    if faults.point("reward"):
      correct = float("nan")
    if not np.isfinite(correct):
      raise ValueError(f"reward {correct} is not finite")
    fmt = format_weight * float(bool(format_fn(response))) if format_fn and format_weight else 0.0
    return correct + fmt, correct, 0
  except _Timeout:
    return 0.0, 0.0, 2
  except Exception:  # noqa: BLE001 - any failure of user code is contained and counted
    return 0.0, 0.0, 1
  finally:
    if in_main:
      signal.setitimer(signal.ITIMER_REAL, 0)
      signal.signal(signal.SIGALRM, old)


def _score_chunk(args):
  reward_fn, format_fn, format_weight, timeout_s, items = args
  return [score_one(reward_fn, format_fn, format_weight, timeout_s, *it) for it in items]


@dataclasses.dataclass(frozen=True)
class RewardBatch:
  reward_B: np.ndarray  # float32 [B], total reward (correctness + format bonus)
  correct_B: np.ndarray  # float32 [B], the verifier's score alone
  failed_B: np.ndarray  # bool [B], the reward function raised
  timed_out_B: np.ndarray  # bool [B], the reward function ran past its timeout


class RewardRunner:
  """Scores responses with `reward_fn` (+ `format_weight` * format_fn)."""

  def __init__(self, reward_fn: RewardFn, format_fn: FormatFn | None = None, *,
               format_weight: float = 0.0, timeout_s: float = 5.0, workers: int = 0):
    if timeout_s <= 0:
      raise ValueError(f"reward timeout_s={timeout_s} must be > 0")
    if workers < 0:
      raise ValueError(f"reward workers={workers} must be >= 0")
    self.reward_fn, self.format_fn = reward_fn, format_fn
    self.format_weight, self.timeout_s, self.workers = format_weight, timeout_s, workers
    self._pool = None

  def _get_pool(self):
    if self._pool is None:
      # spawn, not fork: forking a process that runs JAX's threads can deadlock.
      self._pool = multiprocessing.get_context("spawn").Pool(self.workers)
    return self._pool

  def close(self) -> None:
    if self._pool is not None:
      self._pool.terminate()
      self._pool.join()
      self._pool = None

  def __call__(self, prompts: Sequence[str], responses: Sequence[str],
               answers: Sequence[str]) -> RewardBatch:
    if not len(prompts) == len(responses) == len(answers):
      raise ValueError(f"reward batch lengths differ: {len(prompts)} prompts, "
                       f"{len(responses)} responses, {len(answers)} answers")
    items = list(zip(prompts, responses, answers))
    if self.workers == 0:
      results = [score_one(self.reward_fn, self.format_fn, self.format_weight,
                           self.timeout_s, *it) for it in items]
    else:
      results = self._score_in_pool(items)
    arr = np.asarray(results, dtype=np.float64).reshape(len(items), 3)
    status = arr[:, 2].astype(np.int32)
    return RewardBatch(reward_B=arr[:, 0].astype(np.float32), correct_B=arr[:, 1].astype(np.float32),
                       failed_B=status == 1, timed_out_B=status == 2)

  def _score_in_pool(self, items):
    pool = self._get_pool()
    n_chunks = max(1, min(len(items), self.workers * 4))
    chunks = [items[i::n_chunks] for i in range(n_chunks)]
    pending = [pool.apply_async(_score_chunk, ((self.reward_fn, self.format_fn, self.format_weight,
                                                self.timeout_s, c),)) for c in chunks]
    # Each call has its own timer inside the worker; the batch deadline is the
    # backstop for a hang the timer cannot interrupt.
    deadline = time.monotonic() + self.timeout_s * (max(len(c) for c in chunks) + 1) + 10.0
    out: list = [None] * len(items)
    broken = False
    for ci, (chunk, res) in enumerate(zip(chunks, pending)):
      try:
        scored = res.get(timeout=max(0.0, deadline - time.monotonic()))
      except multiprocessing.TimeoutError:
        scored, broken = [(0.0, 0.0, 2)] * len(chunk), True
      except Exception:  # noqa: BLE001 - e.g. an unpicklable reward function
        scored = [(0.0, 0.0, 1)] * len(chunk)
      for j, s in enumerate(scored):
        out[ci + j * n_chunks] = s
    if broken:
      self.close()
    return out
