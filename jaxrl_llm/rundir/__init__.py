"""What a run directory holds, and how each file is written and read back.

    <workdir>/metrics.jsonl      one JSON row per logged RL step        metrics.py: MetricsWriter, read_metrics
    <workdir>/tb/                the same rows as TensorBoard events    metrics.py: TensorBoardWriter
    <workdir>/summary.json       the run's end: evaluations, rewards    metrics.py: write_summary, load_run
    <workdir>/report.png         the training curves                    report_figure.py: write_report
    <workdir>/dumps/step_N.*     a step's token-weight dump             token_dump.py: write_dump, read_dump
    <workdir>/dumps/step_N.html  that step's inspector page             inspect_page.py, inspect_page.html

The trainer writes through these modules, the entry points (`python -m
jaxrl_llm.report`, `python -m jaxrl_llm.inspect`) and the lab read through
them. Nothing here imports the rest of the package, so any layer may use it.
(config.json, config_history.jsonl and checkpoints/ are training/provenance.py's
and checkpointing/'s.)
"""
