"""The TPU plan table of docs/tpu.md: `python -m jaxrl_llm.compile` for each model x topology x shape.

    python scripts/tpu_plan.py --out /tmp/tpu_plans [--only qwen3_8b] [--write_docs]

Each row runs the compile-only command in its own process (as a user would),
writes <out>/<row>/plan.json and plan.md, and the table collects them; rows
whose plan.json exists are not compiled again. `--write_docs` puts the table
between the plan markers of docs/tpu.md. Every figure is a compiler forecast
(libtpu's XLA:TPU and Mosaic, rooflines of tpu/chips.py with a latency floor):
a lower bound on time, an upper bound on tokens/s, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from jaxrl_llm.tpu.plan_report import MULTI_HOST  # the plan's own words for a multi-host row

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Shapes: the SmolLM2 example's rollout (8 prompts x 4 samples, 12 new tokens; prompts padded to 64 here)
# and a long-reasoning one (32 prompts x 8 samples = 256, 1,024 prompt + 4,096 response tokens).
SHAPES = {
    "example": ["--config.rollout.prompts_per_step=8", "--config.rollout.group_size=4",
                "--config.data.max_prompt_len=64", "--config.rollout.max_response_len=12"],
    "long": ["--config.rollout.prompts_per_step=32", "--config.rollout.group_size=8",
             "--config.data.max_prompt_len=1024", "--config.rollout.max_response_len=4096"],
    # the long shape with 8 prompts x 8 samples: what one v5p-8 slice samples at once for Qwen3-8B
    "long-64": ["--config.rollout.prompts_per_step=8", "--config.rollout.group_size=8",
                "--config.data.max_prompt_len=1024", "--config.rollout.max_response_len=4096"],
}
# bf16 compute and sampling over f32 master params, remat full (a preset is a real model).
NUMERICS = ["--config.model.compute_dtype=bfloat16", "--config.rollout.sampler_dtype=bfloat16"]


def mesh(fsdp: int, tensor: int = 1) -> list[str]:
  """The mesh, and the stated defaults of the steps outside RL that the shapes above outgrow: the warm
  start in micro-batches of one row per batch shard (sft.micro_batch_size = fsdp, data being 1) and the
  evaluation in batches of 4 rows per batch shard (eval.batch_size)."""
  return [f"--config.mesh.fsdp={fsdp}", f"--config.mesh.tensor={tensor}", "--config.mesh.data=1",
          f"--config.sft.micro_batch_size={fsdp}", f"--config.eval.batch_size={4 * fsdp}"]


# name -> (model, topology, shape, extra flags)
ROWS = {
    "smollm2_135m-v5e-8-example": ("smollm2_135m", "v5e-8", "example", mesh(8)),
    "qwen3_0_6b-v6e-8-long": ("qwen3_0_6b", "v6e-8", "long", mesh(8)),
    "gemma3_1b-v6e-8-long": ("gemma3_1b", "v6e-8", "long", mesh(8)),
    "qwen3_8b-v5p-8-long-64": ("qwen3_8b", "v5p-8", "long-64", mesh(4)),
    "qwen3_8b-v5p-128-long": ("qwen3_8b", "v5p:4x4x4", "long", mesh(32, 2)),
    "llama3_1_8b-v5p-64-long": ("llama3_1_8b", "v5p-64", "long", mesh(32)),
    "qwen3_32b-v5p-128-long": ("qwen3_32b", "v5p:4x4x4", "long", mesh(32, 2)),
}


def run_row(name: str, out: str) -> dict | None:
  model, topology, shape, extra = ROWS[name]
  d = os.path.join(out, name)
  path = os.path.join(d, "plan.json")
  if not os.path.exists(path):
    cmd = [sys.executable, "-m", "jaxrl_llm.compile", "--config=configs/gspo.py", f"--topology={topology}",
           f"--model={model}", f"--out={d}", *SHAPES[shape], *NUMERICS, *extra]
    print(" ".join(cmd[1:]), flush=True)
    t0 = time.time()
    env = {**os.environ, "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "log.txt"), "w") as f:
      f.write(proc.stdout + proc.stderr)
    print(f"  exit {proc.returncode} in {time.time() - t0:.0f} s", flush=True)
    if not os.path.exists(path):
      errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
      return {"name": name, "error": errors[-1] if errors else proc.stderr.strip().splitlines()[-1]}
  with open(path) as f:
    return {"name": name, **json.load(f)}


def _pct(x) -> str:
  return "n/a" if x is None else f"{x:.0%}"


def table(rows: list[dict]) -> str:
  """One line per row; the step's seconds are a roofline lower bound, its tokens/s an upper bound, MFU
  only where every program of the step is bound by compute (jaxrl_llm/tpu/forecast.py)."""
  lines = ["| model | topology (chips) | shape | mesh | fits | HBM per device, largest program (GiB) | "
           "step, lower bound (s) | sampled tokens/s/chip, upper bound | MFU step / update | "
           "decode vs HBM roofline | bounding stage |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    model, topology, shape, _ = ROWS[r["name"]]
    if "error" in r:
      lines.append(f"| {model} | {topology} | {shape} | | no | {r['error'][:120]} | | | | | |")
      continue
    step, progs = r["step"], r["programs"]
    big = max(progs, key=lambda p: p["total_bytes"])
    decode = next((p for p in progs if p["name"] == "rollout/decode"), None)
    ratio = f"{decode['hbm_roofline_ratio']:.2f}x" if decode and decode.get("hbm_roofline_ratio") else ""
    misfit = [p["name"] for p in progs if not p["fits"]]
    fits = "yes" if not misfit else "**no**: " + ", ".join(misfit)
    if r.get("hosts", 1) > 1:
      fits += f" ({MULTI_HOST})"
    lines.append(
        f"| {model} | {r['topology']} ({r['chips']}) | {shape} | {r['mesh']} | {fits} "
        f"| {big['total_bytes'] / 2**30:.1f} ({big['name']}) of {big['hbm_bytes'] / 2**30:.0f} | "
        f"{step['seconds']:.2f} | {step['sampled_tokens_per_s_per_chip']:,.0f} | {_pct(step['mfu'])} / "
        f"{_pct(step['update_mfu'])} | {ratio} | {step['bounding_stage']} |")
  return "\n".join(lines)


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", default="/tmp/tpu_plans")
  ap.add_argument("--only", nargs="*", default=None, help="row names (or substrings)")
  ap.add_argument("--write_docs", action="store_true")
  args = ap.parse_args()
  names = [n for n in ROWS if not args.only or any(s in n for s in args.only)]
  rows = [r for r in (run_row(n, args.out) for n in names) if r]
  text = table(rows)
  print(text)
  if args.write_docs:
    path = os.path.join(ROOT, "docs", "tpu.md")
    doc = open(path).read()
    begin, end = "<!-- plan:begin -->", "<!-- plan:end -->"
    head, rest = doc.split(begin)
    _, tail = rest.split(end)
    with open(path, "w") as f:
      f.write(f"{head}{begin}\n{text}\n{end}{tail}")
    print(f"wrote {path}")


if __name__ == "__main__":
  main()
