"""Test-wide settings: a fake 8-device CPU mesh and strict rank promotion.

XLA_FLAGS must be set before jax is imported anywhere, so it lives here.

After each test module, jax's compilation caches are cleared: a worker of
`pytest -n 2` runs some 600 tests for half an hour, and every compiled XLA:CPU
program it keeps alive holds about three memory mappings. Without the clearing
a worker reached 65,378 mappings (vm.max_map_count is 65,530) and segfaulted
inside the next compile.

The suite shares one persistent XLA compilation cache, made fresh for each
run (the workers of `pytest -n 2` and the subprocesses the tests start
inherit its path): many tests compile the same tiny model's programs, and
a program compiled once is loaded from disk after that. It cut a sample of
the suite (the smoke configs and the packed update, `-n 2`, load 3.1-3.2)
from 351 s to 298 s.

The suite's XLA:CPU programs are compiled with LLVM's cheap passes only
(`--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes`)
and XLA:CPU's older elemental fusion emitters
(`--xla_cpu_use_fusion_emitters=false`): the suite is compile-bound (tiny
models, many programs), and the faster compiles outweigh the slower code. The
packed-update tests (`-n 2`, load 0) took 114.8 s without the first two flags
and 70.8 s with them. The third halves the compile of an update step (about
250 fused kernels, each its own LLVM module): the packed-update, first-hour
and vocabulary-kernel modules (`-n 2`) took 250 s and compiled for 309 s
without it, 146 s and 108 s with it (load 3.3 and 2.7). The flags change how
XLA:CPU generates machine code, not the HLO it runs; the subprocesses the
tests start get them too (run_helpers.CHEAP_XLA_FLAGS). Two more fit two
shared cores: `--xla_cpu_parallel_codegen_split_count=1` (a program's LLVM
module is not split for parallel code generation) and
`--xla_cpu_multi_thread_eigen=false` (Eigen's kernels on the calling thread,
not a pool competing with the other worker): the packed-update module
(`-n 0`, load 1.1-1.4) took 83.9 and 85.2 s without them, 72.9 s with both;
it, the first hour and the kept cache (`-n 2`) 129.2 s and 121.2 s (230.7
and 212.8 s of user time, load 1.2-2.5).
"""

import gc
import os
import shutil
import tempfile

import pytest

from run_helpers import CHEAP_XLA_FLAGS

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
  _flags = (_flags + " --xla_force_host_platform_device_count=8").strip()
  if "xla_backend_optimization_level" not in _flags:
    _flags += " " + CHEAP_XLA_FLAGS
  os.environ["XLA_FLAGS"] = _flags

# The run's cache is made by the process pytest was started in (not a worker), before the workers start.
_OWN_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ and "PYTEST_XDIST_WORKER" not in os.environ:
  _OWN_CACHE = os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="jaxrl_llm_test_xla_cache_")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.3")

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")

# Python's cyclic garbage collector runs less often: tracing and lowering a program allocate millions
# of short-lived objects, and each collection walks the heap's long-lived ones (jax, flax, the test's
# arrays). The packed-update module (`-n 0`, load 0.8-1.4) took 95.0 and 97.3 s with the defaults
# (700, 10, 10), 88.5 and 93.3 s with these. Each module's end still collects
# (`_release_compiled_programs`).
gc.set_threshold(100_000, 50, 1000)


@pytest.fixture
def quiet_log():
  return lambda s: None


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
  """The module's compiled programs are dropped when it ends (the module docstring)."""
  yield
  jax.clear_caches()
  gc.collect()


def pytest_unconfigure(config):
  if _OWN_CACHE:
    shutil.rmtree(_OWN_CACHE, ignore_errors=True)


def pytest_configure(config):
  """Under `--dist loadgroup`, pytest-xdist 3.8 sends a marked test to its group's worker by renaming
  it `<nodeid>@<group>` through `item._nodeid`, which pytest 9 no longer reads: every group then
  splits over the workers silently, and each worker builds the module fixtures again (the lab's grid
  and the multi-process reference run were set up twice in CI). pyproject.toml pins pytest 8.4; this
  refuses another major version in one line rather than letting the suite cost minutes unseen."""
  workers = config.getoption("numprocesses", None)
  if config.getoption("dist", "no") == "loadgroup" and workers and int(pytest.__version__.split(".")[0]) >= 9:
    raise pytest.UsageError(
        f"pytest {pytest.__version__} ignores pytest-xdist's xdist_group marks under --dist loadgroup; "
        f"install the test extra's pins: pip install -e \".[test]\" (pytest==8.4.2)")
