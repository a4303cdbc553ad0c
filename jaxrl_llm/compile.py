"""Entry point: `python -m jaxrl_llm.compile --config=configs/gspo.py --topology=v5p:4x4x4
[--model=qwen3_8b | --model=path/to/config.json] [--config.some.key=value ...] [--out=DIR]`.

Compiles every program of the run the config describes (the sampler's
prefill and decode loop, the recomputes, the update, the SFT warm start, the
evaluation) with the real TPU compiler for the devices of a TPU topology,
from this machine, without a TPU (libtpu: `pip install -e ".[tpu-aot]"`),
and prints per program its HBM per device against the device's (the
compiler's own figure), its roofline forecast (a lower bound on its time,
with a latency floor) and the RL step's seconds (a lower bound), sampled
tokens/s per chip (an upper bound) and MFU where compute binds
(jaxrl_llm/tpu/). A v4 topology is refused in one line (libtpu makes a
device of each TensorCore; a v4 runs megacore). `--out` writes plan.json
and plan.md there. A program that does not fit ends the run with status 1
and one line naming it, what it needs, what the chip has and what to
change. The run is built as `train`
builds it: the mesh of `mesh.*` over the topology's chips, the model from
the config (or `--model`: a preset of model/config.py or a Hugging Face
config.json, shapes only, no weights), the method, the batch shapes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

# Compiling for a topology uses no TPU of this machine: jax's own backend stays the CPU.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from jaxrl_llm import cli  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "a configs/<method>.py file", lock_config=True)
_TOPOLOGY = flags.DEFINE_string("topology", None, "a TPU topology (v5e:2x4, v5p:4x4x4, ...) or accelerator type "
                                "(v5e-8, v5p-64)")
_MODEL = flags.DEFINE_string("model", "", "a model preset (model/config.py MODEL_PRESETS: qwen3_8b, ...) or a "
                             "Hugging Face config.json (or its folder); default: the config's model")
_OUT = flags.DEFINE_string("out", "", "a directory for plan.json and plan.md")
_NO_FORECAST = flags.DEFINE_bool("fit_only", False, "compile the run's programs only (memory, kernels, "
                                 "collectives), not the cost probes of the forecast")
_PROGRAMS = flags.DEFINE_string("programs", "", "compile only these programs: names or prefixes, comma-separated "
                                "(rollout, rollout/decode, recompute, update, reward, ...; a decode loop brings its "
                                "prefill); the step's forecast then sums only them. Default: every program")
cli.define_debug_flag()


def model_config(cfg, model: str, tokenizer):
  """The run's ModelConfig: `model` (a preset name or an HF config.json / folder) or the config's own,
  with the run's adapters (`model.lora`, model/lora.py)."""
  m = cfg.model
  base = _base_model_config(cfg, model, tokenizer)
  return base.replace(lora=m.lora) if m.lora.active else base


def _base_model_config(cfg, model: str, tokenizer):
  from jaxrl_llm.checks import ConfigError
  from jaxrl_llm.model.config import MODEL_PRESETS, ModelConfig
  from jaxrl_llm.model.io.hf_config import config_from_hf

  m = cfg.model
  numerics = dict(param_dtype=m.param_dtype, compute_dtype=m.compute_dtype,
                  remat=m.remat if m.remat != "auto" else "full",  # a real model: "auto" is "full"
                  attention_impl=m.attention_impl)
  if model in MODEL_PRESETS:
    return ModelConfig.preset(model, **numerics)
  path = model or m.hf_path
  if path:
    if os.path.isdir(path):
      path = os.path.join(path, "config.json")
    if not os.path.isfile(path):
      raise ConfigError(f"--model={model!r}: neither a preset ({', '.join(MODEL_PRESETS)}) nor a config.json")
    with open(path) as f:
      return config_from_hf(json.load(f), **numerics)
  return m.build(tokenizer.vocab_size)


