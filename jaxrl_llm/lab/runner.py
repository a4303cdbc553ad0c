"""The lab's runs as subprocesses: at most `jobs` at a time, resumable, failures recorded.

A run (a warm start or a cell) is `python -m jaxrl_llm.train` in its own
workdir, its output in `<workdir>/lab_train.log`. When it ends the lab writes
`<workdir>/lab_status.json`: `done` (exit 0 and a summary.json) or `failed`
(with the last lines of its output), and the run's `spec` (preset file, its
hash, every flag), which a later sweep compares: a done run is skipped, a
done run with another spec is an error (it would mix settings in one
table), a failed run is kept unless `retry_failed`, and a run without a
status (never started, or killed with the sweep) runs again. The trainer
resumes a killed run from its newest checkpoint (`checkpoint.every_steps`),
or starts it over when none was saved. Every start and end is appended to
`<out>/lab_log.jsonl`.
"""

from __future__ import annotations

import ctypes
import dataclasses
import fcntl
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time

from jaxrl_llm.checks import ConfigError

STATUS_FILE = "lab_status.json"
RUN_LOG = "lab_train.log"
LAB_LOG = "lab_log.jsonl"
ERROR_LINES = 20  # lines of a failed run's output kept in its status


class LabError(Exception):
  """The sweep cannot go on (a warm start refused its config, another lab holds the folder, ...)."""


@dataclasses.dataclass
class Job:
  name: str  # warm_start/s0 or a cell name
  workdir: str
  argv: list[str]  # the trainer's command
  spec: dict  # what the run computes: compared with a finished run's
  after: str | None = None  # a job (the seed's warm start) that must be done first
  info: dict = dataclasses.field(default_factory=dict)  # recorded in the status (the warm start used)
  proc: subprocess.Popen | None = None
  t_start: float = 0.0
  log_offset: int = 0

  @property
  def status_path(self) -> str:
    return os.path.join(self.workdir, STATUS_FILE)


def read_status(workdir: str) -> dict | None:
  try:
    with open(os.path.join(workdir, STATUS_FILE)) as f:
      return json.load(f)
  except (FileNotFoundError, ValueError):
    return None  # none, or cut by a kill while written (written atomically, so only a foreign file)


def _write_json(path: str, obj) -> None:
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=2)
  os.replace(tmp, path)


def spec_changes(old: dict, new: dict) -> list[str]:
  keys = sorted(set(old) | set(new))
  return [f"{k}: {old.get(k, '<absent>')!r} -> {new.get(k, '<absent>')!r}" for k in keys if old.get(k) != new.get(k)]


def checkpoint_fingerprint(workdir: str) -> str:
  """sha256 over the files of a run's checkpoints (names and bytes): the warm start's identity."""
  h = hashlib.sha256()
  root = os.path.join(workdir, "checkpoints")
  for dirpath, dirnames, files in sorted(os.walk(root)):
    dirnames.sort()
    for f in sorted(files):
      path = os.path.join(dirpath, f)
      h.update(os.path.relpath(path, root).encode())
      with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
          h.update(block)
  return h.hexdigest()[:16]


def _die_with_parent() -> None:
  """In the child: SIGTERM when the lab dies (a killed sweep leaves no orphan run; SIGTERM lets the
  trainer save the step in progress)."""
  try:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
  except OSError:
    pass


