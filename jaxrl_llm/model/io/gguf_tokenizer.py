"""GGUF tokenizer metadata -> a Hugging Face fast tokenizer (tokenizer.json and its config files).

A GGUF file carries its tokenizer as `tokenizer.ggml.*` metadata: the token
strings (their index is the id), their types, BPE merges or SentencePiece
scores, the special ids, the pre-tokenizer's name and the chat template.
Two models exist in the files we read:

* `gpt2`: byte-level BPE (SmolLM2, Llama 3, Qwen). Tokens are spelled in
  GPT-2's byte alphabet, the merges are stored, and `tokenizer.ggml.pre`
  names the regex that splits text before the merges apply; the regexes
  below are llama.cpp's (llama-vocab.cpp, `llm_tokenizer_bpe`).
* `llama`: SentencePiece-style BPE (Gemma 3). Spaces become U+2581, the
  merges are not stored but implied by the vocabulary: (l, r) merges to
  l + r whenever all three are tokens, ranked by the merged token's score,
  or for gemma3 by its position in the file (Gemma's scores do not follow its
  merge order). Bytes with no token fall back to the <0xXX> tokens.

Token types (llama.cpp's `llama_token_type`): 3 = control (special,
matched whole, skipped when decoding), 4 = user-defined (matched whole,
decoded as text), 6 = byte. transformers' gguf tokenizer (the test
reference) builds the same pieces; where llama.cpp and transformers differ
we say which we follow.
"""

from __future__ import annotations

import json

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from jaxrl_llm.checks import ConfigError
from jaxrl_llm.model.io.gguf_reader import GGUFFile

TOKENIZER_MODELS = ("gpt2", "llama")
_CONTROL, _USER_DEFINED = 3, 4
_SPACE = "\u2581"  # SentencePiece's visible space

_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_DIGITS = "digits"  # tokenizers' Digits(individual_digits=True): every numeric character a piece of its own
# tokenizer.ggml.pre -> (splits applied in turn, ignore_merges). llama.cpp looks a whole piece up in
# the vocabulary before merging for Llama 3's tokenizer (ignore_merges), as its tokenizer.json says.
PRE_TOKENIZERS = {
    "default": ((_GPT2_SPLIT,), False),
    "gpt2": ((_GPT2_SPLIT,), False),
    # SmolLM2's tokenizer.json: Digits(individual_digits) then GPT-2's split (llama.cpp: \p{N}, then GPT-2's).
    # transformers' gguf tokenizer leaves the digit step out, and so differs from both on "\n\n1" or " ½".
    "smollm": ((_DIGITS, _GPT2_SPLIT), False),
    "llama-bpe": ((_LLAMA3_SPLIT,), True),
    "llama3": ((_LLAMA3_SPLIT,), True),
    "smaug-bpe": ((_LLAMA3_SPLIT,), True),
    "qwen2": ((_QWEN2_SPLIT,), False),
    "deepseek-r1-qwen": ((_QWEN2_SPLIT,), False),
}


def _byte_alphabet() -> list[str]:
  """GPT-2's byte -> character table: printable Latin-1 bytes stand for themselves, the other 68
  bytes for the characters from U+0100 on, in byte order."""
  printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
               *range(ord("\u00ae"), ord("\u00ff") + 1)]
  table, extra = {}, 0
  for b in range(256):
    if b in printable:
      table[b] = chr(b)
    else:
      table[b] = chr(256 + extra)
      extra += 1
  return [table[b] for b in range(256)]


class _Vocab:
  """The file's tokens, types and special ids, checked against the model's vocabulary size."""

  def __init__(self, gg: GGUFFile, vocab_size: int):
    self.path = gg.path
    self.tokens = list(gg.meta("tokenizer.ggml.tokens"))
    if len(self.tokens) != vocab_size:
      raise ConfigError(f"{gg.path}: the tokenizer lists {len(self.tokens)} tokens (tokenizer.ggml.tokens) but the "
                        f"model's embedding has {vocab_size} rows: expected one token per row")
    self.types = list(gg.meta("tokenizer.ggml.token_type", [1] * len(self.tokens)))
    if len(self.types) != len(self.tokens):
      raise ConfigError(f"{gg.path}: tokenizer.ggml.token_type has {len(self.types)} entries for "
                        f"{len(self.tokens)} tokens")
    self.ids = {}
    for name, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("pad", "padding_token_id"),
                      ("unk", "unknown_token_id"), ("eot", "eot_token_id"), ("eom", "eom_token_id")):
      value = gg.meta(f"tokenizer.ggml.{key}", None)
      if value is None:
        continue
      if not 0 <= int(value) < len(self.tokens):
        raise ConfigError(f"{gg.path}: tokenizer.ggml.{key}={value} is not a token id (the vocabulary has "
                          f"{len(self.tokens)} tokens)")
      self.ids[name] = int(value)
    if "eos" not in self.ids:
      raise ConfigError(f"{gg.path}: no tokenizer.ggml.eos_token_id (the token that ends a response)")

  def text(self, name: str) -> str | None:
    return self.tokens[self.ids[name]] if name in self.ids else None


