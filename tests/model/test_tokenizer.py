"""HFTokenizer against transformers' own tokenizer on the same local files."""

import json

import pytest
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers

from jaxrl_llm.model.tokenizer import load_tokenizer

# A Qwen2.5-style template (system default, roles, generation prompt).
TEMPLATE = (
    "{%- if messages[0]['role'] != 'system' %}{{- '<|im_start|>system\\nYou are helpful.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


# The module-scoped fixtures run once: the module's tests go to one pytest-xdist worker.
pytestmark = pytest.mark.xdist_group("model.test_tokenizer")


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
  path = tmp_path_factory.mktemp("tok")
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  corpus = ["What is 12 + 30? The answer is 42.", "Solve for x: 2x = 10, so x = 5.",
            "You are helpful. Think step by step."] * 20
  tok.train_from_iterator(corpus, trainers.BpeTrainer(
      vocab_size=300, special_tokens=SPECIALS,
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  tok.save(str(path / "tokenizer.json"))
  (path / "tokenizer_config.json").write_text(json.dumps({
      "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": TEMPLATE,
      "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None}))
  (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
  return str(path)


MESSAGES = [{"role": "user", "content": "What is 12 + 30?"}]


def test_matches_transformers(tok_dir):
  ours = load_tokenizer(tok_dir)
  ref = transformers.AutoTokenizer.from_pretrained(tok_dir)
  for gen in (True, False):
    text = ours.apply_chat_template(MESSAGES, add_generation_prompt=gen)
    assert text == ref.apply_chat_template(MESSAGES, add_generation_prompt=gen, tokenize=False)
  text = ours.apply_chat_template(MESSAGES)
  assert text.endswith("<|im_start|>assistant\n")
  ids = ours.encode(text)
  assert ids == ref.encode(text, add_special_tokens=False)
  assert ids[0] == 1  # <|im_start|> is one special token (id 1), not split into characters
  assert ours.decode(ids, skip_special_tokens=False) == text
  assert ours.decode(ours.encode("x = 5.")) == "x = 5."
  # Specials: ids follow the trainer's special-token order.
  assert (ours.eos_id, ours.pad_id, ours.bos_id) == (2, 0, None)
  assert ours.eos_ids == (2, 0)  # config's eos first, then generation_config's others
  assert ours.vocab_size == len(ref) == 300


def test_errors(tok_dir, tmp_path):
  with pytest.raises(FileNotFoundError, match="tokenizer.json"):
    load_tokenizer(str(tmp_path))
  bad = load_tokenizer(tok_dir)
  with pytest.raises(ValueError, match=r"messages\[0\]"):
    bad.apply_chat_template([{"content": "no role"}])
  cfg = json.loads(open(f"{tok_dir}/tokenizer_config.json").read())
  (tmp_path / "tokenizer.json").write_text(open(f"{tok_dir}/tokenizer.json").read())
  (tmp_path / "tokenizer_config.json").write_text(json.dumps({**cfg, "eos_token": "<|nope|>"}))
  with pytest.raises(ValueError, match=r"eos_token='<\|nope\|>' is not in the vocabulary"):
    load_tokenizer(str(tmp_path))
  (tmp_path / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": None}))
  with pytest.raises(ValueError, match="no chat_template"):
    load_tokenizer(str(tmp_path)).apply_chat_template(MESSAGES)


def test_rollout_stops_at_every_eos_and_never_samples_padded_ids(tok_dir):
  """The run's sampler takes all of generation_config.json's eos ids, and the
  tokenizer's size as the limit of what it samples (a model's V may be padded)."""
  from jaxrl_llm.training.config import from_config_dict
  from jaxrl_llm.training.defaults import get_config

  tok = load_tokenizer(tok_dir)
  sampling = from_config_dict(get_config("grpo")).rollout.sampling(tok)
  assert sampling.eos_ids == (2, 0)
  assert sampling.vocab_limit == 300
  assert from_config_dict(get_config("grpo")).rollout.sampling(tok, greedy=True).eos_ids == (2, 0)
