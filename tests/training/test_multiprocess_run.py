"""The main command as a multi-controller run (a pod slice's shape: one process per host), here as 2
local processes of 1 CPU device each with gloo collectives, against 1 process of 2 devices on the
same mesh (data = 2) and config: the same run, bit for bit. Then a process killed with SIGKILL
mid-run: the other exits within a bounded time, and the workdir resumes in one process to the
uninterrupted result.

Why 2 devices: an all-reduce of two participants is a + b in any order, so the in-process and the
gloo collectives give the same bits and the runs can be compared with `==` (with 4 devices the two
sum in different orders, and 60 warm-start steps at lr 5e-3 amplify the last-bit differences into
another trajectory). Why one device per process: XLA:CPU with gloo deadlocked here with two local
devices per process (one device's program in gloo's all-reduce, the other's launch waiting for its
in-flight slot), after a few steps, in about half the runs; a TPU host's chips do not go through gloo.
"""

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from run_helpers import CHEAP_XLA_FLAGS, REPO

from jaxrl_llm.training.tiny import TINY_MODEL, config_flags

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess, pytest.mark.xdist_group("multiprocess_run")]

# The default run, shrunk: 2 RL steps, a checkpoint after each, from the shared warm start (`warm`).
RUN_FLAGS = ("--config=configs/gspo.py", "--config.task.digits=1", "--config.train.steps=2",
             "--config.rollout.prompts_per_step=8", "--config.rollout.group_size=4", "--config.eval.n_examples=16",
             "--config.log.progress=False", "--config.checkpoint.every_steps=1", "--config.log.dump_steps=(2,)")
# The warm start: 60 SFT steps that leave both right and wrong answers, so the groups carry advantages
# and the updates move the weights.
WARM_SFT = ("--config.sft.steps=60", "--config.sft.lr=0.005")
# The wall-clock fields of a metrics row (the rest must agree).
CLOCK = ("time/", "perf/", "engine/export_s", "engine/reload_s", "engine/sync_s")
# XLA:CPU ends a collective whose threads have not all arrived within 40 s by default: on 2 loaded
# cores (the suite's other worker) that can be a slow thread, not a hang.
PATIENT = "--xla_cpu_collective_call_terminate_timeout_seconds=600"
# Not passed on: the suite's persistent compilation cache (a program with collectives loaded from it
# hung in a cross-module all-reduce on 4 devices) and the injected faults of other tests.
_DROPPED = ("XLA_FLAGS", "JAXRL_LLM_FAULT", "JAX_COMPILATION_CACHE_DIR")


def _env(**extra) -> dict:
  return {**{k: v for k, v in os.environ.items() if k not in _DROPPED}, **extra}


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _launch(workdir, processes: int, devices: int, *, flags=(), faults=None, base=RUN_FLAGS,
            module="jaxrl_llm.train") -> list[subprocess.Popen]:
  """`python -m <module>` (the trainer) as `processes` processes of `devices` CPU devices each, as a user
  starts them (the JAX_* variables); faults: {process id: JAXRL_LLM_FAULT spec}."""
  port = _free_port()
  procs = []
  for pid in range(processes):
    env = _env(XLA_FLAGS=f"--xla_force_host_platform_device_count={devices} {CHEAP_XLA_FLAGS} {PATIENT}")
    if processes > 1:
      env.update(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES=str(processes),
                 JAX_PROCESS_ID=str(pid), JAXRL_LLM_HEARTBEAT_TIMEOUT_S="20")
    if faults and pid in faults:
      env["JAXRL_LLM_FAULT"] = faults[pid]
    procs.append(subprocess.Popen([sys.executable, "-m", module, *base, *flags,
                                   f"--workdir={workdir}"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True))
  return procs


def _finish(procs, timeout: float = 900) -> list[tuple[int, str]]:
  out = []
  deadline = time.time() + timeout
  for p in procs:
    try:
      log, _ = p.communicate(timeout=max(deadline - time.time(), 1))
    except subprocess.TimeoutExpired:
      for q in procs:
        q.kill()
      pytest.fail(f"the run did not end within {timeout} s")
    out.append((p.returncode, log))
  return out


def _run(workdir, processes: int, devices: int, **kwargs) -> list[str]:
  results = _finish(_launch(workdir, processes, devices, **kwargs))
  for code, log in results:
    assert code == 0, log[-4000:]
  return [log for _, log in results]


def _metrics(workdir) -> list[dict]:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(CLOCK)} for line in f if line.strip()]


