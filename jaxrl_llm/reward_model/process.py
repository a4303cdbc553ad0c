"""Process reward models (PRMs): a score per reasoning step, trained from per-step labels.

Rows follow TRL's stepwise-supervision convention (PRMTrainer): {prompt,
completions, labels}, `completions` the steps of one solution (strings) and
`labels` one boolean per step (true: the step is good). A sequence is TRL's
tokenisation (`step_ids`):

    [BOS] prompt  step_1 sep  step_2 sep ... step_K sep

each step followed by `data.step_separator`'s tokens, and step k's label
sits on the LAST token of its separator; every other token carries none.
The prompt is the one the policy sees (with `data.chat_template`, the user
turn of the template; TRL's plain text without it), so the PRM scores RL
samples exactly as they were sampled (training/model_reward.py).

The model is the reward model's trunk and linear head (scorer.py), read at
every token: s_t = w_D . h_t, and P(step good) = sigmoid(s_t) at a step end.
The loss is the per-step binary cross-entropy of Lightman et al. (2023),
averaged over the labelled steps as TRL's token-classification loss is:

    L = sum_{n,t} w_n e_nt BCE(s_nt, y_nt) / sum_{n,t} w_n e_nt,
    BCE(s, y) = -[y log sigmoid(s) + (1 - y) log sigmoid(-s)]

with e_nt = 1 at a labelled step end (only the last step's with
`train.last_step_only`, TRL's train_on_last_step_only, held-out rows keep
every step) and w_n 1 for a real row, 0 for padding.

With `data.end_step` a solution has one more step, its end: the
tokenizer's EOS after the last separator,

    [BOS] prompt  step_1 sep ... step_K sep  EOS

labelled good when the solution is complete and every step good (the
outcome). A step's label says whether the answer can still be reached from
it, so every step of a solution that stops early is good, and a PRM without
an end step scores it as high as a whole right one: RL against its weakest
step learns to stop after one line (measured on the chained sums,
docs/benchmarks.md). The end step is read where the policy's EOS is
(training/model_reward.py). A file row says `complete` (default true); the
built-in set cuts `data.truncated_fraction` of its solutions after a random
step before the last.

The built-in set (`chain_rows`) is the chained-sum task's problems
(tasks/chain.py), half solved right and half with one carry error that
propagates (`data.step_errors="varied"`: a carry error, a units digit off,
or another number, a third each: a PRM that saw carry errors only cannot
tell a units-digit error from a right step, and RL against it learns to
write those, measured in docs/benchmarks.md); its gold labels are the
task's `step_labels`; `data.label_noise` flips that share of the training labels (seeded), never the held-out ones
(an end label follows its row's labels, flipped or not).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl_llm.checks import ConfigError
from jaxrl_llm.objectives.aggregation import WeightedSum
from jaxrl_llm.reward_model.data import prompt_ids
from jaxrl_llm.reward_model.loss import ECE_BINS
from jaxrl_llm.tasks.chain import ChainTask, step_labels, wrong_step
from jaxrl_llm.tasks.files import read_rows
from jaxrl_llm.tasks.split import SPLITS, check_split, in_eval_split


@dataclasses.dataclass(frozen=True)
class StepRow:
  prompt: str
  completions: tuple[str, ...]  # the steps, without separators
  labels: tuple[bool, ...]  # one per step: True = good
  where: str = ""  # "file:line" (or "built-in") for error messages
  complete: bool = True  # the solution reaches its final answer (False: stopped early); read with data.end_step

  def end_label(self) -> bool:
    """The end step's label (module docstring): complete, and every step good."""
    return self.complete and all(self.labels)


@dataclasses.dataclass(frozen=True)
class StepArrays:
  """Rows as arrays: tokens, and at each labelled step end its label."""

  tokens_NT: np.ndarray  # int32 [N, T] right-padded with the tokenizer's pad id
  mask_NT: np.ndarray  # bool [N, T] real tokens
  label_NT: np.ndarray  # f32 [N, T] 1 good / 0 bad at a step end, 0 elsewhere
  step_NT: np.ndarray  # bool [N, T] a labelled step end (the e of the module docstring)

  def __len__(self) -> int:
    return self.tokens_NT.shape[0]

  def take(self, idx: np.ndarray) -> "StepArrays":
    return StepArrays(self.tokens_NT[idx], self.mask_NT[idx], self.label_NT[idx], self.step_NT[idx])


