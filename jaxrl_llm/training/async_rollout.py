"""Asynchronous rollouts (`rollout.overlap`): step s + 1's batch is generated while step s updates.

Which policy samples which step. Step s (0-based, s = state.step) samples with
theta_{max(s - k, 0)}, k = `rollout.staleness` >= 1 and theta_v the params after
v steps: the version a synchronous run with the same k samples with
(`state.lag_params[0]`, `step.sampler_version`). theta_v exists from the start
of step v on, k steps before the step that samples with it, so while step s
updates the batches of steps s + 1 .. s + k can be generated: the queue of
finished batches is `k` deep. The first k steps all sample with theta_0 (the
lag buffer starts as k copies of it), so their version lag is s, and k from
step k on.

What is generated does not change, only when. The prompts are drawn by the
one thread that generates, in step order; step s's sampling key is
split(key_s)[1], key_{s+1} = split(key_s)[0] from the run's key, the chain
`rl_step` walks; the engine is synced with theta_{max(s-k,0)} at that version
before step s's batch. So a run with `rollout.overlap` and one without, at the
same staleness, are bit-identical (tests/training/test_async_rollout.py).

Threads. A background thread syncs the engine and generates (the built-in
sampler: JAX releases the GIL while the compiled sampler runs, so the update
runs meanwhile; the `openai` engine: its requests are in flight while the
trainer updates). While it runs nothing else touches the engine or the prompt
pipeline. The trainer's thread scores each batch (the reward runner's
SIGALRM timeouts work in the main thread only, and the evaluation shares the
runner), builds the training batch, updates, logs and saves. The weights the
background thread samples with are snapshots the update never donates: the
lag buffer's entries, and theta_s copied at the start of step s (`publish`).
Each batch carries the pipeline's position right after its prompts, which the
step's state records (the pipeline itself may be k batches ahead).

Resume: the queued batches are not checkpointed, they are regenerated. A
checkpoint after step s holds lag_params = (theta_{s+1-k}, ..., theta_s), the
key and the pipeline's position after step s's prompts: everything the batches
of steps s + 1 .. s + k are a function of. The resumed run regenerates them bit
for bit, so a run stopped anywhere and resumed equals the uninterrupted one. The
checkpoint holds nothing that depends on the mode: it is the synchronous run's.

Errors. An exception in the background (an engine failure, an injected
fault) is handed over in place of the batch being made and raised by `take`
at the step that needs that batch: the error the synchronous run raises at
that step, after the same steps. `close()` stops the thread and joins it;
the trainer closes before it returns or raises (a SIGTERM stop included).
A generation in flight is finished first (a hung server: at most its
request timeouts).

Several processes (`InlineRollouts`). A multi-controller run needs every
process to launch the same programs in the same order, which two threads do
not: their launches interleave differently in each process. There the batch
of step s + 1 is generated in the trainer's own thread at one fixed point of
step s: after step s's updates are launched and before their results are read
(`while_updating`, called by `run_updates`). Its weights, keys and prompts
are the schedule's above, so the samples are those of the threaded queue
and of the synchronous run. What overlaps is what JAX's asynchronous
dispatch allows on devices both roles share: the host's side of the next
batch (prompts, the sampler's launches) while the devices run the update;
the devices themselves run the two in turn, as they do when one thread
launches both. An exception is handed over at the step that needs the batch,
as above.
"""

from __future__ import annotations

import collections
import queue
import threading
import time

import jax

from jaxrl_llm.training.context import StepContext
from jaxrl_llm.training.state import TrainState
from jaxrl_llm.training.step import Generated, generate_step

_POLL_S = 0.05  # how often a blocked queue operation looks at the stop flag


class _Failed:
  """An exception of the background thread, in the queue where its batch would be."""

  def __init__(self, error: BaseException):
    self.error = error


