"""Every named method as DATA: a preset of ObjectiveConfig knobs (docs/objectives.md section 10).

Defaults are the papers' (docs/objectives.md section 10 gives each preset
with its paper): DAPO eps 0.2/0.28, GSPO 3e-4/4e-4, IcePop [0.5, 5],
Token-TIS / Seq-TIS C = 2, Geo-MIS band [0.9998, 1.0002] (verl), ScaleRL DAPO
[0.8, 1.26] and CISPO cap 5 (of 4-8), PipelineRL C = 1.02 with leave-one-out,
SAO (0.7, 6), DPPO delta 0.15 (TV) / 0.05 (binary KL), TRM delta 0.05 (max) /
0.001 (avg), dual-clip c = 3.
Where a paper leaves a choice open the preset says so in PRESET_NOTES.

`python -m jaxrl_llm.objectives` prints `method_table()`, generated from
these presets, so the documentation cannot drift from the code.
"""

from __future__ import annotations

import dataclasses

from jaxrl_llm.objectives.config import FIELD_NAMES, ObjectiveConfig


def _p(name, **kw):
  return ObjectiveConfig(name=name, **kw)


_PPO = dict(trust_region="ppo", eps_low=0.2, eps_high=0.2)
_DAPO = dict(trust_region="ppo", eps_low=0.2, eps_high=0.28)
_GSPO = dict(trust_region="ppo", trust_level="sequence", eps_low=3e-4, eps_high=4e-4)
_ON_MU = dict(correction_ratio="rho")

PRESETS: dict[str, ObjectiveConfig] = {
    p.name: p for p in (
        _p("reinforce", aggregation="seq_mean_token_sum", advantage="raw"),
        _p("grpo", **_PPO, aggregation="seq_mean_token_mean", advantage="grpo"),
        _p("dr_grpo", **_PPO, aggregation="constant", advantage="dr_grpo"),
        _p("dapo", **_DAPO, aggregation="token_mean", advantage="grpo"),
        _p("gspo", **_GSPO, aggregation="seq_mean_token_mean", advantage="grpo", adv_level="sequence"),
        _p("gspo_token", **_GSPO, aggregation="seq_mean_token_mean", advantage="grpo", adv_level="token"),
        _p("cispo", trust_region="truncate", eps_low=0.2, eps_high=0.28, aggregation="token_mean",
           advantage="grpo"),
        _p("decoupled_ppo", **_PPO, correction="is", aggregation="seq_mean_token_mean", advantage="grpo"),
        _p("token_tis", **_PPO, correction="tis", is_cap=2.0, aggregation="seq_mean_token_mean",
           advantage="grpo"),
        _p("icepop", **_PPO, correction="band", band_low=0.5, band_high=5.0,
           aggregation="seq_mean_token_mean", advantage="grpo"),
        _p("seq_tis", **_PPO, correction="tis", correction_level="seq_product", is_cap=2.0,
           aggregation="seq_mean_token_mean", advantage="grpo"),
        _p("seq_mis", **_PPO, correction="mis", correction_level="seq_product", is_cap=2.0,
           aggregation="seq_mean_token_mean", advantage="grpo"),
        _p("geo_mis", **_PPO, correction="band_indicator", correction_level="seq_geomean",
           band_low=0.9998, band_high=1.0002, aggregation="seq_mean_token_mean", advantage="grpo"),
        _p("scalerl_dapo", **_ON_MU, correction="ppo", eps_low=0.2, eps_high=0.26, aggregation="token_mean",
           advantage="reinforce_pp_baseline"),
        _p("scalerl_gspo", **_ON_MU, correction="ppo", correction_level="seq_geomean", eps_low=3e-4,
           eps_high=4e-4, aggregation="seq_mean_token_mean", advantage="reinforce_pp_baseline"),
        _p("scalerl_cispo", **_ON_MU, correction="tis", is_cap=5.0, aggregation="token_mean",
           advantage="reinforce_pp_baseline"),
        _p("pipelinerl", **_ON_MU, correction="tis", is_cap=1.02, aggregation="seq_mean_token_sum",
           advantage="rloo"),
        _p("sao", **_ON_MU, correction="band", band_low=0.7, band_high=6.0, aggregation="token_mean",
           advantage="gae"),
        _p("topr", **_ON_MU, correction="topr", correction_level="seq_product",
           aggregation="seq_mean_token_sum", advantage="dr_grpo"),
        _p("dppo_tv", **_ON_MU, correction="dppo_tv", dppo_delta=0.15, aggregation="token_mean",
           advantage="dr_grpo"),
        _p("dppo_kl", **_ON_MU, correction="dppo_kl", dppo_delta=0.05, aggregation="token_mean",
           advantage="dr_grpo"),
        _p("trm", **_ON_MU, correction="trm", trm_max_delta=0.05, trm_mean_delta=None,
           aggregation="seq_mean_token_sum", advantage="grpo"),
        _p("trm_avg", **_ON_MU, correction="trm", trm_max_delta=None, trm_mean_delta=0.001,
           aggregation="seq_mean_token_sum", advantage="grpo"),
        _p("score_centering", kappa=1, aggregation="seq_mean_token_sum", advantage="dr_grpo"),
        _p("tis_sc", **_ON_MU, correction="tis", is_cap=2.0, kappa=1, aggregation="seq_mean_token_sum",
           advantage="dr_grpo"),
        _p("mis_sc", **_ON_MU, correction="mis", is_cap=2.0, kappa=1, aggregation="seq_mean_token_sum",
           advantage="dr_grpo"),
        _p("ppo", **_PPO, aggregation="token_mean", advantage="gae", gamma=1.0, gae_lambda=0.95,
           adv_whiten=True, value_clip=0.2, value_coef=0.5),
        _p("ppo_dual_clip", **_PPO, dual_clip_c=3.0, aggregation="token_mean", advantage="gae", gamma=1.0,
           gae_lambda=0.95, adv_whiten=True, value_clip=0.2, value_coef=0.5),
        _p("rloo", aggregation="seq_mean_token_sum", advantage="rloo"),
        _p("reinforce_pp", **_PPO, aggregation="token_mean", advantage="reinforce_pp", kl_estimator="k1",
           kl_placement="reward"),
        _p("reinforce_pp_baseline", **_PPO, aggregation="token_mean", advantage="reinforce_pp_baseline",
           kl_estimator="k1", kl_placement="reward"),
    )
}

