"""Preference pairs: rows {prompt, chosen, rejected[, margin]}, from a file or built in.

Rows follow TRL's preference convention: `chosen` and `rejected` are both
plain text or both chat message lists [{role, content}]; `prompt` (the same
kind, or absent: an implicit prompt inside each response) is shared; the
optional `margin` (a number) is that pair's Bradley-Terry margin, else
`train.margin`. A bad row (no chosen or rejected, a value of the wrong kind,
chosen identical to rejected, a margin that is not a number) is one
ConfigError naming the file, the line (row for parquet) and the field,
raised while the pairs load: before any workdir exists.

How a pair becomes two token sequences (`sequence_ids`), as TRL does:
plain text is [BOS] prompt response EOS (the prompt as the policy sees it:
BOS without a chat template, the user turn of the chat template with one);
messages are prompt + response messages rendered by the chat template,
with no EOS added (the template closes its turns). The response's tokens
(`PairArrays.response_N2T`, what DPO's log pi(y|x) sums) start after the
prompt's (`response_starts`).

The held-out split is `data.eval_path`, or the rows whose prompt (chosen
response when the prompt is implicit) hashes into `data.eval_fraction`
(tasks/split.py): every pair of one prompt is on one side.

The built-in sets are a task's problems with a known gold reward: chosen is
the correct answer, rejected a wrong one. `arithmetic_pairs` (data.task =
arithmetic): the wrong answer is a carry error, the policy's systematic
mistake (`wrong_answer`). `word_problem_pairs` (data.task = word_problems,
the SmolLM2 example's task): the wrong answer is the right operands under
another operation (`wrong_operation`), the mistake a small model makes when
it misreads the story. `data.label_noise` swaps that share of the training
pairs (seeded). The held-out pairs are never swapped, so held-out accuracy is
agreement with the gold reward.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxrl_llm.checks import ConfigError
from jaxrl_llm.tasks.arithmetic import ArithmeticTask, carry_free_sum
from jaxrl_llm.tasks.word_problems import WordProblemTask
from jaxrl_llm.tasks.files import read_rows
from jaxrl_llm.tasks.pipeline import prompt_text
from jaxrl_llm.tasks.split import SPLITS, check_split, in_eval_split

Text = str | tuple  # plain text, or a tuple of chat messages {role, content}


@dataclasses.dataclass(frozen=True)
class PreferencePair:
  prompt: Text  # "" for an implicit prompt
  chosen: Text  # the preferred response
  rejected: Text  # the other response
  margin: float | None = None  # this pair's margin; None: train.margin
  where: str = ""  # "file:line" (or "built-in") for error messages
  swapped: bool = False  # built-in set: label noise swapped chosen and rejected (chosen is the wrong answer)


@dataclasses.dataclass(frozen=True)
class PairArrays:
  """Pairs as arrays: row n holds pair n's chosen (slot 0) and rejected (slot 1) sequence."""

  tokens_N2T: np.ndarray  # int32 [N, 2, T] right-padded with the tokenizer's pad id
  mask_N2T: np.ndarray  # bool [N, 2, T] real tokens
  margin_N: np.ndarray  # f32 [N] Bradley-Terry margin per pair
  response_N2T: np.ndarray  # bool [N, 2, T] the response's tokens (EOS included): what DPO's log pi(y|x) sums

  def __len__(self) -> int:
    return self.tokens_N2T.shape[0]

  def take(self, idx: np.ndarray) -> "PairArrays":
    return PairArrays(self.tokens_N2T[idx], self.mask_N2T[idx], self.margin_N[idx], self.response_N2T[idx])


# ---- files ------------------------------------------------------------------------


def _kind(where: str, field: str, value: Any) -> str:
  """"text" or "messages", or a ConfigError naming the field."""
  if isinstance(value, str):
    return "text"
  if isinstance(value, (list, tuple)) and value and all(
      isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value):
    return "messages"
  shown = repr(value)[:60]
  raise ConfigError(f"{where}: field {field!r}={shown} is invalid: allowed a string or a non-empty list of "
                    "{role, content} messages")


def _freeze(value: Any) -> Text:
  return value if isinstance(value, str) else tuple({"role": m["role"], "content": m["content"]} for m in value)