def _byte_level(gg: GGUFFile, vocab: _Vocab) -> Tokenizer:
  pre = gg.meta("tokenizer.ggml.pre", "default")
  if pre not in PRE_TOKENIZERS:
    raise ConfigError(f"{gg.path}: tokenizer.ggml.pre={pre!r} is not supported (supported: "
                      f"{', '.join(sorted(PRE_TOKENIZERS))})")
  splits, ignore_merges = PRE_TOKENIZERS[pre]
  alphabet = _byte_alphabet()
  allowed = set(alphabet)
  spelled = {}
  for i, (token, kind) in enumerate(zip(vocab.tokens, vocab.types)):
    if kind not in (_CONTROL, _USER_DEFINED) and not set(token) <= allowed:
      # A plain token in raw text (some converters write a few so): spell its UTF-8 bytes.
      token = "".join(alphabet[b] for b in token.encode("utf-8"))
    spelled[token] = i
  if len(spelled) != len(vocab.tokens):
    raise ConfigError(f"{gg.path}: tokenizer.ggml.tokens holds a token twice ({len(spelled)} distinct of "
                      f"{len(vocab.tokens)}); expected one id per token")
  merges = [tuple(m.split(" ", 1)) for m in gg.meta("tokenizer.ggml.merges")]
  try:
    tok = Tokenizer(models.BPE(spelled, merges, ignore_merges=ignore_merges))
  except Exception as e:  # tokenizers raises a bare Exception for a merge of unknown tokens
    raise ConfigError(f"{gg.path}: tokenizer.ggml.merges do not fit tokenizer.ggml.tokens ({e})") from None
  tok.pre_tokenizer = pre_tokenizers.Sequence(
      [pre_tokenizers.Digits(individual_digits=True) if s == _DIGITS else
       pre_tokenizers.Split(Regex(s), behavior="isolated") for s in splits]
      + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  tok.decoder = decoders.ByteLevel()
  return tok


def _sentencepiece(gg: GGUFFile, vocab: _Vocab) -> Tokenizer:
  # A token of spaces only is written with real spaces; the normaliser turns text spaces into U+2581.
  tokens = [_SPACE * len(t) if t and not t.strip(" ") else t for t in vocab.tokens]
  index = {t: i for i, t in enumerate(tokens)}
  if len(index) != len(tokens):
    raise ConfigError(f"{gg.path}: tokenizer.ggml.tokens holds a token twice ({len(index)} distinct of "
                      f"{len(tokens)}); expected one id per token")
  if gg.architecture == "gemma3" or not gg.has("tokenizer.ggml.scores"):
    priority = [-i for i in range(len(tokens))]  # the file's order is the merge order
  else:
    priority = list(gg.meta("tokenizer.ggml.scores"))
  found = []
  for token, i in index.items():
    for cut in range(1, len(token)):
      left, right = token[:cut], token[cut:]
      if left in index and right in index:
        # Best merged token first; of two splits of one token the longer left piece first.
        found.append((-priority[i], -cut, i, left, right))
  found.sort()
  unk = vocab.text("unk")
  tok = Tokenizer(models.BPE(index, [(l, r) for *_, l, r in found], unk_token=unk, fuse_unk=unk is not None,
                             byte_fallback=True))
  prefix = bool(gg.meta("tokenizer.ggml.add_space_prefix", True))  # llama.cpp's default for SentencePiece
  steps = [normalizers.Prepend(_SPACE)] if prefix else []
  tok.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", _SPACE)])
  steps = [decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
  tok.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if prefix else []))
  return tok


