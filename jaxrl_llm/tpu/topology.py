"""The devices of a TPU topology, from its name, on any machine with libtpu installed.

``jax.experimental.topologies.get_topology_desc`` returns the devices of a
real TPU slice (multi-host slices included) without a TPU: programs sharded
over them compile with the real XLA:TPU and Mosaic compilers in this one
process. Names: the topology form ``<generation>:<chips per axis>`` of
libtpu ("v5e:2x4", "v5p:4x4x4", "v6e:4x4", "v4:2x2x1", "TPU7x:2x2x1"), or a
Cloud accelerator type ("v5e-8", "v5p-64"), whose number counts chips on
v5e and v6e and TensorCores (two per chip) on v4 and v5p, mapped to the
slice shape Google lists for it (`ACCELERATOR_TYPES`).

What can go wrong says how to fix it, in one line (`TopologyError`): no
libtpu (the install command), a libtpu that is not the one jax pins (both
versions), a name libtpu refuses (the accepted forms and the generations
this table knows), another process holding libtpu's lock, a v4 topology
(`check_one_device_per_chip`).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re

from jaxrl_llm.checks import ConfigError

INSTALL = 'pip install -e ".[tpu-aot]"'
LOCKFILE = "/tmp/libtpu_lockfile"
GENERATIONS = ("v4", "v5e", "v5p", "v6e", "TPU7x")

# Cloud accelerator type -> libtpu topology: v5e / v6e count chips, v4 / v5p TensorCores (2 per chip).
_V5E_SHAPES = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}
_V5P_SHAPES = {8: "2x2x1", 16: "2x2x2", 32: "2x2x4", 64: "2x4x4", 128: "4x4x4", 256: "4x4x8", 512: "4x8x8",
               1024: "8x8x8"}
ACCELERATOR_TYPES = {
    **{f"{g}-{n}": f"{g}:{s}" for g in ("v5e", "v6e") for n, s in _V5E_SHAPES.items()},
    **{f"{g}-{n}": f"{g}:{s}" for g in ("v4", "v5p") for n, s in _V5P_SHAPES.items()},
}


class TopologyError(ConfigError):
  """A topology that cannot be compiled for here, with what to do about it."""


def resolve_name(name: str) -> str:
  """The libtpu topology name of `name` (an accelerator type is mapped, a topology kept)."""
  if name in ACCELERATOR_TYPES:
    return ACCELERATOR_TYPES[name]
  if not re.fullmatch(r"[A-Za-z0-9_ ]+[:=_][0-9x]+(_twisted|_untwisted)?", name or ""):
    raise TopologyError(f"--topology={name!r}: not a TPU topology; give <generation>:<chips per axis> "
                        f"(v5e:2x4, v6e:4x4, v5p:4x4x4, v4:2x2x1, TPU7x:2x2x1) or an accelerator type "
                        f"(v5e-8, v6e-8, v5p-8, v5p-64); generations: {', '.join(GENERATIONS)}")
  return name


def _pinned_libtpu() -> str | None:
  """The libtpu requirement of the installed jax's "tpu" extra ("libtpu==0.0.42.*"), None if none."""
  for req in importlib.metadata.requires("jax") or ():
    if req.startswith("libtpu") and "tpu" in req.split(";")[-1]:
      return req.split(";")[0].strip()
  return None


def check_libtpu() -> None:
  """libtpu is installed, and at the version the installed jax pins."""
  if importlib.util.find_spec("libtpu") is None:
    raise TopologyError(f"libtpu is not installed, and it holds the TPU compiler: {INSTALL} "
                        f"(jax[tpu]=={importlib.metadata.version('jax')}, about 700 MB)")
  have, pin = importlib.metadata.version("libtpu"), _pinned_libtpu()
  if pin:
    want = pin.split("==")[-1]
    if not re.fullmatch(re.escape(want).replace(r"\*", ".*"), have):
      raise TopologyError(f"libtpu {have} is installed but jax {importlib.metadata.version('jax')} pins {pin}: "
                          f"{INSTALL} installs the matching one")


def topology_devices(name: str) -> tuple[list, str]:
  """(the devices of topology `name`, its libtpu name). Checks libtpu first."""
  topo = resolve_name(name)
  check_libtpu()
  from jax.experimental import topologies

  try:
    desc = topologies.get_topology_desc(topology_name=topo, platform="tpu")
  except Exception as e:  # jax's runtime error carries libtpu's status text
    text = str(e)
    if "lockfile" in text:
      raise TopologyError(
          f"another process holds libtpu's lock ({LOCKFILE}): wait for it to end, or set "
          "ALLOW_MULTIPLE_LIBTPU_LOAD=1 to compile beside it (safe where no process here runs on a TPU)") from None
    first = text.split("\n")[0].split("INVALID_ARGUMENT: ")[-1]
    raise TopologyError(f"--topology={name!r}: libtpu refuses it ({first}); give <generation>:<chips per axis> "
                        f"with a generation of {', '.join(GENERATIONS)}, e.g. v5e:2x4 or v5p:4x4x4, or an "
                        f"accelerator type such as v5p-64") from None
  return list(desc.devices), topo


# Generations whose chips jax meshes as several devices (jax's mesh_utils: one per TensorCore).
CORES_AS_DEVICES = ("TPU7x",)


def check_one_device_per_chip(devices, name: str) -> None:
  """libtpu describes a v4 chip as two devices (one per TensorCore), where a v4 runs as one megacore
  device per chip and jax builds its meshes only so: a plan for it would be of a run that cannot
  exist, so it is refused (v5p and 7x are meshed as libtpu makes them)."""
  kind = devices[0].device_kind
  cores = {getattr(d, "core_on_chip", 0) for d in devices}
  if len(cores) > 1 and kind not in CORES_AS_DEVICES:
    chips = len({tuple(d.coords) for d in devices})
    raise TopologyError(
        f"--topology={name!r}: libtpu makes {len(devices)} devices of its {chips} {kind} chips (one per "
        "TensorCore), but a v4 runs one megacore device per chip and jax meshes it only so; v4 is not "
        "planned: give a v5e, v5p, v6e or TPU7x topology (v5e:2x4, v5p:2x2x1, v6e:2x4, TPU7x:2x2x1)")


def allow_parallel_compiles() -> None:
  """Lets several processes of this machine load libtpu at once (tests' workers): compile-only
  processes use no TPU, so they need not exclude each other."""
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
