"""The method lab: which objective to pick under which sampler mismatch, measured.

`python -m jaxrl_llm.lab` (`__main__.py`, reference in docs/lab.md) runs a grid
of (method x mismatch x seed) cells, each a separate trainer run
(`python -m jaxrl_llm.train`) that starts from the SFT warm start of its seed,
computed once per seed and shared by every method and mismatch:

* `grid.py`: method specs (`icepop@band_high=2`), mismatch tokens (`int4+stale:1`),
  seeds, and the `--config.*` flags of each run;
* `runner.py`: the runs as subprocesses, at most `--jobs` at a time, resumable,
  failures recorded with their error;
* `results.py`: each cell's numbers from its metrics.jsonl and summary.json, and
  their aggregate over seeds (results.json, results.md);
* `plots.py`: the method x mismatch heatmap and the curves per mismatch.
"""
