"""The run report: one PNG of the training curves, drawn from metrics.jsonl.

`write_report([workdir])` -> <workdir>/report.png; several workdirs overlay into
compare.png in their common parent. `python -m jaxrl_llm.report` is its command
line; the trainer draws it when a run ends (`write_report_safely`).

Panels: reward, eval accuracy, KL to the reference, entropy, clip and mask
fractions, response length, each against the RL step. A panel plots every
metric whose name matches its patterns, so new diagnostics show up without a
change here; a panel with no matching metric says so instead of vanishing.
A series that is constant over the whole run (GSPO's token clip fraction,
0 by construction) is left out and named in the panel; evaluations, which
exist at a few steps only, are drawn as points, and so are summary.json's
start and end evaluations.
"""

import dataclasses
import os
import re
from collections.abc import Sequence

import numpy as np

from jaxrl_llm.rundir.metrics import load_run, series

REPORT_FILE = "report.png"


@dataclasses.dataclass(frozen=True)
class Panel:
  title: str
  patterns: tuple[str, ...]  # regexes matched (re.search) against metric names
  ylabel: str = ""
  max_series: int = 4


PANELS = (
    Panel("Reward and accuracy (train samples)",
          (r"^reward/mean$", r"^reward/accuracy$", r"^reward(_mean)?$"), "per sample"),
    Panel("Eval accuracy (held-out, greedy)", (r"^eval/accuracy$", r"^eval/pass@1",
                                               r"^eval_accuracy$"), "accuracy"),
    Panel("KL to reference", (r"^kl/ref$", r"(^|/)kl(_to_ref)?$"), "KL (nats / token)"),
    Panel("Entropy", (r"^entropy/mean$", r"(^|/)entropy$"), "nats / token"),
    Panel("Clip and mask fractions", (r"^trust/clip_frac$", r"^correction/masked_frac$",
                                      r"^filter/overlong_masked_frac$", r"clip_frac$",
                                      r"mask(ed)?_frac$"), "fraction of tokens", max_series=5),
    Panel("Response length", (r"^response/length_mean$", r"(^|/)(response_)?length(_mean|/mean)?$"),
          "tokens"),
)
# summary.json fields drawn as eval points at step 0 and at the last step.
SUMMARY_EVAL = (("eval_accuracy_start", 0), ("eval_accuracy_end", None))


def matching_keys(rows: Sequence[dict], panel: Panel) -> list[str]:
  """Numeric metric names matched by the panel, in first-pattern-first order."""
  numeric = []
  for r in rows:
    for k, v in r.items():
      if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) \
          and k not in numeric:
        numeric.append(k)
  out = []
  for pat in panel.patterns:
    out += [k for k in numeric if re.search(pat, k) and k not in out]
  return out[:panel.max_series]


def smooth(v: np.ndarray, window: int) -> np.ndarray:
  """Trailing moving average (the first points average what exists so far)."""
  if window <= 1 or v.size == 0:
    return v
  c = np.cumsum(np.insert(v, 0, 0.0))
  idx = np.arange(1, v.size + 1)
  lo = np.maximum(idx - window, 0)
  return (c[idx] - c[lo]) / (idx - lo)


def draw(runs: Sequence[tuple[str, list[dict]]], out_path: str) -> str:
  """Draws the panels for one or several (label, rows) runs into out_path."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  fig, axes = plt.subplots(2, 3, figsize=(16, 8.5), constrained_layout=True)
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  styles = ("-", "--", ":", "-.")
  overlay = len(runs) > 1
  for ax, panel in zip(axes.flat, PANELS):
    drawn, constant = 0, []
    for ri, (label, rows) in enumerate(runs):
      for ki, key in enumerate(matching_keys(rows, panel)):
        s, v = series(rows, key)
        if s.size == 0:
          continue
        if s.size > 2 and np.ptp(v) == 0:  # constant by construction: a flat line says nothing
          constant.append(f"{key} = {v[0]:g}")
          continue
        color = colors[(ri if overlay else ki) % len(colors)]
        name = f"{label}: {key}" if overlay else key
        sparse = s.size <= 20  # eval points: markers, no smoothing, no line between far-apart points
        if sparse:
          ax.plot(s, v, marker="o", ls="none", color=color, label=name)
        else:
          window = max(1, s.size // 20)
          ax.plot(s, v, color=color, alpha=0.25, lw=0.8)
          ax.plot(s, smooth(v, window), color=color, lw=1.8,
                  ls=styles[ki % 4] if overlay else "-",
                  label=name + (f" (avg {window})" if window > 1 else ""))
        drawn += 1
    if panel is PANELS[1]:
      drawn += _draw_summary_eval(ax, runs, colors, overlay)
    ax.yaxis.get_major_formatter().set_useOffset(False)
    ax.set_title(panel.title, fontsize=12)
    ax.set_xlabel("RL step")
    ax.set_ylabel(panel.ylabel)
    ax.grid(alpha=0.3)
    if drawn:
      ax.legend(fontsize=8, loc="best")
    else:
      ax.text(0.5, 0.5, "constant in this run" if constant else "not logged by this run", ha="center",
              va="center", transform=ax.transAxes, color="gray")
    if constant:
      ax.text(0.01, 0.01, "constant, not drawn: " + ", ".join(sorted(set(constant)))[:90], fontsize=7,
              color="gray", transform=ax.transAxes, va="bottom")
  title = " vs ".join(label for label, _ in runs)
  fig.suptitle(f"jaxrl_llm: {title}", fontsize=14)
  os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
  fig.savefig(out_path, dpi=90, bbox_inches="tight")  # long legends and labels stay inside the image
  plt.close(fig)
  return out_path


def _draw_summary_eval(ax, runs, colors, overlay) -> int:
  """The start / end greedy eval of summary.json (rows with key "summary")."""
  drawn = 0
  for ri, (label, rows) in enumerate(runs):
    summary = next((r["summary"] for r in rows if "summary" in r), None)
    if not summary:
      continue
    last = max((r.get("step", 0) for r in rows if "step" in r), default=0)
    pts = [(last if at is None else at, summary[k]) for k, at in SUMMARY_EVAL
           if isinstance(summary.get(k), (int, float))]
    if pts:
      s, v = zip(*pts)
      ax.plot(s, v, marker="s", ms=8, ls="none", color=colors[ri % len(colors)],
              label=(f"{label}: " if overlay else "") + "start / end eval (summary.json)")
      for x, y in pts:
        ax.annotate(f"{y:.3f}", (x, y), textcoords="offset points", xytext=(4, 6), fontsize=8)
      drawn += 1
  return drawn


def write_report(workdirs: Sequence[str], out_path: str | None = None) -> str:
  """Draws the report of one workdir (or the overlay of several); returns its path."""
  if not workdirs:
    raise ValueError("write_report: expected at least one workdir")
  runs = [load_run(w) for w in workdirs]
  if out_path is None:
    if len(workdirs) == 1:
      out_path = os.path.join(workdirs[0], REPORT_FILE)
    else:
      parent = os.path.commonpath([os.path.abspath(w) for w in workdirs])
      out_path = os.path.join(parent, "compare.png")
  return draw(runs, out_path)


def write_report_safely(workdir: str, log=print) -> str | None:
  """The end-of-run report; a plotting failure is logged, never fatal to the run."""
  try:
    path = write_report([workdir])
  except Exception as e:  # pylint: disable=broad-except
    log(f"report: not written ({type(e).__name__}: {e})")
    return None
  log(f"report: {path}")
  return path
