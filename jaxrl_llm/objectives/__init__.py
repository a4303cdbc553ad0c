"""objectives: pure functions of the master equation (spec 002), plus presets.

Sign convention: every loss here is minimised, loss = -J.
"""

from jaxrl_llm.objectives.advantages import (
    GAEResult,
    compute_advantages,
    gae,
    grpo_advantages,
    masked_whiten,
    outcome_token_rewards,
    rloo_advantages,
    whiten,
)
from jaxrl_llm.objectives.aggregation import (
    AGGREGATIONS,
    BatchNorms,
    WeightedSum,
    aggregate,
    batch_norms,
    masked_mean,
    token_weights,
)
from jaxrl_llm.objectives.config import ObjectiveConfig
from jaxrl_llm.objectives.kl import (
    entropy_from_logits,
    entropy_from_logp,
    fold_kl_into_rewards,
    kl_penalty,
    kl_token_rewards,
)
from jaxrl_llm.objectives.policy_loss import MasterWeights, PolicyLoss, master_weights, policy_loss
from jaxrl_llm.objectives.presets import PRESETS, get_preset, method_table
from jaxrl_llm.objectives.ratios import TokenRatios, token_ratios
from jaxrl_llm.objectives.score_centering import centering_exact, centering_topk, gather_topk
from jaxrl_llm.objectives.value import value_loss
from jaxrl_llm.objectives.weights import full_token_kl
