"""How much mismatch each sampler setting makes: log c = log pi_prox - log mu on the built-in model.

The default run's model (configs/grpo.py: the tiny character model on 2-digit
addition, warm-started by its SFT) samples the same prompts under each
setting of the rollout's weight mismatch (sampling/mismatch.py) and dtype;
the f32 trainer recomputes log pi_prox of the sampled tokens, and
`mismatch_metrics` (what every RL step logs) summarises log c. The baseline
is the same sampler with no mismatch, in the same run.

    python scripts/mismatch_levels.py --out mismatch.json [--sft_steps 300] [--prompts 64]

JSON: {"settings": {name: {"rollout": {...}, "metrics": {...}}}, "sft_steps", "prompts", "group_size"}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import jax
import numpy as np

from jaxrl_llm.sampling.config import SamplingConfig
from jaxrl_llm.sampling.engine import JaxSampler
from jaxrl_llm.sampling.mismatch import SamplerMismatch, mismatch_metrics
from jaxrl_llm.training.config import from_config_dict
from jaxrl_llm.training.defaults import get_config
from jaxrl_llm.training.loop import Trainer
from jaxrl_llm.training.recompute import RecomputeSpec, policy_logprobs

# name -> (sampler dtype, SamplerMismatch)
SETTINGS = {
    "none": ("float32", SamplerMismatch()),
    "bf16": ("bfloat16", SamplerMismatch()),
    "int8_g32": ("float32", SamplerMismatch(quant="int8", quant_group=32)),
    "int4_g32": ("float32", SamplerMismatch(quant="int4", quant_group=32)),
    "int4_g128": ("float32", SamplerMismatch(quant="int4", quant_group=128)),
    "noise_0.01": ("float32", SamplerMismatch(noise=0.01)),
    "noise_0.05": ("float32", SamplerMismatch(noise=0.05)),
    "int4_g32+bf16": ("bfloat16", SamplerMismatch(quant="int4", quant_group=32)),
}


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", required=True, help="JSON file to write")
  ap.add_argument("--sft_steps", type=int, default=300, help="the warm start's SFT steps (the default run's: 300)")
  ap.add_argument("--prompts", type=int, default=64, help="prompts sampled (x rollout.group_size samples)")
  ap.add_argument("--seed", type=int, default=0)
  args = ap.parse_args()

  c = get_config("grpo")
  c.sft.steps, c.rollout.prompts_per_step, c.seed, c.log.progress = args.sft_steps, args.prompts, args.seed, False
  cfg = from_config_dict(c)
  with tempfile.TemporaryDirectory() as wd:
    tr = Trainer(cfg, wd, log=lambda s: None)
    t0 = time.time()
    state = tr.init_state(jax.random.key(cfg.seed))
    state, _ = tr.warm_start(state)
    print(f"warm start: {args.sft_steps} SFT steps in {time.time() - t0:.0f} s", file=sys.stderr)
    prompts = next(tr.pipeline)
    out = {}
    for name, (dtype, mismatch) in SETTINGS.items():
      scfg = SamplingConfig(**{**tr.sampling_cfg.__dict__, "dtype": None if dtype == "float32" else dtype})
      engine = JaxSampler(model_cfg=tr.model_cfg, sampling_cfg=scfg, tokenizer=tr.tokenizer,
                          batch_sharding=tr.batch_sharding, mismatch=mismatch)
      engine.sync(state.params, 0)
      smp = engine.generate(prompts, jax.random.key(cfg.seed + 1))
      spec = RecomputeSpec(model_cfg=tr.model_cfg, temperature=cfg.rollout.temperature, impl=cfg.kernels.impl,
                           chunk=cfg.micro_batch_size, sharding=tr.batch_sharding)
      prox, _ = policy_logprobs(state.params, smp, spec)
      m = mismatch_metrics(prox, np.asarray(jax.device_get(smp.behav_logp_BR)), smp.mask_BR)
      rollout = {"sampler_dtype": dtype,
                 "mismatch": {k: getattr(mismatch, k) for k in ("quant", "quant_group", "noise")}}
      out[name] = {"rollout": rollout, "metrics": m}
      print(f"{name:>14}: mean log c {m['mismatch/log_c_mean']:+.2e}  mean |log c| {m['mismatch/log_c_abs_mean']:.2e}"
            f"  q01 {m['mismatch/log_c_q01']:+.2e}  q99 {m['mismatch/log_c_q99']:+.2e}"
            f"  mean |log c_i| {m['mismatch/seq_abs_log_c_mean']:.2e}"
            f"  outside [0.5, 2] {m['mismatch/c_out_0.5_2_frac']:.4f}", file=sys.stderr)
    tr.runner.close()
  with open(args.out, "w") as f:
    json.dump({"settings": out, "sft_steps": args.sft_steps, "prompts": args.prompts,
               "group_size": cfg.rollout.group_size, "tokens": int(np.asarray(smp.mask_BR).sum()),
               "load_avg": os.getloadavg()}, f, indent=2)


if __name__ == "__main__":
  main()
