"""Compile every program of a run for a TPU topology and forecast it: fit, a lower bound on time, bound, MFU.

For each program (tpu/programs.py):

1. **The program as the run compiles it** (stacked layers, the run's
   micro-batches and shapes): its memory per chip against the chip's HBM,
   plus what the run holds outside it (the reference policy and staleness
   copies; the optimizer state while it samples), its Mosaic kernels and its
   collectives.
2. **Cost probes**: XLA counts a loop body once (tpu/analysis.py), so the
   program is compiled again with its layers unrolled at 1 and 2 layers, and
   the update at 1 and 2 micro-batches, and the costs are extended linearly
   to the run's L layers and micro-batches (`analysis.combine`). The decode
   loop's cost is one step (`sampling.loop.decode_step`) at two cache lengths,
   extended linearly in the cache length and summed over the loop's steps, at
   the cache length each segment of the loop reads (`loop.segment_lengths`):
   the forecast of a loop that runs every row to max_response_len tokens.
3. **Roofline**: per program and per device (tpu/chips.py: a 7x device is
   half a chip), compute = FLOPs / peak bf16, memory = bytes accessed / HBM
   bandwidth, collectives = each collective's bytes moved per device over the
   ICI links along the axes its group spans (tpu/ici.py), and latency = one
   program launch + its kernels in sequence x a kernel's launch + each
   collective's hops x the hop latency (`latency_floor`; the constants and
   their sources: tpu/chips.py). The forecast is the largest of the four
   (perfect overlap), and that one is the program's bound. An RL step is the
   sum of its programs times their calls per step.

The forecast is a **roofline lower bound** on a program's time (every FLOP at
peak, every byte at full bandwidth, everything overlapped), so tokens per
second from it are an **upper bound**. It leaves out the host's share of a
step (the rewards, `device_get`, Python's dispatch between the stages): a
compile-only plan has no measurement of it.

MFU = model FLOPs / (forecast seconds x devices x peak), model FLOPs as PaLM
counts them (appendix B): 6 x (weights the token passes) per trained token
plus 12 x layers x heads x head_dim x sequence for attention, 2 and 4 x those
for a forward-only token. Rematerialisation's extra forward is hardware work,
not model FLOPs. It is given only for a program bound by compute: bound by
memory, collectives or latency, its MFU would be the ratio of two unrelated
floors, not a forecast.

Every figure here is a compiler forecast for a chip this machine does not
have, not a measurement.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp


from jaxrl_llm.model import lora
from jaxrl_llm.sampling import loop as sampler_loop
from jaxrl_llm.tpu import analysis
from jaxrl_llm.tpu.chips import KERNEL_LAUNCH_S, PROGRAM_LAUNCH_S, Chip
from jaxrl_llm.tpu.ici import Links
from jaxrl_llm.tpu.programs import (Program, RunShapes, bytes_per_chip, in_dtype, lower_decode, lower_decode_step,
                                    opt_sds, param_sds, resized, with_shardings)


@dataclasses.dataclass
class ProgramReport:
  name: str
  note: str
  calls_per_step: float
  memory: dict  # bytes per chip: argument, output, temp, alias, generated_code, peak
  outside_bytes: int  # what the run holds on each chip beside the program's own buffers
  mosaic_kernels: int  # Mosaic custom calls in the compiled program
  collectives: dict  # kind -> count in the compiled program
  cost: dict  # one run of the program, per device: flops, transcendentals, bytes, collectives, kernels
  seconds: dict  # compute, memory, collectives, latency, forecast (the largest: a lower bound)
  bound: str  # compute | memory | collectives | latency
  model_flops: float  # seconds of PaLM's model FLOPs per device at peak
  compile_s: float  # seconds the full compile took here
  hbm_bytes: int  # the chip's
  hbm_bytes_per_s: float  # the chip's
  error: str = ""  # why the compiler refused the program (it then has no cost and does not fit)

  @property
  def total_bytes(self) -> int:
    return self.memory["peak"] + self.outside_bytes

  @property
  def fits(self) -> bool:
    return not self.error and self.total_bytes <= self.hbm_bytes

  @property
  def hbm_roofline_ratio(self) -> float | None:
    """A decode loop's forecast over the time to read its weights and KV cache once per step."""
    floor = self.cost.get("hbm_roofline_bytes")
    if not floor:
      return None
    return self.seconds["forecast"] / (floor / self.hbm_bytes_per_s)

  @property
  def mfu(self) -> float | None:
    """Model FLOPs over the forecast at peak, for a program bound by compute; None otherwise."""
    t = self.seconds["forecast"]
    return self.model_flops / t if self.bound == "compute" and t > 0 else None


