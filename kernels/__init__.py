"""Pallas kernels over the vocabulary, installed as ``jaxrl_llm.kernels``.

Each op streams over vocabulary tiles so that no N x V array is materialised,
and has a plain-jnp ``<op>_reference`` (the test oracle) and an ``impl``
switch: "auto" | "pallas" | "xla_chunked" | "naive" (see ``config``).
"""

from jaxrl_llm.kernels.config import IMPLS, VocabTiles, resolve_impl
from jaxrl_llm.kernels.token_logprobs import (TokenLogprobs, gather_logprobs,
                                              gather_logprobs_reference,
                                              token_logprobs,
                                              token_logprobs_reference)
from jaxrl_llm.kernels.sharded import (VocabOps, VocabSharding, gather_logprobs_sharded,
                                       token_logprobs_sharded, vocab_cross_sharded,
                                       vocab_cross_topk_sharded, vocab_topk_sharded)
from jaxrl_llm.kernels.vocab_cross import (VocabCross, vocab_cross,
                                           vocab_cross_reference)
from jaxrl_llm.kernels.vocab_cross_topk import (CROSS_TOPK_TAILS, vocab_cross_topk,
                                                vocab_cross_topk_reference)
from jaxrl_llm.kernels.vocab_topk import (VocabTopK, vocab_topk,
                                          vocab_topk_reference)

__all__ = [
    "IMPLS", "CROSS_TOPK_TAILS", "TokenLogprobs", "VocabCross", "VocabOps", "VocabSharding", "VocabTiles",
    "VocabTopK", "gather_logprobs_sharded", "token_logprobs_sharded", "vocab_cross_sharded",
    "vocab_cross_topk_sharded", "vocab_topk_sharded",
    "gather_logprobs", "gather_logprobs_reference", "resolve_impl",
    "token_logprobs", "token_logprobs_reference", "vocab_cross",
    "vocab_cross_reference", "vocab_cross_topk", "vocab_cross_topk_reference",
    "vocab_topk", "vocab_topk_reference",
]
