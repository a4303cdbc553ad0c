"""What a new user hit in the first hour, each reproduced and checked fixed:
a resume with another config, errors with tracebacks, half-made workdirs,
runs without a learning signal, the logged learning rate, step-0 checkpoints."""

import json
import os
import subprocess
import sys

import pytest

from run_helpers import ONE_DEVICE_XLA_FLAGS, REPO, load_config, make_trainer, shrink
from jaxrl_llm.checks import ConfigError
from jaxrl_llm.rundir.metrics import read_metrics
from jaxrl_llm.training.config import from_config_dict
from jaxrl_llm.training.guards import NoSignalError
from jaxrl_llm.training.tiny import TINY_MODEL, config_flags

# A tiny run for the command line: seconds, one device.
TINY = config_flags({**TINY_MODEL, "sft.steps": 0, "train.steps": 1, "rollout.prompts_per_step": 4,
                     "rollout.group_size": 2, "eval.n_examples": 4, "task.n_train": 64, "log.progress": False})


def _cli(*args, timeout=300):
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=ONE_DEVICE_XLA_FLAGS)
  return subprocess.run([sys.executable, "-m", *args], cwd=REPO, env=env, capture_output=True, text=True,
                        timeout=timeout)


def _tiny(name="grpo", **overrides):
  return from_config_dict(shrink(load_config(name), **{"train.steps": 2, **overrides}))


# ---- 1. provenance -------------------------------------------------------------------

@pytest.mark.slow
def test_resume_with_another_config_is_refused_unless_allowed(tmp_path, quiet_log):
  wd = tmp_path / "run"
  make_trainer(_tiny("gspo"), wd, quiet_log).run()
  # The same config resumes (nothing left to do) and keeps the saved config.
  assert make_trainer(_tiny("gspo"), wd, quiet_log).run()["rl_steps"] == 2
  with pytest.raises(ConfigError, match=r"another config.*method: 'gspo' -> 'grpo'.*--allow_config_change"):
    make_trainer(_tiny("grpo"), wd, quiet_log).run()
  assert json.load(open(wd / "config.json"))["method"] == "gspo"  # not overwritten
  assert json.load(open(wd / "summary.json"))["method"] == "gspo"
  # Settings that do not change the result are not a different config.
  make_trainer(_tiny("gspo", **{"log.every": 2, "checkpoint.keep_last": 1}), wd, quiet_log).run()
  summary = make_trainer(_tiny("grpo", **{"train.steps": 3}), wd, quiet_log, allow_config_change=True).run()
  assert summary["rl_steps"] == 3 and summary["method"] == "grpo"
  history = [json.loads(line) for line in open(wd / "config_history.jsonl")]
  assert len(history) == 1 and history[0]["changes"]["method"] == ["gspo", "grpo"]
  assert history[0]["changes"]["train.steps"] == [2, 3]
  assert json.load(open(wd / "config.json"))["method"] == "grpo"


def test_a_recipe_reports_its_own_name():
  for name in ("opd", "sdpo", "srpo", "rlsd"):
    cfg = from_config_dict(load_config(name))
    assert cfg.run_name == name and cfg.method == "grpo"
  assert from_config_dict(load_config("gspo")).run_name == "gspo"


# ---- 3. errors without tracebacks, found before the workdir is made ------------------------

@pytest.mark.parametrize("flags,says", [
    (["--config=configs/gspo.py", "--config.train.lrr=1"], r"unknown config key 'lrr' in --config.train.lrr.*\"lr\""),
    (["--config=configs/nope.py"], r"cannot load the config file.*configs/nope.py.*No such file"),
    (["--config=configs/gspo.py", "--config.rollout.top_p=1.5"], r"config.rollout.top_p=1.5 is out of range"),
    (["--config=configs/gspo.py", "--config.init_checkpoint=/nonexistent/run"],
     r"config.init_checkpoint='/nonexistent/run' is not a directory"),
    (["--config=configs/gspo.py", "--config.data.max_prompt_len=3"], r"training example 0 .*more than data.max_prompt_len=3"),
])
@pytest.mark.slow
def test_user_errors_are_one_line_and_leave_no_workdir(flags, says, tmp_path):
  wd = tmp_path / "wd"
  proc = _cli("jaxrl_llm.train", *flags, *TINY, f"--workdir={wd}")
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr and "\\n" not in proc.stderr
  lines = [line for line in proc.stderr.splitlines() if line.strip()]
  assert len(lines) == 2 and lines[0].startswith("error: ") and "--debug" in lines[1], proc.stderr
  assert __import__("re").search(says, lines[0]), lines[0]
  assert not wd.exists()