def _final_params(workdir) -> dict:
  """The last checkpoint's params, restored onto this process's first device (whatever saved them)."""
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel

  ckpts = os.path.join(workdir, "checkpoints")
  path = os.path.join(ckpts, str(max(int(s) for s in os.listdir(ckpts) if s.isdigit())), "state")
  tree = ocp.StandardCheckpointer().metadata(path).item_metadata.tree
  one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=one), tree)
  return jax.tree.map(np.asarray, ocp.StandardCheckpointer().restore(path, target)["params"])


def _assert_same_run(got_dir, want_dir):
  got, want = _metrics(got_dir), _metrics(want_dir)
  assert [r["step"] for r in got] == [r["step"] for r in want] == list(range(1, len(want) + 1))
  assert len(want) >= 2
  assert len(got[0]) > 20  # the rows hold the step's metrics, not only its number
  for g, w in zip(got, want):
    assert g.keys() == w.keys()
    assert g == w  # bitwise (module docstring)
  s_got, s_want = (json.load(open(os.path.join(d, "summary.json"))) for d in (got_dir, want_dir))
  for k in ("eval_accuracy_start", "eval_accuracy_end", "train_reward_first", "train_reward_last", "rl_steps"):
    assert s_got[k] == s_want[k], k
  p_got, p_want = _final_params(got_dir), _final_params(want_dir)
  jax.tree.map(np.testing.assert_array_equal, p_got, p_want)
  _assert_same_dump(got_dir, want_dir, step=2)


def _assert_same_dump(got_dir, want_dir, step: int):
  """The token-weight dump of `step` (log.dump_steps; process 0 writes it from the gathered factors):
  every array and every field of its JSON equal, the step's clock metrics aside."""
  from jaxrl_llm.rundir import token_dump  # pylint: disable=import-outside-toplevel

  (a_got, i_got), (a_want, i_want) = (token_dump.read_dump(d, step) for d in (got_dir, want_dir))
  assert sorted(a_got) == sorted(a_want) and any(k.startswith("factor_") for k in a_got)
  for k in a_want:
    np.testing.assert_array_equal(a_got[k], a_want[k], err_msg=k)
  for info in (i_got, i_want):
    info["metrics"] = {k: v for k, v in info["metrics"].items() if not k.startswith(CLOCK)}
  assert i_got == i_want


def _warm_start(tmp_path_factory, name: str, base: tuple[str, ...]) -> tuple[str, ...]:
  """The flags that start a run of `base` from one shared warm start: its SFT steps run once, as one
  process of one device (`train.steps=0`), and every run of a test loads the params
  (`init_checkpoint`, `sft.steps=0`) instead of repeating the warm start in each of its processes.
  The runs compared still start from the same params; what the warm start itself does in several
  processes is the teacher test's (its hint warm start runs in each run)."""
  workdir = tmp_path_factory.mktemp(name) / "run"
  base = tuple(f for f in base if not f.startswith("--config.log.dump_steps="))  # (no step to dump)
  _run(workdir, 1, 1, base=base, flags=("--config.train.steps=0",))
  return (f"--config.init_checkpoint={workdir}", "--config.sft.steps=0")


