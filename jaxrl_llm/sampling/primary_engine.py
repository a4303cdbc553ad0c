"""An external rollout engine in a run of several processes: process 0 drives it, every process gets its results.

The built-in sampler is one program over the mesh, which every process launches. An external engine
(`rollout.engine=openai`: a completions server) is a client of a server, and the server holds the
rows, so one process drives it: process 0 makes the engine (and starts the server where the engine
starts one), exports and verifies the weights, sends every request, and broadcasts what came back
(`on_primary`, `distributed.broadcast_bytes`). The others wait in that broadcast. Why one process and not each for
its own rows:

- the weights: an export (GGUF, Hugging Face) writes the whole model from one place, so the params are
  gathered to the host anyway (`distributed.gather_to_host`, only when a sync is due), and the server's
  sync check compares its probe with those exported weights;
- the same run: the server gets the same requests, with the same seeds, from one client at the same
  concurrency as in a single-process run, so the two runs sample the same tokens;
- one server for all: a server started by process 0 is reachable from process 0; the others would
  need its address. A server that needs more clients than one (a fleet) sits behind one URL.

An error in process 0 (a server that does not answer, a sync check that fails, a ConfigError) is
broadcast in place of the result and raised in every process, so all stop at the same call.

Everything here is a collective: every process calls `sync`, `generate` and each round's turn sampler
in the same order, as the trainer does.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from absl import logging

from jaxrl_llm.model import distributed


class _Raised:
  """An exception of process 0, sent in place of the result: the exception itself where it pickles,
  else its text."""

  def __init__(self, error: BaseException):
    try:
      pickle.loads(pickle.dumps(error))
      self.error = error
    except Exception:  # noqa: BLE001 - an exception that does not pickle goes as its text
      self.error = RuntimeError(f"{type(error).__name__}: {error}")
    if not isinstance(self.error, Exception):  # KeyboardInterrupt, SystemExit: the others stop too
      self.error = RuntimeError(f"process 0 stopped: {type(error).__name__}: {error}")


def on_primary(fn: Callable[[], Any]) -> Any:
  """fn() run by process 0 and its result in every process (a collective). Whatever fails in process 0,
  fn or pickling its result, is sent in place of the result and raised in every process (process 0
  raises the original), so no process is left waiting in the broadcast."""
  if jax.process_count() == 1:
    return fn()
  out, error, blob = None, None, b""
  if distributed.is_primary():
    try:
      out = fn()
      blob = pickle.dumps(out)
    except BaseException as e:  # pylint: disable=broad-except  # raised below, in every process
      error = e
      blob = pickle.dumps(_Raised(e))
  blob = distributed.broadcast_bytes(blob)
  if distributed.is_primary():
    if error is not None:
      raise error
    return out
  out = pickle.loads(blob)
  if isinstance(out, _Raised):
    raise out.error
  return out


class PrimaryEngine:
  """The engine `make()` makes, made and driven by process 0 (module docstring); a RolloutEngine."""

  def __init__(self, make: Callable[[], Any]):
    engine = None

    def made():
      nonlocal engine
      engine = make()
      return getattr(engine, "version", -1), callable(getattr(engine, "turn_sampler", None))

    self.version, has_turns = on_primary(made)
    self._engine = engine  # None outside process 0
    self._metrics: dict = {}
    # (loop.rollout_engine refuses episodes with an engine whose turn_sampler is not callable)
    self.turn_sampler = self._turn_sampler if has_turns else None

  @property
  def engine(self):
    """The engine itself in process 0; None in the others."""
    return self._engine

  def sync(self, params, version: int) -> None:
    """Process 0 syncs the server with `params`, gathered to the host when the engine will read them."""
    wants = getattr(self._engine, "wants_params", lambda v: True)
    if on_primary(lambda: bool(wants(version))):
      host = distributed.gather_to_host(params)  # every process takes part; process 0 exports them
    else:
      host = None  # not read: the server is in sync already, or its weights are not the trainer's

    def synced():
      self._engine.sync(host, version)
      return self._engine.version

    self.version = on_primary(synced)

  def generate(self, prompts, key):
    key = _local_key(key)
    batch, self._metrics = on_primary(lambda: (self._engine.generate(prompts, key), self._engine.metrics()))
    return batch

  def metrics(self) -> dict[str, float]:
    """Process 0's counters after the last generation (or round of turns), the same in every process."""
    return dict(self._metrics)

  def _turn_sampler(self, player, key):
    """Each round's turns sampled by process 0's engine and broadcast to all (episodes)."""
    key = _local_key(key)
    sample_round = self._engine.turn_sampler(player, key) if self._engine is not None else None

    def broadcast_round(contexts, budgets, rnd):
      turns, self._metrics = on_primary(lambda: (sample_round(contexts, budgets, rnd), self._engine.metrics()))
      return turns

    return broadcast_round

  def close(self) -> None:
    """Process 0 closes the engine (stops the server it started). Not a collective: the run may be
    ending on an error that not every process saw; a failure to close is logged, not raised, so that
    process 0 does not leave the others waiting in the run's last collectives."""
    if self._engine is not None:
      try:
        self._engine.close()
      except Exception as e:  # noqa: BLE001 - see the docstring
        logging.warning("rollout engine: closing it failed: %s: %s", type(e).__name__, e)


def _local_key(key):
  """`key` as an array of this process alone: a key replicated over the mesh's processes would make
  process 0's draws from it a computation the others must join."""
  data = jax.random.key_data(key)
  if not data.is_fully_addressable:
    if not data.is_fully_replicated:
      raise ValueError(f"PrimaryEngine: a key sharded over the mesh ({data.sharding}); a step's key is replicated")
    data = data.addressable_data(0)  # every process holds the whole key
  return jax.random.wrap_key_data(np.asarray(data), impl=jax.random.key_impl(key))
