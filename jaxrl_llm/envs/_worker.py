"""The tool worker: a child process that runs tool calls under limits, one at a time (pool.py starts
and feeds it).

Started as `python -c "from jaxrl_llm.envs._worker import serve; serve()"` with pipes on its stdin
and stdout. It imports only the standard library, and each tool's module on that tool's first call.
It first moves the two pipes to other descriptors and points 0, 1 and 2 at /dev/null, so code that
writes to the descriptors themselves cannot reach the protocol or flood a pipe.

Protocol: messages are an 8-byte big-endian length, then that many bytes of UTF-8 JSON. JSON, never
pickle: the worker runs code a model wrote, so the parent reads what comes back as data only.
  parent -> worker, once:  {"sys_path": [...], "memory_mb": M, "file_mb": F}
  worker -> parent, once:  {"ready": true}
  parent -> worker, a call: {"id": n, "fn": "module:function", "arguments": {...},
                             "timeout_s": t, "cpu_s": c, "output_chars": k}
  worker -> parent:         {"id": n, "status": s, "output": text, "detail": one line}
with status one of pool.TOOL_STATUSES.

Limits. Set once: RLIMIT_AS (address space, so an allocation past it raises MemoryError),
RLIMIT_FSIZE (largest file; SIGXFSZ ignored, so a write past it raises OSError), RLIMIT_CORE 0 (a
crash leaves no core file). Per call: a one-shot ITIMER_REAL timer raises after `timeout_s`, and
sys.stdout / sys.stderr become a writer that raises once `output_chars` are exceeded; both raise
BaseExceptions, so `except Exception` in a tool does not swallow them. The soft RLIMIT_CPU is moved to
the CPU time used so far plus `cpu_s` and SIGXCPU keeps its default action, so a call past its CPU
time kills the worker even inside C code, and even after the parent is gone (the parent reports
"tool_timeout" and starts another). Code that swallows the timer, or waits in C without using CPU, is
killed by the parent at its own deadline. None of this is a security boundary against hostile code
(see pool.py).
"""

import gc
import importlib
import json
import math
import os
import resource
import signal
import struct
import sys

_HEADER = struct.Struct(">Q")
_OK, _TOOL_ERROR, _TIMEOUT, _CRASH, _OVERFLOW, _MEMORY = (
    "ok", "tool_error", "tool_timeout", "tool_crash", "tool_output_overflow", "tool_memory")


class _WallLimit(BaseException):
  pass


class _Overflow(BaseException):
  pass


def _raise_wall(signum, frame):
  raise _WallLimit()


class _CappedWriter:
  """A text stream that keeps at most `limit` characters, then raises _Overflow (and remembers it)."""

  def __init__(self, limit: int):
    self.limit, self.parts, self.size, self.overflowed = limit, [], 0, False

  def write(self, text) -> int:
    text = str(text)
    if self.size + len(text) > self.limit:
      self.overflowed = True
      raise _Overflow()
    self.parts.append(text)
    self.size += len(text)
    return len(text)

  def flush(self) -> None:
    pass

  def isatty(self) -> bool:
    return False

  def getvalue(self) -> str:
    return "".join(self.parts)


def read_message(fd: int) -> dict | None:
  """The next message on `fd`, or None at end of file."""
  header = _read_exact(fd, _HEADER.size)
  if header is None:
    return None
  body = _read_exact(fd, _HEADER.unpack(header)[0])
  return None if body is None else json.loads(body.decode("utf-8"))


def _read_exact(fd: int, n: int) -> bytes | None:
  chunks, left = [], n
  while left:
    chunk = os.read(fd, min(left, 1 << 20))
    if not chunk:
      return None
    chunks.append(chunk)
    left -= len(chunk)
  return b"".join(chunks)


def write_message(fd: int, message: dict) -> None:
  body = json.dumps(message).encode("utf-8")
  data = _HEADER.pack(len(body)) + body
  while data:
    data = data[os.write(fd, data):]


_FUNCTIONS: dict = {}


