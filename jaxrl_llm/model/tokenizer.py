"""Tokenizers: the built-in character tokenizer and a Hugging Face tokenizer.

Both follow one protocol, the surface the trainer relies on:
`encode(str) -> list[int]`, `decode(ids) -> str`, `eos_id`, `eos_ids` (every id
that ends a response, `eos_id` first), `pad_id`, `bos_id`,
`vocab_size`, `apply_chat_template(messages, add_generation_prompt=True) -> str`.
`make_tokenizer(hf_path)` picks one: "" is the character tokenizer of the
built-in tasks, a directory is that checkpoint's tokenizer.

`HFTokenizer` reads a local directory through the `tokenizers` library
(tokenizer.json) and jinja2 (the checkpoint's chat template). The template renders in jinja2's immutable sandbox with the helpers Hugging
Face templates expect (raise_exception, strftime_now, a non-escaping tojson),
with trim_blocks / lstrip_blocks as transformers sets them.
"""

from __future__ import annotations

import datetime
import json
import os
import string
from collections.abc import Iterable, Sequence

import jinja2
import jinja2.sandbox
from tokenizers import Tokenizer

from jaxrl_llm.checks import ConfigError


def _token_text(value) -> str | None:
  """tokenizer_config stores special tokens as "text" or {"content": "text", ...}."""
  if isinstance(value, dict):
    return value.get("content")
  return value


def _read_json(path: str) -> dict:
  if not os.path.isfile(path):
    return {}
  with open(path) as f:
    return json.load(f)


def _template_env() -> jinja2.sandbox.ImmutableSandboxedEnvironment:
  def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)

  def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)

  def strftime_now(fmt):
    return datetime.datetime.now().strftime(fmt)

  env = jinja2.sandbox.ImmutableSandboxedEnvironment(
      trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
  env.filters["tojson"] = tojson
  env.globals["raise_exception"] = raise_exception
  env.globals["strftime_now"] = strftime_now
  return env


class HFTokenizer:
  """Wraps a `tokenizers.Tokenizer` plus the special tokens and chat template
  of a Hugging Face checkpoint directory."""

  def __init__(self, tokenizer: Tokenizer, *, eos_token: str, pad_token: str | None = None,
               bos_token: str | None = None, chat_template: str | None = None,
               extra_eos_ids: Sequence[int] = ()):
    self._tok = tokenizer
    self.eos_token, self.bos_token = eos_token, bos_token
    self.pad_token = pad_token or eos_token
    self.eos_id = self._require_id("eos_token", eos_token)
    self.pad_id = self._require_id("pad_token", self.pad_token)
    self.bos_id = self._require_id("bos_token", bos_token) if bos_token else None
    # Every id that ends a response (instruct checkpoints list several in
    # generation_config.json, e.g. <|im_end|> and <|endoftext|>).
    self.eos_ids = tuple(dict.fromkeys([self.eos_id, *map(int, extra_eos_ids)]))
    self.chat_template = chat_template
    self._compiled = _template_env().from_string(chat_template) if chat_template else None

  def _require_id(self, field: str, token: str) -> int:
    idx = self._tok.token_to_id(token)
    if idx is None:
      raise ValueError(f"tokenizer: {field}={token!r} is not in the vocabulary")
    return idx

  @property
  def vocab_size(self) -> int:
    """Ids in use, added tokens included (the model's V may be larger: padded)."""
    return self._tok.get_vocab_size(with_added_tokens=True)

  def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
    """Token ids of `text`. No BOS by default: chat templates write their own."""
    if not isinstance(text, str):
      raise TypeError(f"encode: text must be a str, got {type(text).__name__}")
    return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

  def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
    return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

  def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True,
                          **template_vars) -> str:
    """The conversation rendered by the checkpoint's chat template."""
    if self._compiled is None:
      raise ValueError("apply_chat_template: this tokenizer has no chat_template "
                       "(tokenizer_config.json / chat_template.jinja)")
    for i, m in enumerate(messages):
      if not isinstance(m, dict) or "role" not in m:
        raise ValueError(f"apply_chat_template: messages[{i}]={m!r} must be a dict with a 'role'")
    return self._compiled.render(
        messages=list(messages), add_generation_prompt=add_generation_prompt,
        bos_token=self.bos_token or "", eos_token=self.eos_token, pad_token=self.pad_token,
        **template_vars)


def check_hf_dir(path: str, *, chat_template: bool) -> None:
  """Everything a run needs from a Hugging Face directory, or one ConfigError listing all that is missing."""
  import glob

  if not os.path.isdir(path):
    raise ConfigError(f"config.model.hf_path={path!r} is not a directory: expected a Hugging Face checkpoint "
                      "directory (config.json, *.safetensors, tokenizer.json, tokenizer_config.json)")
  missing = []
  if not os.path.isfile(os.path.join(path, "config.json")):
    missing.append("config.json (the architecture)")
  if not glob.glob(os.path.join(path, "*.safetensors")):
    missing.append("*.safetensors (the weights)")
  if not os.path.isfile(os.path.join(path, "tokenizer.json")):
    missing.append("tokenizer.json (a fast tokenizer)")
  config = _read_json(os.path.join(path, "tokenizer_config.json"))
  special = _read_json(os.path.join(path, "special_tokens_map.json"))
  if not (_token_text(config.get("eos_token")) or _token_text(special.get("eos_token"))):
    missing.append("an eos_token in tokenizer_config.json or special_tokens_map.json (the end of a response)")
  if chat_template and not (config.get("chat_template") or os.path.isfile(os.path.join(path, "chat_template.jinja"))):
    missing.append("a chat_template in tokenizer_config.json or chat_template.jinja "
                   "(or run with --config.data.chat_template=False)")
  if missing:
    raise ConfigError(f"config.model.hf_path={path!r} lacks: " + "; ".join(missing))


