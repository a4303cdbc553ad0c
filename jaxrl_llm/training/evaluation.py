"""Greedy evaluation on the held-out split: pass@1 accuracy."""

from __future__ import annotations

import numpy as np

from jaxrl_llm.training.data import encode_prompts
from jaxrl_llm.training.rollout import sample, sampling_config


def greedy_accuracy(params, model_cfg, examples, tokenizer, runner, rollout_cfg, *, max_prompt_len: int,
                    chat_template: bool, key, batch_size: int = 256, batch_sharding=None,
                    pad_to: int = 1) -> dict:
  """Greedy-decodes every example and scores it with the verifier."""
  scfg = sampling_config(rollout_cfg, tokenizer, greedy=True)
  correct, lengths, truncated = [], [], []
  bs = min(batch_size, len(examples))
  bs = -(-bs // pad_to) * pad_to  # a multiple of the batch shards; one compiled shape
  for s in range(0, len(examples), bs):
    chunk = list(examples[s:s + bs])
    n_real = len(chunk)
    chunk += [chunk[-1]] * (bs - n_real)
    pb = encode_prompts(tokenizer, chunk, max_prompt_len, chat_template)
    smp = sample(params, model_cfg, pb, scfg, key, tokenizer, batch_sharding)
    rb = runner(smp.prompts[:n_real], smp.responses[:n_real], smp.answers[:n_real])
    correct.append(rb.correct_B)
    lengths.append(smp.length_B[:n_real])
    truncated.append(smp.truncated_B[:n_real])
  c, ln, tr = np.concatenate(correct), np.concatenate(lengths), np.concatenate(truncated)
  return {"accuracy": float(c.mean()), "response_length": float(ln.mean()),
          "truncated_frac": float(tr.mean()), "n": int(len(c))}