@pytest.fixture(scope="session")
def warm(tmp_path_factory) -> tuple[str, ...]:
  """Made once per suite: the first pytest-xdist worker to ask makes it in the folder the workers
  share, under a lock; another waits for it rather than making its own (half a minute of both cores)."""
  shared = tmp_path_factory.getbasetemp()
  if "PYTEST_XDIST_WORKER" in os.environ:
    shared = shared.parent  # the run's folder, above the workers' own
  with open(shared / "warm.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    done = shared / "warm.json"
    if not done.exists():
      done.write_text(json.dumps(_warm_start(tmp_path_factory, "warm", (*RUN_FLAGS, *WARM_SFT))))
    return tuple(json.loads(done.read_text()))


@pytest.fixture(scope="session")
def single_process(tmp_path_factory, warm):
  """The reference: one process, 2 devices, the same mesh (data = 2)."""
  workdir = tmp_path_factory.mktemp("single") / "run"
  _run(workdir, 1, 2, flags=warm)
  rows = _metrics(workdir)
  assert any(r["grad/norm"] > 0 for r in rows)  # the groups carried advantages: the updates moved the weights
  assert rows[-1]["kl/ref"] > 0
  return workdir


# `rollout.overlap` at staleness 1 with the built-in sampler, 3 steps: resumed after step 1 in two
# processes, step 2's batch is made when step 2 asks for it and step 3's during step 2's update
# (InlineRollouts.while_updating); the one-process reference makes them in its background thread.
OVERLAP = ("--config.rollout.overlap=True", "--config.rollout.staleness=1", "--config.train.steps=3")


@pytest.fixture(scope="session")
def single_process_overlap(tmp_path_factory, warm):
  """The reference of the overlapped runs: one process, 2 devices, `rollout.overlap` (its thread)."""
  workdir = tmp_path_factory.mktemp("single_overlap") / "run"
  _run(workdir, 1, 2, flags=(*warm, *OVERLAP))
  rows = _metrics(workdir)
  assert [r["rollout/version_lag_mean"] for r in rows] == [0, 1, 1]  # step s sampled theta_{max(s-1, 0)}
  return workdir


def _made_ahead(workdir) -> list[float]:
  """Per metrics row: the seconds its update spent making the next step's batch (time/rollout_ahead_s)."""
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line).get("time/rollout_ahead_s", 0.0) for line in f if line.strip()]


def test_two_processes_run_the_single_process_run(tmp_path, warm, single_process):
  workdir = tmp_path / "run"
  logs = _run(workdir, 2, 1, flags=warm)
  assert "[process 1/2]" in logs[1]  # a multi-process run's lines say which process speaks
  _assert_same_run(workdir, single_process)
  # The run's files are process 0's: one metrics row per step, not one per process.
  assert len(_metrics(workdir)) == 2


def test_a_killed_process_ends_the_run_and_one_process_resumes_it(tmp_path, warm, single_process):
  workdir = tmp_path / "run"
  # Process 1 is killed (SIGKILL: nothing flushed) in the second step's update, after step 1's checkpoint.
  t0 = time.time()
  (code0, log0), (code1, _) = _finish(_launch(workdir, 2, 1, flags=warm, faults={1: "update:2:kill"}))
  assert code1 == -signal.SIGKILL
  assert code0 != 0, log0[-3000:]
  # The survivor stops on its own: gloo's broken connection or the missed heartbeats (20 s here).
  assert time.time() - t0 < 600, log0[-3000:]
  assert not os.path.exists(os.path.join(workdir, "summary.json"))
  # The same command, now one process of 2 devices, resumes the two processes' checkpoint (resharded
  # onto its own devices) and ends with the uninterrupted run.
  log = _run(workdir, 1, 2, flags=warm)[0]
  assert "resum" in log.lower(), log[-3000:]
  _assert_same_run(workdir, single_process)