def latency_floor(c: dict) -> float:
  """Seconds one run of a program takes however few its bytes and FLOPs: its launch, its kernels one
  after another, and its collectives' hops (tpu/chips.py's constants)."""
  return PROGRAM_LAUNCH_S + c.get("kernels", 0.0) * KERNEL_LAUNCH_S + c.get("collective_latency_s", 0.0)


def roofline(c: dict, chip: Chip) -> tuple[dict, str]:
  """A program's seconds per device by each floor, the largest as its forecast (a lower bound), and
  which one that is."""
  secs = {"compute": max(c["flops"], c.get("model_flops_floor", 0.0)) / chip.peak_bf16_flops,
          "memory": c["bytes"] / chip.hbm_bytes_per_s,
          "collectives": c["collective_s"],
          "latency": latency_floor(c)}
  bound = max(secs, key=secs.get)
  secs["forecast"] = secs[bound]
  return secs, bound


# ---------------------------------------------------------------- model FLOPs (PaLM)


def _matmul_params(mc) -> tuple[float, float]:
  """(weights a token passes in the layers, weights of the output head)."""
  D, H, N, K, F = mc.d_model, mc.head_dim, mc.n_heads, mc.n_kv_heads, mc.d_ff
  per_layer = D * N * H + 2 * D * K * H + N * H * D + 3 * D * F
  return mc.n_layers * per_layer, D * mc.vocab_size


def model_flops(mc, *, rows: int, seq: int, head_rows: int, train: bool, context: float | None = None) -> float:
  """PaLM's FLOPs of `rows` sequences of `seq` tokens through the layers, `head_rows` of them
  through the head; x3 for training. `context`: the keys a query sees (default seq)."""
  layers, head = _matmul_params(mc)
  ctx = seq if context is None else context
  attention = 4 * mc.n_layers * mc.n_heads * mc.head_dim * ctx  # QK^T and AV per token, forward
  fwd = rows * seq * (2 * layers + attention) + 2 * head * head_rows
  return 3 * fwd if train else fwd


def _program_model_flops(p: Program, shapes: RunShapes | Any, mc) -> float:
  if p.flops is not None:
    return p.flops(mc)
  P_, R = shapes.prompt_len, shapes.response_len
  cfg = shapes.cfg
  if p.name in ("update", "update/packed", "recompute/packed"):
    rows = cfg.micro_batch_size * p.loop
    train = p.name != "recompute/packed"
    if p.layout is None:
      return model_flops(mc, rows=rows, seq=P_ + R, head_rows=rows * R, train=train)
    S, n = p.layout  # n buffers of S slots per micro-batch (chunk)
    return model_flops(mc, rows=n * p.loop, seq=S, head_rows=rows * R, train=train)
  if p.name == "sft":
    b = cfg.sft.batch_size
    return model_flops(mc, rows=b, seq=P_ + R, head_rows=b * R, train=True)
  if p.name == "rollout/verify":  # the head's product over p.rows rows (sampling/verify.py's draws)
    return 2 * _matmul_params(mc)[1] * p.rows * R
  if p.name == "rollout/exact":  # the full-sequence forward of p.rows rows (sampling/exact.py)
    return model_flops(mc, rows=p.rows, seq=P_ + R, head_rows=p.rows * R, train=False)
  if p.name == "recompute":
    rows = cfg.micro_batch_size
    return model_flops(mc, rows=rows, seq=P_ + R, head_rows=rows * R, train=False)
  if p.name == "teacher":  # programs.lower_teacher: the teacher over its context + R, the student over P + R,
    # and KL(p || q) reading both heads again (vocab_cross); the top-k pass a third time the teacher's
    from jaxrl_llm.tpu.programs import HINT_TOKENS  # pylint: disable=import-outside-toplevel

    rows, t = min(cfg.micro_batch_size, shapes.rows), cfg.teacher
    C = P_ + (HINT_TOKENS if t.context == "hint" else 0)
    _, head = _matmul_params(mc)
    heads_again = (2 + (1 if t.topk else 0)) * 2 * head * rows * R
    return (model_flops(mc, rows=rows, seq=C + R, head_rows=rows * R, train=False)
            + model_flops(mc, rows=rows, seq=P_ + R, head_rows=rows * R, train=False) + heads_again)
  if p.kind == "prefill":
    return model_flops(mc, rows=p.rows, seq=P_, head_rows=p.rows, train=False)
  # decode: every row, every step, one token against the cache so far (mean context P + R / 2)
  rows = p.rows * p.sampling.n_samples
  return R * model_flops(mc, rows=rows, seq=1, head_rows=rows, train=False, context=P_ + R / 2)