PRESET_NOTES: dict[str, str] = {
    "reinforce": "Williams (1992); on-policy, every ratio is 1",
    "grpo": "Shao et al. (2024); the paper's k3 KL (beta=0.04) is off by default, set kl_coef",
    "dr_grpo": "Liu et al. (2025a); L_max = norm_max_len (default: padded T)",
    "dapo": "Yu et al. (2025); dynamic sampling and overlong shaping are data filters (training/)",
    "gspo": "Zheng et al. (2025); one advantage per answer (masked mean of adv)",
    "gspo_token": "GSPO-token: weight s_i with per-token advantages",
    "cispo": "MiniMax (2025); bounds 1 +- eps (verl/slime); truncate_bounds='absolute' for TRL's cap",
    "decoupled_ppo": "Hilton et al. (2022), AReaL (Fu et al., 2025)",
    "token_tis": "Yao et al. (2025)",
    "icepop": "Ling Team (2025)",
    "seq_tis": "Liu et al. (2025b), product c_i",
    "seq_mis": "Liu et al. (2025b), product c_i; C not fixed by the paper, 2 here",
    "geo_mis": "Li & Liu (2025), verl band",
    "scalerl_dapo": "Khatri et al. (2026), ratio against mu; batch-level advantage normalisation",
    "scalerl_gspo": "Khatri et al. (2026), geometric-mean rho",
    "scalerl_cispo": "Khatri et al. (2026), eps_max in 4-8 (5 here)",
    "pipelinerl": "Piche et al. (2026); 1/G per group averaged over prompts = 1/B",
    "sao": "Hou et al. (2026); per-token advantages from a value model",
    "topr": "Le Roux et al. (2025); product rho_i, sign-dependent taper",
    "dppo_tv": "Qi et al. (2026), binary TV, no cap (dppo_cap=5 for their large runs)",
    "dppo_kl": "Qi et al. (2026), binary KL(mu, pi_theta)",
    "trm": "Li et al. (2026), max token KL; needs kl_BR",
    "trm_avg": "Li et al. (2026), mean token KL; needs kl_BR",
    "score_centering": "Marek & Ryabinin (2026); REINFORCE on group-centred rewards",
    "tis_sc": "Marek & Ryabinin (2026), appendix A.2",
    "mis_sc": "Marek & Ryabinin (2026), appendix A.2",
    "ppo": "Schulman et al. (2017) with GAE and a clipped value loss",
    "ppo_dual_clip": "Ye et al. (2020), c = 3",
    "rloo": "Ahmadian et al. (2024), REINFORCE with a leave-one-out baseline",
    "reinforce_pp": "Hu et al. (2025), global whitening; KL (k1) belongs in the reward, set kl_coef",
    "reinforce_pp_baseline": "Hu et al. (2025), group-mean baseline then global whitening",
}


def get_preset(name: str, /, **overrides) -> ObjectiveConfig:
  """The preset `name` (case-insensitive), with knobs overridden and re-validated.

  `name` is positional-only, so every field, `name` included, can be overridden
  (`get_preset(m, **dataclasses.asdict(cfg))` round-trips).
  """
  key = name.lower() if isinstance(name, str) else name
  if key not in PRESETS:
    raise ValueError(f"unknown method {name!r}: allowed names are {sorted(PRESETS)}")
  unknown = sorted(set(overrides) - set(FIELD_NAMES))
  if unknown:
    raise ValueError(f"unknown ObjectiveConfig field(s) {unknown}: allowed fields are {list(FIELD_NAMES)}")
  return dataclasses.replace(PRESETS[key], **overrides)


# ---------------------------------------------------------------- the table


def _num(x) -> str:
  return f"{x:g}"


