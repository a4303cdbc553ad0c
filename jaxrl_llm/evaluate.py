"""Evaluation metrics for verifiable tasks, and the `evaluate` entry point.

The metrics are pure numpy functions of per-sample outcomes:
  pass@1_greedy:    mean over prompts of correct(greedy answer).
  pass@k (sampled): the unbiased estimator of Chen et al. (2021), eq. 1:
      pass@k = E_prompts[ 1 - C(n - c, k) / C(n, k) ]
    for n samples per prompt of which c are correct (k <= n).
  mean@k:           mean over prompts of c / n (the expected accuracy of one
    sampled answer, estimated from n samples).
  mean reward, mean response length (tokens), truncation rate (fraction of
  responses that hit the length limit before EOS).
"""

import dataclasses

import numpy as np


def pass_at_k_per_prompt(n: int, c_P: np.ndarray, k: int) -> np.ndarray:
  """Unbiased pass@k for each prompt with c_P correct out of n samples.

  1 - C(n-c, k) / C(n, k) = 1 - prod_{i=n-c+1}^{n} (1 - k / i), the product form
  avoids huge binomials. When n - c < k every draw of k holds a correct one.
  """
  c_P = np.asarray(c_P, dtype=np.int64)
  if not 1 <= k <= n:
    raise ValueError(f"k = {k}: expected 1 <= k <= n = {n} (samples per prompt)")
  if c_P.size and (c_P.min() < 0 or c_P.max() > n):
    raise ValueError(f"correct counts must lie in [0, n = {n}], got {c_P.min()}..{c_P.max()}")
  out = np.empty(c_P.shape, dtype=np.float64)
  for i, c in enumerate(c_P.reshape(-1)):
    if n - c < k:
      out.reshape(-1)[i] = 1.0
    else:
      out.reshape(-1)[i] = 1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1))
  return out


def pass_at_k(correct_PN: np.ndarray, k: int) -> float:
  """Mean unbiased pass@k from a [prompts, samples] boolean array."""
  correct_PN = np.asarray(correct_PN, dtype=bool)
  if correct_PN.ndim != 2:
    raise ValueError(f"correct_PN must be [prompts, samples], got shape {correct_PN.shape}")
  return float(pass_at_k_per_prompt(correct_PN.shape[1], correct_PN.sum(1), k).mean())


def mean_at_k(correct_PN: np.ndarray) -> float:
  """Mean over prompts of the fraction of correct samples."""
  return float(np.asarray(correct_PN, dtype=np.float64).mean(axis=1).mean())


def greedy_pass_at_1(correct_P: np.ndarray) -> float:
  return float(np.asarray(correct_P, dtype=np.float64).mean())


def truncation_rate(truncated_B: np.ndarray) -> float:
  return float(np.asarray(truncated_B, dtype=np.float64).mean())


@dataclasses.dataclass(frozen=True)
class EvalOutcomes:
  """Per-sample outcomes of one evaluation.

  greedy_correct_P: greedy answer correct, per prompt.
  greedy_reward_P, greedy_length_P, greedy_truncated_P: same responses.
  sampled_correct_PN: N sampled answers per prompt (None when not sampled).
  """

  greedy_correct_P: np.ndarray
  greedy_reward_P: np.ndarray
  greedy_length_P: np.ndarray
  greedy_truncated_P: np.ndarray
  sampled_correct_PN: np.ndarray | None = None


def summarize(o: EvalOutcomes, ks: tuple[int, ...] = ()) -> dict[str, float]:
  """The evaluation table: pass@1 (greedy), pass@k / mean@k, reward, length, truncation."""
  out = {
      "num_prompts": int(np.asarray(o.greedy_correct_P).shape[0]),
      "pass@1_greedy": greedy_pass_at_1(o.greedy_correct_P),
      "mean_reward": float(np.mean(o.greedy_reward_P)),
      "mean_response_length": float(np.mean(o.greedy_length_P)),
      "truncation_rate": truncation_rate(o.greedy_truncated_P),
  }
  if o.sampled_correct_PN is not None:
    n = np.asarray(o.sampled_correct_PN).shape[1]
    out[f"mean@{n}"] = mean_at_k(o.sampled_correct_PN)
    for k in ks:
      out[f"pass@{k}"] = pass_at_k(o.sampled_correct_PN, k)
  return out


# ---------------------------------------------------------------------------
# The entry point: evaluate saved checkpoints of a run.
#
#   python -m jaxrl_llm.evaluate --workdir=DIR [--step=N | --all_steps]
#       [--config=configs/x.py ...] [--data=held_out.jsonl] [--n_samples=8 --k=1,4,8]
#
# The run's own resolved config (<workdir>/config.json) is used unless
# --config is given. Greedy decoding follows the trainer's end-of-run eval
# (training/evaluation.py's Evaluator: same batches, padding and key), so pass@1_greedy of
# the final step equals the eval_accuracy_end it logged.