def _add_special(tok: Tokenizer, vocab: _Vocab, byte_level: bool) -> None:
  """Control tokens become special added tokens, user-defined ones plain added tokens (both matched
  whole in the text, before any splitting). A user-defined token of spaces only stays a vocabulary
  entry in SentencePiece (spelled with U+2581, the BPE forms it from normalised text)."""
  control, user = [], []
  for token, kind in zip(vocab.tokens, vocab.types):
    if kind == _CONTROL:
      control.append(AddedToken(token, special=True, normalized=False))
    elif kind == _USER_DEFINED and (byte_level or token.strip(" ")):
      user.append(AddedToken(token, special=False, normalized=False))
  tok.add_special_tokens(control)
  tok.add_tokens(user)


def _check_ids(tok: Tokenizer, vocab: _Vocab) -> None:
  """The built tokenizer must give every token of the file its own id: else the vocabulary would not
  match the model's rows."""
  size = tok.get_vocab_size(with_added_tokens=True)
  if size != len(vocab.tokens):
    raise ConfigError(f"{vocab.path}: the tokenizer built from tokenizer.ggml.* has {size} ids, the file lists "
                      f"{len(vocab.tokens)} tokens: expected one id per token")
  for name, idx in vocab.ids.items():
    got = tok.token_to_id(vocab.tokens[idx])
    if got != idx:
      raise ConfigError(f"{vocab.path}: {name} token {vocab.tokens[idx]!r} has id {got} in the built tokenizer, "
                        f"the file says {idx}")


def gguf_tokenizer_files(gg: GGUFFile, vocab_size: int, *, max_length: int) -> dict[str, str]:
  """file name -> content of the Hugging Face tokenizer files (tokenizer.json, tokenizer_config.json,
  special_tokens_map.json, generation_config.json, and chat_template.jinja when the file has one)."""
  kind = gg.meta("tokenizer.ggml.model")
  if kind not in TOKENIZER_MODELS:
    raise ConfigError(f"{gg.path}: tokenizer.ggml.model={kind!r} is not supported (supported: gpt2 = byte-level "
                      "BPE, llama = SentencePiece BPE)")
  vocab = _Vocab(gg, vocab_size)
  tok = _byte_level(gg, vocab) if kind == "gpt2" else _sentencepiece(gg, vocab)
  _add_special(tok, vocab, byte_level=kind == "gpt2")
  _check_ids(tok, vocab)
  # SentencePiece files add BOS unless they say otherwise (llama.cpp's default); BPE files only when told.
  add_bos = bool(gg.meta("tokenizer.ggml.add_bos_token", kind == "llama")) and "bos" in vocab.ids
  add_eos = bool(gg.meta("tokenizer.ggml.add_eos_token", False))
  around = [n for n, on in (("bos", add_bos), ("eos", add_eos)) if on]
  if around:  # encode(add_special_tokens=True) writes them
    single = ([vocab.text("bos")] if add_bos else []) + ["$A"] + ([vocab.text("eos")] if add_eos else [])
    tok.post_processor = processors.TemplateProcessing(
        single=single, special_tokens=[(vocab.text(n), vocab.ids[n]) for n in around])
  names = {"bos_token": vocab.text("bos"), "eos_token": vocab.text("eos"), "pad_token": vocab.text("pad"),
           "unk_token": vocab.text("unk")}
  names = {k: v for k, v in names.items() if v is not None}
  config = {"tokenizer_class": "PreTrainedTokenizerFast", **names, "add_bos_token": add_bos,
            "add_eos_token": add_eos, "clean_up_tokenization_spaces": False, "model_max_length": max_length}
  # A response also ends at the end-of-turn / end-of-message tokens llama.cpp knows of.
  eos_ids = list(dict.fromkeys(vocab.ids[n] for n in ("eos", "eot", "eom") if n in vocab.ids))
  generation = {"eos_token_id": eos_ids if len(eos_ids) > 1 else eos_ids[0]}
  generation.update({f"{n}_token_id": vocab.ids[n] for n in ("bos", "pad") if n in vocab.ids})
  files = {"tokenizer.json": tok.to_str(), "tokenizer_config.json": json.dumps(config, indent=2),
           "special_tokens_map.json": json.dumps(names, indent=2),
           "generation_config.json": json.dumps(generation, indent=2)}
  template = gg.meta("tokenizer.chat_template", None)
  if template:
    files["chat_template.jinja"] = template
  return files
