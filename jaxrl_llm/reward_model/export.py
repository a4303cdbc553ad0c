"""A reward model as a Hugging Face sequence-classification folder.

`save_reward_hf` writes the trunk with the causal-LM export (`model.hf_io.save_hf`), then turns
it into `<Family>ForSequenceClassification` with num_labels = 1: the head w_D becomes
`score.weight` [1, D], the output head `lm_head.weight` (untied models) is dropped, and
config.json gets the architecture, `num_labels` and `pad_token_id`.

transformers' sequence classification scores the last token that is not `pad_token_id`
(scorer.py reads the last real token), so the two agree on right-padded inputs whose last real
token is not the pad id: `check_exportable` refuses training data whose sequences end with it (a
tokenizer that pads with the EOS appended to plain-text responses).
"""

from __future__ import annotations

import json
import os

import jax
import numpy as np
from safetensors.numpy import load_file, save_file

from jaxrl_llm.checks import ConfigError
from jaxrl_llm.model.config import ModelConfig
from jaxrl_llm.model.hf_io import save_hf

# family -> transformers' sequence-classification class (Gemma 3's text model: Gemma3Text...).
SEQ_CLS_ARCHITECTURES = {"llama": "LlamaForSequenceClassification", "qwen2": "Qwen2ForSequenceClassification",
                         "qwen3": "Qwen3ForSequenceClassification", "gemma3": "Gemma3TextForSequenceClassification"}


def check_exportable(pad_id: int, tokens_N2T: np.ndarray, mask_N2T: np.ndarray) -> None:
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
                   dtype: str | None = None, base_config: dict | None = None, tokenizer_dir: str | None = None) -> None:
  """`out_dir` as `<Family>ForSequenceClassification` (num_labels 1) with `pad_token_id = pad_id`;
  `dtype`, `base_config`, `tokenizer_dir` as in `save_hf`. Only process 0 writes."""
  save_hf(params, model_cfg, out_dir, dtype=dtype, base_config=base_config, tokenizer_dir=tokenizer_dir)
  w_1D = np.asarray(jax.device_get(head["w_D"]))[None, :]  # gathered by every process, like save_hf
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
      tensors["score.weight"] = np.ascontiguousarray(w_1D.astype(some.dtype))
      if index is not None:
        index["weight_map"]["score.weight"] = name
    save_file(tensors, path, metadata={"format": "pt"})
  if index is not None:
    with open(index_path, "w") as f:
      json.dump(index, f, indent=2)
  config_path = os.path.join(out_dir, "config.json")
  with open(config_path) as f:
    config = json.load(f)
  config.update(architectures=[SEQ_CLS_ARCHITECTURES[model_cfg.family]], num_labels=1, pad_token_id=int(pad_id),
                id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})
  with open(config_path, "w") as f:
    json.dump(config, f, indent=2, sort_keys=True)