def test_sigterm_to_one_process_before_the_first_step_stops_both_after_the_same_step(tmp_path, warm,
                                                                                      single_process):
  """SIGTERM to process 1 alone, in the evaluation before the first RL step (where JAX's preemption
  notifier, installed when the process joined, holds the signal, as in a warm start): both processes
  finish the evaluation and the first RL step, save it and exit 143 together (JAX's preemption sync
  point, not each process's own flag); the same command resumes to the uninterrupted run."""
  workdir = tmp_path / "run"
  results = _finish(_launch(workdir, 2, 1, flags=warm, faults={1: "eval:1:term"}))
  for code, log in results:
    assert code == 128 + signal.SIGTERM, log[-3000:]
    assert "stopped by SIGTERM after step 1" in log, log[-3000:]
  assert sorted(d for d in os.listdir(workdir / "checkpoints") if d.isdigit()) == ["1"]
  assert [r["step"] for r in _metrics(workdir)] == [1]
  logs = _run(workdir, 2, 1, flags=warm)
  assert "resum" in logs[0].lower(), logs[0][-3000:]
  _assert_same_run(workdir, single_process)


def test_one_process_checkpoint_resumes_in_two_processes(tmp_path, warm, single_process_overlap):
  """The reverse of the test above, with `rollout.overlap`: one process (2 devices, its background
  thread) killed in step 2's update; the same command as two processes of one device resumes its
  checkpoint, makes step 2's batch again and step 3's during step 2's update (in the trainer's
  thread), and ends with the uninterrupted run."""
  workdir = tmp_path / "run"
  # Synchronous saves: a lone process killed right after step 1's save started could lose it (the
  # write in flight), and the rerun would start over instead of resuming.
  sync = ("--config.checkpoint.async_save=False", *warm, *OVERLAP)
  ((code, _),) = _finish(_launch(workdir, 1, 2, flags=sync, faults={0: "update:2:kill"}))
  assert code == -signal.SIGKILL
  assert [d for d in os.listdir(workdir / "checkpoints") if d.isdigit()] == ["1"]  # step 1 saved, step 2 not
  logs = _run(workdir, 2, 1, flags=sync)
  assert "resum" in logs[0].lower(), logs[0][-3000:]
  _assert_same_run(workdir, single_process_overlap)
  ahead = _made_ahead(workdir)  # rows 2 and 3 are the two processes': step 3's batch made in step 2's update
  assert ahead[1] > 0.05 and ahead[2] < ahead[1], ahead


def test_evaluate_in_two_processes_is_the_single_process_one(tmp_path, single_process):
  """`python -m jaxrl_llm.evaluate` of the reference run's last checkpoint (greedy and sampled pass@k) as
  2 processes x 1 device against 1 process x 2 devices: the same file, written by process 0; its greedy
  pass@1 is the run's own eval_accuracy_end."""
  flags = ("--n_samples=2", "--k=1,2")
  outs = {}
  for name, (processes, devices) in {"one": (1, 2), "two": (2, 1)}.items():
    out = tmp_path / f"{name}.json"
    logs = _run(single_process, processes, devices, base=(*flags, f"--out={out}"), module="jaxrl_llm.evaluate")
    outs[name] = json.loads(out.read_text())
    assert sum("written to" in log for log in logs) == 1  # process 0 writes the file
  assert outs["two"] == outs["one"] and list(outs["one"]["steps"]) == ["2"]
  summary = json.load(open(os.path.join(single_process, "summary.json")))
  # (the summary holds the mean in float32)
  assert outs["one"]["steps"]["2"]["pass@1_greedy"] == pytest.approx(summary["eval_accuracy_end"], abs=1e-7)


# SDPO, the self-teacher: the hint warm start, the teacher's recompute and the distillation term, shrunk.
# (the hint warm start runs in each run: the warm start's own path in several processes)
TEACHER_FLAGS = ("--config=configs/sdpo.py", *RUN_FLAGS[1:], "--config.teacher.hint_sft_steps=20",
                 "--config.teacher.refresh_every=1")


@pytest.mark.xdist_group("multiprocess_teacher")  # may run beside the module's others
def test_a_teacher_method_in_two_processes_is_the_single_process_run(tmp_path, warm):
  one, two = tmp_path / "one", tmp_path / "two"
  _run(one, 1, 2, base=TEACHER_FLAGS, flags=warm)
  _run(two, 2, 1, base=TEACHER_FLAGS, flags=warm)
  assert any(k.startswith("teacher/") for k in _metrics(one)[0])  # the teacher's terms were computed
  _assert_same_run(two, one)


