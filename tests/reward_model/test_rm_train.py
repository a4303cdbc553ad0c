"""The reward-model run: exact resume, its workdir (metrics.jsonl, summary.json, checkpoints), reading
a trained reward model back (and refusing a checkpoint without a head), `init_checkpoint`, and the
export's tokenizer in transformers."""

import json
import os
import signal

import jax
import numpy as np
import pytest

from jaxrl_llm.checkpointing.errors import IncompatibleCheckpointError
from jaxrl_llm.checks import ConfigError
from jaxrl_llm.learn.shell import Stopped
from jaxrl_llm.model import sharding as sharding_lib
from jaxrl_llm.reward_model.config import reward_config_from_dict
from jaxrl_llm.reward_model.defaults import reward_model_config
from jaxrl_llm.reward_model.scorer import load_reward_model
from jaxrl_llm.reward_model.trainer import RewardModelRun, batch_rows
from jaxrl_llm.training.tiny import TINY_MODEL, apply_settings

STEPS = 6
SMALL = {**TINY_MODEL, "train.steps": STEPS, "train.batch_size": 16, "train.warmup_steps": 2, "data.n_train": 200,
         "data.n_eval": 24, "eval.every": 3, "log.every": 1, "checkpoint.every_steps": 2, "export": False,
         "train.center_coef": 0.01}


def config(**settings):
  return reward_config_from_dict(apply_settings(reward_model_config(), {**SMALL, **settings}))


def rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    out = [json.loads(line) for line in f]
  return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in out]


def test_batch_rows_are_a_function_of_the_step():
  a = [batch_rows(10, 4, seed=0, step=s) for s in range(5)]
  assert [list(x) for x in a] == [list(batch_rows(10, 4, seed=0, step=s)) for s in range(5)]
  epoch0 = np.concatenate(a)[:10]
  assert sorted(epoch0) == list(range(10))  # one pass over the pairs, then the next permutation
  assert list(batch_rows(10, 4, seed=1, step=0)) != list(a[0])


@pytest.mark.slow
def test_stopped_and_resumed_run_equals_the_uninterrupted_one(tmp_path, quiet_log):
  cfg = config()
  full = RewardModelRun(cfg, str(tmp_path / "full"), log=quiet_log)
  summary = full.run()
  assert summary["steps"] == STEPS and summary["eval_pairs"] == 24
  assert summary["train_pairs"] == 200

  stopped = RewardModelRun(cfg, str(tmp_path / "resumed"), log=quiet_log).run(stop_after=3)
  assert stopped == {"stopped_at_step": 3, "workdir": str(tmp_path / "resumed")}
  assert not (tmp_path / "resumed" / "summary.json").exists()
  resumed = RewardModelRun(cfg, str(tmp_path / "resumed"), log=quiet_log)
  summary2 = resumed.run()

  a, b = full.final_state, resumed.final_state
  assert int(b.step) == STEPS
  for x, y in zip(jax.tree.leaves((a.params, a.reward_head, a.opt_state)),
                  jax.tree.leaves((b.params, b.reward_head, b.opt_state))):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  assert rows(tmp_path / "full") == rows(tmp_path / "resumed")
  assert [r["step"] for r in rows(tmp_path / "full")] == list(range(1, STEPS + 1))
  assert {"train/loss", "train/accuracy", "train/margin", "train/ece", "eval/accuracy", "eval/ece",
          "eval/margin", "eval/loss"} <= set(rows(tmp_path / "full")[2])
  moving = ("workdir", "run_time_s")
  assert {k: v for k, v in summary.items() if k not in moving} == {k: v for k, v in summary2.items()
                                                                   if k not in moving}
  with open(tmp_path / "full" / "summary.json") as f:
    assert json.load(f)["eval_accuracy_end"] == summary["eval_accuracy_end"]

  # SIGTERM during step 4: the step finishes and is saved (the run shell, learn/shell.py); the same
  # command resumes and ends as the uninterrupted run.
  term = RewardModelRun(cfg, str(tmp_path / "sigterm"), log=quiet_log)
  step = term.train_batch

  def step_then_term(state):
    out = step(state)
    if int(out[0].step) == 4:
      os.kill(os.getpid(), signal.SIGTERM)
    return out

  term.train_batch = step_then_term
  with pytest.raises(Stopped, match="after step 4, which is saved"):
    term.run()
  assert RewardModelRun(cfg, str(tmp_path / "sigterm"), log=quiet_log).run()["eval_accuracy_end"] == \
      summary["eval_accuracy_end"]
  assert rows(tmp_path / "sigterm") == rows(tmp_path / "full")

  # A trained reward model reads back from its workdir.
  mesh = sharding_lib.make_mesh(cfg.mesh)
  params, head, model_cfg = load_reward_model(str(tmp_path / "full"), mesh)
  assert model_cfg == full.model_cfg
  np.testing.assert_array_equal(np.asarray(head["w_D"]), np.asarray(a.reward_head["w_D"]))
  np.testing.assert_array_equal(np.asarray(params["embed_VD"]), np.asarray(a.params["embed_VD"]))

  # Resuming with another config is refused, naming the key.
  with pytest.raises(ConfigError, match=r"train.lr: 0.003 -> 0.001"):
    RewardModelRun(config(**{"train.lr": 1e-3}), str(tmp_path / "full"), log=quiet_log).run()

  # init_checkpoint: a new run's trunk starts from the reward model's (its head is fresh).
  init = RewardModelRun(config(**{"train.steps": 0, "init_checkpoint": str(tmp_path / "full")}),
                        str(tmp_path / "init"), log=quiet_log)
  init.run()
  np.testing.assert_array_equal(np.asarray(init.final_state.params["embed_VD"]), np.asarray(a.params["embed_VD"]))


