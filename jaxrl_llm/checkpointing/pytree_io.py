"""Pytree conversions around Orbax: typed PRNG keys, abstract targets, shape checks.

Orbax stores arrays, not typed PRNG keys, so keys are saved as their raw
uint32 data and re-wrapped on restore with the implementation of the key in
the restore target. Restoring into a target of a different structure or shape
is caught here with a message naming the first differing leaf, before Orbax
would fail with a less readable one.
"""

from typing import Any

import jax
import numpy as np

PyTree = Any


def _is_key(x) -> bool:
  dtype = getattr(x, "dtype", None)
  return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def keys_to_data(tree: PyTree) -> PyTree:
  """Replaces every typed PRNG key leaf by its uint32 key data."""
  return jax.tree.map(lambda x: jax.random.key_data(x) if _is_key(x) else x, tree)


def _replicated_like(x):
  sharding = getattr(x, "sharding", None)
  if isinstance(sharding, jax.sharding.NamedSharding):
    return jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec())
  return jax.sharding.SingleDeviceSharding(jax.devices()[0])


def abstract_target(tree: PyTree) -> PyTree:
  """ShapeDtypeStructs (with shardings) describing what to restore into.

  Keys become the abstract shape of their data; numpy leaves stay numpy (Orbax
  restores them as numpy); jax arrays keep their sharding.
  """

  def one(x):
    if _is_key(x):
      data = jax.eval_shape(jax.random.key_data, x)
      return jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=_replicated_like(x))
    if isinstance(x, (np.ndarray, np.generic, int, float)):
      return x
    sharding = getattr(x, "sharding", None)
    if sharding is None:
      sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)

  return jax.tree.map(one, tree)


def data_to_keys(restored: PyTree, target: PyTree) -> PyTree:
  """Re-wraps key data where the target holds a typed key."""

  def one(r, t):
    if _is_key(t):
      return jax.random.wrap_key_data(r, impl=jax.random.key_impl(t))
    return r

  return jax.tree.map(one, restored, target)


def _shape_dtype(x):
  if hasattr(x, "shape") and hasattr(x, "dtype"):
    return tuple(x.shape), np.dtype(x.dtype).name
  return (), type(x).__name__


def check_compatible(saved_meta: PyTree, target_abstract: PyTree, where: str) -> None:
  """Raises ValueError naming the first leaf whose path, shape or dtype differs.

  saved_meta: Orbax's per-leaf metadata tree of the saved item (has .shape,
  .dtype). target_abstract: the output of abstract_target.
  """
  saved = dict(jax.tree_util.tree_flatten_with_path(saved_meta)[0])
  want = dict(jax.tree_util.tree_flatten_with_path(target_abstract)[0])
  # Orbax returns plain dicts and lists for containers; compare by key names.
  def norm(paths):
    return {jax.tree_util.keystr(p, simple=True, separator="/"): v for p, v in paths.items()}

  saved, want = norm(saved), norm(want)
  missing = sorted(set(want) - set(saved))
  extra = sorted(set(saved) - set(want))
  if missing or extra:
    raise ValueError(
        f"{where}: the saved state has a different structure. Expected leaves "
        f"missing from the checkpoint: {missing[:5]}; leaves in the checkpoint "
        f"not expected: {extra[:5]}")
  for name in sorted(want):
    w_shape, _ = _shape_dtype(want[name])
    s_shape, _ = _shape_dtype(saved[name])
    if hasattr(want[name], "shape") and w_shape != s_shape:
      raise ValueError(
          f"{where}: leaf '{name}' has shape {s_shape} in the checkpoint, "
          f"expected {w_shape}")