# ---- rows ---------------------------------------------------------------------------


def row_from_dict(row: dict, where: str) -> StepRow:
  """One stepwise row, or a ConfigError naming `where` and the field."""
  for key in ("completions", "labels"):
    if row.get(key) is None:
      raise ConfigError(f"{where}: field {key!r} is missing (keys present: {sorted(row)}); a stepwise row holds "
                        "prompt, completions (the steps) and labels (one boolean per step)")
  prompt, steps, labels = row.get("prompt", ""), row["completions"], row["labels"]
  if not isinstance(prompt, str):
    raise ConfigError(f"{where}: field 'prompt'={repr(prompt)[:60]} is invalid: allowed a string")
  if not isinstance(steps, (list, tuple)) or not steps or not all(isinstance(s, str) and s for s in steps):
    raise ConfigError(f"{where}: field 'completions'={repr(steps)[:60]} is invalid: allowed a non-empty list of "
                      "non-empty strings (the steps)")
  if not isinstance(labels, (list, tuple)) or not all(isinstance(x, bool) or x in (0, 1) for x in labels):
    raise ConfigError(f"{where}: field 'labels'={repr(labels)[:60]} is invalid: allowed a list of booleans "
                      "(or 0 / 1), one per step")
  if len(labels) != len(steps):
    raise ConfigError(f"{where}: field 'labels' has {len(labels)} entries for {len(steps)} completions: allowed "
                      "one label per step")
  complete = row.get("complete", True)
  if not isinstance(complete, bool):
    raise ConfigError(f"{where}: field 'complete'={repr(complete)[:60]} is invalid: allowed true or false (the "
                      "solution reaches its final answer; read with data.end_step)")
  return StepRow(prompt=prompt, completions=tuple(steps), labels=tuple(bool(x) for x in labels), where=where,
                 complete=complete)


def load_rows(path: str) -> list[StepRow]:
  """Every row of a .jsonl / .json / .parquet file (errors name the file, line and field)."""
  if not os.path.exists(path):
    raise FileNotFoundError(f"data file {path!r} does not exist")
  unit = "row" if path.endswith(".parquet") else "line"
  try:
    rows = [row_from_dict(r, f"{path}:{n}" if unit == "line" else f"{path}: row {n}") for n, r in read_rows(path)]
  except ValueError as e:
    if isinstance(e, ConfigError):
      raise
    raise ConfigError(str(e)) from None
  if not rows:
    raise ConfigError(f"data file {path!r} holds no rows")
  return rows


def file_rows(path: str, eval_path: str, split: str, *, seed: int, eval_fraction: float) -> list[StepRow]:
  """The `split` rows of a file (or `eval_path` for "eval" when set), split by prompt."""
  check_split(split)
  if split == "eval" and eval_path:
    return load_rows(eval_path)
  rows = load_rows(path)
  if eval_path:
    return rows
  out = [r for r in rows if in_eval_split(r.prompt or r.completions[0], seed, eval_fraction) == (split == "eval")]
  if not out:
    raise ConfigError(f"config.data.eval_fraction={eval_fraction!r} leaves the {split} split of {path!r} empty "
                      f"({len(rows)} rows): allowed a share that keeps rows on both sides, or set data.eval_path")
  return out


def varied_wrong_step(acc: int, x: int, rng: np.random.Generator) -> int:
  """A wrong running sum for acc + x of one of three kinds, equally likely: the carry error
  (`wrong_step`), the units digit off by 1..9 either way, or another number in [0, 10 (acc + x) + 10)."""
  right = acc + x
  kind = int(rng.integers(3))
  if kind == 0:
    return wrong_step(acc, x)
  if kind == 1:
    d = int(rng.integers(1, 10))
    return right - d if right - d >= 0 and rng.random() < 0.5 else right + d
  wrong = int(rng.integers(0, 10 * right + 10))
  return wrong if wrong != right else right + 1


