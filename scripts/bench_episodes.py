"""Multi-turn rollouts with the KV cache kept between turns against encoding every turn's whole history.

    python scripts/bench_episodes.py --out episodes.json [--batch 32 --turns 4 --turn-tokens 32
        --obs-tokens 64 --rounds 3]

One workload, two ways of sampling its rounds (sampling/turns.py): `kept` (`KeptCache`, the
trainer's default, env.keep_cache) and `reprefill` (`sample_turns`, env.keep_cache=False). Each is
measured in a fresh child process (harness.spawn): a batch of episodes of `--turns` turns of at most
`--turn-tokens` sampled tokens, each turn followed by an observation of `--obs-tokens` tokens (so the
history to re-encode grows by turn + observation every round), played once to compile and then
`--rounds` times timed; the figure is the median episode batch's wall time and its tokens per second
(sampled tokens only). The model is qwen2_10m at random init (vocabulary 8192) with sampled ids kept
below 99 by a vocabulary limit, so the character tokenizer renders them; no turn ends early (no EOS,
no stop), so both sides do the same decode work. The JSON records both sides, their ratio, the turns
checked equal, and the machine's load around each child.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

SIDES = ("kept", "reprefill")


def worker(args) -> dict:
  import jax
  import numpy as np

  from jaxrl_llm.envs.base import Observation
  from jaxrl_llm.envs.episode import Episode, EpisodeLimits
  from jaxrl_llm.envs.render import PlainRenderer
  from jaxrl_llm.model import ModelConfig, init_params
  from jaxrl_llm.model.tokenizer import CharTokenizer
  from jaxrl_llm.sampling.config import SamplingConfig
  from jaxrl_llm.sampling.turns import KeptCache, sample_turns
  from jaxrl_llm.tasks.base import Example
  from jaxrl_llm.training.episodes import play

  tok = CharTokenizer()

  class Fixed:  # an observation of about obs_tokens characters after every turn, `turns` turns
    stop_strings = ()

    def reset(self, example):
      self.n = 0
      return [{"role": "user", "content": example.prompt}]

    def step(self, turn, *, truncated=False):
      self.n += 1
      if self.n == args.turns:
        return Observation((), {"correct": 0.0}, True, "answer")
      return Observation(({"role": "tool", "content": "x" * args.obs_tokens},), {}, False, "tool_result")

  cfg = ModelConfig.preset("qwen2_10m")
  params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.key(0))
  sampling = SamplingConfig(temperature=1.0, max_new_tokens=args.turn_tokens, pad_id=tok.pad_id, vocab_limit=tok.vocab_size)
  renderer = PlainRenderer(tok)
  limits = EpisodeLimits(max_turn_tokens=args.turn_tokens, max_context_tokens=64 + args.turns * (args.turn_tokens + args.obs_tokens + 16))
  examples = [Example(prompt=f"{i}+{i}=", answer="", tag="bench") for i in range(args.batch)]

  def one(key):
    episodes = [Episode(Fixed(), renderer, ex, limits) for ex in examples]
    if args.worker == "kept":
      kept = KeptCache(params, cfg, sampling)
      sample_round = lambda c, n, r: kept(c, n, jax.random.fold_in(key, r))  # noqa: E731
    else:
      sample_round = lambda c, n, r: sample_turns(params, cfg, c, n, sampling, jax.random.fold_in(key, r))  # noqa: E731
    t0 = time.perf_counter()
    played = play(episodes, sample_round)
    return time.perf_counter() - t0, played

  compile_s, _ = one(jax.random.key(0))
  times, played = [], None
  for r in range(args.rounds):
    dt, played = one(jax.random.key(1 + r))
    times.append(dt)
  sampled = sum(len(p.sampled) for p in played)
  history = [len(p.result.rendered.ids_T) for p in played]
  return {"side": args.worker, "first_s": compile_s, "times_s": times, "median_s": statistics.median(times),
          "sampled_tokens": sampled, "tokens_per_s": sampled / statistics.median(times),
          "episode_tokens_mean": float(np.mean(history)),
          "last_turns": [list(map(int, p.sampled[-args.turn_tokens:])) for p in played[:4]]}


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", required=True)
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--turns", type=int, default=4)
  p.add_argument("--turn-tokens", "--turn_tokens", type=int, default=32)
  p.add_argument("--obs-tokens", "--obs_tokens", type=int, default=64)
  p.add_argument("--rounds", type=int, default=3)
  p.add_argument("--worker", choices=SIDES, default=None)
  args = p.parse_args(argv)
  if args.worker:
    harness.emit(worker(args))
    return
  flags = ["--batch", str(args.batch), "--turns", str(args.turns), "--turn-tokens", str(args.turn_tokens),
           "--obs-tokens", str(args.obs_tokens), "--rounds", str(args.rounds), "--out", args.out]
  sides = {side: harness.spawn(__file__, flags, side) for side in SIDES}
  out = {"workload": {k: getattr(args, k) for k in ("batch", "turns", "turn_tokens", "obs_tokens", "rounds")},
         "model": 'ModelConfig.preset("qwen2_10m"), random init', "sides": sides,
         "speedup_kept_over_reprefill": sides["reprefill"]["median_s"] / sides["kept"]["median_s"],
         "same_turns": sides["kept"]["last_turns"] == sides["reprefill"]["last_turns"]}
  with open(args.out, "w") as f:
    json.dump(out, f, indent=1)
  print(f"kept {sides['kept']['median_s']:.2f} s, reprefill {sides['reprefill']['median_s']:.2f} s per batch of "
        f"{args.batch} episodes: {out['speedup_kept_over_reprefill']:.2f}x; same turns: {out['same_turns']}")


if __name__ == "__main__":
  main()
