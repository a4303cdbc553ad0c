"""The lab's plots (matplotlib, Agg): a method x mismatch heatmap of the final
held-out accuracy, and per mismatch the reward and accuracy curves of every
method over the RL steps, the line the mean over seeds and the band its min-max."""

from __future__ import annotations

import os

import numpy as np

from jaxrl_llm.lab.grid import slug
from jaxrl_llm.rundir.report_figure import smooth


def _pyplot():
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  return plt


def heatmap(results: dict, path: str) -> str:
  """Rows methods, columns mismatch settings; colour the mean final accuracy, text mean ± std (n)."""
  plt = _pyplot()
  methods, mismatches = results["methods"], results["mismatches"]
  groups = {(g["method"], g["mismatch"]): g["aggregate"] for g in results["groups"]}
  mean = np.full((len(methods), len(mismatches)), np.nan)
  for i, m in enumerate(methods):
    for j, x in enumerate(mismatches):
      v = groups[(m, x)]["acc_end"]["mean"]
      mean[i, j] = np.nan if v is None else v
  fig, ax = plt.subplots(figsize=(1.6 + 1.55 * len(mismatches), 1.2 + 0.55 * len(methods)), constrained_layout=True)
  finite = mean[np.isfinite(mean)]
  lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
  if hi - lo < 1e-6:
    lo, hi = lo - 0.05, hi + 0.05
  cmap = plt.get_cmap("viridis").copy()
  cmap.set_bad("#dddddd")
  im = ax.imshow(np.ma.masked_invalid(mean), cmap=cmap, vmin=lo, vmax=hi, aspect="auto")
  for i, m in enumerate(methods):
    for j, x in enumerate(mismatches):
      a = groups[(m, x)]
      acc = a["acc_end"]
      if acc["mean"] is None:
        text, colour = f"no result\n({a['failed']} failed)", "black"
      else:
        text = f"{acc['mean']:.3f}\n± {acc['std']:.3f} (n={acc['n']})"
        if a["collapses"]:
          text += f"\n{a['collapses']} collapsed"
        colour = "white" if (acc["mean"] - lo) / (hi - lo) < 0.55 else "black"
      ax.text(j, i, text, ha="center", va="center", fontsize=8, color=colour)
  ax.set_xticks(range(len(mismatches)), mismatches, rotation=20, ha="right")
  ax.set_yticks(range(len(methods)), methods)
  ax.set_xlabel("sampler mismatch")
  ax.set_ylabel("method")
  ax.set_title(f"Final held-out accuracy (mean ± std over seeds), {results['steps']} RL steps", fontsize=10)
  fig.colorbar(im, ax=ax, label="accuracy")
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


def _band(curves: list[list[list[float]]]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """(steps, mean, min, max) over seeds at the steps every seed has."""
  common = sorted(set.intersection(*[{p[0] for p in c} for c in curves])) if curves else []
  vals = np.asarray([[dict((p[0], p[1]) for p in c)[s] for s in common] for c in curves], float)
  if not common:
    return np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0)
  return np.asarray(common), vals.mean(0), vals.min(0), vals.max(0)


def curves(results: dict, out_dir: str, window: int) -> list[str]:
  """curves_<mismatch>.png: training reward (trailing mean over `window` steps) and held-out
  accuracy against the RL step, one colour per method, band = min-max over seeds."""
  plt = _pyplot()
  colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  paths = []
  for x in results["mismatches"]:
    fig, (ax_r, ax_a) = plt.subplots(1, 2, figsize=(13, 4.8), constrained_layout=True)
    drawn = 0
    for k, m in enumerate(results["methods"]):
      cells = [c for c in results["cells"] if c["method"] == m and c["mismatch"] == x and c["status"] == "done"]
      if not cells:
        continue
      colour, styles = colours[k % len(colours)], ("-", "--", "-.", ":")
      ls = styles[(k // len(colours)) % len(styles)]
      rew = [[[s, v] for s, v in zip([p[0] for p in c["numbers"]["reward_curve"]],
                                     smooth(np.asarray([p[1] for p in c["numbers"]["reward_curve"]]), window))]
             for c in cells]
      s, mean, lo, hi = _band(rew)
      ax_r.plot(s, mean, color=colour, ls=ls, lw=1.6, label=f"{m} (n={len(cells)})")
      ax_r.fill_between(s, lo, hi, color=colour, alpha=0.15, lw=0)
      s, mean, lo, hi = _band([c["numbers"]["eval_curve"] for c in cells])
      ax_a.plot(s, mean, color=colour, ls=ls, lw=1.6, marker="o", ms=4, label=m)
      ax_a.fill_between(s, lo, hi, color=colour, alpha=0.15, lw=0)
      drawn += 1
    for ax, title, ylabel in ((ax_r, f"Training reward (trailing mean, {window} steps)", "reward/mean"),
                              (ax_a, "Held-out accuracy (greedy)", "accuracy")):
      ax.set_title(title, fontsize=11)
      ax.set_xlabel("RL step")
      ax.set_ylabel(ylabel)
      ax.grid(alpha=0.3)
      if drawn:
        ax.legend(fontsize=8, loc="best")
      else:
        ax.text(0.5, 0.5, "no finished cell", ha="center", va="center", transform=ax.transAxes, color="gray")
    fig.suptitle(f"mismatch {x}: mean over seeds, band min-max", fontsize=12)
    path = os.path.join(out_dir, f"curves_{slug(x)}.png")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    paths.append(path)
  return paths