@pytest.mark.slow
def test_a_workdir_that_is_a_file_and_debug(tmp_path):
  wd = tmp_path / "afile"
  wd.write_text("")
  proc = _cli("jaxrl_llm.train", "--config=configs/gspo.py", *TINY, f"--workdir={wd}")
  assert proc.returncode == 2 and "Traceback" not in proc.stderr
  assert f"workdir {str(wd)!r} is a file" in proc.stderr
  debug = _cli("jaxrl_llm.train", "--config=configs/gspo.py", *TINY, f"--workdir={wd}", "--debug")
  assert debug.returncode == 1 and "Traceback" in debug.stderr  # --debug: the traceback


def test_evaluate_bad_k_is_one_line(tmp_path):
  proc = _cli("jaxrl_llm.evaluate", f"--workdir={tmp_path}", "--k=abc")
  assert proc.returncode == 2 and "Traceback" not in proc.stderr
  assert "--k='abc' is invalid: a comma-separated list of ints" in proc.stderr


# ---- 4. runs without a learning signal ------------------------------------------------------

def _always_raises(prompt, response, answer):
  raise RuntimeError("verifier crashed")


@pytest.mark.slow
def test_every_reward_failing_stops_the_run(tmp_path):
  logs = []
  cfg = _tiny(**{"train.steps": 6, "guard.warn_after_steps": 1, "guard.stop_after_failed_steps": 3})
  tr = make_trainer(cfg, tmp_path, logs.append, reward=_always_raises)
  with pytest.raises(NoSignalError, match=r"failed .* on every sample for 3 steps in a row \(up to step 3\)"):
    tr.run()
  warnings = [s for s in logs if s.startswith("warning: step")]
  assert any("the reward function failed on 100% of the samples" in s for s in warnings)
  rows = read_metrics(os.path.join(tmp_path, "metrics.jsonl"))
  assert [r["step"] for r in rows] == [1, 2]  # the third step raised before it was logged
  assert all(r["signal/failure_rate"] == 1.0 and r["signal/warning"] == 1.0 for r in rows)


@pytest.mark.slow
def test_equal_rewards_warn(tmp_path):
  logs = []
  tr = make_trainer(_tiny(**{"train.steps": 3, "guard.warn_after_steps": 2}), tmp_path, logs.append,
                    reward=lambda p, r, a: 1.0)
  summary = tr.run()
  assert summary["rl_steps"] == 3
  rows = read_metrics(os.path.join(tmp_path, "metrics.jsonl"))
  assert [r["signal/zero_adv_groups"] for r in rows] == [1.0, 1.0, 1.0]
  assert [r["signal/warning"] for r in rows] == [0.0, 1.0, 1.0]  # from the second step in a row
  assert sum("groups have equal rewards" in s for s in logs) == 2


# ---- 6 and 9. the logged learning rate; a run of zero RL steps --------------------------------