class Runner:
  def __init__(self, out_dir: str, jobs: int, *, env: dict, retry_failed: bool, log=print):
    self.out_dir, self.jobs, self.env, self.retry_failed, self.log = out_dir, jobs, env, retry_failed, log
    self._lock = None

  # ---- the folder's lock and log --------------------------------------------------
  def lock(self) -> None:
    os.makedirs(self.out_dir, exist_ok=True)
    self._lock = open(os.path.join(self.out_dir, "lab.lock"), "a+")
    try:
      fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      self._lock.seek(0)
      raise LabError(f"--out={self.out_dir!r} is in use by another lab process (pid {self._lock.read().strip()})")
    self._lock.seek(0)
    self._lock.truncate()
    self._lock.write(str(os.getpid()))
    self._lock.flush()

  def event(self, event: str, job: str, **info) -> None:
    row = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "lab_pid": os.getpid(), "event": event,
           "run": job, **info}
    with open(os.path.join(self.out_dir, LAB_LOG), "a") as f:
      f.write(json.dumps(row) + "\n")

  # ---- which jobs run ---------------------------------------------------------------
  def plan(self, jobs: list[Job]) -> list[Job]:
    """The jobs to run; raises LabError when a finished run has another spec."""
    todo = []
    for job in jobs:
      st = read_status(job.workdir)
      if st and st.get("status") == "done":
        changes = spec_changes(st.get("spec", {}), job.spec)
        if changes:
          raise LabError(f"{job.workdir} was run with other settings ({'; '.join(changes[:6])}): use another "
                         f"--out for the new settings, or delete that folder to rerun it")
        continue
      if st and st.get("status") == "failed" and not self.retry_failed and st.get("spec") == job.spec:
        continue
      todo.append(job)
    return todo

  # ---- running ------------------------------------------------------------------------
  def _start(self, job: Job) -> None:
    os.makedirs(job.workdir, exist_ok=True)
    if os.path.exists(job.status_path):  # a failed run tried again: undecided until it ends
      os.remove(job.status_path)
    log_path = os.path.join(job.workdir, RUN_LOG)
    with open(log_path, "a") as f:
      f.write(f"\n==== lab: {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(job.argv)}\n")
    job.log_offset = os.path.getsize(log_path)
    out = open(log_path, "ab")  # pylint: disable=consider-using-with
    try:
      job.proc = subprocess.Popen(job.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  env=self.env, preexec_fn=_die_with_parent)
    finally:
      out.close()
    job.t_start = time.time()
    self.event("start", job.name, pid=job.proc.pid)
    self.log(f"lab: start {job.name}")

  def _output_tail(self, job: Job) -> list[str]:
    with open(os.path.join(job.workdir, RUN_LOG), "rb") as f:
      f.seek(job.log_offset)
      text = f.read().decode("utf-8", "replace")
    return [line for line in text.splitlines() if line.strip()][-ERROR_LINES:]

  def _finish(self, job: Job, rc: int) -> dict:
    wall = time.time() - job.t_start
    summary_path = os.path.join(job.workdir, "summary.json")
    # The summary of this process (not one left by an earlier run of the workdir).
    ok = rc == 0 and os.path.exists(summary_path) and os.path.getmtime(summary_path) >= job.t_start - 1
    status = {"status": "done" if ok else "failed", "returncode": rc, "wall_s": round(wall, 2),
              "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "spec": job.spec,
              "command": job.argv, **job.info}
    if ok and job.name.startswith("warm_start"):
      status["fingerprint"] = checkpoint_fingerprint(job.workdir)
    if not ok:
      tail = self._output_tail(job)
      status["error"] = error_line(tail, rc)
      status["output_tail"] = tail
    _write_json(job.status_path, status)
    self.event(status["status"], job.name, returncode=rc, wall_s=status["wall_s"])
    self.log(f"lab: {status['status']} {job.name} in {wall:.0f} s"
             + ("" if ok else f" (exit {rc}): {status['error']}"))
    return status

  def _fail_unstarted(self, job: Job, why: str) -> None:
    os.makedirs(job.workdir, exist_ok=True)
    _write_json(job.status_path, {
        "status": "failed", "returncode": None, "wall_s": 0.0, "spec": job.spec, "error": why,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": job.argv})
    self.event("failed", job.name, error=why)
    self.log(f"lab: failed {job.name}: {why}")

  def run(self, todo: list[Job]) -> None:
    """Runs `todo` (dependencies first), at most `self.jobs` at a time. A warm start that ends
    with exit status 2 (the trainer refused its config, a user's mistake) stops the sweep."""
    pending, running = list(todo), []
    try:
      while pending or running:
        for job in list(pending):
          if len(running) >= self.jobs:
            break
          if job.after is not None:
            dep = read_status(os.path.join(self.out_dir, job.after))
            if dep is None or any(j.name == job.after for j in pending + running):
              continue  # the warm start is still to come
            if dep.get("status") != "done":
              pending.remove(job)
              self._fail_unstarted(job, f"its warm start {job.after} failed: {dep.get('error', '')}")
              continue
            job.info["warm_start"] = {"run": job.after, "fingerprint": dep.get("fingerprint")}
          pending.remove(job)
          self._start(job)
          running.append(job)
        time.sleep(0.2)
        for job in list(running):
          rc = job.proc.poll()
          if rc is None:
            continue
          running.remove(job)
          status = self._finish(job, rc)
          if status["status"] != "done" and job.name.startswith("warm_start") and rc == 2:
            raise LabError(f"the warm start {job.name} refused its config ({status['error']}); "
                           f"its command and output: {os.path.join(job.workdir, RUN_LOG)}")
    finally:
      self._stop(running)

  def _stop(self, running: list[Job]) -> None:
    """Runs still going when the sweep ends early: SIGTERM (the trainer saves its step), then wait."""
    for job in running:
      if job.proc.poll() is None:
        job.proc.send_signal(signal.SIGTERM)
    deadline = time.time() + 120
    for job in running:
      try:
        job.proc.wait(timeout=max(1.0, deadline - time.time()))
      except subprocess.TimeoutExpired:
        job.proc.kill()
      self.event("stopped", job.name)


def error_line(tail: list[str], rc: int) -> str:
  """The line of a failed run's output that says why: the trainer's `error:` line (a user's
  mistake), else the exception of a traceback, else the last line; a signal is named."""
  if rc is not None and rc < 0:
    return f"killed by {signal.Signals(-rc).name}" + (f" after: {tail[-1].strip()}" if tail else "")
  for pattern in (r"^error: ", r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b"):
    found = [line.strip() for line in tail if re.match(pattern, line.strip())]
    if found:
      return found[-1]
  return tail[-1].strip() if tail else f"exit status {rc}"


def child_env(out_dir: str, compile_cache: bool) -> dict:
  """The runs' environment: the lab's, plus a compilation cache shared by the runs (the same
  sampler, evaluation and SFT programs compile once per sweep; compiled code, not results)."""
  env = dict(os.environ)
  if compile_cache and "JAX_COMPILATION_CACHE_DIR" not in env:
    env["JAX_COMPILATION_CACHE_DIR"] = os.path.join(os.path.abspath(out_dir), "compile_cache")
    # Every program, also the many small ones (a tiny cell: 38 s without them cached, 16 s with).
    env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  env.setdefault("PYTHONUNBUFFERED", "1")
  return env


def trainer_argv(preset_path: str, workdir: str, flags: dict[str, str]) -> list[str]:
  return [sys.executable, "-m", "jaxrl_llm.train", f"--config={preset_path}", f"--workdir={workdir}",
          *(f"--config.{k}={v}" for k, v in flags.items())]


def check_jobs(jobs: int) -> int:
  if jobs < 1:
    raise ConfigError(f"--jobs={jobs} is out of range: allowed >= 1")
  return jobs
