"""ObjectiveConfig: every knob of the master equation (docs/objectives.md eq. 9.1).

    grad J = E_mu[ sum_{i,t} lambda_{i,t} A_{i,t} (W_{i,t} s_y - kappa sum_v mu_v W_v s_v) ],
    W = f * T.

* T, the trust region on r = pi_theta / pi_prox: `trust_region` (none, ppo =
  masked M(x) x, truncate = CISPO's sg(clip(x))), `trust_level` (token x = r,
  or sequence x = s_i the geometric mean), bounds `eps_low`, `eps_high`,
  `dual_clip_c`; truncation bounds are 1 +- eps (`truncate_bounds=relative`,
  verl/slime) or [0, `truncate_cap`] (`absolute`, TRL).
* f, the correction: `correction` (the transform), `correction_ratio` (c =
  pi_prox/mu or rho = pi_theta/mu: whether the trust region is centred on
  pi_prox or on mu), `correction_level` (token, seq_product c_i = prod c,
  seq_geomean c_bar_i), and its constants.
* kappa (Score Centering), lambda (`aggregation`), the advantage estimator,
  KL and entropy terms, the value loss of PPO.

A named method is a preset of these knobs (presets.py); nothing here branches
on the method's name.
"""

from __future__ import annotations

import dataclasses
import math

from jaxrl_llm.checks import bad, check_choice
from jaxrl_llm.objectives.aggregation import AGGREGATIONS

TRUST_REGIONS = ("none", "ppo", "truncate")
TRUST_LEVELS = ("token", "sequence")
TRUNCATE_BOUNDS = ("relative", "absolute")
CORRECTIONS = ("none", "is", "tis", "mis", "band", "band_indicator", "ppo", "dppo_tv", "dppo_kl", "trm", "topr")
CORRECTION_RATIOS = ("c", "rho")
CORRECTION_LEVELS = ("token", "seq_product", "seq_geomean")
ADVANTAGES = ("raw", "grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gae", "grpo_process")
ADV_LEVELS = ("token", "sequence")
KL_ESTIMATORS = ("k1", "k2", "k3")
KL_PLACEMENTS = ("loss", "reward")
# Corrections whose weight for a vocabulary entry v depends only on rho(v):
# the ones Score Centering can combine with (docs/objectives.md eqs. 8.3-8.4).
CENTERABLE_CORRECTIONS = ("none", "is", "tis", "mis", "band", "band_indicator")


def _positive(field, value, *, allow_none=False):
  if value is None and allow_none:
    return
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
    raise bad(f"ObjectiveConfig.{field}", value, "must be a finite number > 0" + (" or None" if allow_none else ""))


