"""Reward over-optimisation on the embedded default: proxy reward and gold accuracy against KL.

Gao, Schulman and Hilton (2022) found that as RL against a learned reward model moves the policy
away from its start (KL(pi || pi_init) grows), the proxy reward keeps rising while the gold reward
peaks and falls. This script measures that curve on the built-in arithmetic task, where the gold
reward is the verifier:

  1. a Bradley-Terry reward model per label-noise level (`python -m jaxrl_llm.reward_model
     --config=configs/reward_model.py --config.data.label_noise=N`, seed 0);
  2. a lab sweep (`python -m jaxrl_llm.lab --config=configs/rlhf_arithmetic.py`): GRPO against each
     reward model with InstructGPT's k1 KL penalty in the reward at each coefficient, every seed
     from the same per-seed warm start;
  3. per (noise, coefficient), from the cells' metrics.jsonl: the proxy (reward/model_mean, the raw
     reward-model score), the gold accuracy of the sampled answers (reward/accuracy) and the greedy
     held-out accuracy (eval/accuracy), each against kl/ref, averaged over seeds step by step.

    python scripts/overoptimisation.py --out=runs/overopt --noise=0,0.3 --kl=0,0.05,0.2 --seeds=3 --steps=40 --rm-seed=1

Writes <out>/overoptimisation.json (every curve, and the start / peak / end of each) and
<out>/overoptimisation.png (one panel per noise level: proxy and gold against KL, a line per
coefficient). Reruns reuse the finished reward models and cells. Records the load average
beside the wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _floats(text: str) -> list[float]:
  return [float(x) for x in text.split(",") if x]


def rm_dir(out: str, noise: float) -> str:
  return os.path.join(out, "rm", f"noise{noise:g}")


# A reward model whose held-out pairwise accuracy ends at or below this learned nothing to over-optimise:
# at label noise 0.3 the seed-0 model stayed at the loss of a constant score (ln 2, held-out 0.480) for all
# 400 steps, while seed 1 reached 0.606 (2026-12-07).
MIN_RM_ACCURACY = 0.55


def train_reward_models(out: str, noises: list[float], steps: int, seed: int) -> dict:
  """One reward model per noise level (skipped when its summary.json exists); -> their summaries. Exits
  with one line naming the model when one did not learn (MIN_RM_ACCURACY)."""
  summaries = {}
  for n in noises:
    d = rm_dir(out, n)
    path = os.path.join(d, "summary.json")
    if not os.path.exists(path):
      subprocess.run([sys.executable, "-m", "jaxrl_llm.reward_model", "--config=configs/reward_model.py",
                      f"--workdir={d}", f"--config.data.label_noise={n}", "--config.export=False",
                      f"--config.train.steps={steps}", f"--config.seed={seed}"], cwd=REPO, check=True)
    with open(path) as f:
      summaries[f"{n:g}"] = json.load(f)
    acc = summaries[f"{n:g}"]["eval_accuracy_end"]
    if acc <= MIN_RM_ACCURACY:
      sys.exit(f"error: the reward model at label noise {n:g} (seed {seed}, {d}) ended at held-out pairwise "
               f"accuracy {acc:.3f}, not above {MIN_RM_ACCURACY} (chance 0.5): it learned nothing to over-optimise; "
               f"run again with another --rm-seed and a new --out")
  return summaries


def method(kl: float, noise: float, out: str) -> str:
  """The lab's method spec: GRPO with the k1 KL in the reward at coefficient `kl`, against the
  reward model of `noise` (the base config's objective changes do not reach the cells: set here)."""
  return (f"grpo@objective.kl_coef={kl:g}@objective.kl_placement=reward@objective.kl_estimator=k1"
          f"@data.reward_model={rm_dir(out, noise)}")


def run_lab(args, out: str) -> None:
  methods = ",".join(method(k, n, out) for n in args.noise for k in args.kl)
  cmd = [sys.executable, "-m", "jaxrl_llm.lab", "--config=configs/rlhf_arithmetic.py", f"--methods={methods}",
         "--mismatch=none", f"--seeds={args.seeds}", f"--steps={args.steps}",
         f"--eval-every={args.eval_every}", f"--out={os.path.join(out, 'lab')}", f"--jobs={args.jobs}",
         f"--config.data.reward_model={rm_dir(out, args.noise[0])}"]
  subprocess.run(cmd, cwd=REPO, check=False)  # failed cells are listed by the lab and skipped below


def read_cells(out: str) -> list[dict]:
  """Every finished cell: its kl coefficient, noise, seed and metrics rows."""
  cells_dir = os.path.join(out, "lab", "cells")
  cells = []
  for name in sorted(os.listdir(cells_dir)) if os.path.isdir(cells_dir) else []:
    d = os.path.join(cells_dir, name)
    try:
      with open(os.path.join(d, "lab_status.json")) as f:
        status = json.load(f)
    except FileNotFoundError:
      continue
    if status.get("status") != "done":
      continue
    spec = status["spec"]
    rm = spec["config.data.reward_model"]
    noise = float(os.path.basename(rm)[len("noise"):])
    with open(os.path.join(d, "metrics.jsonl")) as f:
      rows = [json.loads(line) for line in f if line.strip()]
    summary = {}
    if os.path.exists(os.path.join(d, "summary.json")):
      with open(os.path.join(d, "summary.json")) as f:
        summary = json.load(f)
    cells.append({"kl_coef": float(spec["config.objective.kl_coef"]), "noise": noise,
                  "seed": int(spec["config.seed"]), "rows": rows, "summary": summary})
  return cells


# Gold accuracy moves this much or more to count as a rise or a fall (sampled accuracy of 64 prompts x 8
# samples per step, averaged over the window and the seeds: its noise is about 0.01).
SHAPE_MARGIN = 0.03


def gold_shape(smooth: np.ndarray, margin: float = SHAPE_MARGIN) -> str:
  """The smoothed gold curve's shape: rise_then_fall (the peak above both the start and the end by
  `margin`), fall (ends `margin` below its start without rising first), rise, or flat. A peak at the
  first window alone is no rise: it is where a curve that only falls has its maximum."""
  start, end, peak = float(smooth[0]), float(smooth[-1]), float(np.max(smooth))
  if peak - start > margin and peak - end > margin:
    return "rise_then_fall"
  if start - end > margin:
    return "fall"
  if end - start > margin:
    return "rise"
  return "flat"


def curves(cells: list[dict]) -> list[dict]:
  """Per (noise, kl_coef): the seeds' mean per step of KL, proxy and gold, and their summary numbers."""
  out = []
  for key in sorted({(c["noise"], c["kl_coef"]) for c in cells}):
    group = [c for c in cells if (c["noise"], c["kl_coef"]) == key]
    n_steps = min(len(c["rows"]) for c in group)

    def per_step(metric):
      return np.array([[r.get(metric, np.nan) for r in c["rows"][:n_steps]] for c in group], np.float64)

    kl, proxy, gold = per_step("kl/ref"), per_step("reward/model_mean"), per_step("reward/accuracy")
    evals = [[(r["step"], r["eval/accuracy"]) for r in c["rows"] if "eval/accuracy" in r] for c in group]
    eval_steps = sorted(set.intersection(*[{s for s, _ in e} for e in evals])) if evals else []
    eval_mean = [float(np.mean([dict(e)[s] for e in evals])) for s in eval_steps]
    gold_m = np.nanmean(gold, axis=0)
    window = max(1, n_steps // 8)  # the sampled accuracy is noisy: its peak over a moving mean
    smooth = np.convolve(gold_m, np.ones(window) / window, mode="valid")
    peak = int(np.argmax(smooth))
    out.append({
        "noise": key[0], "kl_coef": key[1], "seeds": sorted(c["seed"] for c in group), "steps": n_steps,
        "kl_mean": np.nanmean(kl, axis=0).tolist(), "proxy_mean": np.nanmean(proxy, axis=0).tolist(),
        "gold_mean": gold_m.tolist(), "eval_steps": eval_steps, "eval_accuracy_mean": eval_mean,
        "kl_end": [float(x) for x in kl[:, -1]], "proxy_start": [float(x) for x in proxy[:, 0]],
        "proxy_end": [float(x) for x in proxy[:, -1]],
        # held-out greedy accuracy at step 0 and at the end (the run's summary; without one, the first and
        # last evaluations logged)
        "eval_start": [c["summary"].get("eval_accuracy_start", dict(e)[eval_steps[0]] if eval_steps else np.nan)
                       for c, e in zip(group, evals)],
        "eval_end": [c["summary"].get("eval_accuracy_end", dict(e)[eval_steps[-1]] if eval_steps else np.nan)
                     for c, e in zip(group, evals)],
        "gold_smoothed_peak": float(smooth[peak]), "gold_smoothed_peak_step": peak + window,
        "gold_smoothed_end": float(smooth[-1]), "gold_window": window,
        # the earliest step a smoothed peak can be reported at is `window`: a peak there is the start
        "gold_smoothed_start": float(smooth[0]), "gold_shape": gold_shape(smooth),
    })
  return out


def plot(groups: list[dict], path: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  noises = sorted({g["noise"] for g in groups})
  fig, axes = plt.subplots(1, len(noises), figsize=(5.2 * len(noises), 4.0), squeeze=False, constrained_layout=True)
  colours = plt.get_cmap("viridis")
  coefs = sorted({g["kl_coef"] for g in groups})
  for ax, noise in zip(axes[0], noises):
    twin = ax.twinx()
    for g in (g for g in groups if g["noise"] == noise):
      c = colours(coefs.index(g["kl_coef"]) / max(1, len(coefs) - 1))
      ax.plot(g["kl_mean"], g["proxy_mean"], color=c, label=f"proxy, beta={g['kl_coef']:g}")
      twin.plot(g["kl_mean"], g["gold_mean"], color=c, linestyle="--", alpha=0.8)
    ax.set_xlabel("KL(pi || pi_init) (kl/ref), nats per token")
    ax.set_ylabel("proxy: reward-model score (solid)")
    twin.set_ylabel("gold: sampled accuracy (dashed)")
    twin.set_ylim(0, 1)
    ax.set_title(f"label noise {noise:g} ({len(groups[0]['seeds'])} seeds, mean per step)")
    ax.legend(fontsize=7, loc="lower right")
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--out", required=True)
  p.add_argument("--noise", type=_floats, default=[0.0, 0.3], help="label-noise levels, comma-separated")
  p.add_argument("--kl", type=_floats, default=[0.0, 0.05, 0.2], help="KL coefficients, comma-separated")
  p.add_argument("--seeds", type=int, default=3)
  p.add_argument("--steps", type=int, default=40)
  p.add_argument("--eval-every", type=int, default=10)
  p.add_argument("--rm-steps", type=int, default=400)
  p.add_argument("--rm-seed", type=int, default=0, help="the reward models' config.seed (their init and batches)")
  p.add_argument("--jobs", type=int, default=1)
  args = p.parse_args(argv)
  out = os.path.abspath(args.out)
  os.makedirs(out, exist_ok=True)
  t0, load0 = time.time(), os.getloadavg()
  rms = train_reward_models(out, args.noise, args.rm_steps, args.rm_seed)
  run_lab(args, out)
  groups = curves(read_cells(out))
  result = {"command": " ".join(sys.argv), "wall_s": time.time() - t0, "loadavg_start": load0,
            "loadavg_end": os.getloadavg(),
            "reward_models": {k: {"eval_accuracy_end": v["eval_accuracy_end"], "label_noise": v["label_noise"]}
                              for k, v in rms.items()},
            "groups": groups}
  with open(os.path.join(out, "overoptimisation.json"), "w") as f:
    json.dump(result, f, indent=1)
  if groups:
    plot(groups, os.path.join(out, "overoptimisation.png"))
  for g in groups:
    print(f"noise {g['noise']:g} beta {g['kl_coef']:g}: KL end {np.mean(g['kl_end']):.3f}, proxy "
          f"{np.mean(g['proxy_start']):.2f} -> {np.mean(g['proxy_end']):.2f}, held-out gold "
          f"{np.mean(g['eval_start']) if g['eval_start'] else float('nan'):.3f} -> "
          f"{np.mean(g['eval_end']) if g['eval_end'] else float('nan'):.3f} +/- "
          f"{np.std(g['eval_end']) if g['eval_end'] else float('nan'):.3f}; sampled gold peak "
          f"{g['gold_smoothed_peak']:.3f} at step {g['gold_smoothed_peak_step']}, end {g['gold_smoothed_end']:.3f} "
          f"({g['gold_shape']})")
  print(f"wall {result['wall_s']:.0f} s; load {load0[0]:.1f} -> {result['loadavg_end'][0]:.1f}; "
        f"{os.path.join(out, 'overoptimisation.json')}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