def load_run_config(workdir: str, config_override=None):
  """The RunConfig: from a --config ConfigDict, else the workdir's config.json."""
  import json  # pylint: disable=import-outside-toplevel
  import os  # pylint: disable=import-outside-toplevel

  from jaxrl_llm.training.config import from_config_dict  # pylint: disable=import-outside-toplevel
  from jaxrl_llm.training.provenance import complete  # pylint: disable=import-outside-toplevel
  if config_override is not None:
    return from_config_dict(config_override)
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    raise FileNotFoundError(
        f"no config.json in {workdir}: expected the workdir of a training run, "
        "or pass --config=configs/<method>.py")
  with open(path) as f:  # a workdir written before a key was renamed reads in the current layout
    return from_config_dict(complete(json.load(f)))


def evaluate_steps(workdir: str, steps=None, *, config_override=None, data_path: str = "",
                   n_samples: int = 0, ks: tuple[int, ...] = (), split: str = "eval", on_samples=None,
                   log=print) -> dict[int, dict]:
  """{step: summary} for the given steps (None: the newest intact step; "all": every step), on the
  run's `split` ("eval": held-out, "train": its training problems) or `data_path`'s rows.
  on_samples(step, examples, correct_PN, responses_PN): the sampled answers (n_samples > 0)."""
  import jax  # pylint: disable=import-outside-toplevel

  from jaxrl_llm.checkpointing import CheckpointManager  # pylint: disable=import-outside-toplevel
  from jaxrl_llm.checkpointing.init_params import checkpoint_dir  # pylint: disable=import-outside-toplevel
  from jaxrl_llm.model.build import make_model  # pylint: disable=import-outside-toplevel
  from jaxrl_llm.training import inputs  # pylint: disable=import-outside-toplevel
  for k in ks:
    if not 1 <= k <= n_samples:
      from jaxrl_llm.checks import ConfigError  # pylint: disable=import-outside-toplevel
      raise ConfigError(f"--k={k}: expected 1 <= k <= --n_samples={n_samples}")
  cfg = load_run_config(workdir, config_override)
  data = inputs.run_data(cfg)
  runner = inputs.make_reward_runner(data.cfg, data.task)
  # The restore target: the params' shapes and shardings (as the trainer initialises them, same key).
  k_model = jax.random.split(jax.random.key(cfg.seed), 3)[0]
  model_cfg, target = make_model(data.cfg.model, data.tokenizer, data.mesh, k_model)
  from jaxrl_llm.training.episodes import episode_player  # pylint: disable=import-outside-toplevel

  episodes = episode_player(data.cfg, data.task, data.tokenizer)  # a run with an environment: its episodes
  if on_samples is not None and episodes is not None:
    from jaxrl_llm.checks import ConfigError  # pylint: disable=import-outside-toplevel
    raise ConfigError(f"--pairs_out: {workdir} is a run of multi-turn episodes (env.name={cfg.env.name!r}), whose "
                      "samples are transcripts, not one response to pair; allowed: a single-turn run")
  evaluator = data.evaluator(model_cfg, runner, episodes)
  mngr = CheckpointManager(checkpoint_dir(workdir), model_config=model_cfg, read_only=True)
  if data_path:
    from jaxrl_llm.tasks.files import load_examples  # pylint: disable=import-outside-toplevel
    examples = load_examples(data_path, cfg.data.prompt_key, cfg.data.answer_key)
  else:
    examples = data.eval_examples if split == "eval" else data.train_examples
  todo = mngr.all_steps() if steps == "all" else [steps]
  out = {}
  for step in todo:
    found, params = mngr.restore_subtree("params", target, step)
    if step is None and found != mngr.latest_step():
      log(f"warning: the newest checkpoint (step {mngr.latest_step()}) is damaged; evaluated step {found}, "
          "the newest intact one")
    correct, reward, length, truncated = evaluator.greedy_outcomes(params, examples)
    sampled = None
    if n_samples:
      sampled, texts = evaluator.sampled(params, examples, n_samples)
      if on_samples is not None:
        on_samples(found, examples, sampled, texts)
    out[found] = summarize(EvalOutcomes(correct, reward, length, truncated, sampled), ks)
    log(f"step {found}: " + ", ".join(f"{k} {v:.4g}" for k, v in out[found].items()))
  runner.close()
  if episodes is not None:
    episodes.close()
  return out


def format_table(results: dict[int, dict]) -> str:
  cols = list(next(iter(results.values())))
  head = ["step"] + cols
  lines = [head] + [[str(s)] + [f"{r[c]:.4f}" if isinstance(r[c], float) else str(r[c])
                                for c in cols] for s, r in sorted(results.items())]
  widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
  return "\n".join("  ".join(x.rjust(w) for x, w in zip(row, widths)) for row in lines)