# The calculator example, shrunk: 2 RL steps of episodes whose tool calls each process runs for its own
# rows only, from a warm start on tool demonstrations (its own, shared by the two runs). The tiny model, as
# in the fault matrix's episodes row (tests/checkpointing/test_fault_matrix.py): it learns the call format
# in the same warm start.
EPISODE_FLAGS = ("--config=configs/examples/arithmetic_calculator.py", *config_flags(TINY_MODEL),
                 "--config.train.steps=2", "--config.task.digits=1", "--config.rollout.prompts_per_step=8",
                 "--config.rollout.group_size=2", "--config.eval.n_examples=16", "--config.log.progress=False", "--config.checkpoint.every_steps=1",
                 "--config.log.dump_steps=(2,)")
EPISODE_SFT = ("--config.sft.steps=80", "--config.sft.batch_size=32", "--config.sft.lr=0.02")


@pytest.mark.xdist_group("multiprocess_episodes")  # no shared fixture: may run beside the module's others
def test_episodes_with_a_tool_in_two_processes_are_the_single_process_run(tmp_path_factory, tmp_path):
  warm_tools = _warm_start(tmp_path_factory, "warm_tools", (*EPISODE_FLAGS, *EPISODE_SFT))
  one, two = tmp_path / "one", tmp_path / "two"
  _run(one, 1, 2, base=EPISODE_FLAGS, flags=warm_tools)
  _run(two, 2, 1, base=EPISODE_FLAGS, flags=warm_tools)
  rows = _metrics(one)
  assert max(r["env/observation_tokens_mean"] for r in rows) > 0  # the calculator was called and answered
  _assert_same_run(two, one)


# A reward model (configs/reward_model.py), shrunk: 4 steps of 16 pairs in micro-batches of 8, a held-out
# evaluation and a checkpoint every 2 steps.
REWARD_FLAGS = ("--config=configs/reward_model.py", "--config.train.steps=4", "--config.train.batch_size=16",
                "--config.train.micro_batch_size=8", "--config.train.warmup_steps=1", "--config.data.n_train=200",
                "--config.data.n_eval=24", "--config.eval.every=2", "--config.checkpoint.every_steps=2",
                "--config.log.every=1")


@pytest.mark.xdist_group("multiprocess_reward_model")  # no shared fixture: may run beside the module's others
def test_a_reward_model_in_two_processes_is_the_single_process_run(tmp_path):
  """`python -m jaxrl_llm.reward_model` as 2 processes x 1 device against 1 process x 2 devices: the same
  metrics rows (clock fields aside), summary and final trunk, bitwise; one set of files (process 0's)."""
  one, two = tmp_path / "one", tmp_path / "two"
  _run(one, 1, 2, base=REWARD_FLAGS, module="jaxrl_llm.reward_model")
  logs = _run(two, 2, 1, base=REWARD_FLAGS, module="jaxrl_llm.reward_model")
  assert "[process 1/2]" in logs[1]
  got, want = _metrics(two), _metrics(one)
  assert [r["step"] for r in want] == [1, 2, 3, 4] and "eval/accuracy" in want[1] and got == want
  s_got, s_want = (json.load(open(os.path.join(d, "summary.json"))) for d in (two, one))
  assert s_got.keys() == s_want.keys()
  for k in s_want:
    if k not in ("workdir", "export_dir", "run_time_s"):
      assert s_got[k] == s_want[k], k
  jax.tree.map(np.testing.assert_array_equal, _final_params(two), _final_params(one))
  # The Hugging Face export (export=True by default): the same tensors, written by process 0.
  from safetensors.numpy import load_file  # pylint: disable=import-outside-toplevel

  want_t, got_t = (load_file(os.path.join(d, "hf", "model.safetensors")) for d in (one, two))
  assert got_t.keys() == want_t.keys() and "score.weight" in want_t
  for k in want_t:
    np.testing.assert_array_equal(got_t[k], want_t[k], err_msg=k)