def pair_from_row(row: dict, where: str) -> PreferencePair:
  """One row as a PreferencePair, or a ConfigError naming `where` ("file:line") and the field."""
  for key in ("chosen", "rejected"):
    if row.get(key) is None:
      raise ConfigError(f"{where}: field {key!r} is missing (keys present: {sorted(row)}); a preference row "
                        "holds chosen and rejected (and optionally prompt, margin)")
  kind = _kind(where, "chosen", row["chosen"])
  if _kind(where, "rejected", row["rejected"]) != kind:
    raise ConfigError(f"{where}: field 'rejected' is {'text' if kind == 'messages' else 'messages'} but "
                      f"'chosen' is {kind}: allowed both plain text or both message lists")
  prompt = row.get("prompt")
  if prompt is None or prompt == "" or prompt == []:
    prompt = ""
  elif _kind(where, "prompt", prompt) != kind:
    raise ConfigError(f"{where}: field 'prompt' is not {kind} like 'chosen' and 'rejected': allowed the same "
                      "kind for all three")
  if row["chosen"] == row["rejected"]:
    raise ConfigError(f"{where}: field 'rejected' equals 'chosen' ({repr(row['chosen'])[:60]}): a pair needs "
                      "two different responses")
  margin = row.get("margin")
  if margin is not None:
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not math.isfinite(margin):
      raise ConfigError(f"{where}: field 'margin'={margin!r} is invalid: allowed a finite number (or no margin key)")
    margin = float(margin)
  return PreferencePair(prompt=_freeze(prompt), chosen=_freeze(row["chosen"]), rejected=_freeze(row["rejected"]),
                        margin=margin, where=where)


def load_pairs(path: str) -> list[PreferencePair]:
  """Every row of a .jsonl / .json / .parquet file as a PreferencePair (errors name file, line, field)."""
  if not os.path.exists(path):
    raise FileNotFoundError(f"data file {path!r} does not exist")
  unit = "row" if path.endswith(".parquet") else "line"
  try:
    pairs = [pair_from_row(row, f"{path}:{n}" if unit == "line" else f"{path}: row {n}")
             for n, row in read_rows(path)]
  except ValueError as e:  # read_rows: not JSON, not an object, another extension
    if isinstance(e, ConfigError):
      raise
    raise ConfigError(str(e)) from None
  if not pairs:
    raise ConfigError(f"data file {path!r} holds no rows")
  return pairs


def split_key(pair: PreferencePair) -> str:
  """What the held-out split hashes: the prompt, or the chosen response for an implicit prompt."""
  value = pair.prompt if pair.prompt else pair.chosen
  return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def file_pairs(path: str, eval_path: str, split: str, *, seed: int, eval_fraction: float) -> list[PreferencePair]:
  """The `split` ("train" / "eval") pairs of a file (or of `eval_path` for "eval" when it is set)."""
  check_split(split)
  if split == "eval" and eval_path:
    return load_pairs(eval_path)
  pairs = load_pairs(path)
  if eval_path:
    return pairs
  out = [p for p in pairs if in_eval_split(split_key(p), seed, eval_fraction) == (split == "eval")]
  if not out:
    raise ConfigError(f"config.data.eval_fraction={eval_fraction!r} leaves the {split} split of {path!r} empty "
                      f"({len(pairs)} rows): allowed a share that keeps rows on both sides, or set data.eval_path")
  return out


# ---- pairs from the policy's own samples ------------------------------------------------


def policy_pairs(prompts: Sequence[str], responses_PN: Sequence[Sequence[str]], correct_PN: np.ndarray, *,
                 per_prompt: int, seed: int) -> list[dict]:
  """Preference rows {prompt, chosen, rejected} from a policy's samples, labelled by the verifier
  (the stand-in for a human rater): for each prompt row (a problem drawn twice is two rows, each
  with its own samples) with both a correct and an incorrect sample, up to `per_prompt` pairs of a correct response (chosen) against an incorrect one (rejected),
  drawn without repeating a (chosen, rejected) text pair, seeded. A reward model trained on them
  sees the mistakes this policy makes, not only the built-in set's. Prompts whose samples are all
  right or all wrong give no pair. `python -m jaxrl_llm.evaluate --pairs_out` writes them."""
  if per_prompt < 1:
    raise ValueError(f"policy_pairs: per_prompt={per_prompt}, expected >= 1")
  rng = np.random.default_rng(seed)
  rows = []
  for prompt, responses, correct in zip(prompts, responses_PN, np.asarray(correct_PN, bool)):
    good = sorted({r for r, c in zip(responses, correct) if c})
    bad = sorted({r for r, c in zip(responses, correct) if not c} - set(good))
    combos = [(g, b) for g in good for b in bad]
    for i in rng.permutation(len(combos))[:per_prompt]:
      rows.append({"prompt": prompt, "chosen": combos[i][0], "rejected": combos[i][1]})
  return rows


