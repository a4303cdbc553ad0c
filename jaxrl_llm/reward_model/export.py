"""A reward model as a Hugging Face sequence-classification folder, a process reward model as a
token-classification one.

`save_reward_hf` writes the trunk with the causal-LM export (`model.io.hf_io.save_hf`), then turns
it into `<Family>ForSequenceClassification` with num_labels = 1: the head w_D becomes
`score.weight` [1, D], the output head `lm_head.weight` (untied models) is dropped, and
config.json gets the architecture, `num_labels` and `pad_token_id`.

transformers' sequence classification scores the last token that is not `pad_token_id`
(scorer.py reads the last real token), so the two agree on right-padded inputs whose last real
token is not the pad id: `check_exportable` refuses training data whose sequences end with it (a
tokenizer that pads with the EOS appended to plain-text responses).

A process reward model (process.py) scores every token, so it becomes
`<Family>ForTokenClassification` with num_labels = 2 (TRL's PRM convention, label 1 = a good step):
`score.weight` = [0; w_D] and `score.bias` = 0, so softmax(logits)[..., 1] = sigmoid(w_D . h_t), the
probability the step ending at t is good, exactly as process.py reads it. transformers has no
Gemma 3 text token classifier: `check_exportable` refuses that family's export up front.
"""

from __future__ import annotations

import json
import os

import jax
import numpy as np
from safetensors.numpy import load_file, save_file

from jaxrl_llm.checks import ConfigError
from jaxrl_llm.model.config import ModelConfig
from jaxrl_llm.model.io.hf_io import save_hf

# family -> transformers' sequence-classification class (Gemma 3's text model: Gemma3Text...).
SEQ_CLS_ARCHITECTURES = {"llama": "LlamaForSequenceClassification", "qwen2": "Qwen2ForSequenceClassification",
                         "qwen3": "Qwen3ForSequenceClassification", "gemma3": "Gemma3TextForSequenceClassification"}


# family -> transformers' token-classification class (a process reward model).
TOKEN_CLS_ARCHITECTURES = {"llama": "LlamaForTokenClassification", "qwen2": "Qwen2ForTokenClassification",
                           "qwen3": "Qwen3ForTokenClassification"}


def check_exportable(cfg, data) -> None:
  """A ConfigError before the run when config.export cannot be honoured (trainer.RewardData `data`)."""
  if cfg.process:
    family = _family(cfg)
    if family is not None and family not in TOKEN_CLS_ARCHITECTURES:
      raise ConfigError(f"config.export=True: transformers has no token classifier for the {family!r} family "
                        f"(a process reward model exports as one; allowed {sorted(TOKEN_CLS_ARCHITECTURES)}), "
                        "set export=False")
    return
  for arrays in (data.train, data.eval):
    check_last_token(data.tokenizer.pad_id, arrays.tokens_N2T, arrays.mask_N2T)


def _family(cfg) -> str | None:
  """The checkpoint's model family (None: the tiny Llama-shaped model)."""
  if not cfg.model.hf_path:
    return None
  from jaxrl_llm.model.io.hf_config import config_from_hf
  from jaxrl_llm.model.io.hf_io import read_hf_config

  return config_from_hf(read_hf_config(cfg.model.hf_path)).family


def check_last_token(pad_id: int, tokens_N2T: np.ndarray, mask_N2T: np.ndarray) -> None:
  """A ConfigError when a sequence's last real token is the pad id: transformers would read an earlier one."""
  last_N2 = np.take_along_axis(tokens_N2T, (mask_N2T.sum(-1) - 1)[..., None], axis=-1)[..., 0]
  if np.any(last_N2 == pad_id):
    raise ConfigError(f"config.export=True: sequences end with token id {pad_id}, the tokenizer's pad id (a "
                      "tokenizer that pads with the EOS it appends?); transformers' sequence classification reads "
                      "the last token that is not pad_token_id, so it would score an earlier token than this model: "
                      "use a tokenizer with a pad token of its own, or export=False")


def _weight_files(out_dir: str) -> list[str]:
  index = os.path.join(out_dir, "model.safetensors.index.json")
  if os.path.exists(index):
    with open(index) as f:
      return sorted(set(json.load(f)["weight_map"].values()))
  return ["model.safetensors"]


def save_reward_hf(params: dict, head: dict, model_cfg: ModelConfig, out_dir: str, *, pad_id: int,
                   dtype: str | None = None, base_config: dict | None = None, tokenizer_dir: str | None = None,
                   process: bool = False) -> None:
  """`out_dir` as `<Family>ForSequenceClassification` (num_labels 1; `process`: the module docstring's
  `<Family>ForTokenClassification`, num_labels 2) with `pad_token_id = pad_id`; `dtype`, `base_config`,
  `tokenizer_dir` as in `save_hf`. Only process 0 writes."""
  save_hf(params, model_cfg, out_dir, dtype=dtype, base_config=base_config, tokenizer_dir=tokenizer_dir)
  w_D = np.asarray(jax.device_get(head["w_D"]))  # gathered by every process, like save_hf
  head_tensors = ({"score.weight": np.stack([np.zeros_like(w_D), w_D]), "score.bias": np.zeros(2, w_D.dtype)}
                  if process else {"score.weight": w_D[None, :]})
  if jax.process_index() != 0:
    return
  files = _weight_files(out_dir)
  index_path = os.path.join(out_dir, "model.safetensors.index.json")
  index = None
  if os.path.exists(index_path):
    with open(index_path) as f:
      index = json.load(f)
  for i, name in enumerate(files):
    path = os.path.join(out_dir, name)
    tensors = load_file(path)
    if "lm_head.weight" in tensors:
      del tensors["lm_head.weight"]
      if index is not None:
        index["weight_map"].pop("lm_head.weight", None)
    if i == len(files) - 1:
      some = next(iter(tensors.values()))
      for key, value in head_tensors.items():
        tensors[key] = np.ascontiguousarray(value.astype(some.dtype))
        if index is not None:
          index["weight_map"][key] = name
    save_file(tensors, path, metadata={"format": "pt"})
  if index is not None:
    with open(index_path, "w") as f:
      json.dump(index, f, indent=2)
  config_path = os.path.join(out_dir, "config.json")
  with open(config_path) as f:
    config = json.load(f)
  if process:
    config.update(architectures=[TOKEN_CLS_ARCHITECTURES[model_cfg.family]], num_labels=2, pad_token_id=int(pad_id),
                  id2label={"0": "bad", "1": "good"}, label2id={"bad": 0, "good": 1})
  else:
    config.update(architectures=[SEQ_CLS_ARCHITECTURES[model_cfg.family]], num_labels=1, pad_token_id=int(pad_id),
                  id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})
  with open(config_path, "w") as f:
    json.dump(config, f, indent=2, sort_keys=True)