def chain_rows(split: str, n: int, *, n_terms: int, digits: int, seed: int, eval_fraction: float,
               label_noise: float, truncated_fraction: float = 0.0, step_errors: str = "carry") -> list[StepRow]:
  """`n` built-in rows of the chained-sum task's `split` (the module docstring): half of them wrong from
  a random step on, its mistake the carry error or (`step_errors="varied"`) `varied_wrong_step`'s;
  `truncated_fraction` of them cut to their first 1 .. n_terms - 2 steps (of n_terms - 1), incomplete.
  The varied mistakes and the cuts are drawn from streams of their own: with neither, the rows are
  those drawn without them."""
  task = ChainTask(n_terms=n_terms, digits=digits, seed=seed, eval_fraction=eval_fraction)
  rng = np.random.default_rng([seed, SPLITS.index(split), 31])
  cut_rng = np.random.default_rng([seed, SPLITS.index(split), 37])
  error_rng = np.random.default_rng([seed, SPLITS.index(split), 41])
  varied = functools.partial(varied_wrong_step, rng=error_rng)
  rows = []
  for ex in task.examples(split, n):
    wrong_at = int(rng.integers(n_terms - 1)) if rng.random() < 0.5 else None
    steps = task.solution(ex.prompt, wrong_at, wrong=varied if step_errors == "varied" else wrong_step)
    labels = step_labels(ex.prompt, steps)
    if split == "train" and label_noise:
      labels = [y != (rng.random() < label_noise) for y in labels]
    complete = True
    if truncated_fraction and cut_rng.random() < truncated_fraction:
      keep = int(cut_rng.integers(1, n_terms - 1))  # 1 .. n_terms - 2 steps of n_terms - 1
      steps, labels, complete = steps[:keep], labels[:keep], False
    rows.append(StepRow(prompt=ex.prompt, completions=tuple(steps), labels=tuple(labels), where="built-in chain",
                        complete=complete))
  return rows


# ---- tokens ---------------------------------------------------------------------------


def step_ids(tokenizer, row: StepRow, separator: str, chat_template: bool,
             end_step: bool = False) -> tuple[list[int], list[int]]:
  """(ids, step_end_positions) of a row, the module docstring's sequence; `end_step`: the EOS after the
  last step, its position the last of the list."""
  ids = prompt_ids(tokenizer, row.prompt, chat_template)
  sep = tokenizer.encode(separator)
  ends = []
  for step in row.completions:
    ids = ids + tokenizer.encode(step) + sep
    ends.append(len(ids) - 1)
  if end_step:
    ids = ids + [tokenizer.eos_id]
    ends.append(len(ids) - 1)
  return ids, ends


def row_labels(row: StepRow, end_step: bool) -> tuple[bool, ...]:
  """The labels at a row's step ends (step_ids): its steps', and with `end_step` its end label."""
  return row.labels + ((row.end_label(),) if end_step else ())