# ---------------------------------------------------------------- compiling


def _probe_cfgs(mc):
  """The model at 1 and 2 layers (Gemma 3's layer kinds: its first two)."""
  out = {}
  for n in (1, 2):
    fields = {"n_layers": n}
    if getattr(mc, "layer_types", None):
      fields["layer_types"] = tuple(mc.layer_types[:n])
    out[n] = mc.replace(**fields)
  return out


def _mosaic_count(hlo: str) -> int:
  return sum('custom_call_target="tpu_custom_call"' in line for line in hlo.splitlines())


def _collective_counts(hlo: str, n: int) -> dict:
  counts: dict[str, int] = {}
  for c in analysis.collectives(hlo, n):
    counts[c["kind"]] = counts.get(c["kind"], 0) + 1
  return counts


def _decode_cost(p: Program, shapes: RunShapes, probe_prefills: dict, links: Links, full_state) -> dict:
  """The decode loop's cost: decode_step probes at 1 and 2 layers x two cache lengths, extended
  linearly to L layers and summed over the loop's steps at each segment's cache length. Adds
  `hbm_roofline_bytes`: what each step must read at least, the chip's share of the weights (in the
  sampler's dtype and layout) and of the KV cache the step's segment attends over, summed."""
  scfg, mc = p.sampling, shapes.model_cfg
  P_, R = shapes.prompt_len, scfg.max_new_tokens
  S = scfg.cache_slots(P_)
  lengths = sampler_loop.segment_lengths(P_, R, S)
  lo, hi = lengths[0], S
  if lo == hi:
    lo = max(P_ + 1, hi // 2)
  probes = {}
  for n, pmc in _probe_cfgs(mc).items():
    state = probe_prefills[n]
    params = param_sds(pmc, shapes.mesh, unstacked=True)
    params = p.params_view(params) if p.params_view else params
    for j, length in ((1, lo), (2, hi)):
      compiled = lower_decode_step(shapes, scfg, pmc, params, resized(state, length)).compile()
      probes[(n, j)] = analysis.cost(compiled, links)
  total = {k: 0.0 for k in probes[(1, 1)]}
  # Step t (1 <= t < R) runs in the first segment whose cache reaches slot P + t - 1 (loop.decode).
  steps_at = {}
  for t in range(1, R):
    length = next(x for x in lengths if P_ + t - 1 < x)
    steps_at[length] = steps_at.get(length, 0) + 1
  at_lo = analysis.combine({(1, 1): probes[(1, 1)], (2, 1): probes[(2, 1)]}, mc.n_layers, 1)
  at_hi = analysis.combine({(1, 1): probes[(1, 2)], (2, 1): probes[(2, 2)]}, mc.n_layers, 1)
  weights = param_sds(mc, shapes.mesh)
  weights = bytes_per_chip(p.params_view(weights) if p.params_view else in_dtype(weights, scfg.dtype))
  kv_full = bytes_per_chip([full_state.cache.k_BKHS, full_state.cache.v_BKSH])  # at S slots
  total["hbm_roofline_bytes"] = 0.0
  # Where a step's bytes go, at the shortest and the full cache: the layers' (per layer, from the
  # probes' difference) and the rest (embedding, head, sampling), beside the KV cache and weights.
  total["decode_steps"] = [
      {"slots": length, "bytes": c["bytes"], "per_layer_bytes": two["bytes"] - one["bytes"],
       "outside_layers_bytes": 2 * one["bytes"] - two["bytes"], "kv_bytes": kv_full * length / S,
       "weights_bytes": weights}
      for length, c, one, two in ((lo, at_lo, probes[(1, 1)], probes[(2, 1)]),
                                  (hi, at_hi, probes[(1, 2)], probes[(2, 2)]))]
  for length, count in steps_at.items():
    frac = (length - lo) / (hi - lo)  # linear in the cache length between the two probes
    c = {k: at_lo[k] + frac * (at_hi[k] - at_lo[k]) for k in at_lo}
    for k in c:
      total[k] += count * c[k]
    total["hbm_roofline_bytes"] += count * (weights + kv_full * length / S)
  return total


def forecast_programs(shapes: RunShapes | Any, programs: list[Program], chip: Chip, *, probes: bool = True,
                      log=print) -> list[ProgramReport]:
  """Compiles each program for the mesh's devices (and its cost probes), -> one report each. `shapes`:
  an RL run's RunShapes or a reward-model run's RewardShapes (tpu/reward_programs.py)."""
  mc, mesh = shapes.model_cfg, shapes.mesh
  n_dev = mesh.devices.size
  links = Links.of(mesh.devices.flat, chip)
  params = param_sds(mc, mesh)
  opt = opt_sds(shapes.tx, lora.trainable(params), mesh)
  p_bytes, o_bytes = bytes_per_chip(params), bytes_per_chip(opt)
  copies = shapes.param_copies  # pi_ref, lagged samplers
  copy_bytes = bytes_per_chip(lora.trainable(params))  # a snapshot copies what trains (learn/learner.snapshot)
  reports, full_prefill, probe_prefill = [], {}, {}
  for p in programs:
    t0 = time.time()
    log(f"compiling {p.name} ({p.note}) ...")
    view = p.params_view or (lambda x: x)
    # Held beside the program: the other copies of the params always; the optimizer state except in
    # the programs that take it (update, sft: their own optimizer state is an argument).
    # (The warm start runs before the RL optimizer state and the copies exist: nothing beside it.)
    outside = 0 if p.name == "sft" else copies * copy_bytes + (0 if p.kind == "update" else o_bytes)
    if p.params_view is not None:  # the sampler's copy is the argument; the policy's stays beside it
      outside += p_bytes
    if p.kind == "decode" and p.sampling not in full_prefill:
      reports.append(_refused(p, "not compiled: its prefill did not compile", 0, outside, chip, 0.0))
      log(f"  {p.name}: {reports[-1].error}")
      continue
    try:
      if p.kind == "decode":
        prefill = full_prefill[p.sampling]
        state = with_shardings(prefill.out_info, prefill.output_shardings)
        compiled = lower_decode(shapes, p.sampling, mc, view(params), state).compile()
      else:
        compiled = p.lower(mc, view(params), p.loop).compile()
        if p.kind == "prefill":
          full_prefill[p.sampling] = compiled
    except jax.errors.JaxRuntimeError as e:
      # XLA:TPU refuses a program whose temporaries exceed the chip's HBM: a misfit to report, not a crash.
      oom = analysis.out_of_hbm(str(e))
      if oom is None:
        raise
      reports.append(_refused(p, "XLA:TPU ran out of HBM compiling it", oom[0], outside, chip, time.time() - t0))
      log(f"  {p.name}: {reports[-1].error} ({oom[0] / 2**30:.2f} GiB of temporaries per chip)")
      continue
    compile_s = time.time() - t0
    hlo = compiled.as_text()
    mem = analysis.memory(compiled)
    cost = analysis.cost(compiled, links)
    if probes:
      pcfgs = _probe_cfgs(mc)
      if p.kind == "decode":
        cost = _decode_cost(p, shapes, probe_prefill[p.sampling], links, state)
      else:
        costs = {}
        u = p.loop_unit
        loops = (u, 2 * u) if p.kind == "update" and p.loop > 1 else (1,)
        for n, pmc in pcfgs.items():
          pparams = view(param_sds(pmc, mesh, unstacked=True))
          for m in loops:
            c = p.lower(pmc, pparams, m).compile()
            costs[(n, m)] = analysis.cost(c, links)
            if p.kind == "prefill" and m == 1:
              probe_prefill.setdefault(p.sampling, {})[n] = with_shardings(c.out_info, c.output_shardings)
        cost = analysis.combine(costs, mc.n_layers, p.loop, loops if len(loops) == 2 else (1, 2))
    flops = _program_model_flops(p, shapes, mc) / n_dev / chip.peak_bf16_flops
    if probes:
      # XLA may split a matmul into a loop of its own (a collective matmul over tensor), whose body it
      # counts once: the compute time is at least the model's FLOPs (and remat's extra forward).
      remat = 4 / 3 if (p.kind == "update" or p.name == "sft") and mc.remat == "full" else 1.0
      cost["model_flops_floor"] = flops * chip.peak_bf16_flops * remat
      secs, bound = roofline(cost, chip)
    else:  # fit only: one compile counts each loop body once, no forecast from it
      secs, bound = {"compute": 0.0, "memory": 0.0, "collectives": 0.0, "latency": 0.0, "forecast": 0.0}, \
          "not forecast"
    reports.append(ProgramReport(
        name=p.name, note=p.note, calls_per_step=p.calls_per_step, memory=mem, outside_bytes=int(outside),
        mosaic_kernels=_mosaic_count(hlo), collectives=_collective_counts(hlo, n_dev), cost=cost, seconds=secs,
        bound=bound, model_flops=flops, compile_s=time.time() - t0, hbm_bytes=chip.hbm_bytes,
        hbm_bytes_per_s=chip.hbm_bytes_per_s))
    log(f"  {p.name}: {mem['peak'] / 2**30:.2f} GiB peak per device, lower bound {secs['forecast'] * 1e3:.2f} ms "
        f"({bound}), compiled in {compile_s:.0f} s" + (f", {time.time() - t0 - compile_s:.0f} s of probes"
                                                       if probes else ""))
  return reports


def _refused(p: Program, why: str, need: int, outside: int, chip: Chip, compile_s: float) -> ProgramReport:
  """The report of a program the compiler refused: `need` bytes of temporaries per chip, no cost."""
  mem = {"argument": 0, "output": 0, "temp": need, "alias": 0, "generated_code": 0, "peak": need}
  zero = {"compute": 0.0, "memory": 0.0, "collectives": 0.0, "latency": 0.0, "forecast": 0.0}
  return ProgramReport(name=p.name, note=p.note, calls_per_step=p.calls_per_step, memory=mem,
                       outside_bytes=int(outside), mosaic_kernels=0, collectives={}, cost={}, seconds=zero,
                       bound="not compiled", model_flops=0.0, compile_s=compile_s, hbm_bytes=chip.hbm_bytes,
                       hbm_bytes_per_s=chip.hbm_bytes_per_s, error=why)


def step_summary(reports: list[ProgramReport], shapes: RunShapes | Any, chip: Chip) -> dict:
  """A step's forecast (an RL step's, or a reward-model run's): seconds (a roofline lower bound), tokens
  per second per chip (an upper bound; `shapes.step_tokens`: sampled tokens, or trained ones), its
  latency floor, MFU (only when every program of the step is bound by compute: else None), the stage
  that bounds it."""
  chips = shapes.mesh.devices.size / chip.devices_per_chip
  in_step = [r for r in reports if r.calls_per_step]
  seconds = sum(r.calls_per_step * r.seconds["forecast"] for r in in_step)
  model_s = sum(r.calls_per_step * r.model_flops for r in in_step)  # model FLOPs / peak, per device
  by_stage = {r.name: r.calls_per_step * r.seconds["forecast"] for r in in_step}
  tokens, kind = shapes.step_tokens
  compute_bound = bool(in_step) and all(r.bound == "compute" for r in in_step)
  rate = tokens / seconds / chips if seconds else 0.0
  return {"seconds": seconds, "tokens_per_s_per_chip": rate, "tokens": kind,
          **({"sampled_tokens_per_s_per_chip": rate} if kind == "sampled" else {}),
          "latency_floor_s": sum(r.calls_per_step * r.seconds["latency"] for r in in_step),
          "mfu": model_s / seconds if seconds and compute_bound else None,
          "bounding_stage": max(by_stage, key=by_stage.get) if seconds else "not forecast",
          "stage_seconds": by_stage, "stage_bounds": {r.name: r.bound for r in in_step},
          "fits": all(r.fits for r in reports),
          "update_mfu": next((r.mfu for r in reports if r.name in ("update", "reward/train")), None)}
