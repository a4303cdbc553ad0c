"""Evaluation on held-out examples: greedy pass@1, and sampled answers for pass@k.

The trainer's start and end evaluations and `python -m jaxrl_llm.evaluate`
both run `Evaluator`, so the greedy accuracy of a run's final checkpoint
equals the `eval_accuracy_end` the run logged: same batches, padding and key.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from jaxrl_llm import faults
from jaxrl_llm.sampling.config import RolloutConfig
from jaxrl_llm.sampling.engine import sample_batch
from jaxrl_llm.tasks.pipeline import encode_prompts

SAMPLE_KEY_SEED = 1  # PRNG seed of the sampled answers (greedy needs none)


@dataclasses.dataclass(frozen=True)
class Evaluator:
  model_cfg: object  # model.ModelConfig
  tokenizer: object
  runner: object  # tasks.rewards.RewardRunner
  rollout: RolloutConfig  # response length and (for sampled answers) the sampling settings
  max_prompt_len: int
  chat_template: bool
  batch_sharding: object = None
  pad_to: int = 1  # batches are a multiple of this (the mesh's batch shards)

  def _batches(self, examples, batch_size: int):
    """(padded example chunk, number of real examples) of `batch_size` rows, one compiled shape."""
    bs = -(-min(batch_size, len(examples)) // self.pad_to) * self.pad_to
    for s in range(0, len(examples), bs):
      chunk = list(examples[s:s + bs])
      n_real = len(chunk)
      yield chunk + [chunk[-1]] * (bs - n_real), n_real

  def greedy_outcomes(self, params, examples, batch_size: int = 256):
    """Per example: (verifier score, reward, response length, truncated) of the greedy answer."""
    scfg = self.rollout.sampling(self.tokenizer, greedy=True)
    cols = {"correct": [], "reward": [], "length": [], "truncated": []}
    for chunk, n_real in self._batches(examples, batch_size):
      faults.point("eval")
      pb = encode_prompts(self.tokenizer, chunk, self.max_prompt_len, self.chat_template)
      smp = sample_batch(params, self.model_cfg, pb, scfg, jax.random.key(0), self.tokenizer, self.batch_sharding)
      rb = self.runner(smp.prompts[:n_real], smp.responses[:n_real], smp.answers[:n_real])
      cols["correct"].append(rb.correct_B)
      cols["reward"].append(rb.reward_B)
      cols["length"].append(smp.length_B[:n_real])
      cols["truncated"].append(smp.truncated_B[:n_real])
    c = {k: np.concatenate(v) for k, v in cols.items()}
    # correct_B is the verifier's score in [0, 1]; the accuracy is its mean.
    return c["correct"], c["reward"], c["length"], c["truncated"]

  def greedy_accuracy(self, params, examples) -> dict:
    """Greedy-decodes every example and scores it with the verifier."""
    correct, _, length, truncated = self.greedy_outcomes(params, examples)
    return {"accuracy": float(correct.mean()), "response_length": float(length.mean()),
            "truncated_frac": float(truncated.mean()), "n": int(len(correct))}

  def sampled_correct(self, params, examples, n_samples: int, batch_prompts: int = 64) -> np.ndarray:
    """[P, n_samples] verifier scores of sampled answers (the run's temperature, top-k, top-p)."""
    scfg = dataclasses.replace(self.rollout.sampling(self.tokenizer), n_samples=n_samples, record_topk=0)
    key = jax.random.key(SAMPLE_KEY_SEED)
    rows = []
    for i, (chunk, n_real) in enumerate(self._batches(examples, batch_prompts)):
      pb = encode_prompts(self.tokenizer, chunk, self.max_prompt_len, self.chat_template)
      smp = sample_batch(params, self.model_cfg, pb, scfg, jax.random.fold_in(key, i), self.tokenizer,
                         self.batch_sharding)
      keep = n_real * n_samples
      rb = self.runner(smp.prompts[:keep], smp.responses[:keep], smp.answers[:keep])
      rows.append(rb.correct_B.reshape(n_real, n_samples))
    return np.concatenate(rows)