def encode_rows(rows: Sequence[StepRow], tokenizer, *, separator: str, chat_template: bool, max_len: int,
                last_step_only: bool = False, end_step: bool = False) -> StepArrays:
  """Right-padded arrays; max_len 0 takes the longest (a multiple of 8); longer is a ConfigError naming the row."""
  encoded = []
  for i, r in enumerate(rows):
    try:
      encoded.append(step_ids(tokenizer, r, separator, chat_template, end_step))
    except ValueError as e:
      raise ConfigError(f"{r.where or f'row {i}'}: {e}") from None
  T = max_len or -(-max(len(ids) for ids, _ in encoded) // 8) * 8
  N = len(rows)
  out = StepArrays(np.full((N, T), tokenizer.pad_id, np.int32), np.zeros((N, T), bool),
                   np.zeros((N, T), np.float32), np.zeros((N, T), bool))
  for n, (r, (ids, ends)) in enumerate(zip(rows, encoded)):
    if len(ids) > T:
      raise ConfigError(f"{r.where or f'row {n}'}: {len(ids)} tokens with the prompt and separators, more than "
                        f"config.data.max_len={T}: raise data.max_len (0: the longest row)")
    out.tokens_NT[n, :len(ids)] = ids
    out.mask_NT[n, :len(ids)] = True
    for k, (t, y) in enumerate(zip(ends, row_labels(r, end_step))):
      out.label_NT[n, t] = float(y)
      out.step_NT[n, t] = not last_step_only or k == len(ends) - 1
  return out


# ---- loss and metrics ---------------------------------------------------------------------


def process_bce_loss(s_NT: jax.Array, label_NT: jax.Array, step_NT: jax.Array, weight_N: jax.Array) -> WeightedSum:
  """The module docstring's L as (numerator, denominator)."""
  s = s_NT.astype(jnp.float32)
  y = label_NT.astype(jnp.float32)
  e = step_NT.astype(jnp.float32) * weight_N.astype(jnp.float32)[:, None]
  bce = -(y * jax.nn.log_sigmoid(s) + (1.0 - y) * jax.nn.log_sigmoid(-s))
  return WeightedSum(jnp.sum(e * bce), jnp.sum(e))


@struct.dataclass
class StepStats:
  """Weighted sums over labelled steps and over solutions; `summary` divides once.

  A step is predicted good when s > 0 (P > 1/2); calibration bins its
  confidence max(p, 1 - p) as PairStats does. A solution's earliest error
  is its first step labelled bad (none: all good); `first_error_accuracy`
  is the share of solutions whose predicted earliest error is the labelled
  one (ProcessBench's criterion, Zheng et al. 2024): the cumulative products
  of labels and of predictions agree at every step. ProcessBench reports it
  apart on the solutions with an error (`error_accuracy`: the earliest one
  found) and on those without (`correct_accuracy`: no error predicted), and
  their harmonic mean `processbench_f1` = 2 a_e a_c / (a_e + a_c) (0 when
  both are 0, or when a set is empty).
  """

  n: jax.Array  # [] labelled steps
  correct: jax.Array  # [] steps predicted right
  p_good: jax.Array  # [] sum of sigmoid(s) over the steps
  good: jax.Array  # [] steps labelled good
  solutions: jax.Array  # [] rows with a labelled step
  first_error: jax.Array  # [] rows whose earliest error is predicted right
  erroneous: jax.Array  # [] rows with a step labelled bad
  erroneous_found: jax.Array  # [] of those, rows whose earliest error is predicted right
  bin_n_K: jax.Array
  bin_conf_K: jax.Array
  bin_correct_K: jax.Array

  def __add__(self, other: "StepStats") -> "StepStats":
    return jax.tree.map(lambda a, b: a + b, self, other)

  def summary(self) -> dict[str, float]:
    s = jax.tree.map(lambda a: np.asarray(a, np.float64), self)
    n, m = float(s.n), float(s.solutions)
    if n == 0:
      return {"accuracy": 0.0, "p_good": 0.0, "good_share": 0.0, "first_error_accuracy": 0.0, "ece": 0.0,
              "error_accuracy": 0.0, "correct_accuracy": 0.0, "processbench_f1": 0.0}
    m_err, found_err = float(s.erroneous), float(s.erroneous_found)
    m_ok, found_ok = m - m_err, float(s.first_error) - found_err
    a_err, a_ok = found_err / max(m_err, 1.0), found_ok / max(m_ok, 1.0)
    return {"accuracy": float(s.correct) / n, "p_good": float(s.p_good) / n, "good_share": float(s.good) / n,
            "first_error_accuracy": float(s.first_error) / max(m, 1.0),
            "ece": float(np.sum(np.abs(s.bin_correct_K - s.bin_conf_K))) / n,
            "error_accuracy": a_err, "correct_accuracy": a_ok,
            "processbench_f1": 2 * a_err * a_ok / (a_err + a_ok) if a_err + a_ok > 0 else 0.0}


def step_stats(s_NT: jax.Array, label_NT: jax.Array, step_NT: jax.Array, weight_N: jax.Array,
               n_bins: int = ECE_BINS) -> StepStats:
  """The sums of `StepStats` for one batch."""
  s = s_NT.astype(jnp.float32)
  w_N = weight_N.astype(jnp.float32)
  e_NT = step_NT.astype(jnp.float32) * w_N[:, None]
  y_NT = label_NT.astype(jnp.float32)
  pred_NT = (s > 0).astype(jnp.float32)
  correct_NT = (pred_NT == y_NT).astype(jnp.float32)
  p_NT = jax.nn.sigmoid(s)
  conf_NT = jnp.maximum(p_NT, 1.0 - p_NT)
  bin_NT = jnp.clip(jnp.floor((conf_NT - 0.5) * 2.0 * n_bins), 0, n_bins - 1).astype(jnp.int32)
  onehot_NTK = jax.nn.one_hot(bin_NT, n_bins, dtype=jnp.float32) * e_NT[..., None]
  on_step = step_NT.astype(bool)
  gold_prefix = jnp.cumprod(jnp.where(on_step, y_NT, 1.0), axis=1)  # 1 until the first bad step
  pred_prefix = jnp.cumprod(jnp.where(on_step, pred_NT, 1.0), axis=1)
  agree_N = jnp.all(jnp.where(on_step, gold_prefix == pred_prefix, True), axis=1).astype(jnp.float32)
  has_N = jnp.any(on_step, axis=1).astype(jnp.float32) * w_N
  err_N = jnp.any(on_step & (y_NT < 0.5), axis=1).astype(jnp.float32) * has_N
  return StepStats(n=jnp.sum(e_NT), correct=jnp.sum(e_NT * correct_NT), p_good=jnp.sum(e_NT * p_NT),
                   good=jnp.sum(e_NT * y_NT), solutions=jnp.sum(has_N), first_error=jnp.sum(has_N * agree_N),
                   erroneous=jnp.sum(err_N), erroneous_found=jnp.sum(err_N * agree_N),
                   bin_n_K=jnp.sum(onehot_NTK, axis=(0, 1)),
                   bin_conf_K=jnp.einsum("NTK,NT->K", onehot_NTK, conf_NT),
                   bin_correct_K=jnp.einsum("NTK,NT->K", onehot_NTK, correct_NT))


# ---- the steps of a sampled response -----------------------------------------------------------

SOLUTION_REDUCES = ("min", "prod")  # data.process_reduce: a solution's score from its steps' P(good)


def _eos_ids(tokenizer) -> set[int]:
  return set(getattr(tokenizer, "eos_ids", ()) or (tokenizer.eos_id,))


def response_step_ends(tokens_R: np.ndarray, mask_R: np.ndarray, tokenizer, separator: str) -> np.ndarray:
  """bool [R]: where a sampled response's steps end, as `step_ids` places the labels: the token that
  completes each occurrence of `separator` in the decoded text, and, when text other than whitespace
  follows the last separator, the response's last sampled token before EOS (a final step left open).
  The text is the tokens decoded one by one (the policy's own tokens, not a re-encoding)."""
  out = np.zeros(tokens_R.shape, bool)
  eos = _eos_ids(tokenizer)
  text, last = "", -1
  for t in np.flatnonzero(mask_R):
    tok = int(tokens_R[t])
    if tok in eos:
      break
    start = max(0, len(text) - len(separator) + 1)  # an occurrence that ends inside this token's text
    text += tokenizer.decode([tok])
    out[t] = text.find(separator, start) >= 0
    last = t
  tail = text[text.rfind(separator) + len(separator):] if separator in text else text
  if last >= 0 and tail.strip():
    out[last] = True
  return out


def response_eos(tokens_R: np.ndarray, mask_R: np.ndarray, tokenizer) -> int | None:
  """The position of a sampled response's EOS (the end step of data.end_step), None when it has none."""
  eos = _eos_ids(tokenizer)
  at = [t for t in np.flatnonzero(mask_R) if int(tokens_R[t]) in eos]
  return int(at[0]) if at else None


def solution_score(p_K: np.ndarray, reduce: str) -> float:
  """A solution's score from its steps' P(good): the weakest step ("min", Wang et al. 2024's
  Math-Shepherd) or the chance that every step is good ("prod", Lightman et al. 2023). No step: 0."""
  if p_K.size == 0:
    return 0.0
  return float(np.min(p_K)) if reduce == "min" else float(np.prod(p_K.astype(np.float64)))
