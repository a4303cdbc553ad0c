"""The token-weight inspector: one dumped step as a self-contained HTML page.

    python -m jaxrl_llm.inspect --workdir=runs/grpo-... --step=50 [--out=page.html]

reads <workdir>/dumps/step_50.{npz,json} (written by a run with
`--config.log.dump_steps=(50,)`, training/dump.py) and writes one HTML file
(default <workdir>/dumps/step_50.html) that needs no network: the CSS and
JS are inline and the step's data is embedded as compact JSON
(jaxrl_llm/rundir/inspect_page.py renders it). On it:

* each response as text, its tokens coloured by a chosen factor (W, T, f, A,
  lambda A W, log c, the teacher's gap, r, c, rho, lambda) with a legend;
* a tooltip per token with every factor the loss used for it (the dump's
  values), the teacher's signals and gates, and why it was masked or clipped;
* masked or clipped tokens marked, tokens outside the loss greyed, with the reason;
* for multi-turn episodes (an `env` run), the environment's tokens (tool results) in a grey
  box, uncoloured: context for the later turns, weight zero; and why each episode ended;
* per-sequence summaries (reward, advantage, c_i, length, finish reason);
* filters by group and reward, paging, and histograms of r, c and W;
* a pass selector when the step took several passes (train.epochs).
"""

from __future__ import annotations

from jaxrl_llm.checks import ConfigError
from jaxrl_llm.rundir import token_dump
from jaxrl_llm.rundir.inspect_page import write_page


def main(argv):
  from absl import app, flags

  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  fl = flags.FLAGS
  if not fl.workdir:
    raise ConfigError("--workdir=DIR is required: a run's directory holding dumps/ (log.dump_steps)")
  if fl.step is None:
    steps = token_dump.dumped_steps(fl.workdir)
    hint = f": the dumped steps are {', '.join(map(str, steps))}" if steps else ""
    raise ConfigError(f"--step=N is required{hint}")
  path = write_page(fl.workdir, fl.step, fl.out or None)
  print(path)


def _define_flags() -> None:
  from absl import flags

  from jaxrl_llm import cli

  flags.DEFINE_string("workdir", None, "a run's directory holding dumps/ (log.dump_steps)")
  flags.DEFINE_integer("step", None, "the dumped RL step to render")
  flags.DEFINE_string("out", None, "the HTML file to write; default <workdir>/dumps/step_N.html")
  cli.define_debug_flag()


if __name__ == "__main__":
  from jaxrl_llm import cli

  _define_flags()
  cli.run(main)