def test_warmup_schedule_first_update_moves():
  from jaxrl_llm.learn.optim import warmup_schedule  # pylint: disable=import-outside-toplevel
  # No warm-up: update 0 is at the configured rate (it was 0: the first update of every run a no-op).
  assert [float(warmup_schedule(1e-3, 0)(k)) for k in range(3)] == pytest.approx([1e-3] * 3, rel=1e-6)
  # Warm-up over 4 updates: lr_k = 1e-3 * (k + 1) / 4, at peak from update 3 on.
  assert [float(warmup_schedule(1e-3, 4)(k)) for k in range(6)] == pytest.approx(
      [2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3], rel=1e-6)
  # Cosine decay after it: update 4 + 10 (the end) is at decay_to * peak; halfway, at the mean.
  sched = warmup_schedule(1e-3, 4, total_steps=14, decay_to=0.1)
  assert float(sched(14)) == pytest.approx(1e-4, rel=1e-5)
  assert float(sched(9)) == pytest.approx(0.55e-3, rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("warmup,want", [(10, [1e-4, 2e-4, 3e-4]), (0, [1e-3, 0.775e-3, 0.325e-3])])
def test_logged_lr_is_the_rate_the_step_used(tmp_path, quiet_log, warmup, want):
  # Without warm-up the cosine decay to 0.1 lr spans the 3 updates: 1e-3 (0.1 + 0.9 (1 + cos(pi k / 3)) / 2).
  cfg = _tiny(**{"train.steps": 3, "train.warmup_steps": warmup, "train.lr": 1e-3, "train.lr_decay_to": 0.1})
  make_trainer(cfg, tmp_path, quiet_log).run()
  rows = read_metrics(os.path.join(tmp_path, "metrics.jsonl"))
  # Linear warm-up over 10 updates, lr_k = 1e-3 (k + 1) / 10; step s's (only) update is update s - 1.
  assert [r["lr"] for r in rows] == pytest.approx(want, rel=1e-6, abs=1e-12)
  # The first update moved the weights: step 2 samples with them, and its KL to the warm start is not 0.
  assert rows[1]["kl/ref"] > 0


@pytest.mark.slow
def test_zero_rl_steps_saves_the_warm_started_model(tmp_path, quiet_log):
  make_trainer(_tiny(**{"train.steps": 0}), tmp_path, quiet_log).run()
  assert os.listdir(tmp_path / "checkpoints") == ["0"]


@pytest.mark.slow
def test_the_update_compiles_once(tmp_path, quiet_log):
  # The optimizer's step count came uncommitted from optax's init and committed out of the first
  # update: every method (DAPO's dynamic sampling included) compiled its update twice.
  tr = make_trainer(_tiny("dapo", **{"train.steps": 3}), tmp_path, quiet_log)
  state = tr.start_rl(tr.setup_extensions(tr.init_state(__import__("jax").random.key(0))))
  for _ in range(3):
    state, _ = tr.step(state)
  assert tr.context.updater.compiled_count() == 1


def test_a_resumed_progress_bar_starts_at_its_step():
  from jaxrl_llm.training.metrics import Progress

  bar = Progress(30, True, "gspo", initial=20)
  assert bar._bar.n == 20 and bar._bar.total == 30  # "20/30" at once, not "0/30" ending at "10/30"
  bar.update({"reward/mean": 0.5})
  assert bar._bar.n == 21
  bar.close()


@pytest.mark.slow
def test_evaluate_keeps_greedy_and_sampled_results_and_warns_on_damage(tmp_path, quiet_log):
  wd = tmp_path / "run"
  make_trainer(_tiny(**{"checkpoint.every_steps": 1}), wd, quiet_log).run()
  greedy = _cli("jaxrl_llm.evaluate", f"--workdir={wd}")
  sampled = _cli("jaxrl_llm.evaluate", f"--workdir={wd}", "--n_samples=2", "--k=1,2")
  assert greedy.returncode == 0 and sampled.returncode == 0, sampled.stderr[-2000:]
  assert sorted(os.listdir(wd / "eval")) == ["step_2.json", "step_2_n2.json"]  # both kept
  assert "pass@2" in json.load(open(wd / "eval" / "step_2_n2.json"))["steps"]["2"]
  assert "INFO" not in greedy.stderr  # Orbax's restore log is quiet
  largest = max((p for p in (wd / "checkpoints" / "2").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
  with open(largest, "r+b") as f:  # a cut-off copy of the newest step's array data
    f.truncate(largest.stat().st_size // 2)
  damaged = _cli("jaxrl_llm.evaluate", f"--workdir={wd}")
  assert damaged.returncode == 0
  assert "the newest checkpoint (step 2) is damaged; evaluated step 1" in damaged.stdout + damaged.stderr


def test_keys_added_after_a_workdir_was_written_are_no_change_at_their_defaults():
  """A workdir saved before a key existed resumes when the key is at its default; a
  changed value of it, or of an existing key, is still a change."""
  from jaxrl_llm.training.provenance import flatten, plain_config, result_changes

  new = plain_config(from_config_dict(load_config("grpo")))
  old = json.loads(json.dumps(new))
  del old["rollout"]["mismatch"]["quant"], old["train"]["micro_batch_tokens"]
  assert result_changes(old, new) == {}
  changed = json.loads(json.dumps(new))
  changed["rollout"]["mismatch"]["quant"] = "int4"
  changed["train"]["lr"] = 1.0
  assert set(result_changes(old, changed)) == {"rollout.mismatch.quant", "train.lr"}
  assert "train.micro_batch_tokens" in flatten(new)
  # rollout.overlap changes when batches are generated, not which (overlapped == sync bit for bit at a staleness).
  flipped = json.loads(json.dumps(new))
  flipped["rollout"]["overlap"] = not new["rollout"]["overlap"]
  assert result_changes(new, flipped) == {}