def load_tokenizer(path: str) -> HFTokenizer:
  """HFTokenizer from a local directory with tokenizer.json (+ tokenizer_config.json,
  chat_template.jinja, generation_config.json when present)."""
  tok_file = os.path.join(path, "tokenizer.json")
  if not os.path.isfile(tok_file):
    raise FileNotFoundError(f"{path}: no tokenizer.json (only fast tokenizers are supported)")
  tokenizer = Tokenizer.from_file(tok_file)
  config = _read_json(os.path.join(path, "tokenizer_config.json"))
  special = _read_json(os.path.join(path, "special_tokens_map.json"))
  gen = _read_json(os.path.join(path, "generation_config.json"))

  def token(name):
    return _token_text(config.get(name)) or _token_text(special.get(name))

  eos = token("eos_token")
  if eos is None:
    raise ValueError(f"{path}: no eos_token in tokenizer_config.json or special_tokens_map.json")
  template = config.get("chat_template")
  jinja_file = os.path.join(path, "chat_template.jinja")
  if os.path.isfile(jinja_file):  # transformers >= 4.43 writes it beside the config
    with open(jinja_file) as f:
      template = f.read()
  if isinstance(template, list):  # named templates: use "default"
    named = {t["name"]: t["template"] for t in template}
    if "default" not in named:
      raise ValueError(f"{path}: chat_template lists {sorted(named)} but no 'default'")
    template = named["default"]
  extra = gen.get("eos_token_id", [])
  extra = [extra] if isinstance(extra, int) else list(extra or [])
  return HFTokenizer(tokenizer, eos_token=eos, pad_token=token("pad_token"),
                     bos_token=token("bos_token"), chat_template=template, extra_eos_ids=extra)


# ---- the character tokenizer of the built-in tasks ---------------------------

PAD, EOS, BOS = "<pad>", "<eos>", "<bos>"
# Every printable ASCII character plus newline: enough for arithmetic,
# countdown and plain-text prompts, small enough for a tiny model (V = 103).
_CHARS = string.digits + string.ascii_letters + string.punctuation + " \n"


class CharTokenizer:
  """One id per character; ids 0, 1, 2 are pad, eos and bos."""

  def __init__(self) -> None:
    self._itos = [PAD, EOS, BOS] + list(_CHARS)
    self._stoi = {c: i for i, c in enumerate(self._itos) if len(c) == 1}

  pad_id = 0
  eos_id = 1
  eos_ids = (1,)
  bos_id = 2

  @property
  def vocab_size(self) -> int:
    return len(self._itos)

  def encode(self, text: str) -> list[int]:
    try:
      return [self._stoi[c] for c in text]
    except KeyError as e:
      raise ValueError(
          f"CharTokenizer.encode: character {e.args[0]!r} in {text[:60]!r} is "
          f"not in the vocabulary (printable ASCII and newline)") from None

  def decode(self, ids: Iterable[int]) -> str:
    """Decodes ids, dropping pad/bos and stopping at the first eos."""
    out = []
    for i in ids:
      i = int(i)
      if i == self.eos_id:
        break
      if i in (self.pad_id, self.bos_id):
        continue
      if not 0 <= i < len(self._itos):
        raise ValueError(f"CharTokenizer.decode: id {i} outside [0, {len(self._itos)})")
      out.append(self._itos[i])
    return "".join(out)

  def save_pretrained(self, out: str) -> dict:
    """Writes this tokenizer as a Hugging Face fast tokenizer (tokenizer.json, tokenizer_config.json,
    special_tokens_map.json, generation_config.json) so that transformers loads and generates from an
    exported model without this package; returns the special tokens' ids.

    One id per character, as `encode`: a WordLevel model over single characters (a character outside
    the vocabulary maps to <pad>, where `encode` raises). The model's own prompts start with <bos>.
    """
    import json as json_lib

    from tokenizers import AddedToken, Regex, Tokenizer as HFTok, decoders, models, pre_tokenizers

    tok = HFTok(models.WordLevel({t: i for i, t in enumerate(self._itos)}, unk_token=PAD))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # every character
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in (PAD, EOS, BOS)])
    os.makedirs(out, exist_ok=True)
    tok.save(os.path.join(out, "tokenizer.json"))
    special = {"pad_token": PAD, "eos_token": EOS, "bos_token": BOS}
    ids = {"pad_token_id": self.pad_id, "eos_token_id": self.eos_id, "bos_token_id": self.bos_id}
    files = {"tokenizer_config.json": {"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": False,
                                       "clean_up_tokenization_spaces": False, **special},
             "special_tokens_map.json": special, "generation_config.json": ids}
    for name, content in files.items():
      with open(os.path.join(out, name), "w") as f:
        json_lib.dump(content, f, indent=2)
    return ids

  def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
    """Plain concatenation of the message contents.

    A tiny character model has no roles, so the template adds no markers: the
    task prompt itself ("12+45=") ends where the answer starts. The argument
    `add_generation_prompt` is accepted for protocol compatibility.
    """
    del add_generation_prompt
    for m in messages:
      if "content" not in m:
        raise ValueError(f"apply_chat_template: message {m!r} has no 'content'")
    return "".join(m["content"] for m in messages)


def make_tokenizer(hf_path: str = ""):
  """The run's tokenizer: "" -> CharTokenizer; a Hugging Face directory -> its tokenizer."""
  return load_tokenizer(hf_path) if hf_path else CharTokenizer()