@dataclasses.dataclass(frozen=True)
class ObjectiveConfig:
  """All knobs of the policy objective; validated on construction."""

  name: str = "custom"
  # --- T: trust region on r = pi_theta / pi_prox ---
  trust_region: str = "none"  # none | ppo (masked) | truncate (CISPO)
  trust_level: str = "token"  # token: r_{i,t}; sequence: s_i = geomean_t r_{i,t} (GSPO)
  eps_low: float = 0.2  # lower bound 1 - eps_low, in (0, 1)
  eps_high: float = 0.2  # upper bound 1 + eps_high, > 0
  dual_clip_c: float | None = None  # dual-clip PPO: A < 0 and x > c -> masked; > 1
  truncate_bounds: str = "relative"  # relative: [1-eps_low, 1+eps_high]; absolute: [0, truncate_cap]
  truncate_cap: float = 5.0  # absolute CISPO cap (TRL's epsilon_high)
  # --- f: correction on c = pi_prox / mu or rho = pi_theta / mu ---
  correction: str = "none"  # see CORRECTIONS
  correction_ratio: str = "c"  # c: trust region centred on pi_prox; rho: on mu
  correction_level: str = "token"  # token | seq_product | seq_geomean
  is_cap: float = 2.0  # C of tis (min(x, C)) and mis (x 1[x <= C])
  band_low: float = 0.5  # band / band_indicator lower bound (inclusive)
  band_high: float = 5.0  # band / band_indicator upper bound (inclusive)
  dppo_delta: float = 0.15  # DPPO divergence threshold delta
  dppo_cap: float | None = None  # optional min(rho, C) on DPPO's kept tokens
  trm_max_delta: float | None = 0.05  # TRM: max_t KL <= delta
  trm_mean_delta: float | None = None  # TRM: mean_t KL <= delta_avg
  # --- kappa: Score Centering ---
  kappa: float = 0.0  # 0 or 1
  # --- lambda: aggregation ---
  aggregation: str = "seq_mean_token_mean"
  norm_max_len: int | None = None  # L_max of `constant`; None -> padded T of the batch
  # --- advantage ---
  advantage: str = "grpo"
  adv_level: str = "token"  # sequence: replace A_{i,t} by the answer's masked mean (GSPO)
  adv_std_ddof: int = 1  # GRPO / REINFORCE++ std: 1 = unbiased (torch.std, verl, TRL)
  adv_eps: float = 1e-6  # (R - mean) / (std + eps)
  adv_std_rtol: float = 1e-4  # std <= rtol * max|R|: the rewards are equal up to float noise, A = 0 (0: off)
  gamma: float = 1.0  # GAE discount
  gae_lambda: float = 0.95  # GAE lambda
  adv_whiten: bool = False  # whiten GAE advantages over the batch's valid tokens
  # --- KL to a reference and entropy bonus ---
  kl_coef: float = 0.0  # beta; 0 disables (no reference model needed)
  kl_estimator: str = "k3"
  kl_placement: str = "loss"  # loss: + beta k(pi_theta, pi_ref) per token; reward: R - beta sum k1
  kl_target: float = 0.0  # adaptive beta (objectives/kl_control.py, Ziegler et al. 2019): the target KL, nats per answer; 0: kl_coef fixed
  kl_horizon: float = 10000.0  # adaptive beta's horizon in samples: K_beta = samples per step / kl_horizon
  entropy_coef: float = 0.0  # loss -= coef * entropy (same lambda)
  # --- value function (PPO with GAE) ---
  value_clip: float | None = None  # clipped value loss range around V_old
  value_coef: float = 0.0  # weight of the value loss in the trainer's total
  # --- numerics ---
  log_ratio_clamp: float = 20.0  # log-ratios clamped to +-this before exp

  def __post_init__(self):
    check_choice("ObjectiveConfig.trust_region", self.trust_region, TRUST_REGIONS, lead="allowed values are")
    check_choice("ObjectiveConfig.trust_level", self.trust_level, TRUST_LEVELS, lead="allowed values are")
    check_choice("ObjectiveConfig.truncate_bounds", self.truncate_bounds, TRUNCATE_BOUNDS, lead="allowed values are")
    check_choice("ObjectiveConfig.correction", self.correction, CORRECTIONS, lead="allowed values are")
    check_choice("ObjectiveConfig.correction_ratio", self.correction_ratio, CORRECTION_RATIOS, lead="allowed values are")
    check_choice("ObjectiveConfig.correction_level", self.correction_level, CORRECTION_LEVELS, lead="allowed values are")
    check_choice("ObjectiveConfig.aggregation", self.aggregation, AGGREGATIONS, lead="allowed values are")
    check_choice("ObjectiveConfig.advantage", self.advantage, ADVANTAGES, lead="allowed values are")
    check_choice("ObjectiveConfig.adv_level", self.adv_level, ADV_LEVELS, lead="allowed values are")
    check_choice("ObjectiveConfig.kl_estimator", self.kl_estimator, KL_ESTIMATORS, lead="allowed values are")
    check_choice("ObjectiveConfig.kl_placement", self.kl_placement, KL_PLACEMENTS, lead="allowed values are")
    v = self.eps_low
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1:
      raise bad("ObjectiveConfig.eps_low", v, "must lie in the open interval (0, 1)")
    _positive("eps_high", self.eps_high)
    if self.dual_clip_c is not None:
      _positive("dual_clip_c", self.dual_clip_c)
      if self.dual_clip_c <= 1:
        raise bad("ObjectiveConfig.dual_clip_c", self.dual_clip_c, "must be > 1 (Ye et al. use 3) or None")
      if self.trust_region != "ppo" and self.correction != "ppo":
        raise bad("ObjectiveConfig.dual_clip_c", self.dual_clip_c,
                   "dual-clip bounds a PPO mask: needs trust_region='ppo' or correction='ppo' (else None)")
    for field in ("truncate_cap", "is_cap", "band_high", "dppo_delta", "log_ratio_clamp"):
      _positive(field, getattr(self, field))
    if isinstance(self.band_low, bool) or not isinstance(self.band_low, (int, float)) or self.band_low < 0:
      raise bad("ObjectiveConfig.band_low", self.band_low, "must be a number >= 0")
    if self.band_low > self.band_high:
      raise bad("ObjectiveConfig.band_low", self.band_low, f"must be <= band_high={self.band_high} (band [lower, upper])")
    if self.advantage == "grpo_process" and self.kl_coef > 0 and self.kl_placement == "reward":
      raise bad("ObjectiveConfig.kl_placement", "reward", "advantage='grpo_process' normalises step rewards, "
                "where a sequence's KL has no step: use kl_placement='loss'")
    if isinstance(self.kl_target, bool) or not isinstance(self.kl_target, (int, float)) \
        or not math.isfinite(self.kl_target) or self.kl_target < 0:
      raise bad("ObjectiveConfig.kl_target", self.kl_target, "must be a finite number >= 0 (0: kl_coef fixed)")
    _positive("kl_horizon", self.kl_horizon)
    if self.kl_target > 0 and (self.kl_coef <= 0 or self.kl_placement != "reward"):
      raise bad("ObjectiveConfig.kl_target", self.kl_target, "the adaptive coefficient (Ziegler et al.) moves the KL "
                f"in the reward: needs kl_coef > 0 (its start) and kl_placement='reward' (kl_coef={self.kl_coef}, "
                f"kl_placement={self.kl_placement!r}), or kl_target=0")
    _positive("dppo_cap", self.dppo_cap, allow_none=True)
    _positive("trm_max_delta", self.trm_max_delta, allow_none=True)
    _positive("trm_mean_delta", self.trm_mean_delta, allow_none=True)
    if self.correction == "trm" and self.trm_max_delta is None and self.trm_mean_delta is None:
      raise bad("ObjectiveConfig.trm_max_delta", None, "TRM needs trm_max_delta or trm_mean_delta (or both) set")
    if self.correction in ("dppo_tv", "dppo_kl", "trm"):
      if self.correction_ratio != "rho" or self.correction_level != "token":
        raise bad("ObjectiveConfig.correction_ratio", self.correction_ratio,
                   f"correction={self.correction!r} needs correction_ratio='rho' and correction_level='token'")
    if self.kappa not in (0, 1):
      raise bad("ObjectiveConfig.kappa", self.kappa, "allowed values are 0 (no centering) and 1 (Score Centering)")
    if self.kappa == 1:
      if self.trust_region != "none":
        raise bad("ObjectiveConfig.trust_region", self.trust_region,
                   "kappa=1 (Score Centering) needs trust_region='none': its weight for every "
                   "vocabulary entry must depend on rho(v) only")
      if self.correction not in CENTERABLE_CORRECTIONS:
        raise bad("ObjectiveConfig.correction", self.correction, f"with kappa=1 allowed values are {CENTERABLE_CORRECTIONS}")
      if self.correction != "none" and (self.correction_ratio != "rho" or self.correction_level != "token"):
        raise bad("ObjectiveConfig.correction_level", self.correction_level,
                   "with kappa=1 the correction must be token-level on rho")
    if self.norm_max_len is not None and (not isinstance(self.norm_max_len, int) or self.norm_max_len < 1):
      raise bad("ObjectiveConfig.norm_max_len", self.norm_max_len, "must be a positive integer or None")
    if self.adv_std_ddof not in (0, 1):
      raise bad("ObjectiveConfig.adv_std_ddof", self.adv_std_ddof, "allowed values are 0 (population) and 1 (unbiased)")
    if isinstance(self.adv_eps, bool) or not isinstance(self.adv_eps, (int, float)) or self.adv_eps < 0:
      raise bad("ObjectiveConfig.adv_eps", self.adv_eps, "must be a number >= 0")
    if isinstance(self.adv_std_rtol, bool) or not isinstance(self.adv_std_rtol, (int, float)) \
        or not 0 <= self.adv_std_rtol < 1:
      raise bad("ObjectiveConfig.adv_std_rtol", self.adv_std_rtol, "must be a number in [0, 1)")
    for field in ("gamma", "gae_lambda"):
      v = getattr(self, field)
      if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
        raise bad(f"ObjectiveConfig.{field}", v, "must lie in [0, 1]")
    for field in ("kl_coef", "entropy_coef", "value_coef"):
      v = getattr(self, field)
      if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise bad(f"ObjectiveConfig.{field}", v, "must be a finite number >= 0")
    _positive("value_clip", self.value_clip, allow_none=True)

  # What the trainer must provide to `policy_loss` for this config.
  @property
  def needs_prox(self) -> bool:
    """Whether pi_prox log-probs are used (else the recompute can be skipped)."""
    return self.trust_region != "none" or (self.correction != "none" and self.correction_ratio == "c")

  @property
  def needs_token_kl(self) -> bool:
    """TRM needs the full-distribution KL(mu || pi_theta) per token (kl_BR)."""
    return self.correction == "trm"

  @property
  def needs_centering(self) -> bool:
    return self.kappa == 1

  @property
  def needs_ref(self) -> bool:
    return self.kl_coef > 0

  @property
  def needs_entropy(self) -> bool:
    return self.entropy_coef > 0

  @property
  def trunc_bounds(self) -> tuple[float, float]:
    """[lower, upper] of the CISPO truncation."""
    if self.truncate_bounds == "relative":
      return 1.0 - self.eps_low, 1.0 + self.eps_high
    return 0.0, float(self.truncate_cap)


FIELD_NAMES = tuple(f.name for f in dataclasses.fields(ObjectiveConfig))
