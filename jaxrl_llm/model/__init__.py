"""The decoder (Llama 3 / Qwen2 / Qwen3 / Gemma 3 families): config, params, the Flax NNX
modules (transformer.py: Decoder, DecoderLayers; heads.py: ValueHead, RewardHead) with KV cache.
Sharding, LoRA, Hugging Face and GGUF interop, tokenizers and multi-host initialisation live in
sibling modules (sharding, lora, tokenizer, distributed; the checkpoint formats in io/: hf_io, gguf_*)
and are imported from there.

The state a run holds is the modules' state as a plain dict (`nnx.to_pure_dict`), the table of
params.py; `forward`, `logits`, ... merge it into the modules and call them (transformer.py).
"""

from jaxrl_llm.model.cache import KVCache, init_cache
from jaxrl_llm.model.config import MODEL_PRESETS, ModelConfig, RopeScaling
from jaxrl_llm.model.params import check_params, init_params, param_axes, param_shapes
from jaxrl_llm.model.transformer import (Decoder, DecoderLayers, bind, embed, forward,
                                         forward_embeddings, lm_head, logits, unstack_layers)

__all__ = [
    "Decoder", "DecoderLayers", "KVCache", "MODEL_PRESETS", "ModelConfig", "RopeScaling", "bind",
    "check_params", "embed", "forward",
    "forward_embeddings", "init_cache", "init_params", "lm_head", "logits", "param_axes",
    "param_shapes", "unstack_layers",
]
