"""The lab's numbers: each cell's from its own metrics.jsonl and summary.json, then
their aggregate over seeds per (method, mismatch).

Per cell (definitions also in docs/lab.md):

* `acc_start`, `acc_end`: held-out greedy accuracy at step 0 and after the last
  step (summary.json); `gain` = acc_end - acc_start;
* `eval_curve`: (step, accuracy) at 0, at every `eval.every` and at the end;
* `auc`: area under the training-reward curve normalised by steps, the mean of
  `reward/mean` over the logged RL steps (1/N sum_t r_t with every step logged);
* `steps_to_target`: the first step whose reward, smoothed by a trailing mean
  over `smooth` steps, reaches `target`; None if it never does;
* `collapse`: the reasons found, any of `reward_drop` (the smoothed reward falls
  more than `drop` below its running best), `nonfinite` (an update skipped for
  a non-finite loss or gradient, or a non-finite reward or KL logged) and
  `kl` (`kl/ref`, KL(pi || pi_ref) to the run's start = the warm start, smoothed
  like the reward, above `kl_bound`), with the first step of each;
* `log_c_abs`, `seq_log_c_abs`: the means over steps of `mismatch/log_c_abs_mean`
  and `mismatch/seq_abs_log_c_mean` (None when no step recomputed pi_prox: no mismatch);
* `fractions`: the mean over steps of every `trust/*_frac` and `correction/*_frac`.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from jaxrl_llm.rundir.metrics import load_run, series
from jaxrl_llm.rundir.report_figure import smooth


@dataclasses.dataclass(frozen=True)
class Criteria:
  target: float  # reward the smoothed curve must reach (steps_to_target)
  drop: float  # reward fall below the running best that counts as a collapse
  kl_bound: float  # kl/ref above this counts as a collapse
  smooth: int  # trailing-mean window (steps) of the reward and KL curves for target, drop and KL bound


FRACTION_PREFIXES = ("trust/", "correction/")


def _finite(v) -> bool:
  return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def cell_numbers(workdir: str, crit: Criteria) -> dict:
  """The numbers of one finished cell, from its metrics.jsonl and summary.json."""
  _, rows = load_run(workdir)
  summary = next((r["summary"] for r in rows if "summary" in r), None)
  if summary is None:
    raise FileNotFoundError(f"no summary.json in {workdir}: the run did not finish")
  rows = [r for r in rows if "step" in r]
  steps, reward = series(rows, "reward/mean")
  n_steps = int(summary["rl_steps"])
  out = {"acc_start": summary["eval_accuracy_start"], "acc_end": summary["eval_accuracy_end"],
         "gain": summary["eval_gain"], "rl_steps": n_steps, "run_time_s": summary.get("run_time_s"),
         "reward_first": summary.get("train_reward_first"), "reward_last": summary.get("train_reward_last")}
  out["auc"] = float(reward.mean()) if reward.size else None
  sm = smooth(reward, crit.smooth)
  reached = np.nonzero(sm >= crit.target)[0]
  out["steps_to_target"] = int(steps[reached[0]]) if reached.size else None

  collapse = {}
  best = np.maximum.accumulate(sm) if sm.size else sm
  fell = np.nonzero(best - sm > crit.drop)[0]
  if fell.size:
    collapse["reward_drop"] = int(steps[fell[0]])
  bad_steps = [r["step"] for r in rows if float(r.get("update/skipped_nonfinite", 0) or 0) > 0
               or any(k in r and not _finite(r[k]) for k in ("reward/mean", "kl/ref", "loss/total"))]
  if bad_steps:
    collapse["nonfinite"] = int(bad_steps[0])
  kl_steps, kl = series(rows, "kl/ref")
  over = np.nonzero(smooth(kl, crit.smooth) > crit.kl_bound)[0]
  if over.size:
    collapse["kl"] = int(kl_steps[over[0]])
  out["collapse"] = collapse
  out["kl_max"] = float(kl.max()) if kl.size else None

  for name, key in (("log_c_abs", "mismatch/log_c_abs_mean"), ("seq_log_c_abs", "mismatch/seq_abs_log_c_mean")):
    _, v = series(rows, key)
    out[name] = float(v.mean()) if v.size else None
  keys = sorted({k for r in rows for k in r if k.startswith(FRACTION_PREFIXES) and k.endswith("_frac")})
  out["fractions"] = {k: float(series(rows, k)[1].mean()) for k in keys if series(rows, k)[1].size}

  ev_steps, ev = series(rows, "eval/accuracy")
  curve = [(0, out["acc_start"])] + [(int(s), float(a)) for s, a in zip(ev_steps, ev)] + [(n_steps, out["acc_end"])]
  out["eval_curve"] = [list(p) for p in curve]
  out["reward_curve"] = [[int(s), float(r)] for s, r in zip(steps, reward)]
  return out


def _spread(values: list[float]) -> dict:
  """mean, std (sample, ddof=1; 0 for one value), min, max and n of finished seeds."""
  v = np.asarray([x for x in values if x is not None], float)
  if not v.size:
    return {"mean": None, "std": None, "min": None, "max": None, "n": 0}
  return {"mean": float(v.mean()), "std": float(v.std(ddof=1)) if v.size > 1 else 0.0,
          "min": float(v.min()), "max": float(v.max()), "n": int(v.size)}


def aggregate_seeds(cells: list[dict]) -> dict:
  """One (method, mismatch)'s numbers over its seeds; `cells` are results.json's cell entries."""
  done = [c["numbers"] for c in cells if c["status"] == "done"]
  reached = [n["steps_to_target"] for n in done if n["steps_to_target"] is not None]
  collapsed = [n for n in done if n["collapse"]]
  reasons: dict[str, int] = {}
  for n in collapsed:
    for r in n["collapse"]:
      reasons[r] = reasons.get(r, 0) + 1
  frac_keys = sorted({k for n in done for k in n["fractions"]})
  return {
      "seeds": len(cells), "done": len(done), "failed": sum(c["status"] == "failed" for c in cells),
      "acc_end": _spread([n["acc_end"] for n in done]), "acc_start": _spread([n["acc_start"] for n in done]),
      "gain": _spread([n["gain"] for n in done]), "auc": _spread([n["auc"] for n in done]),
      "steps_to_target": {**_spread(reached), "reached": len(reached)},
      "collapses": len(collapsed), "collapse_reasons": reasons,
      "log_c_abs": _spread([n["log_c_abs"] for n in done])["mean"],
      "seq_log_c_abs": _spread([n["seq_log_c_abs"] for n in done])["mean"],
      "fractions": {k: _spread([n["fractions"].get(k) for n in done])["mean"] for k in frac_keys},
  }


def _clipped(fractions: dict) -> float | None:
  """The clipped share: the trust region's on r (`trust/clip_frac`) plus a clipping correction's on c or
  rho (`correction/clip_{low,high}_frac`: ScaleRL's and the other one-ratio presets clip there); None
  when the cells logged neither."""
  parts = [fractions.get(k) for k in ("trust/clip_frac", "correction/clip_low_frac", "correction/clip_high_frac")]
  parts = [v for v in parts if v is not None]
  return float(sum(parts)) if parts else None


def _fmt(v, spec=".3f") -> str:
  return "–" if v is None else format(v, spec)


def markdown(results: dict) -> str:
  """results.md: the settings, one table row per (method, mismatch), the failed cells."""
  crit = results["criteria"]
  lines = [f"# Method lab: {results['out']}", "", f"Command: `{results['command']}`", "",
           f"{len(results['cells'])} cells ({results['counts']['done']} done, {results['counts']['failed']} failed, "
           f"{results['counts']['missing']} not run); {results['steps']} RL steps each; seeds {results['seeds']}. "
           f"Accuracy: held-out greedy. Spread over seeds: mean ± std (sample) [min, max]. AUC: mean training "
           f"reward over the steps. Target: smoothed reward >= {crit['target']} (window {crit['smooth']}). "
           f"Collapse: smoothed reward {crit['drop']} below its best, a non-finite update, or kl/ref > "
           f"{crit['kl_bound']}.", "",
           "| method | mismatch | seeds | acc start | acc end | gain | AUC | steps to target (reached) | collapses "
           "| mean abs log c | clip frac | masked frac |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for g in results["groups"]:
    a, acc = g["aggregate"], g["aggregate"]["acc_end"]
    end = "–" if acc["mean"] is None else f"{acc['mean']:.3f} ± {acc['std']:.3f} [{acc['min']:.3f}, {acc['max']:.3f}]"
    st = a["steps_to_target"]
    reached = f"{_fmt(st['mean'], '.1f')} ({st['reached']}/{a['done']})"
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(a["collapse_reasons"].items()))
    fr = a["fractions"]
    clip = _clipped(fr)
    masked = fr.get("correction/masked_frac")
    gain = a["gain"]
    lines.append(
        f"| {g['method']} | {g['mismatch']} | {a['done']}/{a['seeds']} | {_fmt(a['acc_start']['mean'])} | {end} | "
        f"{_fmt(gain['mean'], '+.3f')} ± {_fmt(gain['std'])} | {_fmt(a['auc']['mean'])} ± {_fmt(a['auc']['std'])} | "
        f"{reached} | {a['collapses']}/{a['done']}{f' ({reasons})' if reasons else ''} | "
        f"{_fmt(a['log_c_abs'], '.4f')} | {_fmt(clip, '.4f')} | {_fmt(masked, '.4f')} |")
  failed = [c for c in results["cells"] if c["status"] == "failed"]
  if failed:
    lines += ["", "## Failed cells", ""]
    lines += [f"- `{c['name']}`: {c.get('error', '')}" for c in failed]
  missing = [c for c in results["cells"] if c["status"] == "missing"]
  if missing:
    lines += ["", "## Not run", ""] + [f"- `{c['name']}`" for c in missing]
  lines += ["", "Plots: `heatmap.png`, " + ", ".join(f"`{p}`" for p in results["plots"].get("curves", [])), ""]
  return "\n".join(lines)

