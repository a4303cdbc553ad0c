"""The compile-only run's report: JSON for scripts, a markdown table for people, one line per misfit.

Its labels say what the figures are: a program's forecast is a roofline lower bound on its time,
the step's tokens per second an upper bound (tpu/forecast.py), MFU only where compute binds.
"""

from __future__ import annotations

import dataclasses

from jaxrl_llm.tpu.chips import Chip
from jaxrl_llm.tpu.forecast import ProgramReport

GIB = 1 << 30
LABEL = ("compiler forecast (XLA:TPU cost and memory analyses, rooflines with a latency floor): a lower bound "
         "on time and an upper bound on tokens/s, not a measurement; the host's share of a step is not in it")
MULTI_HOST = "multi-controller run verified with several processes on CPU, not on a pod"


def as_json(head: dict, reports: list[ProgramReport], step: dict, chip: Chip) -> dict:
  return {**head, "chip": dataclasses.asdict(chip), "step": step,
          "programs": [{**dataclasses.asdict(r), "fits": r.fits, "total_bytes": r.total_bytes, "mfu": r.mfu,
                        "hbm_roofline_ratio": r.hbm_roofline_ratio}
                       for r in reports],
          "label": LABEL}


def _ms(s: float) -> str:
  return f"{s * 1e3:.3f}" if s < 1e-3 else f"{s * 1e3:,.1f}" if s < 10 else f"{s * 1e3:,.0f}"


def _pct(x: float | None) -> str:
  return "n/a" if x is None else f"{x:.0%}"


def fits_text(fits: bool, hosts: int) -> str:
  """"yes" / "no", and for a slice of several hosts what of the run is verified."""
  return ("yes" if fits else "no") + (f" ({MULTI_HOST})" if hosts > 1 else "")


def plan_markdown(head: dict, reports: list[ProgramReport], step: dict, chip: Chip) -> str:
  lines = [f"### {head['model']} on {head['topology']} ({head['chips']} chips of {chip.generation}, "
           f"mesh {head['mesh']}), {head['method']}",
           "",
           f"{head['shapes']}; {head['dtypes']}. Compiler forecast, per device: a roofline "
           "lower bound on time (the largest of compute, memory, collectives and latency), not a measurement; "
           "MFU only where compute binds.",
           "",
           "| program | calls/step | HBM per device (GiB) | fits | compute ms | memory ms | collectives ms | "
           "latency ms | lower bound ms | bound | MFU | Mosaic kernels | collectives |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in reports:
    s = r.seconds
    colls = ", ".join(f"{k} {v}" for k, v in sorted(r.collectives.items())) or "none"
    lines.append(
        f"| {r.name} | {r.calls_per_step:g} | {r.total_bytes / GIB:.2f} of {r.hbm_bytes / GIB:.0f} | "
        f"{'yes' if r.fits else '**no**'} | {_ms(s['compute'])} | {_ms(s['memory'])} | {_ms(s['collectives'])} | "
        f"{_ms(s['latency'])} | {_ms(s['forecast'])} | {r.bound} | {_pct(r.mfu)} | {r.mosaic_kernels} | {colls} |")
  for r in reports:
    if r.hbm_roofline_ratio is not None:
      lines.append(f"\n{r.name}: {r.seconds['forecast'] / max(1, head['response_len'] - 1) * 1e3:.2f} ms per step, "
                   f"{r.hbm_roofline_ratio:.2f}x its HBM roofline (the device's weights and KV cache read once per "
                   "step)")
      steps = r.cost.get("decode_steps", ())
      if steps:
        lines.append("where a step's bytes go, per device (outside the layers: embedding, head, sampling, from a "
                     "line through the 1- and 2-layer probes, which a small program's layout can bend below 0):")
      for d in steps:
        lines.append(f"- at {d['slots']:,} cache slots: {d['bytes'] / 1e9:.3f} GB, {head['layers']} layers x "
                     f"{d['per_layer_bytes'] / 1e6:.1f} MB, {d['outside_layers_bytes'] / 1e6:+.1f} MB outside them; "
                     f"the KV cache {d['kv_bytes'] / 1e9:.3f} GB, the weights {d['weights_bytes'] / 1e9:.3f} GB")
  secs, floor = step["seconds"], step["latency_floor_s"]
  t = lambda x: f"{x:.2f} s" if x >= 1 else f"{x * 1e3:.2f} ms"  # noqa: E731
  rl = step["tokens"] == "sampled"
  lines += ["", f"{'RL' if rl else 'Reward-model'} step forecast (roofline lower bound): **{t(secs)}**, its latency "
            f"floor {t(floor)}; at most {step['tokens_per_s_per_chip']:,.0f} {step['tokens']} tokens/s/chip (upper "
            f"bound); MFU {_pct(step['mfu'])}" + (f" (update alone {_pct(step['update_mfu'])})" if rl else "")
            + f"; bound by {step['bounding_stage']}; "
            f"fits: {fits_text(step['fits'], head.get('hosts', 1))}. Not in it: the host's share of a step "
            "(rewards, device_get, dispatch), which a compile-only plan does not measure."
            + (f" Only these programs were compiled (--programs): {', '.join(head['programs'])}; the step "
               "sums them alone." if head.get("programs") else "")]
  return "\n".join(lines)


def misfits(reports: list[ProgramReport], head: dict) -> list[str]:
  """One line per program that does not fit: what it needs, what the chip has, what to change."""
  out = []
  for r in reports:
    if r.fits:
      continue
    if r.error and not r.memory["peak"]:
      out.append(f"{r.name} on {head['topology']}: {r.error}")
      continue
    advice = ("raise mesh.fsdp (params and optimizer state split further)" if r.outside_bytes > r.memory["temp"]
              else "set sft.micro_batch_size (micro-batches of the warm start's step) or model.remat=full"
              if r.name == "sft"
              else "lower train.micro_batch_size or use model.remat=full" if r.name == "update"
              else "lower train.micro_batch_size, set train.pack_length or train.pack=off" if r.name == "update/packed"
              else "set (or lower) train.micro_batch_size or use model.remat=full" if r.name == "reward/train"
              else "lower train.micro_batch_size" if r.name in ("recompute", "recompute/packed")
              else "lower train.batch_size (the held-out step's rows)" if r.name == "reward/eval"
              else "lower eval.batch_size (the evaluation decodes min(eval.batch_size, eval.n_examples) rows at once)"
              if r.name.startswith("eval/")
              else "fewer rows per chip (more mesh.data / mesh.fsdp) or a shorter rollout.max_response_len")
    program = (f"{r.memory['peak'] / GIB:.2f} of temporaries, for which XLA:TPU refused it" if r.error
               else f"{r.memory['peak'] / GIB:.2f} program")
    out.append(f"{r.name} does not fit on {head['topology']}: needs {'at least ' if r.error else ''}"
               f"{r.total_bytes / GIB:.2f} GiB per device ({program} + {r.outside_bytes / GIB:.2f} held beside it), "
               f"the device has {r.hbm_bytes / GIB:.2f} GiB: {advice}, or add mesh.tensor")
  return out
