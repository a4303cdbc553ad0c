"""Evaluation on held-out examples: greedy pass@1, and sampled answers for pass@k.

The trainer's start and end evaluations and `python -m jaxrl_llm.evaluate`
both run `Evaluator`, so the greedy accuracy of a run's final checkpoint
equals the `eval_accuracy_end` the run logged: same batches, padding and key.
A run with an environment (`env` section) is evaluated on whole episodes, as
it trains: each example one episode (greedy turns), scored by its reward parts.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from jaxrl_llm import faults
from jaxrl_llm.sampling.config import RolloutConfig
from jaxrl_llm.sampling.engine import sample_batch
from jaxrl_llm.tasks.pipeline import encode_prompts
from jaxrl_llm.training.score import episode_rewards, verify_once

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
  episodes: object = None  # training/episodes.EpisodePlayer: each example is an episode of the run's environment
  batch_size: int = 256  # eval.batch_size: examples greedy-decoded at once

  def _sample(self, params, pb, chunk, scfg, key):
    """The samples of a chunk of examples (`pb` their PromptBatch): single-turn, or episodes, each
    example's n_samples consecutive."""
    if self.episodes is None:
      return sample_batch(params, self.model_cfg, pb, scfg, key, self.tokenizer, self.batch_sharding)
    mesh = self.batch_sharding.mesh if self.batch_sharding is not None else None
    rows = [ex for ex in chunk for _ in range(scfg.n_samples)]
    return self.episodes.play(params, self.model_cfg, rows, scfg, key, mesh=mesh)

  def _score(self, smp, keep: int):
    """RewardBatch-like (reward_B, correct_B) of the first `keep` samples."""
    if smp.episodic:
      return episode_rewards(smp.reward_parts[:keep], self.episodes.format_weight)
    reward_B, correct_B, _, _ = verify_once(self.runner, smp.prompts[:keep], smp.responses[:keep],
                                            smp.answers[:keep])
    return reward_B, correct_B

  def _batches(self, examples, batch_size: int):
    """(padded example chunk, number of real examples) of `batch_size` rows, one compiled shape."""
    bs = -(-min(batch_size, len(examples)) // self.pad_to) * self.pad_to
    for s in range(0, len(examples), bs):
      chunk = list(examples[s:s + bs])
      n_real = len(chunk)
      yield chunk + [chunk[-1]] * (bs - n_real), n_real

  def greedy_outcomes(self, params, examples):
    """Per example: (verifier score, reward, response length, truncated) of the greedy answer, in
    batches of `batch_size` examples."""
    scfg = self.rollout.sampling(self.tokenizer, greedy=True)
    cols = {"correct": [], "reward": [], "length": [], "truncated": []}
    for chunk, n_real in self._batches(examples, self.batch_size):
      faults.point("eval")
      pb = encode_prompts(self.tokenizer, chunk, self.max_prompt_len, self.chat_template)
      smp = self._sample(params, pb, chunk, scfg, jax.random.key(0))
      reward_B, correct_B = self._score(smp, n_real)
      cols["correct"].append(correct_B)
      cols["reward"].append(reward_B)
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
    return self.sampled(params, examples, n_samples, batch_prompts)[0]

  def sampled(self, params, examples, n_samples: int, batch_prompts: int = 64
              ) -> tuple[np.ndarray, list[tuple[str, ...]]]:
    """([P, n_samples] verifier scores, per prompt its n_samples response texts) of sampled answers
    (the run's temperature, top-k, top-p); the texts are what the verifier read."""
    scfg = dataclasses.replace(self.rollout.sampling(self.tokenizer), n_samples=n_samples, record_topk=0)
    key = jax.random.key(SAMPLE_KEY_SEED)
    rows, texts = [], []
    for i, (chunk, n_real) in enumerate(self._batches(examples, batch_prompts)):
      pb = encode_prompts(self.tokenizer, chunk, self.max_prompt_len, self.chat_template)
      smp = self._sample(params, pb, chunk, scfg, jax.random.fold_in(key, i))
      keep = n_real * n_samples
      _, correct_B = self._score(smp, keep)
      rows.append(correct_B.reshape(n_real, n_samples))
      texts += [tuple(smp.responses[p * n_samples:(p + 1) * n_samples]) for p in range(n_real)]
    return np.concatenate(rows), texts