@pytest.mark.slow
def test_a_checkpoint_without_a_reward_head_is_refused(tmp_path):
  from jaxrl_llm.checkpointing.manager import CheckpointManager
  from jaxrl_llm.model.config import ModelConfig
  from jaxrl_llm.model.params import init_params

  cfg = ModelConfig.tiny(103, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=64)
  policy = tmp_path / "policy_run"
  with CheckpointManager(str(policy / "checkpoints"), model_config=cfg) as mngr:  # what an RL run saves, in short
    mngr.save(4, {"params": init_params(cfg, jax.random.key(0)), "step": np.int32(4)})
  mesh = sharding_lib.make_mesh(config().mesh)
  with pytest.raises(IncompatibleCheckpointError) as e:
    load_reward_model(str(policy), mesh)
  text = str(e.value)
  assert text.startswith(f"{policy} is not a reward model: checkpoint step 4 has no field 'reward_head'"), text
  assert "\n" not in text


@pytest.mark.slow
def test_the_export_loads_in_transformers_with_its_tokenizer(tmp_path, quiet_log):
  import torch
  import transformers

  run = RewardModelRun(config(**{"train.steps": 2, "export": True}), str(tmp_path / "rm"), log=quiet_log)
  summary = run.run()
  out = summary["export_dir"]
  assert out == str(tmp_path / "rm" / "hf")
  tok = transformers.AutoTokenizer.from_pretrained(out)
  ours = run.data.tokenizer
  text = "<bos>47+8=55<eos>"
  ids = tok(text, add_special_tokens=False)["input_ids"]
  assert ids == [ours.bos_id] + ours.encode("47+8=55") + [ours.eos_id]
  model = transformers.AutoModelForSequenceClassification.from_pretrained(out, dtype=torch.float32).eval()
  assert model.config.pad_token_id == ours.pad_id
  batch = run.data.eval.take(np.arange(8))
  tokens = batch.tokens_N2T.reshape(16, -1)
  with torch.no_grad():
    ref = model(input_ids=torch.from_numpy(tokens).long(),
                attention_mask=torch.from_numpy(batch.mask_N2T.reshape(16, -1)).long()).logits.numpy()[:, 0]
  from jaxrl_llm.reward_model.scorer import reward_scores

  st = run.final_state
  got = np.asarray(reward_scores(st.params, st.reward_head, run.model_cfg, tokens, batch.mask_N2T.reshape(16, -1)))
  np.testing.assert_allclose(got, ref, atol=1e-4)


def test_a_workdir_saved_before_a_key_existed_resumes_and_other_values_are_changes():
  from jaxrl_llm.checkpointing import provenance
  from jaxrl_llm.reward_model.trainer import reward_defaults

  new = provenance.plain_config(config())
  old = json.loads(json.dumps(new))
  del old["train"]["micro_batch_size"]  # a reward model trained before the key existed
  assert provenance.config_changes(old, new, reward_defaults) == {}
  micro = provenance.plain_config(config(**{"train.micro_batch_size": 8}))
  assert provenance.config_changes(old, micro, reward_defaults) == {"train.micro_batch_size": ("<absent>", 8)}
