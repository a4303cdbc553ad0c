"""The reward model: the policy's decoder plus a linear score head.

    r(x, y) = w_D . h_D,   h_D = the final (normed) hidden state at the LAST real token of x + y

Why the last token: the decoder is causal, so only the last position has
read the whole sequence; it is also what Hugging Face's
`*ForSequenceClassification` reads (the last token that is not the pad
token), so an exported model scores right-padded inputs as this one does
(`export.py`). With plain-text pairs that token is the EOS closing the
response (data.py).

The head (model/heads.py's RewardHead) is `{"w_D": f32 [D]}`, with no bias: the Bradley-Terry loss only
sees score differences, so a bias would be learned by the centring penalty
alone, and transformers' `score` layer has none (`nn.Linear(D, 1,
bias=False)`), so the exported scores would lose it. It is not PPO's value
head (model/heads.py's ValueHead): that one is an MLP on a stop-gradient hidden
state, while a reward model trains its trunk and exports to `score`.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

from jaxrl_llm import model as model_lib
from jaxrl_llm.checkpointing.errors import IncompatibleCheckpointError, NoCheckpointError
from jaxrl_llm.model.config import ModelConfig
from jaxrl_llm.model.heads import REWARD_HEAD_AXES, reward_head
from jaxrl_llm.model.logprobs import positions_from_mask
from jaxrl_llm.model.sharding import logical_to_spec, param_shardings

HEAD_KEY = "reward_head"  # the head's field in a reward model's checkpoint (beside "params", the trunk)


def head_shardings(mesh) -> dict:
  """The head's placement from its logical axes (heads.REWARD_HEAD_AXES: D split like the trunk's
  model dim)."""
  return {name: NamedSharding(mesh, logical_to_spec(axes)) for name, axes in REWARD_HEAD_AXES.items()}


def last_index(mask_BT: jax.Array) -> jax.Array:
  """idx_B: the slot of each row's last real token (right- or left-padded rows)."""
  T = mask_BT.shape[1]
  return T - 1 - jnp.argmax(mask_BT[:, ::-1], axis=1)


def reward_scores(params: dict, head: dict, model_cfg: ModelConfig, tokens_BT: jax.Array,
                  mask_BT: jax.Array) -> jax.Array:
  """r_B (f32): the score of each row of tokens (the module docstring's r)."""
  hidden_BTD, _ = model_lib.forward(params, model_cfg, tokens_BT, positions_from_mask(mask_BT), mask_BT)
  h_BD = jnp.take_along_axis(hidden_BTD, last_index(mask_BT)[:, None, None], axis=1)[:, 0]
  return reward_head(head, h_BD)


def token_scores(params: dict, head: dict, model_cfg: ModelConfig, tokens_BT: jax.Array,
                 mask_BT: jax.Array) -> jax.Array:
  """s_BT (f32): the head read at every token, a process reward model's per-step score (process.py)."""
  hidden_BTD, _ = model_lib.forward(params, model_cfg, tokens_BT, positions_from_mask(mask_BT), mask_BT)
  B, T, D = hidden_BTD.shape
  return reward_head(head, hidden_BTD.reshape(B * T, D)).reshape(B, T)


def model_config_from_dict(d: dict) -> ModelConfig:
  """The ModelConfig a checkpoint's meta recorded (`to_jsonable` of it)."""
  return ModelConfig.from_dict(d)


def load_reward_model(path: str, mesh, *, step: int | None = None) -> tuple[dict, dict, ModelConfig]:
  """(trunk params, head, ModelConfig) of a reward model's workdir (or its checkpoints/ folder), at `step`
  (None: the newest intact one), placed on `mesh`. A workdir whose checkpoint has no head (a policy
  run's) is an IncompatibleCheckpointError naming the workdir, the step and the missing field."""
  from jaxrl_llm.checkpointing.init_params import checkpoint_dir
  from jaxrl_llm.checkpointing.manager import CheckpointManager

  if not os.path.isdir(path):
    raise NoCheckpointError(f"reward model {path!r} is not a directory: expected the workdir of "
                            "python -m jaxrl_llm.reward_model")
  mngr = CheckpointManager(checkpoint_dir(path), read_only=True)
  step = mngr.latest_step() if step is None else step
  if step is None:
    raise NoCheckpointError(f"reward model {path!r} holds no checkpoint: expected the workdir of "
                            "python -m jaxrl_llm.reward_model")
  cfg = model_config_from_dict(mngr.restore_meta(step)["model_config"])
  shardings = param_shardings(cfg, mesh)
  target = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                        model_lib.param_shapes(cfg), shardings)
  head_target = {"w_D": jax.ShapeDtypeStruct((cfg.d_model,), jnp.float32, sharding=head_shardings(mesh)["w_D"])}
  mngr = CheckpointManager(checkpoint_dir(path), model_config=cfg, read_only=True)
  try:
    _, head = mngr.restore_subtree(HEAD_KEY, head_target, step)
  except IncompatibleCheckpointError as e:
    if f"no '{HEAD_KEY}'" not in str(e):
      raise
    raise IncompatibleCheckpointError(
        f"{path} is not a reward model: checkpoint step {step} has no field {HEAD_KEY!r} (a policy run's "
        f"workdir?); train one with python -m jaxrl_llm.reward_model ({e})") from None
  _, params = mngr.restore_subtree("params", target, step)
  return params, head, cfg
