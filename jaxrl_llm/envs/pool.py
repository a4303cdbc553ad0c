"""A pool of long-lived tool workers: tool calls run in child processes under limits, and whatever a
call does (hang, crash, flood its output, allocate without bound) ends as a `ToolOutcome` while the
caller goes on.

Each worker is a process of its own (envs/_worker.py) that serves calls one at a time; a call takes
an idle worker, sends the call, and waits for the reply until `limits.timeout_s` plus a grace period.
What each failure becomes:
- Python code past its wall-clock time: interrupted inside the worker, "tool_timeout"; the worker
  serves the next call.
- A call past its CPU time (`limits.cpu_s`, even inside C code): the kernel kills the worker
  (SIGXCPU), "tool_timeout", and a fresh worker is started on next use.
- A call that does not answer by the deadline (waiting in C code, or it swallowed the interrupt): its
  worker's process group is killed, "tool_timeout", and a fresh worker is started on next use.
- A worker that dies otherwise (os._exit, a segfault, a signal): "tool_crash".
- More than `limits.output_chars` printed or returned: "tool_output_overflow" (the writer raises at
  the cap, so a print of 10 MB stops there; a reply larger than the cap allows kills the worker).
- An allocation past `limits.memory_mb` (RLIMIT_AS): MemoryError in the worker, "tool_memory", and
  the worker is replaced (its heap may be fragmented).

Why a pool and not a process per call: starting a worker (a Python interpreter importing the
standard library) costs tens of milliseconds, far more than a calculator call through the pipes.

This is containment of accidents, not a sandbox against hostile code: a tool (and the Python tool's
code) runs as the trainer's user, can read its files and open sockets. Run untrusted code under an
OS-level sandbox (a container, nsjail, gVisor) on top of these limits.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import json
import os
import queue
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Sequence

from jaxrl_llm.checks import check_float, check_int
from jaxrl_llm.envs import _worker

# What a call ends as. "ok" and "tool_error" are answers the model reads; the others end the episode
# with the status of the same name (envs/base.py).
TOOL_STATUSES = ("ok", "tool_error", "tool_timeout", "tool_crash", "tool_output_overflow", "tool_memory")
_WORKER_CODE = "from jaxrl_llm.envs._worker import serve; serve()"


@dataclasses.dataclass(frozen=True)
class ToolLimits:
  """What one tool call may use."""

  timeout_s: float = 10.0  # wall-clock seconds per call
  cpu_s: float = 10.0  # CPU seconds per call (the worker's soft RLIMIT_CPU, moved per call)
  memory_mb: int = 1024  # address space of a worker process (RLIMIT_AS), MiB
  output_chars: int = 16_384  # characters a call may print and return, together
  file_mb: int = 16  # largest file a call may write (RLIMIT_FSIZE), MiB

  def __post_init__(self):
    check_float("ToolLimits.timeout_s", self.timeout_s, 0.0, 3600.0, low_open=True)
    check_float("ToolLimits.cpu_s", self.cpu_s, 0.0, 3600.0, low_open=True)
    check_int("ToolLimits.memory_mb", self.memory_mb, 64)
    check_int("ToolLimits.output_chars", self.output_chars, 1)
    check_int("ToolLimits.file_mb", self.file_mb, 0)

  @property
  def deadline_s(self) -> float:
    """How long the parent waits for a reply before it kills the worker: past the worker's own timer,
    so that a plain hang is interrupted inside the worker (which then lives on)."""
    return self.timeout_s * 1.25 + 1.0


@dataclasses.dataclass(frozen=True)
class ToolOutcome:
  status: str  # one of TOOL_STATUSES
  output: str  # "ok": what the call printed, then returned; "tool_error": the tool's message; else ""
  detail: str = ""  # why a call failed, one line, for logs (never shown to the model)


class _Worker:
  """One worker process and its two pipes."""

  def __init__(self, cwd: str, limits: ToolLimits, start_timeout_s: float):
    self.proc = subprocess.Popen(
        [sys.executable, "-c", _WORKER_CODE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, cwd=cwd, start_new_session=True, close_fds=True)
    self.wfd, self.rfd = self.proc.stdin.fileno(), self.proc.stdout.fileno()
    self.calls = 0
    try:
      _worker.write_message(self.wfd, {"sys_path": [p for p in sys.path if p], "memory_mb": limits.memory_mb,
                                       "file_mb": limits.file_mb})
      ready = self.read(time.monotonic() + start_timeout_s, 1 << 10)
    except OSError as e:
      ready = e
    if not isinstance(ready, dict) or not ready.get("ready"):
      self.kill()
      raise RuntimeError(f"a tool worker did not start ({sys.executable} -c {_WORKER_CODE!r}): {ready}")

  def read(self, deadline: float, max_bytes: int) -> dict | str:
    """The next reply, or why there is none: "timeout", "eof", "too_large", "garbled"."""
    header = self._read_exact(_worker._HEADER.size, deadline)
    if isinstance(header, str):
      return header
    size = _worker._HEADER.unpack(header)[0]
    if size > max_bytes:
      return "too_large"
    body = self._read_exact(size, deadline)
    if isinstance(body, str):
      return body
    try:
      message = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
      return "garbled"
    return message if isinstance(message, dict) else "garbled"

  def _read_exact(self, n: int, deadline: float) -> bytes | str:
    chunks, left = [], n
    while left:
      wait = deadline - time.monotonic()
      if wait <= 0 or not select.select([self.rfd], [], [], wait)[0]:
        return "timeout"
      chunk = os.read(self.rfd, min(left, 1 << 20))
      if not chunk:
        return "eof"
      chunks.append(chunk)
      left -= len(chunk)
    return b"".join(chunks)

  def kill(self) -> None:
    """Kills the worker and everything it started (its own process group)."""
    try:
      os.killpg(self.proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
      pass
    self.proc.wait()
    for f in (self.proc.stdin, self.proc.stdout):
      try:
        f.close()
      except OSError:
        pass

  def death(self) -> ToolOutcome:
    """The outcome of a call whose worker closed its pipe."""
    try:
      code = self.proc.wait(timeout=5.0)
    except subprocess.TimeoutExpired:
      return ToolOutcome("tool_crash", "", "the worker closed its pipe but did not exit")
    if code == -signal.SIGXCPU:
      return ToolOutcome("tool_timeout", "", "the worker was killed at its CPU-time limit (SIGXCPU)")
    if code < 0:
      return ToolOutcome("tool_crash", "", f"the worker died of signal {signal.Signals(-code).name}")
    return ToolOutcome("tool_crash", "", f"the worker exited with code {code}")


def _kill_all(workers: list, tmpdir: str) -> None:
  for w in list(workers):
    w.kill()
  workers.clear()
  shutil.rmtree(tmpdir, ignore_errors=True)


class ToolPool:
  """`workers` tool worker processes, shared by every environment of a run; thread-safe."""

  def __init__(self, workers: int = 2, limits: ToolLimits = ToolLimits(), *, start_timeout_s: float = 60.0):
    check_int("ToolPool.workers", workers, 1)
    self.workers, self.limits, self.start_timeout_s = workers, limits, start_timeout_s
    self._tmpdir = tempfile.mkdtemp(prefix="jaxrl_llm_tools_")
    self._live: list[_Worker] = []  # for the finalizer: every started worker not yet killed
    self._idle: queue.SimpleQueue = queue.SimpleQueue()
    for _ in range(workers):
      self._idle.put(None)  # a slot; its worker starts on first use
    self._lock = threading.Lock()
    self._next_id = 0
    self._threads = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="tool-call")
    self.counts: collections.Counter = collections.Counter()  # outcomes by status, plus "started" workers
    self._finalizer = weakref.finalize(self, _kill_all, self._live, self._tmpdir)

  def close(self) -> None:
    """Kills every worker; the pool cannot be used afterwards."""
    self._threads.shutdown(wait=True)
    self._finalizer()

  def __enter__(self) -> ToolPool:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def run(self, fn: str, arguments: dict, *, timeout_s: float | None = None) -> ToolOutcome:
    """Runs the tool function `fn` ("module:function") on `arguments` in a worker.

    timeout_s: a shorter wall-clock limit for this call (the pool's is the most a call gets).
    """
    if not self._finalizer.alive:
      raise RuntimeError("ToolPool.run: the pool is closed")
    limits = self.limits
    if timeout_s is not None and timeout_s < limits.timeout_s:
      limits = dataclasses.replace(limits, timeout_s=timeout_s)
    with self._lock:
      self._next_id += 1
      call_id = self._next_id
    worker = self._idle.get()
    try:
      if worker is None:
        worker = _Worker(self._tmpdir, self.limits, self.start_timeout_s)
        self._live.append(worker)
        self._count("started")
      outcome, healthy = self._call(worker, call_id, fn, arguments, limits)
      if not healthy:
        worker.kill()
        self._live.remove(worker)
        worker = None
    except BaseException:
      if worker is not None:
        worker.kill()
        self._live.remove(worker)
      self._idle.put(None)
      raise
    self._idle.put(worker)
    self._count(outcome.status)
    return outcome

  def _count(self, key: str) -> None:
    with self._lock:
      self.counts[key] += 1

  def run_many(self, calls: Sequence[tuple[str, dict]]) -> list[ToolOutcome]:
    """Runs (fn, arguments) calls in parallel over the workers; outcomes in the calls' order."""
    futures = [self._threads.submit(self.run, fn, arguments) for fn, arguments in calls]
    return [f.result() for f in futures]

  def _call(self, worker: _Worker, call_id: int, fn: str, arguments: dict,
            limits: ToolLimits) -> tuple[ToolOutcome, bool]:
    """(outcome, whether the worker may serve another call)."""
    request = {"id": call_id, "fn": fn, "arguments": arguments, "timeout_s": limits.timeout_s,
               "cpu_s": limits.cpu_s, "output_chars": limits.output_chars}
    try:
      _worker.write_message(worker.wfd, request)
    except (BrokenPipeError, OSError):
      return worker.death(), False
    # A reply holds at most output_chars characters (4 bytes each in UTF-8, 6 as a JSON escape) and a
    # short detail; anything larger did not come from _worker._call.
    reply = worker.read(time.monotonic() + limits.deadline_s, 6 * limits.output_chars + (1 << 16))
    if reply == "timeout":
      return ToolOutcome("tool_timeout", "", f"no reply within {limits.deadline_s:.1f} s: the worker was "
                                               "killed"), False
    if reply == "eof":
      return worker.death(), False
    if reply == "too_large":
      return ToolOutcome("tool_output_overflow", "", "a reply larger than the output cap: the worker was "
                                                       "killed"), False
    if reply == "garbled" or reply.get("id") != call_id or reply.get("status") not in TOOL_STATUSES:
      return ToolOutcome("tool_crash", "", f"the worker's reply is not the call's: {str(reply)[:200]}"), False
    worker.calls += 1
    outcome = ToolOutcome(reply["status"], str(reply.get("output", "")), str(reply.get("detail", "")))
    return outcome, outcome.status != "tool_memory"
