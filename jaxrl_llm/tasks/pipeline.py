"""The prompt pipeline: a grain dataset of example indices, shuffled and
repeated, batched into left-padded token arrays.

The iterator state (one small dict) is part of the resumable run state, so a
restored run draws exactly the prompts it would have drawn.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import grain
import numpy as np

from jaxrl_llm.checks import ConfigError
from jaxrl_llm.tasks.base import Example


@dataclasses.dataclass(frozen=True)
class PromptBatch:
  tokens_BP: np.ndarray  # int32 [B, P], left-padded prompt tokens
  mask_BP: np.ndarray  # bool [B, P], true on real prompt tokens
  prompts: tuple[str, ...]  # [B] prompt texts, as the reward function sees them
  answers: tuple[str, ...]  # [B] reference answers
  tags: tuple[str, ...]  # [B] task tags (Example.tag): route samples to teachers


def prompt_text(tokenizer, prompt: str, chat_template: bool) -> str:
  if chat_template:
    return tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                         add_generation_prompt=True)
  return prompt


def encode_prompts(tokenizer, examples: Sequence[Example], max_prompt_len: int,
                   chat_template: bool = False) -> PromptBatch:
  """Tokenises and left-pads; a prompt longer than max_prompt_len is an error."""
  bos = getattr(tokenizer, "bos_id", None)
  B = len(examples)
  tokens_BP = np.full((B, max_prompt_len), tokenizer.pad_id, np.int32)
  mask_BP = np.zeros((B, max_prompt_len), bool)
  for b, ex in enumerate(examples):
    ids = tokenizer.encode(prompt_text(tokenizer, ex.prompt, chat_template))
    if bos is not None and not chat_template:
      ids = [bos] + ids
    if len(ids) > max_prompt_len:
      raise ValueError(f"prompt {ex.prompt[:60]!r} is {len(ids)} tokens, more than "
                       f"data.max_prompt_len={max_prompt_len}; raise data.max_prompt_len")
    if ids:
      tokens_BP[b, max_prompt_len - len(ids):] = ids
      mask_BP[b, max_prompt_len - len(ids):] = True
  return PromptBatch(tokens_BP, mask_BP, tuple(e.prompt for e in examples),
                     tuple(e.answer for e in examples), tuple(e.tag for e in examples))


def longest_prompt(tokenizer, examples: Sequence[Example], chat_template: bool) -> int:
  """Tokens of the longest prompt of `examples`, as `encode_prompts` writes them."""
  bos = getattr(tokenizer, "bos_id", None)
  extra = 1 if bos is not None and not chat_template else 0
  return max((len(tokenizer.encode(prompt_text(tokenizer, ex.prompt, chat_template))) + extra
              for ex in examples), default=1)


def resolve_prompt_len(max_prompt_len: int, tokenizer, examples: Sequence[Example], chat_template: bool,
                       multiple: int = 8) -> int:
  """`data.max_prompt_len` itself, or for 0 the longest prompt of `examples`
  rounded up to `multiple` (few distinct shapes: one compile per length)."""
  if max_prompt_len:
    return max_prompt_len
  return -(-longest_prompt(tokenizer, examples, chat_template) // multiple) * multiple


def check_prompts(tokenizer, examples: Sequence[Example], max_prompt_len: int, chat_template: bool,
                  what: str) -> None:
  """Every prompt of `examples` encodes (known characters, at most max_prompt_len tokens), or a
  ConfigError naming the first one that does not: found before any workdir or model exists."""
  for s in range(0, len(examples), 1024):
    for i, ex in enumerate(examples[s:s + 1024], start=s):
      try:
        encode_prompts(tokenizer, [ex], max_prompt_len, chat_template)
      except ValueError as e:
        raise ConfigError(f"{what} example {i} ({ex.prompt[:60]!r}): {e}") from None


class PromptPipeline:
  """Endless shuffled batches of `batch_size` prompts from `examples`."""

  def __init__(self, examples: Sequence[Example], tokenizer, *, batch_size: int,
               max_prompt_len: int, seed: int, chat_template: bool = False):
    if not examples:
      raise ValueError("PromptPipeline: no training examples")
    self.examples, self.tokenizer = list(examples), tokenizer
    self.max_prompt_len, self.chat_template = max_prompt_len, chat_template
    ds = (grain.MapDataset.source(np.arange(len(self.examples))).shuffle(seed=seed)
          .repeat().batch(batch_size, drop_remainder=True))
    self._it = iter(ds)

  def __iter__(self):
    return self

  def __next__(self) -> PromptBatch:
    idx = next(self._it)
    return encode_prompts(self.tokenizer, [self.examples[int(i)] for i in idx],
                          self.max_prompt_len, self.chat_template)

  def get_state(self) -> dict:
    return self._it.get_state()

  def set_state(self, state: dict) -> None:
    self._it.set_state(state)
