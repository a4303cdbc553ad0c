"""Compile-only TPU plans: every program of a run through the real TPU compiler, from any machine.

topology.py (a topology's devices, libtpu checks), programs.py (the run's jitted programs as shapes),
analysis.py (memory, cost, collectives and kernels of a compiled program), chips.py (the chips'
per-device figures, the latency constants), ici.py (the links and hops of a collective's group),
forecast.py (probes, rooflines with a latency floor: a lower bound; MFU), plan_report.py (JSON, markdown,
misfits); the entry point is `python -m jaxrl_llm.compile`.
"""
