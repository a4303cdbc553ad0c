"""Fixtures of the compile-only TPU tests."""

import pytest


@pytest.fixture(scope="module")
def compiled_once():
  """For a module's tests: each topology's devices made once (`tpu.topology.topology_devices` makes new
  ones at each call), and each program compiled once, keyed on its StableHLO, its arguments' and
  results' trees and its devices (the same device objects): a hit is the very program, and what it
  returns the compiler's own result for it. Plans of the same run then share their programs."""
  import jax

  from jaxrl_llm.tpu import topology as topology_lib

  real_devices, real_compile = topology_lib.topology_devices, jax.stages.Lowered.compile
  devices, programs = {}, {}

  def shared_devices(name):
    if name not in devices:
      devices[name] = real_devices(name)
    return devices[name]

  def compile_once(lowered, compiler_options=None, **kwargs):
    on = getattr(lowered._lowering, "_device_list", None)  # pylint: disable=protected-access
    if compiler_options or kwargs or on is None:
      return real_compile(lowered, compiler_options, **kwargs)
    key = (lowered.as_text(), str(lowered.in_tree), str(lowered.out_tree), tuple(on))
    if key not in programs:
      programs[key] = real_compile(lowered)
    return programs[key]

  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(topology_lib, "topology_devices", shared_devices)
    mp.setattr(jax.stages.Lowered, "compile", compile_once)
    yield
