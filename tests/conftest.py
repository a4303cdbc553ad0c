"""Test-wide settings: a fake 8-device CPU mesh and strict rank promotion.

XLA_FLAGS must be set before jax is imported anywhere, so it lives here.
"""

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