def level_of(cfg: ObjectiveConfig) -> str:
  seq = cfg.trust_level == "sequence" or cfg.correction_level != "token" or cfg.correction == "trm"
  return "Sequence" if seq else "Token"


def trust_str(cfg: ObjectiveConfig) -> str:
  if cfg.trust_region == "none":
    return "-" if cfg.correction != "none" and cfg.correction_ratio == "rho" else "1"
  x = "r" if cfg.trust_level == "token" else "s_i"
  if cfg.trust_region == "ppo":
    out = f"M({x})*{x} in [{_num(1 - cfg.eps_low)}, {_num(1 + cfg.eps_high)}]"
    if cfg.dual_clip_c is not None:
      out += f", dual-clip c={_num(cfg.dual_clip_c)}"
    return out
  lo, hi = cfg.trunc_bounds
  return f"clip({x}, {_num(lo)}, {_num(hi)})" if lo > 0 else f"min({x}, {_num(hi)})"


def correction_str(cfg: ObjectiveConfig) -> str:
  base = "c" if cfg.correction_ratio == "c" else "rho"
  x = {"token": base, "seq_product": f"{base}_i", "seq_geomean": f"{base}bar_i"}[cfg.correction_level]
  k = cfg.correction
  if k == "none":
    return "1"
  if k == "is":
    return x
  if k == "tis":
    return f"min({x}, {_num(cfg.is_cap)})"
  if k == "mis":
    return f"{x}*1[{x} <= {_num(cfg.is_cap)}]"
  if k == "band":
    return f"{x}*1[{_num(cfg.band_low)} <= {x} <= {_num(cfg.band_high)}]"
  if k == "band_indicator":
    return f"1[{_num(cfg.band_low)} <= {x} <= {_num(cfg.band_high)}]"
  if k == "ppo":
    return f"M({x})*{x} in [{_num(1 - cfg.eps_low)}, {_num(1 + cfg.eps_high)}]"
  if k in ("dppo_tv", "dppo_kl"):
    d = "TV_bin(mu, pi)" if k == "dppo_tv" else "KL_bin(mu, pi)"
    capped = x if cfg.dppo_cap is None else f"min({x}, {_num(cfg.dppo_cap)})"
    return f"M({d} > {_num(cfg.dppo_delta)}, sign rule)*{capped}"
  if k == "trm":
    tests = []
    if cfg.trm_max_delta is not None:
      tests.append(f"max_t KL <= {_num(cfg.trm_max_delta)}")
    if cfg.trm_mean_delta is not None:
      tests.append(f"mean_t KL <= {_num(cfg.trm_mean_delta)}")
    return f"1[{' and '.join(tests)}]*{base}"
  return f"1 if A >= 0; min({x}, 1) if A < 0"


def weight_str(cfg: ObjectiveConfig) -> str:
  t, f = trust_str(cfg), correction_str(cfg)
  if t in ("1", "-"):
    return f if t == "1" or f != "1" else "1"
  return t if f == "1" else f"{f} * {t}"


def defaults_str(cfg: ObjectiveConfig) -> str:
  """The knobs outside T and f that shape the update: advantage, lambda, KL, value."""
  out = []
  if cfg.advantage in ("grpo", "reinforce_pp", "reinforce_pp_baseline"):
    out.append(f"std ddof={cfg.adv_std_ddof}, eps={_num(cfg.adv_eps)}")
  if cfg.advantage == "gae":
    out.append(f"gamma={_num(cfg.gamma)}, lambda={_num(cfg.gae_lambda)}" + (", whitened" if cfg.adv_whiten else ""))
  if cfg.adv_level == "sequence":
    out.append("A per answer")
  if cfg.aggregation == "constant":
    out.append(f"L_max={cfg.norm_max_len or 'padded T'}")
  if cfg.kl_coef > 0 or cfg.kl_placement == "reward":
    out.append(f"KL {cfg.kl_estimator} in {cfg.kl_placement}, beta={_num(cfg.kl_coef)}")
  if cfg.entropy_coef > 0:
    out.append(f"entropy bonus {_num(cfg.entropy_coef)}")
  if cfg.value_coef > 0:
    clip = "none" if cfg.value_clip is None else _num(cfg.value_clip)
    out.append(f"value coef {_num(cfg.value_coef)}, clip {clip}")
  return "; ".join(out) or "-"


def method_table(presets: dict[str, ObjectiveConfig] | None = None) -> str:
  """Markdown table of the master equation's knobs, one row per preset."""
  presets = PRESETS if presets is None else presets
  head = ("| method | level | T (trust region) | f (correction) | W = f T | kappa | aggregation (lambda) "
          "| advantage | defaults | notes |")
  rows = [head, "|" + "---|" * 10]
  for name, cfg in presets.items():
    rows.append(f"| {name} | {level_of(cfg)} | {trust_str(cfg)} | {correction_str(cfg)} | {weight_str(cfg)} "
                f"| {int(cfg.kappa)} | {cfg.aggregation} | {cfg.advantage} | {defaults_str(cfg)} "
                f"| {PRESET_NOTES.get(name, '')} |")
  return "\n".join(rows)
