"""The names the report and the lab read are names a real run writes.

Both read metrics.jsonl by name (rundir/report_figure.py's panels, lab/results.py's columns). The names are
taken from real short runs here and from those two modules' sources, so a renamed metric fails
this test instead of leaving an empty panel or a blank column.
"""

import inspect
import json
import re

import pytest
from run_helpers import load_config, make_trainer, shrink

from jaxrl_llm.lab import results as lab_results
from jaxrl_llm.rundir import report_figure as report
from jaxrl_llm.training.config import from_config_dict

# Two runs that between them log every family of metrics: GSPO (a trust region on r, a KL to the
# reference, an evaluation every step) and IcePop one step stale (a correction on c that masks
# tokens, and the sampler mismatch log c that a stale sampler makes).
RUNS = {
    "gspo": {"train.steps": 2, "eval.every": 1},
    "icepop": {"train.steps": 2, "rollout.staleness": 1},
}


# The module-scoped fixtures run once: the module's tests go to one pytest-xdist worker.
pytestmark = pytest.mark.xdist_group("training.test_metric_names")


@pytest.fixture(scope="module")
def written_names(tmp_path_factory) -> set[str]:
  names = set()
  for name, overrides in RUNS.items():
    workdir = tmp_path_factory.mktemp(name)
    tr = make_trainer(from_config_dict(shrink(load_config(name), **overrides)), workdir, lambda s: None)
    tr.run()
    with open(workdir / "metrics.jsonl") as f:
      for line in f:
        names |= set(json.loads(line))
  return names


def _literal(pattern: str) -> str | None:
  """The metric name an anchored pattern names exactly (`^kl/ref$` -> kl/ref), else None."""
  m = re.fullmatch(r"\^([a-z_]+/[a-z_@0-9]+)\$", pattern)
  return m.group(1) if m else None


@pytest.mark.slow
def test_every_panel_finds_the_names_the_trainer_writes(written_names):
  exact = [lit for p in report.PANELS for lit in map(_literal, p.patterns) if lit]
  assert len(exact) >= 8  # the panels name the trainer's metrics exactly, not only by loose patterns
  assert sorted(set(exact) - written_names) == []
  rows = [{k: 1.0 for k in written_names}]
  assert all(report.matching_keys(rows, p) for p in report.PANELS)  # no panel left empty


def test_every_name_the_lab_reads_is_written(written_names):
  read = set(re.findall(r'"([a-z_]+/[a-z_@0-9]+)"', inspect.getsource(lab_results)))
  assert {"reward/mean", "kl/ref", "eval/accuracy", "mismatch/log_c_abs_mean"} <= read  # the scan sees them
  assert sorted(read - written_names) == []
