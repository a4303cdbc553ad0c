"""The jitted KV-cache sampler, its logit processors and the rollout record.

    from jaxrl_llm.sampling.generate import generate
    rollout = generate(params, model_cfg, prompt_tokens_BP, prompt_mask_BP,
                       SamplingConfig(temperature=1.0, top_p=0.95, n_samples=8,
                                      max_new_tokens=512, eos_ids=(eos,)),
                       jax.random.key(seed), mesh=mesh)

(`jaxrl_llm.sampling.generate` stays the module: the function is not
re-exported here under the same name.)
"""

from jaxrl_llm.sampling.config import SamplingConfig
from jaxrl_llm.sampling.processors import process_logits, sample_from_logp
from jaxrl_llm.sampling.rollout import FINISH_EOS, FINISH_LENGTH, FINISH_NAMES, FINISH_STOP, Rollout
from jaxrl_llm.sampling import openai_engine as _openai_engine  # registers rollout engine "openai"

__all__ = [
    "FINISH_EOS", "FINISH_LENGTH", "FINISH_NAMES", "FINISH_STOP", "Rollout", "SamplingConfig",
    "process_logits", "sample_from_logp",
]