# ---- the built-in set ------------------------------------------------------------------


def wrong_answer(prompt: str, answer: str) -> str:
  """The policy's systematic mistake on "a<op>b=", a carry error (the arithmetic task's wrong
  demonstrations): "+" the carry-free sum, or where no carry is dropped a carry that is not there
  (answer + 10); "-" a forgotten borrow (answer + 10); "*" one multiplicand too many (answer + a, or
  answer + 10 for a = 0). For "+" and "-" it differs from the answer in the tens digit only: telling
  the two apart takes checking the carry, which a model learns as a rule in a few hundred steps (near
  misses in the units digit, a mod-10 sum table, take a fresh tiny model far longer)."""
  value = int(answer)
  a, op, b = _operands(prompt)
  if op == "+":
    wrong = carry_free_sum(a, b)
    return str(wrong if wrong != value else value + 10)
  if op == "*" and a:
    return str(value + a)
  return str(value + 10)


def _operands(prompt: str) -> tuple[int, str, int]:
  body = prompt.rstrip("=")
  for i in range(1, len(body)):
    if body[i] in "+-*":
      return int(body[:i]), body[i], int(body[i + 1:])
  raise ValueError(f"not an arithmetic prompt: {prompt!r}")


def _task_pairs(task, split: str, n: int, wrong, rng: np.random.Generator, label_noise: float) -> list[PreferencePair]:
  """`n` pairs of `task`'s `split`: chosen the answer, rejected `wrong(prompt, answer, rng)`; in the
  training split each pair swapped with probability `label_noise` (eval: each held-out problem at most
  once, never swapped)."""
  pairs = []
  for ex in task.examples(split, n):
    bad_answer = wrong(ex.prompt, ex.answer, rng)
    swap = split == "train" and rng.random() < label_noise
    chosen, rejected = (bad_answer, ex.answer) if swap else (ex.answer, bad_answer)
    pairs.append(PreferencePair(prompt=ex.prompt, chosen=chosen, rejected=rejected, where=f"built-in {task.name}",
                                swapped=swap))
  return pairs


def arithmetic_pairs(split: str, n: int, *, digits: int, digits2: int, ops: str, seed: int,
                     eval_fraction: float, label_noise: float) -> list[PreferencePair]:
  """`n` pairs of the arithmetic task's `split`, rejected a carry error (`wrong_answer`)."""
  task = ArithmeticTask(digits=digits, digits2=digits2, ops=ops, seed=seed, eval_fraction=eval_fraction)
  rng = np.random.default_rng([seed, SPLITS.index(split), 29])  # a stream of its own: the task's draws stay as they are
  return _task_pairs(task, split, n, lambda prompt, answer, _: wrong_answer(prompt, answer), rng, label_noise)


def wrong_operation(prompt: str, answer: str, rng: np.random.Generator) -> str:
  """A wrong answer to a word problem: its two numbers (in the order the story gives them) under
  another of +, -, *, // than the one it asks for, drawn by `rng` among those that are non-negative
  integers different from `answer`; answer + 1 where none is."""
  a, b = (int(x) for x in re.findall(r"\d+", prompt)[-2:])
  value = int(answer)
  others = sorted({a + b, a - b, a * b, a // b if b and a % b == 0 else -1} - {value})
  others = [x for x in others if x >= 0]
  return str(others[int(rng.integers(len(others)))] if others else value + 1)


def word_problem_pairs(split: str, n: int, *, max_number: int, seed: int, eval_fraction: float,
                       label_noise: float) -> list[PreferencePair]:
  """`n` pairs of the word-problem task's `split` (tasks/word_problems.py, the instruction format),
  rejected another operation's result (`wrong_operation`)."""
  task = WordProblemTask(max_number=max_number, seed=seed, eval_fraction=eval_fraction)
  rng = np.random.default_rng([seed, SPLITS.index(split), 31])
  return _task_pairs(task, split, n, wrong_operation, rng, label_noise)


# ---- tokens ---------------------------------------------------------------------------


def prompt_ids(tokenizer, prompt: str, chat_template: bool) -> list[int]:
  """A plain-text prompt's ids as the policy sees it: BOS + prompt, or the chat template's user turn
  (which opens with its own BOS); BOS alone for an implicit prompt ("")."""
  ids = tokenizer.encode(prompt_text(tokenizer, prompt, chat_template)) if prompt else []
  bos = getattr(tokenizer, "bos_id", None)
  if bos is not None and not (chat_template and prompt):
    ids = [bos] + ids
  return ids


def sequence_ids(tokenizer, prompt: Text, response: Text, chat_template: bool) -> list[int]:
  """The token ids of prompt + response, as the module docstring says."""
  if isinstance(response, str):
    return prompt_ids(tokenizer, prompt, chat_template) + tokenizer.encode(response) + [tokenizer.eos_id]
  messages = list(prompt or ()) + list(response)
  return tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=False))


