"""Prompts and reference answers from a local JSONL or parquet file.

Each row must hold the configured prompt key and answer key (and the tag key
when one is configured: the example's task tag, which routes it to a teacher;
without a tag key every row is tagged with the task name, "file"); a row
missing one fails loading with an error naming the file and line (row for
parquet).
The eval split is a second file if given, else a seeded held-out share of the
rows.
"""

from __future__ import annotations

import dataclasses
import json
import os

from jaxrl_llm.tasks.base import Example, FormatFn, RewardFn
from jaxrl_llm.tasks.split import check_split, in_eval_split


def read_rows(path: str):
  """Yields (line or row number starting at 1, row dict) of a .jsonl / .json / .parquet file; a line that
  is not a JSON object is a ValueError naming the file and line."""
  if path.endswith(".jsonl") or path.endswith(".json"):
    with open(path, encoding="utf-8") as f:
      for lineno, line in enumerate(f, start=1):
        if not line.strip():
          continue
        try:
          row = json.loads(line)
        except json.JSONDecodeError as e:
          raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
        if not isinstance(row, dict):
          raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
        yield lineno, row
  elif path.endswith(".parquet"):
    try:
      import pyarrow.parquet as pq
    except ImportError:
      raise ImportError(f"reading {path} needs pyarrow: pip install pyarrow") from None
    for i, row in enumerate(pq.read_table(path).to_pylist(), start=1):
      yield i, row
  else:
    raise ValueError(f"data file {path!r}: extension must be .jsonl, .json or .parquet")


def load_examples(path: str, prompt_key: str, answer_key: str, tag_key: str = "",
                  default_tag: str = "file") -> list[Example]:
  """The rows as Examples; the tag is row[tag_key], or ``default_tag`` without a tag key."""
  if not os.path.exists(path):
    raise FileNotFoundError(f"data file {path!r} does not exist")
  out = []
  unit = "row" if path.endswith(".parquet") else "line"
  keys = (prompt_key, answer_key) + ((tag_key,) if tag_key else ())
  for n, row in read_rows(path):
    for key in keys:
      if row.get(key) is None:
        raise ValueError(f"{path}:{n}: {unit} {n} has no {key!r} key "
                         f"(keys present: {sorted(row)}); set data.prompt_key / data.answer_key / data.tag_key")
    tag = str(row[tag_key]) if tag_key else default_tag
    out.append(Example(prompt=str(row[prompt_key]), answer=str(row[answer_key]), tag=tag))
  if not out:
    raise ValueError(f"data file {path!r} holds no rows")
  return out


@dataclasses.dataclass(frozen=True)
class FileTask:
  path: str  # training rows (.jsonl or .parquet)
  reward_fn: RewardFn
  format_fn: FormatFn | None = None
  prompt_key: str = "prompt"
  answer_key: str = "answer"
  eval_path: str = ""  # held-out rows; empty: hold out eval_fraction of `path`
  tag_key: str = ""  # row key of the task tag; empty: every row is tagged `name`
  eval_fraction: float = 0.05
  seed: int = 0
  name: str = "file"

  def examples(self, split: str, n: int) -> list[Example]:
    check_split(split)
    if split == "eval" and self.eval_path:
      rows = load_examples(self.eval_path, self.prompt_key, self.answer_key, self.tag_key, self.name)
    else:
      rows = load_examples(self.path, self.prompt_key, self.answer_key, self.tag_key, self.name)
      if not self.eval_path:
        want_eval = split == "eval"
        rows = [r for r in rows if in_eval_split(r.prompt, self.seed, self.eval_fraction) == want_eval]
    if not rows:
      raise ValueError(f"split {split!r} of {self.path!r} is empty (eval_fraction={self.eval_fraction})")
    # Repeat rows to reach n for training; eval uses at most every row once.
    if split == "eval":
      return rows[:n]
    return [rows[i % len(rows)] for i in range(n)]
