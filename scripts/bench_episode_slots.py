"""Episodes per second: the lock-step rounds against the continuous batcher, written as JSON.

    python scripts/bench_episode_slots.py --workdir W --out F.json [--step S --slots 32 64 --chunk 8
        --batches 3]

W is the workdir of a run with an environment (configs/examples/arithmetic_calculator.py,
countdown_python.py); its checkpoint at --step (default: the newest) is the policy, so the turns
are those the run's policy writes. Each batch is one training step's episodes (rollout.prompts_per_step
x rollout.group_size) from the run's training problems, with the run's sampling settings and key
fold_in(key(0), batch). Sides, in one process on the same params, alternating batch by batch so that
a change in the machine's load falls on every side alike:

  lock_step      training/episodes.play: every round samples one turn for every episode of the batch
                 (its KV cache kept, env.keep_cache), then every environment steps (the default)
  slots_N        play_slots on N continuous slots (rollout.continuous_slots=N, --chunk decode steps
                 between looks): each episode holds a slot, its turns run as they come

--tool-latency-ms makes every environment step sleep first (a tool that answers slowly), --workers sets
env.workers. Each side plays one untimed batch first (compilation), then --batches timed ones. Every side must give
the same episodes (tokens, labels, statuses: the JSON's `same_episodes`); the figure is episodes per
second over the timed batches, with the machine's load before and after.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def _slowed(make_env, seconds: float):
  """make_env whose environments sleep `seconds` before each step."""
  def make():
    env = make_env()
    step = env.step

    def slow_step(*args, **kwargs):
      time.sleep(seconds)
      return step(*args, **kwargs)
    env.step = slow_step
    return env
  return make


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--workdir", required=True)
  p.add_argument("--out", required=True)
  p.add_argument("--step", type=int, default=None)
  p.add_argument("--slots", type=int, nargs="+", default=[32, 64])
  p.add_argument("--chunk", type=int, default=8)
  p.add_argument("--batches", type=int, default=3)
  p.add_argument("--tool-latency-ms", "--tool_latency_ms", type=float, default=0.0,
                 help="each environment step first sleeps this long (a tool that answers slowly: a sandbox, a "
                      "web call); 0: the environment as it is")
  p.add_argument("--workers", type=int, default=0, help="env.workers (step threads and tool workers); 0: the run's")
  args = p.parse_args(argv)

  import jax
  import numpy as np

  from jaxrl_llm.checkpointing import CheckpointManager
  from jaxrl_llm.checkpointing.init_params import checkpoint_dir
  from jaxrl_llm.evaluate import load_run_config
  from jaxrl_llm.model.build import make_model
  from jaxrl_llm.tasks.base import Example
  from jaxrl_llm.training import inputs
  from jaxrl_llm.training.episodes import EpisodePlayer

  cfg = load_run_config(args.workdir)
  if not cfg.env.active:
    raise SystemExit(f"bench_episode_slots: {args.workdir} is a single-turn run (env.name={cfg.env.name!r})")
  data = inputs.run_data(cfg)
  model_cfg, target = make_model(data.cfg.model, data.tokenizer, data.mesh,
                                 jax.random.split(jax.random.key(cfg.seed), 3)[0])
  mngr = CheckpointManager(checkpoint_dir(args.workdir), model_config=model_cfg, read_only=True)
  step, params = mngr.restore_subtree("params", target, args.step)
  scfg = data.cfg.rollout.sampling(data.tokenizer)
  G, P = data.cfg.rollout.group_size, data.cfg.rollout.prompts_per_step
  batches = []
  for i in range(args.batches + 1):
    rows = data.train_examples[(i * P) % len(data.train_examples):][:P]
    batches.append([Example(prompt=e.prompt, answer=e.answer, tag=e.tag) for e in rows for _ in range(G)])

  sides = {"lock_step": 0, **{f"slots_{n}": n for n in args.slots}}
  players = {}
  for side, n in sides.items():
    side_cfg = dataclasses.replace(data.cfg, rollout=dataclasses.replace(data.cfg.rollout, continuous_slots=n,
                                                                         decode_chunk=args.chunk))
    if args.workers:
      side_cfg = dataclasses.replace(side_cfg, env=dataclasses.replace(side_cfg.env, workers=args.workers))
    players[side] = EpisodePlayer(side_cfg, data.task, data.tokenizer)
    if args.tool_latency_ms:
      players[side].make_env = _slowed(players[side].make_env, args.tool_latency_ms / 1000)
  results = {side: {"seconds": [], "first_call_s": None} for side in sides}
  played = {side: [] for side in sides}
  load_before = harness.load()
  try:
    for i, examples in enumerate(batches):
      for side, player in players.items():
        t0 = time.perf_counter()
        batch = player.play(params, model_cfg, examples, scfg, jax.random.fold_in(jax.random.key(0), i),
                            mesh=data.mesh)
        seconds = time.perf_counter() - t0
        if i == 0:
          results[side]["first_call_s"] = seconds
        else:
          results[side]["seconds"].append(seconds)
        played[side].append(batch)
        print(f"batch {i} {side}: {seconds:.2f} s", flush=True)
  finally:
    for player in players.values():
      player.close()
  ref = played["lock_step"]
  same = {}
  for side in sides:
    same[side] = all(np.array_equal(a.tokens_BR, b.tokens_BR) and np.array_equal(a.mask_BR, b.mask_BR)
                     and np.array_equal(a.context_BR, b.context_BR) and a.statuses == b.statuses
                     for a, b in zip(played[side], ref))
  n_episodes = len(batches[0]) * args.batches
  for side, r in results.items():
    r["episodes_per_s"] = n_episodes / sum(r["seconds"])
  turns = [float((np.where(b.mask_BR, b.turn_BR, -1).max(axis=1) + 1).mean()) for b in ref]
  lengths = [int(b.mask_BR.sum()) for b in ref]
  out = {"workdir": os.path.abspath(args.workdir), "step": int(step), "config": cfg.name,
         "episodes_per_batch": len(batches[0]), "timed_batches": args.batches, "chunk": args.chunk,
         "tool_latency_ms": args.tool_latency_ms, "workers": args.workers or cfg.env.workers,
         "turns_per_episode": turns, "policy_tokens_per_batch": lengths,
         "statuses": {s: ref[-1].statuses.count(s) for s in sorted(set(ref[-1].statuses))},
         "sides": results, "same_episodes": same,
         "speedup_over_lock_step": {s: results["lock_step"]["seconds"] and
                                    sum(results["lock_step"]["seconds"]) / sum(r["seconds"])
                                    for s, r in results.items() if s != "lock_step"},
         "load_before": load_before, "load_after": harness.load()}
  with open(args.out, "w") as f:
    json.dump(out, f, indent=1)
  print(json.dumps({k: out[k] for k in ("speedup_over_lock_step", "same_episodes", "turns_per_episode")}))


if __name__ == "__main__":
  main()