class AsyncRollouts:
  """Generates the batches of steps `state.step` .. `steps` - 1 in a background thread, k ahead at most.

  Per step s the trainer calls `publish(theta_s)` (a snapshot of the params step s starts from: the
  weights of step s + k's batch) and then `take(s)` -> (Generated, seconds it waited)."""

  def __init__(self, ctx: StepContext, state: TrainState, *, steps: int):
    _check_lag(ctx, state)
    k = ctx.cfg.rollout.staleness
    self._ctx, self._next, self._end = ctx, int(state.step), steps
    # The weights of the batches to make, in step order: those of steps s .. s+k-1 are in the lag buffer.
    self._weights: queue.Queue = queue.Queue()
    for params in state.lag_params:
      self._weights.put(params)
    self._ready: queue.Queue = queue.Queue(maxsize=k)
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, args=(state.key,), name="jaxrl_llm-rollouts", daemon=True)
    self._thread.start()

  # ---- the trainer's side --------------------------------------------------------------

  def publish(self, params) -> None:
    """theta_s at the start of step s: the weights step s + k samples with (a snapshot, never donated)."""
    self._weights.put(params)

  def take(self, step: int) -> tuple[Generated, float]:
    """Step `step`'s first round of samples and the seconds the caller waited for it; the background
    thread's exception instead, when making that batch failed."""
    if step != self._next:
      raise ValueError(f"AsyncRollouts.take({step}): the next batch is step {self._next}'s")
    t0 = time.perf_counter()
    while True:
      try:
        item = self._ready.get(timeout=_POLL_S)
        break
      except queue.Empty:
        if not self._thread.is_alive() and self._ready.empty():
          raise RuntimeError(f"the background rollout thread ended without step {step}'s batch") from None
    waited = time.perf_counter() - t0
    self._next += 1
    if isinstance(item, _Failed):
      raise item.error
    return item, waited

  def while_updating(self) -> None:
    """Nothing: the background thread generates on its own (`InlineRollouts` generates here)."""

  def close(self) -> None:
    """Stops the background thread (after the generation in flight) and waits for it."""
    self._stop.set()
    self._thread.join()

  @property
  def running(self) -> bool:
    return self._thread.is_alive()

  # ---- the background thread -------------------------------------------------------------

  def _run(self, key) -> None:
    ctx = self._ctx
    # As Trainer.step does for the synchronous step (a thread-local JAX context, part of the compile key).
    with jax.sharding.use_abstract_mesh(ctx.mesh.abstract_mesh):
      for step in range(self._next, self._end):
        try:
          key, k_sample = jax.random.split(key)  # rl_step's split of the state's key at this step
          params = self._get(self._weights)
          if params is None:  # closed
            return
          item = generate_step(ctx, step, params, k_sample)
        except Exception as e:  # noqa: BLE001 - handed to the step that needs this batch
          item = _Failed(e)
        if not self._put(item) or isinstance(item, _Failed):
          return

  def _get(self, q: queue.Queue):
    while not self._stop.is_set():
      try:
        return q.get(timeout=_POLL_S)
      except queue.Empty:
        pass
    return None

  def _put(self, item) -> bool:
    while not self._stop.is_set():
      try:
        self._ready.put(item, timeout=_POLL_S)
        return True
      except queue.Full:
        pass
    return False


class InlineRollouts:
  """`rollout.overlap` in a run of several processes: step s + 1's batch is generated in the trainer's
  thread while step s's updates run on the devices (module docstring, "Several processes").

  The same interface and the same batches as `AsyncRollouts`, one batch ahead at most (which batch
  is made, not how far ahead, decides the samples)."""

  def __init__(self, ctx: StepContext, state: TrainState, *, steps: int):
    _check_lag(ctx, state)
    self._ctx, self._next, self._end = ctx, int(state.step), steps
    self._key = state.key  # the chain rl_step walks, one split per batch made
    self._weights = collections.deque(state.lag_params)  # those of the batches to make, in step order
    self._made: collections.deque = collections.deque()  # (step, Generated | _Failed)
    self._to_make = self._next  # the next step whose batch is made

  def publish(self, params) -> None:
    """theta_s at the start of step s: the weights of step s + k's batch."""
    self._weights.append(params)

  def take(self, step: int) -> tuple[Generated, float]:
    """Step `step`'s first round of samples (made now unless `while_updating` made it during the
    previous step's update) and the seconds making it took here."""
    if step != self._next:
      raise ValueError(f"InlineRollouts.take({step}): the next batch is step {self._next}'s")
    t0 = time.perf_counter()
    if not self._made:
      self._make()
    made_for, item = self._made.popleft()
    assert made_for == step, (made_for, step)
    self._next += 1
    if isinstance(item, _Failed):
      raise item.error
    return item, time.perf_counter() - t0

  def while_updating(self) -> None:
    """Makes the next step's batch: `run_updates` calls it once its updates are launched and before
    it reads their results, at the same point in every process."""
    if not self._made and self._to_make < self._end:
      self._make()

  def close(self) -> None:
    """Drops what was made ahead (a resumed run regenerates it)."""
    self._made.clear()

  @property
  def running(self) -> bool:
    return self._to_make < self._end

  def _make(self) -> None:
    step = self._to_make
    self._key, k_sample = jax.random.split(self._key)  # rl_step's split of the state's key at this step
    try:
      item = generate_step(self._ctx, step, self._weights.popleft(), k_sample)
    except Exception as e:  # noqa: BLE001 - handed to the step that needs this batch
      item = _Failed(e)
      self._end = step + 1  # nothing after a failure is made
    self._made.append((step, item))
    self._to_make = step + 1


def _check_lag(ctx: StepContext, state: TrainState) -> None:
  k = ctx.cfg.rollout.staleness
  if k < 1 or len(state.lag_params) != k:
    raise ValueError(f"rollout.overlap needs rollout.staleness >= 1 and a lag buffer of that many snapshots "
                     f"(staleness {k}, buffer {len(state.lag_params)})")
