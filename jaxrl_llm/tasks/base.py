"""What a task hands the trainer: examples with a prompt, a reference answer
for the verifier, and (for built-in tasks) a demonstration for the SFT warm
start."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol

# reward_fn(prompt, response, answer) -> float. The response is the decoded
# text up to (not including) EOS.
RewardFn = Callable[[str, str, str], float]
# format_fn(response) -> bool: is the response in the expected final-answer format.
FormatFn = Callable[[str], bool]


@dataclasses.dataclass(frozen=True)
class Example:
  prompt: str  # text shown to the model (before the chat template)
  answer: str  # reference answer given to the reward function
  demo: str = ""  # demonstration response for the SFT warm start (may be wrong on purpose)
  tag: str = ""  # task tag (a built-in task's name, or a file row's data.tag_key): routes it to a teacher


class Task(Protocol):
  """A verifiable task: a source of examples plus how to score a response."""

  name: str
  reward_fn: RewardFn
  format_fn: FormatFn

  def examples(self, split: str, n: int) -> list[Example]:
    """`n` examples of `split` ('train' or 'eval'), deterministic in the task's seed."""
    ...
