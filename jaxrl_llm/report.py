"""The run report: one PNG of the training curves, drawn from metrics.jsonl.

    python -m jaxrl_llm.report --workdir=runs/gspo-...            # -> <workdir>/report.png
    python -m jaxrl_llm.report --workdir=runs/a --workdir=runs/b  # overlay -> compare.png

Panels: reward, eval accuracy, KL to the reference, entropy, clip and mask
fractions, response length, each against the RL step; a panel with no
matching metric says so. The figure is drawn by jaxrl_llm/rundir/report_figure.py.
"""

from jaxrl_llm.rundir.report_figure import write_report


def main(argv):
  del argv
  from absl import flags  # pylint: disable=import-outside-toplevel
  out = write_report(flags.FLAGS.workdir, flags.FLAGS.out or None)
  print(f"report written to {out}")


if __name__ == "__main__":
  from absl import flags  # pylint: disable=import-outside-toplevel
  flags.DEFINE_multi_string("workdir", None, "run workdir(s); several are overlaid")
  flags.DEFINE_string("out", "", "output PNG; default <workdir>/report.png, or "
                      "compare.png in the common parent of several workdirs")
  flags.mark_flag_as_required("workdir")
  from jaxrl_llm import cli  # pylint: disable=import-outside-toplevel
  cli.define_debug_flag()
  cli.run(main)
