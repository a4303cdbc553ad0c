"""Test-wide settings: a fake 8-device CPU mesh and strict rank promotion.

XLA_FLAGS must be set before jax is imported anywhere, so it lives here.

After each test module, jax's compilation caches are cleared: a worker of
`pytest -n 2` runs some 600 tests for half an hour, and every compiled XLA:CPU
program it keeps alive holds about three memory mappings. Without the clearing
a worker reached 65,378 mappings (vm.max_map_count is 65,530) and segfaulted
inside the next compile.
"""

import gc
import os

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
  os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")


@pytest.fixture
def quiet_log():
  return lambda s: None


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
  """The module's compiled programs are dropped when it ends (the module docstring)."""
  yield
  jax.clear_caches()
  gc.collect()
