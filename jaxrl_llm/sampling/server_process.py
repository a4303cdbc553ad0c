"""A llama.cpp server process that the rollout engine starts, restarts and stops.

`LlamaServerProcess(command, ...)` runs `command` (llama.cpp's `llama-server`,
with any flags of the user's, e.g. "llama-server -t 2") plus the flags the
engine owns:

    -m MODEL.gguf --host 127.0.0.1 --port PORT --alias NAME -np SLOTS -c SLOTS*CTX --no-warmup
    [-ctk f32 -ctv f32 -fa off]   (exact=True: an f32 export)

The last three keep an f32 export exact: llama.cpp's defaults, an f16 KV
cache and (auto-enabled on the CPU) a flash-attention kernel that rounds to
f16, put max |log mu - log pi_prox| at 3.4e-2 on the tiny test model, these
at 3.7e-5 (tests/sampling/test_llama_cpp_engine.py).

and waits until GET /health answers 200 (llama.cpp answers 503 while it
loads the model). Restarting is how llama.cpp takes new weights: its server
has no call that reloads a model file in place (its router mode loads other
*models*, by name), and a restart of a small model costs well under a second
plus the load; the engine measures it (`start` returns the seconds).

The process's output goes to a log file beside the model; its last lines
are in the error when the server dies while starting.
"""

from __future__ import annotations

import atexit
import os
import shlex
import shutil
import socket
import subprocess
import time

from jaxrl_llm.checks import ConfigError
from jaxrl_llm.sampling.http_client import ServerClient, ServerRejected, ServerUnavailable


def free_port() -> int:
  """A loopback TCP port nobody listens on now."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _tail(path: str, n: int = 6) -> str:
  try:
    with open(path, errors="replace") as f:
      lines = [line.strip() for line in f.readlines() if line.strip()]
  except OSError:
    return ""
  return " | ".join(lines[-n:])


class ServerNotReady(ConfigError):
  """The server process did not answer GET /health in time (it may still be loading)."""


class LlamaServerProcess:
  """One llama.cpp server on a loopback port; `start(model)` (re)starts it on that model file."""

  def __init__(self, command: str, *, alias: str, slots: int, ctx_per_slot: int, wait_s: float,
               log_dir: str, port: int = 0, exact: bool = False):
    argv = shlex.split(command)
    if not argv:
      raise ConfigError("config.rollout.server.command='' is invalid: the llama.cpp server to start "
                        "(e.g. 'llama-server')")
    if shutil.which(argv[0]) is None:
      raise ConfigError(f"config.rollout.server.command={command!r}: {argv[0]!r} is not an executable on PATH "
                        "(llama.cpp's llama-server; see tests/sampling/test_llama_cpp_engine.py for how to build it)")
    self.argv, self.alias, self.slots, self.ctx_per_slot = argv, alias, slots, ctx_per_slot
    # f32 keys and values, no flash attention: llama.cpp's defaults (an f16 KV cache; a CPU flash-attention
    # kernel that rounds to f16) move log mu by ~3e-2 on an f32 export, these settings by ~4e-5.
    self.precision = ["-ctk", "f32", "-ctv", "f32", "-fa", "off"] if exact else []
    self.wait_s, self.log_dir = wait_s, log_dir
    self.port = port or free_port()
    self.url = f"http://127.0.0.1:{self.port}"
    self.proc: subprocess.Popen | None = None
    self.model_path = ""
    self.log_path = os.path.join(log_dir, "llama-server.log")
    atexit.register(self.stop)  # a run that dies without closing its engine leaves no server behind

  def alive(self) -> bool:
    return self.proc is not None and self.proc.poll() is None

  @property
  def exit_code(self) -> int | None:
    return None if self.proc is None else self.proc.poll()

  def start(self, model_path: str, wait_s: float | None = None) -> float:
    """Stop the running server (if any), start one on `model_path`, wait until it serves (at most `wait_s`,
    default the `wait_s` it was made with); the seconds."""
    t0 = time.perf_counter()
    self.stop()
    self.model_path = model_path
    argv = self.argv + ["-m", model_path, "--host", "127.0.0.1", "--port", str(self.port), "--alias", self.alias,
                        "-np", str(self.slots), "-c", str(self.slots * self.ctx_per_slot), "--no-warmup",
                        *self.precision]
    log = open(self.log_path, "ab")
    try:
      self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    finally:
      log.close()
    self.wait_ready(self.wait_s if wait_s is None else wait_s)
    return time.perf_counter() - t0

  def wait_ready(self, wait_s: float) -> None:
    """Until GET /health is 200; a ConfigError if the process exits, ServerNotReady if `wait_s` passes first
    (the process is then stopped)."""
    client = ServerClient(self.url, timeout_s=2.0)
    deadline = time.monotonic() + wait_s
    while True:
      if not self.alive():
        raise ConfigError(f"llama.cpp server ({' '.join(self.argv)}) exited with code {self.exit_code} while "
                          f"starting on {self.model_path}: {_tail(self.log_path)}")
      try:
        client.get("/health")
        return
      except (ServerUnavailable, ServerRejected):
        pass
      if time.monotonic() > deadline:
        self.stop()
        raise ServerNotReady(f"llama.cpp server on {self.url} did not become ready within {wait_s:g} s "
                             f"(config.rollout.server.wait_s={self.wait_s:g}): {_tail(self.log_path)}")
      time.sleep(0.05)

  def stop(self) -> None:
    if self.proc is None:
      return
    if self.proc.poll() is None:
      self.proc.terminate()
      try:
        self.proc.wait(timeout=10)
      except subprocess.TimeoutExpired:
        self.proc.kill()
        self.proc.wait()
    self.proc = None
