"""A character-level tokenizer for the built-in tasks.

It follows the tokenizer protocol the trainer relies on (the same surface a
Hugging Face tokenizer is adapted to): `encode(str) -> list[int]`,
`decode(ids) -> str`, `eos_id`, `pad_id`, `bos_id`, `vocab_size` and
`apply_chat_template(messages, add_generation_prompt=True) -> str`.
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Sequence

PAD, EOS, BOS = "<pad>", "<eos>", "<bos>"
# Every printable ASCII character plus newline: enough for arithmetic,
# countdown and plain-text prompts, small enough for a tiny model (V = 103).
_CHARS = string.digits + string.ascii_letters + string.punctuation + " \n"


class CharTokenizer:
  """One id per character; ids 0, 1, 2 are pad, eos and bos."""

  def __init__(self) -> None:
    self._itos = [PAD, EOS, BOS] + list(_CHARS)
    self._stoi = {c: i for i, c in enumerate(self._itos) if len(c) == 1}

  pad_id = 0
  eos_id = 1
  bos_id = 2

  @property
  def vocab_size(self) -> int:
    return len(self._itos)

  def encode(self, text: str) -> list[int]:
    try:
      return [self._stoi[c] for c in text]
    except KeyError as e:
      raise ValueError(
          f"CharTokenizer.encode: character {e.args[0]!r} in {text[:60]!r} is "
          f"not in the vocabulary (printable ASCII and newline)") from None

  def decode(self, ids: Iterable[int]) -> str:
    """Decodes ids, dropping pad/bos and stopping at the first eos."""
    out = []
    for i in ids:
      i = int(i)
      if i == self.eos_id:
        break
      if i in (self.pad_id, self.bos_id):
        continue
      if not 0 <= i < len(self._itos):
        raise ValueError(f"CharTokenizer.decode: id {i} outside [0, {len(self._itos)})")
      out.append(self._itos[i])
    return "".join(out)

  def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
    """Plain concatenation of the message contents.

    A tiny character model has no roles, so the template adds no markers: the
    task prompt itself ("12+45=") ends where the answer starts. The argument
    `add_generation_prompt` is accepted for protocol compatibility.
    """
    del add_generation_prompt
    for m in messages:
      if "content" not in m:
        raise ValueError(f"apply_chat_template: message {m!r} has no 'content'")
    return "".join(m["content"] for m in messages)
