"""objectives: pure functions of the master equation (docs/objectives.md), plus presets.

Sign convention: every loss here is minimised, loss = -J.

One RL update with a named method:

    cfg = get_preset("dapo", eps_high=0.3)           # ObjectiveConfig (data)
    adv_B = compute_advantages(rewards_B, G, cfg)     # or gae(...) for PPO / SAO
    norms = batch_norms(mask_BR, G, cfg)              # once, on the FULL mini-batch
    for micro-batch k:                                 # and on every host
      out = policy_loss(logp_BR, prox_logp_BR, behav_logp_BR, adv_B, mask_BR, cfg, norms=norms)
      grads += jax.grad(lambda p: policy_loss(...).loss.numerator)(params)

`out.loss.numerator` is the micro-batch's exact share of the full-batch loss,
so summed gradients are the full-batch gradient; `sum(num) / sum(den)` over
micro-batches is the loss (aggregation.py). `cfg.needs_prox`,
`needs_token_kl`, `needs_centering`, `needs_ref`, `needs_entropy` say which
optional inputs the method uses. `python -m jaxrl_llm.objectives` prints the
method table.
"""

from jaxrl_llm.objectives.advantages import (
    GAEResult,
    group_mean_baseline,
    batch_advantages,
    compute_advantages,
    gae,
    grpo_advantages,
    masked_whiten,
    outcome_token_rewards,
    process_advantages,
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
from jaxrl_llm.objectives.policy_loss import (MasterWeights, PolicyLoss, TokenFactors, master_weights,
                                             policy_loss, sequence_advantage)
from jaxrl_llm.objectives.presets import PRESETS, get_preset, method_table
from jaxrl_llm.objectives.ratios import TokenRatios, token_ratios
from jaxrl_llm.objectives.score_centering import centering_exact, centering_topk, gather_topk
from jaxrl_llm.objectives.value import value_loss
from jaxrl_llm.objectives.weights import full_token_kl
# Teacher-derived weights (docs/objectives.md section 11): distillation
# divergences, the trust knobs z and tau, routing, inputs and schedules.
from jaxrl_llm.objectives.distill import (distill_loss, forward_kl, generalized_jsd, reverse_kl,
                                          reverse_kl_surrogate, sampled_token_surrogate, teacher_gap,
                                          token_divergence)
from jaxrl_llm.objectives.distill_topk import topk_support, topk_support_gathered
from jaxrl_llm.objectives.teacher import (confidence_weight, rlsd_advantage, rlsd_multiplier, sign_gate,
                                          teacher_entropy)
from jaxrl_llm.objectives.teacher_inputs import TeacherInputs, build_teacher_inputs, gather_predictions
from jaxrl_llm.objectives.teacher_routing import (select_teacher, srpo_branch_masks, srpo_loss,
                                                  srpo_routed_advantage, srpo_routes, teacher_for_tasks)
from jaxrl_llm.objectives.teacher_schedule import TeacherSchedule, teacher_params_for_step
