"""The decoder (Llama 3 / Qwen2 / Qwen3 / Gemma 3 families): config, params, forward
pass with KV cache. Sharding, Hugging Face interop, tokenizers and multi-host
initialisation live in sibling modules (sharding, hf_io, hf_config,
tokenizer, distributed) and are imported from there.

Design: pure functions over a params pytree (nested dict of arrays), not Flax
NNX modules. The train step must be a pure function of params anyway; with a
plain dict, sharding is one parallel tree of logical axes (params.py), the
Hugging Face mapping is a flat name table (hf_io.py), and optax, Orbax and
jax.grad see exactly the arrays, with no module state to split and merge.
"""

from jaxrl_llm.model.cache import KVCache, init_cache
from jaxrl_llm.model.config import MODEL_PRESETS, ModelConfig, RopeScaling
from jaxrl_llm.model.params import check_params, init_params, param_axes, param_shapes
from jaxrl_llm.model.transformer import (embed, forward, forward_embeddings, lm_head, logits,
                                         unstack_layers)

__all__ = [
    "KVCache", "MODEL_PRESETS", "ModelConfig", "RopeScaling", "check_params", "embed", "forward",
    "forward_embeddings", "init_cache", "init_params", "lm_head", "logits", "param_axes",
    "param_shapes", "unstack_layers",
]
