"""Heads on the decoder's final hidden states, as Flax NNX modules: PPO's value head and a reward
model's score head.

Which trunk each reads (a documented choice):

  ValueHead    the policy's own trunk, shared: V(prefix) is a small MLP on the policy's final
               hidden state under stop_gradient, so the value loss trains the head alone and never
               moves the policy (the critic costs no second forward pass; training/update.py,
               training/recompute.py).
  RewardHead   a separate trunk: a reward model is a decoder of its own plus this linear score,
               trained together by the Bradley-Terry loss (reward_model/), and exported as
               transformers' `*ForSequenceClassification` `score` layer (no bias there, none here).

As for the decoder (model/transformer.py), each module's state is a plain dict under the names the
checkpoints already use (`{"w1_DF", "b1_F", "w2_F", "b2"}`, `{"w_D"}`), every parameter carries its
logical axes as `out_sharding`, and the functions `value_head` / `reward_head` are `nnx.merge` of
that state followed by the module's call: the form the jitted programs use.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

# Logical axes (model/sharding.py): the value head is small and replicated; the score vector is split
# like the trunk's model dim.
VALUE_HEAD_AXES = {"w1_DF": (None, None), "b1_F": (None,), "w2_F": (None,), "b2": ()}
REWARD_HEAD_AXES = {"w_D": ("embed",)}


def _params(module_axes: dict, arrays: dict, owner: str) -> dict:
  if set(arrays) != set(module_axes):
    raise ValueError(f"{owner}: tensors {sorted(arrays)}, expected {sorted(module_axes)}")
  return {name: nnx.Param(arrays[name], out_sharding=module_axes[name], eager_sharding=False)
          for name in module_axes}


def init_value_head(d_model: int, key: jax.Array, hidden: int = 64) -> dict:
  """A value head's state: w1 ~ N(0, 1/D), the rest zero (so V starts at 0)."""
  return {
      "w1_DF": jax.random.normal(key, (d_model, hidden), jnp.float32) / jnp.sqrt(d_model),
      "b1_F": jnp.zeros((hidden,), jnp.float32),
      "w2_F": jnp.zeros((hidden,), jnp.float32),
      "b2": jnp.zeros((), jnp.float32),
  }


class ValueHead(nnx.Module):
  """V(prefix) = w2 . relu(W1^T sg(h) + b1) + b2 on each response position's hidden state h."""

  def __init__(self, d_model: int, params: dict | None = None, *, rngs: nnx.Rngs | None = None,
               hidden: int = 64):
    if params is None:
      if rngs is None:
        raise ValueError("ValueHead: give its params, or rngs to initialise them")
      params = init_value_head(d_model, rngs.params(), hidden)
    for name, var in _params(VALUE_HEAD_AXES, params, "value head").items():
      setattr(self, name, var)

  def __call__(self, hidden_BRD: jax.Array) -> jax.Array:
    """values_BR (f32); the trunk gets no gradient from them."""
    h_BRD = jax.lax.stop_gradient(hidden_BRD).astype(jnp.float32)
    z_BRF = jax.nn.relu(jnp.einsum("BRD,DF->BRF", h_BRD, self.w1_DF[...]) + self.b1_F[...][None, None, :])
    return jnp.einsum("BRF,F->BR", z_BRF, self.w2_F[...]) + self.b2[...]


def init_reward_head(d_model: int, key: jax.Array) -> dict:
  """w_D ~ N(0, 0.1^2 / D): initial scores of about 0.1 (unit-RMS hidden states), so the first
  Bradley-Terry loss is near log 2 and the trunk gets a gradient from the first step."""
  return {"w_D": 0.1 * jax.random.normal(key, (d_model,), jnp.float32) / jnp.sqrt(d_model)}


class RewardHead(nnx.Module):
  """r = w . h on one hidden state per row (reward_model/scorer.py picks the last real token's)."""

  def __init__(self, d_model: int, params: dict | None = None, *, rngs: nnx.Rngs | None = None):
    if params is None:
      if rngs is None:
        raise ValueError("RewardHead: give its params, or rngs to initialise them")
      params = init_reward_head(d_model, rngs.params())
    for name, var in _params(REWARD_HEAD_AXES, params, "reward head").items():
      setattr(self, name, var)

  def __call__(self, h_BD: jax.Array) -> jax.Array:
    """r_B (f32)."""
    return jnp.einsum("BD,D->B", h_BD.astype(jnp.float32), self.w_D[...].astype(jnp.float32))


@functools.lru_cache(maxsize=None)
def _graphdef(kind: type) -> nnx.GraphDef:
  """A head's structure (its shapes do not enter it). Built outside any mesh in context (a step runs
  under `use_abstract_mesh`, whose axes are not the params' logical names), so the first call may come
  from anywhere."""
  abstract = {ValueHead: lambda: ValueHead(1, init_value_head(1, jax.random.key(0), 1)),
              RewardHead: lambda: RewardHead(1, init_reward_head(1, jax.random.key(0)))}[kind]
  with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((), ())):
    return nnx.graphdef(nnx.eval_shape(abstract))


def value_head(vparams: dict, hidden_BRD: jax.Array) -> jax.Array:
  """ValueHead holding `vparams`, called: values_BR."""
  return nnx.merge(_graphdef(ValueHead), vparams)(hidden_BRD)


def reward_head(head: dict, h_BD: jax.Array) -> jax.Array:
  """RewardHead holding `head`, called: r_B."""
  return nnx.merge(_graphdef(RewardHead), head)(h_BD)
