"""Iterated RLHF on the built-in task: RL against a reward model, the policy's own samples labelled by
the verifier, the reward model retrained on every pair so far, RL again.

    python scripts/rlhf_iterate.py --out runs/rlhf_iterate [--rounds 3] [--rl_steps 40] [--seed 0]

Round 0's reward model learns the built-in pairs (configs/reward_model.py: the correct sum over a carry
error). Each round r then
1. trains the policy from its warm start against RM_r (configs/rlhf_arithmetic.py: data.reward=model,
   the verifier as gold, greedy held-out accuracy every 10 steps);
2. samples the final policy's answers to the training problems (8 each) and keeps a correct answer over
   a wrong one of the same problem (`python -m jaxrl_llm.evaluate --pairs_out`: the verifier stands in
   for the human rater);
3. trains RM_{r+1} on the built-in pairs and every round's policy pairs so far, and scores it on the
   built-in held-out pairs and the policy's pairs of the held-out problems (sampled the same way).
Every RL round starts from the same warm start and seed: the rounds differ in their reward model only.
Writes <out>/iterate.json (each round's RM and RL summaries, its gold curve) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def _run(args: list[str], log: str) -> None:
  t0 = time.time()
  with open(log, "w") as f:
    proc = subprocess.run([sys.executable, "-m", *args], cwd=REPO, stdout=f, stderr=subprocess.STDOUT)
  if proc.returncode:
    raise SystemExit(f"{' '.join(args[:2])} failed (rc {proc.returncode}); its log: {log}")
  print(f"  {args[0]} done in {time.time() - t0:.0f} s ({os.path.basename(log)})", flush=True)


def _builtin_pairs(path: str, seed: int, split: str) -> int:
  """The round-0 reward model's pairs of `split` (configs/reward_model.py's built-in set), as JSONL rows."""
  from jaxrl_llm.reward_model.config import reward_config_from_dict  # pylint: disable=import-outside-toplevel
  from jaxrl_llm.reward_model.data import arithmetic_pairs  # pylint: disable=import-outside-toplevel
  from jaxrl_llm.reward_model.defaults import reward_model_config  # pylint: disable=import-outside-toplevel

  d = reward_config_from_dict(reward_model_config()).data
  pairs = arithmetic_pairs(split, d.n_train if split == "train" else d.n_eval, digits=d.digits, digits2=d.digits2,
                           ops=d.ops, seed=seed, eval_fraction=d.eval_fraction, label_noise=0.0)
  with open(path, "w") as f:
    for p in pairs:
      f.write(json.dumps({"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected}) + "\n")
  return len(pairs)


def _rows(workdir: str) -> list[dict]:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f if line.strip()]


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--out", required=True)
  ap.add_argument("--rounds", type=int, default=3, help="RL rounds (round r against RM_r)")
  ap.add_argument("--rl_steps", type=int, default=40)
  ap.add_argument("--seed", type=int, default=0)
  args = ap.parse_args()
  out = os.path.abspath(args.out)
  os.makedirs(out, exist_ok=True)
  pairs_all, held_all = os.path.join(out, "pairs_all.jsonl"), os.path.join(out, "heldout_all.jsonl")
  n_builtin = _builtin_pairs(pairs_all, args.seed, "train")
  _builtin_pairs(held_all, args.seed, "eval")
  rounds = []
  for r in range(args.rounds):
    print(f"round {r}", flush=True)
    rm, rl = os.path.join(out, f"rm{r}"), os.path.join(out, f"rl{r}")
    rm_args = ["jaxrl_llm.reward_model", "--config=configs/reward_model.py", f"--workdir={rm}",
               f"--config.seed={args.seed}", "--config.export=False"]
    if r:  # the built-in pairs and every round's policy pairs so far; held out: those of the held-out problems
      rm_args += [f"--config.data.path={pairs_all}", f"--config.data.eval_path={held_all}"]
    if not os.path.exists(os.path.join(rm, "summary.json")):
      _run(rm_args, rm + ".log")
    if not os.path.exists(os.path.join(rl, "summary.json")):
      _run(["jaxrl_llm.train", "--config=configs/rlhf_arithmetic.py", f"--config.data.reward_model={rm}",
            f"--config.train.steps={args.rl_steps}", f"--config.seed={args.seed}", "--config.log.progress=False",
            f"--workdir={rl}"], rl + ".log")
    new = {}
    for split, into in (("train", pairs_all), ("eval", held_all)):  # RM_{r+1}'s sets grow by this round's pairs
      pairs = os.path.join(out, f"pairs{r}_{split}.jsonl")
      if not os.path.exists(pairs):
        _run(["jaxrl_llm.evaluate", f"--workdir={rl}", f"--split={split}", "--n_samples=8", f"--pairs_out={pairs}",
              f"--out={os.path.join(out, f'eval_{split}{r}.json')}"], os.path.join(out, f"pairs{r}_{split}.log"))
      with open(pairs) as f:
        new[split] = f.read()
      with open(into, "a") as f:
        f.write(new[split])
    rm_s, rl_s = (json.load(open(os.path.join(d, "summary.json"))) for d in (rm, rl))
    rows = _rows(rl)
    rounds.append({
        "round": r, "rm_pairs": n_builtin + sum(x["policy_pairs"] for x in rounds) if r else n_builtin,
        "rm_heldout_accuracy": rm_s["eval_accuracy_end"],
        "gold_start": rl_s["eval_accuracy_start"], "gold_end": rl_s["eval_accuracy_end"],
        "gold_curve": [[row["step"], row["eval/accuracy"]] for row in rows if "eval/accuracy" in row],
        "proxy_first": rows[0]["reward/model_mean"], "proxy_last": rows[-1]["reward/model_mean"],
        "train_accuracy_first": rows[0]["reward/accuracy"], "train_accuracy_last": rows[-1]["reward/accuracy"],
        "kl_ref_last": rows[-1].get("kl/ref"), "policy_pairs": new["train"].count("\n"),
        "policy_pairs_heldout": new["eval"].count("\n")})
    print(json.dumps(rounds[-1]), flush=True)
  with open(os.path.join(out, "iterate.json"), "w") as f:
    json.dump({"args": vars(args), "rounds": rounds}, f, indent=1)
  print("\n| round | RM pairs | RM held-out acc | gold start -> end | proxy first -> last | policy pairs |")
  print("|---|---|---|---|---|---|")
  for x in rounds:
    print(f"| {x['round']} | {x['rm_pairs']} | {x['rm_heldout_accuracy']:.3f} | {x['gold_start']:.3f} -> "
          f"{x['gold_end']:.3f} | {x['proxy_first']:.2f} -> {x['proxy_last']:.2f} | {x['policy_pairs']} |")


if __name__ == "__main__":
  main()