def _function(path: str):
  if path not in _FUNCTIONS:
    module, _, name = path.partition(":")
    obj = importlib.import_module(module)
    for part in name.split("."):
      obj = getattr(obj, part)
    _FUNCTIONS[path] = obj
  return _FUNCTIONS[path]


def _cpu_used_s() -> float:
  usage = resource.getrusage(resource.RUSAGE_SELF)
  return usage.ru_utime + usage.ru_stime


def _set_cpu_soft(seconds) -> None:
  _, hard = resource.getrlimit(resource.RLIMIT_CPU)
  soft = resource.RLIM_INFINITY if seconds is None else int(math.ceil(seconds))
  if hard != resource.RLIM_INFINITY and (soft == resource.RLIM_INFINITY or soft > hard):
    soft = hard
  resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _restore(streams) -> None:
  """Disarms the call's timers and gives the streams back."""
  signal.setitimer(signal.ITIMER_REAL, 0)
  _set_cpu_soft(None)
  sys.stdout, sys.stderr = streams


def _call(request: dict) -> dict:
  """Runs one call; the reply's status, output and detail."""
  from jaxrl_llm.envs.tool import ToolError  # the tools' own exception (standard library only)

  out = _CappedWriter(int(request["output_chars"]))
  status, output, detail = _OK, "", ""
  saved = sys.stdout, sys.stderr
  try:
    try:
      fn = _function(request["fn"])
      sys.stdout = sys.stderr = out
      _set_cpu_soft(_cpu_used_s() + float(request["cpu_s"]))
      signal.setitimer(signal.ITIMER_REAL, float(request["timeout_s"]))
      value = fn(**request["arguments"])
      if not isinstance(value, str):
        raise TypeError(f"returned {type(value).__name__}, expected str")
      out.write(value)
    finally:
      _restore(saved)
  except _Overflow:
    status, detail = _OVERFLOW, f"more than {request['output_chars']} characters of output"
  except _WallLimit:
    status, detail = _TIMEOUT, f"ran past {request['timeout_s']} s"
  except MemoryError:
    status, detail = _MEMORY, "ran out of the worker's address space"
  except ToolError as e:
    status, output = _TOOL_ERROR, str(e)[:int(request["output_chars"])]
  except BaseException as e:  # noqa: BLE001 - a tool's failure is reported, the worker goes on
    status, detail = _CRASH, f"{type(e).__name__}: {e}"[:500]
  _restore(saved)  # again: an interrupt inside the `finally` above skips the rest of it
  if out.overflowed:  # also when the tool swallowed the _Overflow
    status, detail = _OVERFLOW, f"more than {request['output_chars']} characters of output"
  if status == _OK:
    output = out.getvalue()
  elif status != _TOOL_ERROR:
    output = ""
  out.parts.clear()
  gc.collect()  # the frames of a failed call may hold its allocations
  return {"id": request["id"], "status": status, "output": output, "detail": detail}


def serve() -> None:
  """The worker's main loop (the process's only code)."""
  rfd, wfd = os.dup(0), os.dup(1)
  devnull = os.open(os.devnull, os.O_RDWR)
  for fd in (0, 1, 2):
    os.dup2(devnull, fd)
  config = read_message(rfd)
  if config is None:
    return
  sys.path[:0] = [p for p in config["sys_path"] if p not in sys.path]
  resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
  file_bytes = int(config["file_mb"]) << 20
  resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
  signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
  signal.signal(signal.SIGALRM, _raise_wall)
  import jaxrl_llm.envs.tool  # noqa: F401 - imported before the limit, needed by every call
  memory = int(config["memory_mb"]) << 20
  resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
  write_message(wfd, {"ready": True})
  while (request := read_message(rfd)) is not None:
    try:
      reply = _call(request)
    except _WallLimit:  # the timer fired inside _call's own handlers
      _restore((sys.__stdout__, sys.__stderr__))
      reply = {"id": request["id"], "status": _TIMEOUT, "output": "", "detail": "ran past its limit"}
    write_message(wfd, reply)