def main(argv):
  import json  # pylint: disable=import-outside-toplevel
  import os  # pylint: disable=import-outside-toplevel

  from absl import flags, logging  # pylint: disable=import-outside-toplevel
  del argv
  logging.set_verbosity(logging.WARNING)  # Orbax logs every restore at INFO
  from jaxrl_llm.model import distributed  # pylint: disable=import-outside-toplevel

  # A multi-process launch joins here, before any device is touched, as `python -m jaxrl_llm.train` does:
  # every process restores and evaluates its share of each checkpoint; process 0 writes the file.
  distributed.initialize()
  distributed.check_same_everywhere("code", distributed.code_fingerprint())
  f = flags.FLAGS
  if f.all_steps and f.step is not None:
    from jaxrl_llm.checks import ConfigError  # pylint: disable=import-outside-toplevel
    raise ConfigError("--step and --all_steps exclude each other: pick one")
  steps = "all" if f.all_steps else f.step
  ks = ()
  for k in f.k or ():
    if not k.strip().isdigit() or int(k) < 1:
      from jaxrl_llm.checks import bad  # pylint: disable=import-outside-toplevel
      raise bad("--k", ",".join(f.k), "a comma-separated list of ints >= 1 (each <= --n_samples), e.g. --k=1,4")
    ks += (int(k),)
  if f.split not in ("eval", "train"):
    from jaxrl_llm.checks import bad  # pylint: disable=import-outside-toplevel
    raise bad("--split", f.split, "eval (the held-out problems) or train (the run's training problems)")
  pairs = []
  if f.pairs_out:
    from jaxrl_llm.checks import ConfigError  # pylint: disable=import-outside-toplevel
    if f.n_samples < 2 or steps == "all" or f.pairs_per_prompt < 1:
      raise ConfigError(f"--pairs_out needs --n_samples >= 2 (got {f.n_samples}), one step (not --all_steps) and "
                        f"--pairs_per_prompt >= 1 (got {f.pairs_per_prompt})")

  def on_samples(step, examples, correct_PN, responses_PN):
    from jaxrl_llm.reward_model.data import policy_pairs  # pylint: disable=import-outside-toplevel

    pairs.extend(policy_pairs([ex.prompt for ex in examples], responses_PN, correct_PN,
                              per_prompt=f.pairs_per_prompt, seed=step))

  results = evaluate_steps(f.workdir, steps, config_override=f.config, data_path=f.data,
                           n_samples=f.n_samples, ks=ks, split=f.split,
                           on_samples=on_samples if f.pairs_out else None)
  print(format_table(results))
  out = f.out
  if not out:
    # Greedy-only and sampled evaluations of one step go to different files.
    suffix = f"_n{f.n_samples}" if f.n_samples else ""
    name = f"curve{suffix}.json" if steps == "all" else f"step_{next(iter(results))}{suffix}.json"
    out = os.path.join(f.workdir, "eval", name)
  if distributed.is_primary():
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as fh:
      json.dump({"workdir": f.workdir, "data": f.data or "held-out split",
                 "steps": {str(s): r for s, r in sorted(results.items())}}, fh, indent=2)
    print(f"written to {out}")
    if f.pairs_out:
      os.makedirs(os.path.dirname(os.path.abspath(f.pairs_out)), exist_ok=True)
      with open(f.pairs_out, "w") as fh:
        fh.writelines(json.dumps(row) + "\n" for row in pairs)
      print(f"{len(pairs)} preference pairs (verifier-labelled samples) written to {f.pairs_out}")


if __name__ == "__main__":
  from absl import app, flags  # pylint: disable=import-outside-toplevel
  from ml_collections import config_flags  # pylint: disable=import-outside-toplevel
  flags.DEFINE_string("workdir", None, "the run's workdir")
  flags.DEFINE_integer("step", None, "step to evaluate; default: the newest intact step")
  flags.DEFINE_bool("all_steps", False, "evaluate every saved step (a curve)")
  config_flags.DEFINE_config_file("config", None, "a configs/<method>.py file; default: "
                                  "the run's config.json", lock_config=True)
  flags.DEFINE_string("data", "", "a JSONL/parquet file of held-out rows; default: the "
                      "run's held-out split")
  flags.DEFINE_integer("n_samples", 0, "sampled answers per prompt for pass@k / mean@k; 0: greedy only")
  flags.DEFINE_list("k", [], "k values of pass@k (each <= n_samples)")
  flags.DEFINE_string("split", "eval", "the run's problems to evaluate: eval (held-out) or train")
  flags.DEFINE_string("pairs_out", "", "also write preference pairs {prompt, chosen, rejected} from the sampled "
                      "answers, the verifier's correct one chosen over an incorrect one, as JSONL for "
                      "python -m jaxrl_llm.reward_model --config.data.path=FILE (needs --n_samples >= 2)")
  flags.DEFINE_integer("pairs_per_prompt", 4, "with --pairs_out: at most this many pairs per prompt")
  flags.DEFINE_string("out", "", "output JSON; default <workdir>/eval/step_<N>.json or curve.json "
                      "(step_<N>_n<n_samples>.json with --n_samples)")
  flags.mark_flag_as_required("workdir")
  from jaxrl_llm import cli  # pylint: disable=import-outside-toplevel
  cli.define_debug_flag()
  cli.run(main)
