"""Bad configs fail before training, with the field, value and what is allowed."""

import json
import os
import subprocess
import sys

import pytest

from run_helpers import REPO, load_config, shrink
from jaxrl_llm.training.config import from_config_dict
from jaxrl_llm.training.loop import Trainer


def test_every_config_file_resolves():
  names = sorted(f[:-3] for f in os.listdir(os.path.join(REPO, "configs")) if f.endswith(".py") and f != "base.py")
  from jaxrl_llm.objectives import PRESETS
  assert set(PRESETS) <= set(names)  # one config file per preset
  for name in set(PRESETS) & set(names):
    cfg = from_config_dict(load_config(name))
    assert cfg.method == name and cfg.objective == PRESETS[name]


def test_locked_config_rejects_unknown_key():
  c = load_config("grpo")
  with pytest.raises(AttributeError, match="lrr"):
    c.train.lrr = 1.0


def test_misspelled_method_suggests_the_right_one():
  c = load_config("gspo")
  c.method = "gpso"
  with pytest.raises(ValueError, match=r"config\.method='gpso'.*did you mean 'gspo'"):
    from_config_dict(c)


def test_method_override_must_match_the_objective_block():
  c = load_config("gspo")
  c.method = "grpo"
  with pytest.raises(ValueError, match=r"configs/grpo\.py"):
    from_config_dict(c)


def test_group_size_one_with_grpo_std_normalisation():
  c = load_config("grpo")
  c.rollout.group_size = 1
  with pytest.raises(ValueError, match=r"config\.rollout\.group_size=1.*std normalisation"):
    from_config_dict(c)


def test_batch_must_divide_into_micro_batches():
  c = load_config("grpo")  # 64 prompts x 8 = 512 samples, one mini-batch
  c.train.micro_batch_size = 100
  with pytest.raises(ValueError, match=r"config\.train\.micro_batch_size=100.*mini-batch of 512"):
    from_config_dict(c)
  c.train.micro_batch_size, c.train.mini_batches = 0, 3
  with pytest.raises(ValueError, match=r"config\.train\.mini_batches=3.*512"):
    from_config_dict(c)


@pytest.mark.parametrize("key,value,match", [
    ("rollout.temperature", 0.0, r"rollout\.temperature=0\.0"),
    ("rollout.sampler_dtype", "fp8", r"rollout\.sampler_dtype='fp8'"),
    ("kernels.impl", "palas", r"did you mean 'pallas'"),
    ("filters.overlong_buffer", 6, r"filters\.overlong_buffer=6.*max_response_len=6"),
    ("objective.eps_low", 1.5, r"eps_low=1\.5"),
    ("objective.aggregation", "token_sum", r"aggregation='token_sum'"),
])
def test_bad_values_name_field_and_allowed(key, value, match):
  c = load_config("grpo")
  section, leaf = key.split(".")
  c[section][leaf] = value
  with pytest.raises(ValueError, match=match):
    from_config_dict(c)


def test_score_centering_needs_sampler_topk():
  c = load_config("score_centering")
  c.rollout.record_topk = 0
  with pytest.raises(ValueError, match=r"rollout\.record_topk=0"):
    from_config_dict(c)


def test_dataset_row_missing_answer_fails_before_training(tmp_path, quiet_log):
  data = tmp_path / "train.jsonl"
  data.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2="}\n')
  c = shrink(load_config("grpo"), **{"task.name": "file", "data.path": str(data), "data.reward": "arithmetic"})
  cfg = from_config_dict(c)
  with pytest.raises(ValueError, match=r"train\.jsonl:2"):
    Trainer(cfg, str(tmp_path / "run"), log=quiet_log)
  assert not (tmp_path / "run").exists()


def _cli(*args):
  return subprocess.run([sys.executable, "-m", "jaxrl_llm.train", *args], cwd=REPO, capture_output=True,
                        text=True, timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"})


@pytest.mark.slow
def test_cli_rejects_unknown_key_and_misspelled_method(tmp_path):
  r = _cli("--config=configs/grpo.py", "--config.train.stepz=3", f"--workdir={tmp_path}/a")
  assert r.returncode != 0 and "stepz" in r.stderr and 'Did you mean "steps"' in r.stderr
  r = _cli("--config=configs/gspo_token.py", "--config.method=gspo_tokn", f"--workdir={tmp_path}/b")
  assert r.returncode != 0 and "config.method='gspo_tokn'" in r.stderr and "did you mean 'gspo_token'" in r.stderr
  assert not os.path.exists(tmp_path / "a") and not os.path.exists(tmp_path / "b")


@pytest.mark.slow
def test_resolved_config_is_saved(tmp_path, quiet_log):
  cfg = from_config_dict(shrink(load_config("grpo"), **{"train.steps": 1}))
  Trainer(cfg, str(tmp_path), log=quiet_log).run()
  saved = json.loads((tmp_path / "config.json").read_text())
  assert saved["method"] == "grpo" and saved["objective"]["eps_low"] == 0.2
  assert saved["rollout"]["group_size"] == 4
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert {"eval_accuracy_start", "eval_accuracy_end", "run_time_s"} <= set(summary)
