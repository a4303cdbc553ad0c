"""Compile-only TPU plans: every program of a run through the real TPU compiler, from any machine.

topology.py (a topology's devices, libtpu checks), programs.py (the run's jitted programs as shapes),
analysis.py (memory, cost and collectives of a compiled program), chips.py (the chips' constants),
forecast.py (probes, rooflines, MFU), report.py (JSON, markdown, misfits); the entry point is
`python -m jaxrl_llm.compile`.
"""