def build_shapes(cfg, model: str, devices):
  """The run as `Trainer` builds it, as shapes over `devices` -> tpu.programs.RunShapes."""
  from jaxrl_llm.model import sharding as sharding_lib
  from jaxrl_llm.tpu.programs import RunShapes
  from jaxrl_llm.training import inputs
  from jaxrl_llm.training.config import AUTO_MICRO_BATCH_TOKENS
  from jaxrl_llm.training.optimizers import run_optimizers

  hf_path = cfg.model.hf_path
  if model:  # the shapes come from --model: the config's checkpoint folder is not read
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, hf_path=""))
  data = inputs.run_data(cfg, devices)
  cfg = data.cfg
  inputs.check_batch_shards(cfg, data.batch_shards)
  if model and not cfg.train.micro_batch_tokens:  # a real model's token budget, as for a checkpoint
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, micro_batch_tokens=AUTO_MICRO_BATCH_TOKENS))
  cfg = cfg.with_micro_batch(cfg.data.max_prompt_len, data.batch_shards)
  if model and hf_path:
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, hf_path=hf_path))
  model_cfg = model_config(cfg, model, data.tokenizer)
  sharding_lib.check_divisible(model_cfg, data.mesh)
  opts = run_optimizers(cfg)
  shards = data.batch_shards
  eval_rows = -(-min(cfg.eval.batch_size, len(data.eval_examples)) // shards) * shards  # Evaluator._batches
  return RunShapes(cfg=cfg, model_cfg=model_cfg, mesh=data.mesh, sampling=cfg.rollout.sampling(data.tokenizer),
                   eval_sampling=cfg.rollout.sampling(data.tokenizer, greedy=True), tx=opts.tx, vtx=opts.vtx,
                   eval_rows=eval_rows)


def is_reward_config(cd) -> bool:
  """A reward-model run's config (reward_model/defaults.py: `objective` is a name, not a section)."""
  return isinstance(cd.get("objective"), str)


def build_reward_shapes(cfg, model: str, devices):
  """The reward-model run as `RewardModelRun` builds it, as shapes over `devices` (its data read and
  encoded: their length T) -> tpu.reward_programs.RewardShapes."""
  from jaxrl_llm.checks import ConfigError
  from jaxrl_llm.model import sharding as sharding_lib
  from jaxrl_llm.reward_model.trainer import micro_batch_size, reward_data
  from jaxrl_llm.tpu.reward_programs import reward_shapes

  mesh = sharding_lib.make_mesh(cfg.mesh, devices)
  shards = sharding_lib.batch_shards(mesh)
  if micro_batch_size(cfg) % shards:  # as RewardModelRun checks it
    field = "micro_batch_size" if cfg.train.micro_batch_size else "batch_size"
    raise ConfigError(f"config.train.{field}={getattr(cfg.train, field)} must be a multiple of the {shards} batch "
                      "shards of the mesh (mesh.data x mesh.fsdp)")
  data = reward_data(cfg)
  model_cfg = model_config(cfg, model, data.tokenizer)
  sharding_lib.check_divisible(model_cfg, mesh)
  return reward_shapes(cfg, model_cfg, mesh, data)


def select_programs(programs: list, wanted: str) -> list:
  """The programs named (or prefixed) in the comma-separated `wanted` ("" for all), in run order; a
  decode loop brings the prefill whose cache it starts from."""
  from jaxrl_llm.checks import ConfigError

  names = [w.strip().rstrip("/") for w in wanted.split(",") if w.strip()]
  if not names:
    return programs
  hit = lambda p, w: p.name == w or p.name.startswith(w + "/")  # noqa: E731
  for w in names:
    if not any(hit(p, w) for p in programs):
      raise ConfigError(f"--programs={wanted!r}: {w!r} names no program of this run; its programs: "
                        f"{', '.join(p.name for p in programs)} (or a prefix: rollout, eval)")
  keep = {id(p) for p in programs if any(hit(p, w) for w in names)}
  keep |= {id(q) for p in programs if id(p) in keep and p.kind == "decode"
           for q in programs if q.kind == "prefill" and q.sampling is p.sampling}
  return [p for p in programs if id(p) in keep]


def plan(cfg, topology: str, model: str = "", *, probes: bool = True, programs: str = "", log=print):
  """-> (head, reports, step summary, chip) of `cfg` (an RL run's RunConfig or a reward-model run's
  RewardModelConfig) compiled for `topology` (`programs`: only those, `select_programs`)."""
  import jax

  from jaxrl_llm.checks import ConfigError
  from jaxrl_llm.model import param_shapes
  from jaxrl_llm.tpu import analysis, forecast
  from jaxrl_llm.tpu.chips import chip_for
  from jaxrl_llm.tpu.programs import run_programs
  from jaxrl_llm.tpu.topology import check_one_device_per_chip, topology_devices

  reward = not hasattr(cfg, "rollout")  # reward_model/config.py's RewardModelConfig

  devices, topo = topology_devices(topology)
  check_one_device_per_chip(devices, topology)
  chip = chip_for(devices[0].device_kind)
  if chip is None:
    raise ConfigError(f"--topology={topology!r}: its chips ({devices[0].device_kind}) are not in "
                      "jaxrl_llm/tpu/chips.py's table")
  hbm = analysis.compiler_hbm(devices[0])  # the fit check's HBM: the compiler's own, where it says
  if hbm:
    chip = dataclasses.replace(chip, hbm_bytes=hbm)
  if reward:
    from jaxrl_llm.tpu.reward_programs import reward_programs

    shapes = build_reward_shapes(cfg, model, devices)
    mc, c = shapes.model_cfg, shapes.cfg
    all_programs = reward_programs(shapes)
    run = {"method": f"{c.run_name} ({c.objective})", "rows": shapes.rows, "seq_len": shapes.seq_len,
           "micro_batch": shapes.micro_batch_size,
           "shapes": f"{shapes.rows} {'solutions' if c.process else 'pairs'} a step, {shapes.seq_len} tokens a "
                     "sequence"}
  else:
    shapes = build_shapes(cfg, model, devices)
    mc, c = shapes.model_cfg, shapes.cfg
    all_programs = run_programs(shapes)
    run = {"method": c.run_name, "prompts": c.rollout.prompts_per_step, "group": c.rollout.group_size,
           "prompt_len": shapes.prompt_len, "response_len": shapes.response_len,
           "micro_batch": c.micro_batch_size, "kernels_impl": c.kernels.impl,
           "shapes": f"Rollout: {c.rollout.prompts_per_step} prompts x {c.rollout.group_size} samples, "
                     f"{shapes.prompt_len} prompt + {shapes.response_len} response tokens"}
  head = {"topology": topo, "chips": len(devices) // chip.devices_per_chip, "devices": len(devices),
          "hosts": len({d.process_index for d in devices}),
          "mesh": "x".join(f"{k} {v}" for k, v in shapes.mesh.shape.items()),
          "model": model or (os.path.basename(c.model.hf_path.rstrip("/")) if c.model.hf_path else "config's model"),
          **run,
          "dtypes": f"params {mc.param_dtype}, compute {mc.compute_dtype}, remat {mc.remat}",
          "layers": mc.n_layers, "params": sum(int(x.size) for x in jax.tree.leaves(param_shapes(mc))),
          "hbm_per_device": f"{chip.hbm_bytes / 2**30:.2f} GiB ({'the compiler' if hbm else 'tpu/chips.py'})"}
  n = head["params"]
  size = f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M"
  log(f"{head['model']}: {size} params; {topo}: {len(devices)} devices "
      f"({chip.generation}, {chip.devices_per_chip} per chip), {head['hosts']} hosts; mesh {head['mesh']}")
  chosen = select_programs(all_programs, programs)
  if programs:
    head["programs"] = [p.name for p in chosen]
  reports = forecast.forecast_programs(shapes, chosen, chip, probes=probes, log=log)
  return head, reports, forecast.step_summary(reports, shapes, chip), chip


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  from jaxrl_llm.checks import ConfigError
  from jaxrl_llm.tpu import plan_report as report
  from jaxrl_llm.training.config import from_config_dict

  if _CONFIG.value is None:
    raise app.UsageError("--config=configs/<method>.py is required")
  if not _TOPOLOGY.value:
    raise ConfigError("--topology is required: a TPU topology such as v5e:2x4 or v5p:4x4x4, or an accelerator "
                      "type such as v5p-64")
  if is_reward_config(_CONFIG.value):
    from jaxrl_llm.reward_model.config import reward_config_from_dict

    cfg = reward_config_from_dict(_CONFIG.value)
  else:
    cfg = from_config_dict(_CONFIG.value)
  t0 = time.time()
  head, reports, step, chip = plan(cfg, _TOPOLOGY.value, _MODEL.value, probes=not _NO_FORECAST.value,
                                   programs=_PROGRAMS.value)
  head["compile_s"] = round(time.time() - t0, 1)
  md = report.plan_markdown(head, reports, step, chip)
  print(md)
  if _OUT.value:
    os.makedirs(_OUT.value, exist_ok=True)
    with open(os.path.join(_OUT.value, "plan.json"), "w") as f:
      json.dump(report.as_json(head, reports, step, chip), f, indent=1)
    with open(os.path.join(_OUT.value, "plan.md"), "w") as f:
      f.write(md + "\n")
    print(f"wrote {os.path.join(_OUT.value, 'plan.json')} and plan.md")
  bad = report.misfits(reports, head)
  for line in bad:
    print(f"error: {line}", file=sys.stderr)
  if bad:
    raise SystemExit(1)


if __name__ == "__main__":
  cli.run(main)