# The external engine (`rollout.engine=openai`) on the stand-in llama.cpp server the engine starts, with
# `rollout.overlap` at staleness 1, 3 steps: process 0 drives the engine (sampling/primary_engine.py), a
# GGUF export and a verified sync before each batch; with one process a background thread generates
# the next batch, with two the trainer's thread during each update (training/async_rollout.py).
ENGINE_FLAGS = (*RUN_FLAGS, "--config.rollout.engine=openai",
                f"--config.rollout.server.command={sys.executable} tests/sampling/fake_openai_server.py",
                "--config.rollout.server.sync_every=1", "--config.rollout.server.backoff_s=0.01",
                "--config.rollout.server.concurrency=4", "--config.rollout.overlap=True",
                "--config.rollout.staleness=1", "--config.train.steps=3")


@pytest.mark.xdist_group("multiprocess_engine")  # may run beside the module's others
def test_an_external_engine_and_overlap_in_two_processes_are_the_single_process_run(tmp_path, warm):
  """Process 0 starts the server, exports the gathered weights to it (GGUF) and verifies them, sends every
  request and broadcasts the samples; steps 2 and 3's batches are made during the previous update: the
  same run as one process (its background thread), bitwise (the engine's clocks aside)."""
  one, two = tmp_path / "one", tmp_path / "two"
  _run(one, 1, 2, base=ENGINE_FLAGS, flags=warm)
  logs = _run(two, 2, 1, base=ENGINE_FLAGS, flags=warm)
  assert "[process 1/2]" in logs[1]
  rows = _metrics(one)
  assert [r["rollout/version_lag_mean"] for r in rows] == [0, 1, 1]  # step s sampled theta_{max(s-1, 0)}
  # two exports (versions 0 and 1: step 2 samples theta_0 again), each verified: the server's probe
  # scored as the trainer scores the exported weights
  assert [r["engine/syncs"] for r in rows] == [1.0, 1.0, 2.0] and rows[-1]["engine/sync_check_failures"] == 0
  assert rows[-1]["engine/requests"] == 96 and rows[-1]["engine/sync_probe_max_abs_dlogp"] < 1e-5
  _assert_same_run(two, one)
  ahead = _made_ahead(two)  # steps 2 and 3's batches made during steps 1 and 2's updates
  assert min(ahead[:2]) > 0.01 and ahead[2] < min(ahead[:2]), ahead


def test_processes_with_different_configs_are_refused(tmp_path):
  port = _free_port()
  procs = []
  for pid, extra in ((0, ()), (1, ("--config.train.lr=0.5",))):
    env = _env(XLA_FLAGS=f"--xla_force_host_platform_device_count=1 {CHEAP_XLA_FLAGS}",
               JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(pid))
    procs.append(subprocess.Popen([sys.executable, "-m", "jaxrl_llm.train", *RUN_FLAGS, *extra,
                                   f"--workdir={tmp_path / 'run'}"], cwd=REPO, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
  for code, log in _finish(procs, timeout=300):
    assert code == 2, log[-3000:]
    assert "error: the processes of this run were started with different configs: processes [1]" in log
  assert not os.path.exists(tmp_path / "run")  # refused before anything was written


def test_a_coordinator_that_never_comes_up_fails_in_one_line(tmp_path):
  env = _env(XLA_FLAGS=f"--xla_force_host_platform_device_count=1 {CHEAP_XLA_FLAGS}",
             JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{_free_port()}", JAX_NUM_PROCESSES="2", JAX_PROCESS_ID="1",
             JAXRL_LLM_INIT_TIMEOUT_S="5")
  t0 = time.time()
  res = subprocess.run([sys.executable, "-m", "jaxrl_llm.train", *RUN_FLAGS, f"--workdir={tmp_path / 'run'}"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
  assert time.time() - t0 < 120
  errors = [line for line in (res.stdout + res.stderr).splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and "process 1 of 2 could not join the run: no coordinator answered at 127.0.0.1:" in errors[0], errors
  assert "Traceback" not in res.stdout + res.stderr
