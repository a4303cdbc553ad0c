"""The tool pool contains every way a call can go wrong: each ends as its named status while the pool
goes on serving calls (a worker that died or was killed is replaced on next use)."""

import pytest

from jaxrl_llm.envs.builtin_tools import CALCULATOR, PYTHON
from jaxrl_llm.envs.pool import TOOL_STATUSES, ToolLimits, ToolPool

from tool_fixtures import TEST_LIMITS


def _still_serves(pool):
  assert pool.run(CALCULATOR.fn, {"expression": "1+1"}).output == "2"


@pytest.mark.parametrize("code,status,replaced", [
    # a pure-Python hang: interrupted inside the worker at 2 s; the same worker serves on
    ("while True: pass", "tool_timeout", False),
    # a hang in C (the interrupt waits for the loop): killed by the parent at its deadline
    ("sum(range(10**13))", "tool_timeout", True),
    # a hang that ignores the interrupt
    ("import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True: pass", "tool_timeout", True),
    ("import os\nos._exit(3)", "tool_crash", True),
    ("import ctypes\nctypes.string_at(0)", "tool_crash", True),  # a segfault (no core file: RLIMIT_CORE 0)
    ("print('x' * 10_000_000)", "tool_output_overflow", False),  # 10 MB print: cut at the 4096-char cap
    ("for i in range(10**7): print(i)", "tool_output_overflow", False),
    ("x = bytearray(10**10)", "tool_memory", True),  # 10 GB at once, past the 512 MiB RLIMIT_AS
    ("x = []\nwhile True: x.append(bytes(10**7))", "tool_memory", True),  # unbounded growth (test_tool_env.py)
])
def test_bad_calls_are_contained(pool, code, status, replaced):
  # Idle workers queue first in, first out: two calls in a row warm both slots, and the two after the
  # bad call use both again, so a killed worker's replacement starts (once) among them.
  _still_serves(pool)
  _still_serves(pool)
  started = pool.counts["started"]
  outcome = pool.run(PYTHON.fn, {"code": code})
  assert (outcome.status, outcome.output) == (status, "")
  assert outcome.detail  # one line saying why
  _still_serves(pool)
  _still_serves(pool)
  assert pool.counts["started"] - started == (1 if replaced else 0)
  assert set(pool.counts) <= set(TOOL_STATUSES) | {"started"}


def test_worker_killed_detail_and_replacement():
  with ToolPool(1, TEST_LIMITS) as pool:
    _still_serves(pool)
    assert pool.counts["started"] == 1
    crash = pool.run(PYTHON.fn, {"code": "import os\nos._exit(7)"})
    assert crash.detail == "the worker exited with code 7"
    segv = pool.run(PYTHON.fn, {"code": "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)"})
    assert segv.detail == "the worker died of signal SIGSEGV"
    _still_serves(pool)
    assert pool.counts["started"] == 3  # the first, and one after each death
    hang = pool.run(PYTHON.fn, {"code": "while True: pass"})
    assert (hang.status, hang.detail) == ("tool_timeout", "ran past 2.0 s")
    _still_serves(pool)
    assert pool.counts["started"] == 3  # interrupted inside the worker, which lives on
  with pytest.raises(RuntimeError, match="closed"):
    pool.run(CALCULATOR.fn, {"expression": "1"})


def test_cpu_time_limit_kills_a_loop_in_c():
  # A C loop never lets the wall-clock interrupt run; the CPU-time limit (SIGXCPU, the kernel's default
  # action) ends it long before the 60 s deadline.
  with ToolPool(1, ToolLimits(timeout_s=60.0, cpu_s=1.0, memory_mb=512)) as pool:
    outcome = pool.run(PYTHON.fn, {"code": "sum(range(10**13))"})
    assert (outcome.status, outcome.detail) == ("tool_timeout", "the worker was killed at its CPU-time limit "
                                                                "(SIGXCPU)")
    _still_serves(pool)
    assert pool.counts["started"] == 2


def test_misbehaving_tool_functions(pool):
  assert pool.run("tool_fixtures:echo", {"x": "a"}).output == "printed returned a"  # prints, then the return
  bad_return = pool.run("tool_fixtures:returns_int", {"x": "a"})
  assert (bad_return.status, bad_return.detail) == ("tool_crash", "TypeError: returned int, expected str")
  raised = pool.run("tool_fixtures:raises", {"x": "a"})
  assert (raised.status, raised.detail) == ("tool_crash", "KeyError: 'a'")
  swallowed = pool.run("tool_fixtures:swallows_everything", {"x": "a"})
  assert swallowed.status == "tool_output_overflow"
  big_file = pool.run("tool_fixtures:writes_file", {"x": "a"})
  assert big_file.status == "tool_crash" and "File too large" in big_file.detail  # RLIMIT_FSIZE
  missing = pool.run("tool_fixtures:no_such_function", {"x": "a"})
  assert missing.status == "tool_crash" and missing.detail.startswith("AttributeError")
  _still_serves(pool)


def test_per_call_timeout_and_parallel_calls(pool):
  short = pool.run(PYTHON.fn, {"code": "import time\ntime.sleep(30)"}, timeout_s=0.3)
  assert (short.status, short.detail) == ("tool_timeout", "ran past 0.3 s")
  outcomes = pool.run_many([(CALCULATOR.fn, {"expression": f"{i} * 3"}) for i in range(7)]
                           + [(PYTHON.fn, {"code": "import os\nos._exit(1)"})])
  assert [o.output for o in outcomes[:7]] == [str(3 * i) for i in range(7)]
  assert outcomes[7].status == "tool_crash"
  _still_serves(pool)


def test_limits_are_validated():
  with pytest.raises(ValueError, match=r"ToolLimits.timeout_s=0 is out of range"):
    ToolLimits(timeout_s=0)
  with pytest.raises(ValueError, match=r"ToolLimits.memory_mb=16 is out of range: allowed >= 64"):
    ToolLimits(memory_mb=16)
  with pytest.raises(ValueError, match=r"ToolPool.workers=0 is out of range"):
    ToolPool(0)