def pair_ids(tokenizer, pairs: Sequence[PreferencePair], chat_template: bool) -> list[tuple[list[int], list[int]]]:
  """(chosen ids, rejected ids) per pair; a text the tokenizer cannot encode is a ConfigError naming the pair."""
  out = []
  for i, p in enumerate(pairs):
    try:
      out.append((sequence_ids(tokenizer, p.prompt, p.chosen, chat_template),
                  sequence_ids(tokenizer, p.prompt, p.rejected, chat_template)))
    except ValueError as e:
      raise ConfigError(f"{p.where or f'pair {i}'}: {e}") from None
  return out


def response_starts(tokenizer, pairs: Sequence[PreferencePair], ids: Sequence[tuple[list[int], list[int]]],
                    chat_template: bool) -> list[int]:
  """Per pair, the index of the response's first token in both sequences (at least 1: the first token
  has no prefix to be predicted from). Plain text with a prompt: the prompt's length (`prompt_ids`).
  Messages, or an implicit prompt: the length of the prefix the chosen and rejected ids share (TRL's
  prompt extraction), so a response's first tokens that equal the other's count as prompt; they score
  the same under every policy, so the DPO margin does not change, only the chosen and rejected rewards."""
  out = []
  for p, (c, r) in zip(pairs, ids):
    if isinstance(p.chosen, str) and p.prompt:
      n = len(prompt_ids(tokenizer, p.prompt, chat_template))
    else:
      n = next((i for i, (a, b) in enumerate(zip(c, r)) if a != b), min(len(c), len(r)))
    out.append(max(n, 1))
  return out


def longest(ids: Sequence[tuple[list[int], list[int]]], multiple: int = 8) -> int:
  """The longest sequence, rounded up to `multiple` (few distinct shapes: one compile per length)."""
  n = max((max(len(c), len(r)) for c, r in ids), default=1)
  return -(-n // multiple) * multiple


def encode_pairs(pairs: Sequence[PreferencePair], ids: Sequence[tuple[list[int], list[int]]], *, max_len: int,
                 pad_id: int, default_margin: float, starts: Sequence[int] | None = None) -> PairArrays:
  """Right-padded arrays of `ids` (from `pair_ids`); a sequence over `max_len` is a ConfigError naming its pair.
  `starts` (from `response_starts`): where each pair's response begins; None: at the second token."""
  N = len(pairs)
  tokens_N2T = np.full((N, 2, max_len), pad_id, np.int32)
  mask_N2T = np.zeros((N, 2, max_len), bool)
  response_N2T = np.zeros((N, 2, max_len), bool)
  for n, (p, sides) in enumerate(zip(pairs, ids)):
    for s, (field, seq) in enumerate(zip(("chosen", "rejected"), sides)):
      if len(seq) > max_len:
        raise ConfigError(f"{p.where or f'pair {n}'}: field {field!r} is {len(seq)} tokens with the prompt, more "
                          f"than config.data.max_len={max_len}: raise data.max_len (0: the longest pair)")
      tokens_N2T[n, s, :len(seq)] = seq
      mask_N2T[n, s, :len(seq)] = True
      response_N2T[n, s, (1 if starts is None else starts[n]):len(seq)] = True
  margin_N = np.array([default_margin if p.margin is None else p.margin for p in pairs], np.float32)
  return PairArrays(tokens_N2T, mask_N2T, margin_N, response_N2T)
