"""The reliability matrix: inject a fault into a small training run, let it recover, check what was lost.

    python scripts/fault_matrix.py --out fault_matrix.json [--md docs/reliability_table.md] [--rows a,b]

A reference run goes uninterrupted first. Then each row injects one fault
(jaxrl_llm/faults.py, through JAXRL_LLM_FAULT, or by damaging files) into a
run of the same command, reruns that command as a user would, and compares:

* SIGKILL at 20 points drawn over the run (inside the SFT warm start, the
  rollout, the update, a checkpoint save in flight, an evaluation): the
  resumed run's final params and metrics (timing fields aside) must equal the
  reference bitwise;
* the newest checkpoint damaged (a truncated file, a deleted file, a flipped
  bit, the manifest removed): the rerun must notice, resume from the previous
  one and still end equal to the reference;
* a full disk while a checkpoint is written (an injected ENOSPC): the run
  fails, the rerun resumes from the last good checkpoint and ends equal;
* SIGTERM: the run saves the step it is in and exits 143; the rerun ends equal;
* NaN in a reward, in the advantages, in the logits or in the gradients: the
  update is skipped and counted, no parameter is ever non-finite;
* a reward function that hangs, raises or returns a non-number: counted, the
  run goes on;
* the asynchronous state: SIGKILL in a run whose next batches are generated
  in the background (`rollout.overlap`, staleness 2) with continuous batching
  (killed with samples in the slots, or in an update with batches queued), and
  in a run of multi-turn episodes with a tool (killed between two rounds, with
  episodes and tool workers mid-way, and the same on the continuous batcher,
  killed after a chunk with slots mid-turn). Nothing in flight is checkpointed: the
  resumed run regenerates it from the checkpointed policy snapshots, key and
  pipeline position, and must end equal to its own uninterrupted reference.

Each row of the JSON says what was injected, what the run did and whether
anything was lost. `--md` writes the table docs/reliability.md shows.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from jaxrl_llm.training.tiny import WARM_TINY_RUN, config_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 6
# A small run that still has every stage: SFT, rollouts, updates, saves every 2 steps, evaluations.
FLAGS = ["--config=configs/gspo.py", *config_flags({
    **WARM_TINY_RUN, "train.steps": STEPS, "sft.steps": 40, "checkpoint.keep_last": 3, "eval.every": 3,
    "data.reward_timeout_s": 2.0})]
TIMING = ("time/", "perf/tokens_per_s")
# The runs' XLA flags: one CPU device (tests/checkpointing/test_fault_matrix.py adds the suite's cheap passes).
XLA_FLAGS = "--xla_force_host_platform_device_count=1"
# The asynchronous state's runs, each compared with its own uninterrupted reference: flags after FLAGS.
# Synchronous saves: the kill in the slots lands after step 2's save has committed (an asynchronous one
# may still be in flight, and the rerun would start over: safe, but not the case to show).
ASYNC = config_flags({"rollout.overlap": True, "rollout.staleness": 2, "rollout.continuous_slots": 8,
                      "rollout.decode_chunk": 2, "checkpoint.async_save": False})
EPISODES = ["--config=configs/examples/arithmetic_calculator.py", *config_flags({
    "train.steps": STEPS, "sft.steps": 80, "sft.batch_size": 32, "sft.lr": 0.02, "task.digits": 1,
    "rollout.prompts_per_step": 8, "rollout.group_size": 2, "eval.n_examples": 16, "eval.every": 3,
    "log.progress": False, "checkpoint.every_steps": 2, "checkpoint.keep_last": 3, "checkpoint.async_save": False})]
# The same episodes on the continuous batcher: 16 episodes a step in 8 slots (queued episodes take freed
# slots), each turn decoded 4 steps a chunk, their tool calls stepped while the other slots decode.
EPISODE_SLOTS = config_flags({"rollout.continuous_slots": 8, "rollout.decode_chunk": 4})
VARIANTS = {"async": (FLAGS, ASYNC), "episodes": (EPISODES, ()), "episode_slots": (EPISODES, EPISODE_SLOTS)}
VARIANT_SAYS = {"async": "overlap, staleness 2, continuous batching in 8 slots",
                "episodes": "configs/examples/arithmetic_calculator.py: episodes with a tool",
                "episode_slots": "the same episodes on the continuous batcher, 8 slots, chunks of 4"}
# (row, variant, fault): each lands after step 2's checkpoint has committed (saved synchronously). The
# counts are of the training's rollouts only (evaluation passes neither point) and the runs are
# deterministic, so each lands in the same batch every time:
# - decode_chunk 22 is in the 5th batch (the same flags without overlap, raising there, fail in step 5's
#   rollout; so do chunks 18 and 21), which samples with theta_2: published after step 2's save,
#   whatever the background thread's timing;
# - episode_round 5: at most 2 rounds a step (env.max_turns = 2), so step 3 or later;
# - with episode slots, episode_round passes after each chunk (the calculator example: 7-11 a step):
N_SLOT_ROUND = 24  # step 3 is rounds 21-29 (step 1: 1-11, step 2: 12-20)
ASYNC_ROWS = (("async_kill_decode_chunk_22", "async", "decode_chunk:22:kill"),
              ("async_kill_update_5", "async", "update:5:kill"),
              ("episodes_kill_episode_round_5", "episodes", "episode_round:5:kill"),
              (f"episode_slots_kill_episode_round_{N_SLOT_ROUND}", "episode_slots", f"episode_round:{N_SLOT_ROUND}:kill"))
# Where SIGKILL may land: point -> how many times one run passes it.
KILL_RANGES = {"sft_step": 40, "rollout": STEPS, "update": STEPS, "checkpoint_save": STEPS // 2, "eval": 3}


def _env(cache: str, fault: str = "") -> dict:
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=XLA_FLAGS,
             JAX_COMPILATION_CACHE_DIR=cache, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  env.pop("JAXRL_LLM_FAULT", None)
  if fault:
    env["JAXRL_LLM_FAULT"] = fault
  return env


def train(workdir: str, cache: str, fault: str = "", extra=(), base=FLAGS) -> subprocess.CompletedProcess:
  cmd = [sys.executable, "-m", "jaxrl_llm.train", *base, *extra, f"--workdir={workdir}"]
  return subprocess.run(cmd, cwd=REPO, env=_env(cache, fault), capture_output=True, text=True, timeout=900)


def final_params(workdir: str) -> dict:
  import orbax.checkpoint as ocp

  state = ocp.PyTreeCheckpointer().restore(os.path.join(workdir, "checkpoints", str(STEPS), "state"))
  return state["params"]


def metrics(workdir: str) -> list[dict]:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in rows]


def equal_to(reference: str, workdir: str) -> tuple[bool, str]:
  """(final params and metrics equal bitwise, what differs)."""
  import jax

  try:
    a, b = final_params(reference), final_params(workdir)
  except Exception as e:  # pylint: disable=broad-except
    return False, f"no final checkpoint ({type(e).__name__})"
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  if len(la) != len(lb) or any(not np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb)):
    return False, "final params differ"
  ma, mb = metrics(reference), metrics(workdir)
  if ma != mb:
    if len(ma) != len(mb):
      return False, f"metrics.jsonl differs: {len(mb)} rows against {len(ma)}"
    step, key = next((ra.get("step"), k) for ra, rb in zip(ma, mb) if ra != rb
                     for k in sorted(set(ra) | set(rb)) if ra.get(k) != rb.get(k))
    return False, f"metrics.jsonl differs: first at step {step}, {key}"
  return True, "final params and metrics bitwise equal"


def summary(workdir: str) -> dict:
  with open(os.path.join(workdir, "summary.json")) as f:
    return json.load(f)


def all_finite(workdir: str) -> bool:
  import jax

  return all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(final_params(workdir)))


# ---- the rows --------------------------------------------------------------------------

def kill_rows(rng) -> list[tuple[str, str]]:
  """20 (name, fault) pairs: every point twice, then ten more drawn by the share of the run spent there."""
  points = list(KILL_RANGES)
  chosen = [points[i % len(points)] for i in range(10)]
  chosen += list(rng.choice(points, size=10, p=[0.3, 0.2, 0.2, 0.15, 0.15]))
  rows = {}
  for point in chosen:
    free = [n for n in range(1, KILL_RANGES[point] + 1) if f"kill_{point}_{n}" not in rows]
    if not free:  # every occurrence of this point is taken: the busiest point instead
      point = "sft_step"
      free = [n for n in range(1, KILL_RANGES[point] + 1) if f"kill_{point}_{n}" not in rows]
    n = int(rng.choice(free))
    rows[f"kill_{point}_{n}"] = f"{point}:{n}:kill"
  return list(rows.items())


def run_kill(name, fault, ref, tmp, cache, base=FLAGS, extra=()):
  wd = os.path.join(tmp, name)
  first = train(wd, cache, fault, extra, base)
  second = train(wd, cache, extra=extra, base=base)
  ok, how = equal_to(ref, wd)
  resumed = "resumed from checkpoint step" in second.stdout + second.stderr
  did = (f"killed (rc {first.returncode}); rerun rc {second.returncode}, "
         f"{'resumed from a checkpoint' if resumed else 'started over (no checkpoint committed yet)'}")
  return {"row": name, "injected": f"SIGKILL at {fault.rsplit(':', 1)[0].replace(':', ' #')}", "run": did,
          "lost": not (ok and second.returncode == 0), "check": how}


def _damage(step_dir: str, how: str) -> str:
  if not os.path.isdir(step_dir):
    raise FileNotFoundError(f"{step_dir}: the partial run saved no such checkpoint")
  files = sorted((os.path.getsize(os.path.join(dp, f)), os.path.join(dp, f))
                 for dp, _, fs in os.walk(step_dir) for f in fs if not f.startswith("manifest"))
  target = files[-1][1]  # the largest file: array data
  if how == "truncate":
    with open(target, "r+b") as f:
      f.truncate(max(1, os.path.getsize(target) // 2))
  elif how == "delete":
    os.remove(target)
  elif how == "bitflip":
    with open(target, "r+b") as f:
      f.seek(os.path.getsize(target) // 2)
      byte = f.read(1)
      f.seek(-1, 1)
      f.write(bytes([byte[0] ^ 0x10]))
  elif how == "manifest":
    os.remove(os.path.join(step_dir, "manifest.jaxrl.json"))
  return os.path.relpath(target, step_dir) if how != "manifest" else "manifest.jaxrl.json"


def run_damage(how, ref, tmp, cache, partial):
  from jaxrl_llm.checkpointing import manifest as manifest_lib

  wd = os.path.join(tmp, f"damage_{how}")
  shutil.copytree(partial, wd)
  step_dir = os.path.join(wd, "checkpoints", "4")
  # The partial run died before it wrote step 4's manifest (written once the next save starts or the run
  # ends); a run that lived on would have: write it, then damage the step.
  if not manifest_lib.has_manifest(step_dir):
    manifest_lib.write_manifest(step_dir)
  what = _damage(step_dir, how)
  rerun = train(wd, cache)
  ok, check = equal_to(ref, wd)
  said = rerun.stdout + rerun.stderr
  if how == "manifest":  # no manifest: the step is trusted as Orbax committed it, and it is intact
    behaved, did = "resumed from checkpoint step 4" in said, "resumed from step 4 (intact, no manifest to check)"
  else:
    behaved, did = "step 4 is damaged" in said and "resumed from checkpoint step 2" in said, \
        "noticed the damage, resumed from step 2"
  return {"row": f"damage_{how}", "injected": f"newest checkpoint (step 4): {how} {what}",
          "run": f"rerun rc {rerun.returncode}; {did if behaved else 'did not say so: ' + said[-200:]}",
          "lost": not (ok and rerun.returncode == 0 and behaved), "check": check}


def run_then_rerun(name, fault, injected, ref, tmp, cache, *, expect_rc):
  wd = os.path.join(tmp, name)
  first = train(wd, cache, fault)
  second = train(wd, cache)
  ok, check = equal_to(ref, wd)
  said = [line for line in (first.stdout + first.stderr).splitlines() if line.strip() and "Warning" not in line
          and not line.startswith(" ")]
  tail = (said or [""])[-1][:120]
  return {"row": name, "injected": injected,
          "run": f"rc {first.returncode} ({tail}); rerun rc {second.returncode}",
          "lost": not (ok and second.returncode == 0 and first.returncode == expect_rc), "check": check}


def run_counted(name, fault, injected, tmp, cache, *, key):
  """A fault the run must absorb: it completes, counts the fault, never holds a non-finite parameter."""
  wd = os.path.join(tmp, name)
  proc = train(wd, cache, fault)
  if proc.returncode != 0:
    return {"row": name, "injected": injected, "run": f"rc {proc.returncode}: {proc.stderr[-200:]}",
            "lost": True, "check": "the run did not complete"}
  s = summary(wd)
  counted = {"skipped_updates": s["skipped_updates"], "reward_failures": s["reward_failures"]}[key]
  finite = all_finite(wd)
  return {"row": name, "injected": injected,
          "run": f"completed {s['rl_steps']} steps; {key} = {counted:g}",
          "lost": not (finite and counted > 0), "check": "params finite" if finite else "NON-FINITE params"}


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--out", required=True, help="JSON file of the rows")
  ap.add_argument("--md", default="", help="also write the rows as a markdown table here")
  ap.add_argument("--rows", default="", help="comma-separated row names or prefixes (default: all)")
  args = ap.parse_args(argv)
  rng = np.random.default_rng(0)
  tmp = tempfile.mkdtemp(prefix="fault_matrix_")
  cache = os.path.join(tmp, "jax_cache")
  t0 = time.time()

  def wanted(name):
    return not args.rows or any(name.startswith(p) for p in args.rows.split(","))

  ref = os.path.join(tmp, "reference")
  if not args.rows or any(not p.startswith(tuple(VARIANTS)) for p in args.rows.split(",")):
    proc = train(ref, cache)
    assert proc.returncode == 0, proc.stderr[-3000:]

  rows = []
  for name, fault in kill_rows(rng):
    if wanted(name):
      rows.append(run_kill(name, fault, ref, tmp, cache))
  refs = {}
  for name, variant, fault in ASYNC_ROWS:
    if wanted(name):
      base, extra = VARIANTS[variant]
      if variant not in refs:  # its own uninterrupted reference
        refs[variant] = os.path.join(tmp, f"reference_{variant}")
        proc = train(refs[variant], cache, extra=extra, base=base)
        assert proc.returncode == 0, proc.stderr[-3000:]
      row = run_kill(name, fault, refs[variant], tmp, cache, base, extra)
      row["injected"] += f" ({VARIANT_SAYS[variant]})"
      rows.append(row)
  if any(wanted(f"damage_{h}") for h in ("truncate", "delete", "bitflip", "manifest")):
    partial = os.path.join(tmp, "partial")  # checkpoints at steps 2 and 4 (written synchronously), killed in step 5
    train(partial, cache, "rollout:5:kill", extra=["--config.checkpoint.async_save=False"])
    for how in ("truncate", "delete", "bitflip", "manifest"):
      if wanted(f"damage_{how}"):
        rows.append(run_damage(how, ref, tmp, cache, partial))
  if wanted("disk_full"):
    rows.append(run_then_rerun("disk_full", "checkpoint_write:2:enospc", "ENOSPC while writing checkpoint step 4",
                               ref, tmp, cache, expect_rc=1))
  if wanted("sigterm"):
    rows.append(run_then_rerun("sigterm", "update:3:term", "SIGTERM during step 3's update", ref, tmp, cache,
                               expect_rc=143))
  for name, fault, injected, key in (
      ("nan_reward", "reward:70:nan", "NaN returned by one reward call", "reward_failures"),
      ("nan_advantage", "advantage:2:nan", "NaN in step 2's advantages", "skipped_updates"),
      ("nan_logits", "logits_nan:1:nan", "NaN logits in every update", "skipped_updates"),
      ("nan_gradients", "grad_nan:1:nan", "NaN gradients in every update", "skipped_updates"),
      ("reward_hangs", "reward:40:hang", "a reward call that hangs (timeout 2 s)", "reward_failures"),
      ("reward_raises", "reward:40:raise", "a reward call that raises", "reward_failures")):
    if wanted(name):
      rows.append(run_counted(name, fault, injected, tmp, cache, key=key))
  out = {"rows": rows, "all_safe": not any(r["lost"] for r in rows), "seconds": round(time.time() - t0, 1),
         "load_avg": os.getloadavg(), "steps": STEPS, "workdir": tmp}
  with open(args.out, "w") as f:
    json.dump(out, f, indent=2)
  if args.md:
    lines = ["| row | injected | what the run did | lost | check |", "|---|---|---|---|---|"]
    lines += [f"| {r['row']} | {r['injected']} | {r['run']} | {'**yes**' if r['lost'] else 'no'} | {r['check']} |"
              for r in rows]
    with open(args.md, "w") as f:
      f.write("\n".join(lines) + "\n")
  print(json.dumps({"rows": len(rows), "lost": [r["row"] for r in rows if r["lost"]], "seconds": out["seconds"]}))
  shutil.rmtree(tmp, ignore_errors=True)
  return 0 if out["all_safe"] else 1


if __name__ == "__main__":
  sys.exit(main())
