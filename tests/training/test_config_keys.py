"""Every config key is declared once (STYLE.md, "Config"), read from the declarations themselves.

A key of `training/defaults.py`'s `get_config` is declared either by a literal
assignment line there (`c.rollout.staleness = 0  # ...`, or `c.rollout["key"] = ...`)
or by a field of the one dataclass a `section_block(Cls)` (or `objective_block`)
builds its section from. A key that is both, or a literal whose section
dataclass (training/config.py's SECTIONS, and the sections inside them) holds
the same default again (a copy by hand, free to drift), is declared twice.
The sections' dataclass fields are the keys of their blocks, one for one.
"""

import ast
import dataclasses
import inspect
import json

import pytest

from jaxrl_llm.objectives import ObjectiveConfig
from jaxrl_llm.sampling.config import ServerConfig
from jaxrl_llm.training import defaults
from jaxrl_llm.training.config import SECTIONS, RunConfig
from jaxrl_llm.training.provenance import flatten as _flat

def _key(target) -> str | None:
  """`c.a.b` / `c.a["b"]` -> "a.b"; None for anything that is not a path from `c`."""
  if isinstance(target, ast.Name):
    return "" if target.id == "c" else None
  if isinstance(target, ast.Attribute):
    base = _key(target.value)
    return None if base is None else f"{base}.{target.attr}".lstrip(".")
  if isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant):
    base = _key(target.value)
    return None if base is None else f"{base}.{target.slice.value}".lstrip(".")
  return None


def _call_name(node) -> str:
  if isinstance(node, ast.Call):
    f = node.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
  return ""


def parse_defaults(source: str) -> tuple[dict[str, list[int]], dict[str, type]]:
  """({key: lines of its literal assignments}, {section: the dataclass its block is built from})
  of the assignments in `get_config` of defaults.py's source."""
  fn = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == "get_config")
  literals: dict[str, list[int]] = {}
  blocks: dict[str, type] = {}
  for node in ast.walk(fn):
    if not isinstance(node, ast.Assign):
      continue
    pairs = []
    for target in node.targets:
      if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
        pairs += list(zip(target.elts, node.value.elts))
      else:
        pairs.append((target, node.value))
    for target, value in pairs:
      key = _key(target)
      if not key:
        continue
      name = _call_name(value)
      if name == "ConfigDict":  # an empty section; its keys are declared by the lines below it
        continue
      if name == "section_block":
        blocks[key] = getattr(defaults, value.args[0].id)
      elif name == "objective_block":
        blocks[key] = ObjectiveConfig  # every field of the method's preset (defaults.objective_block)
      else:
        literals.setdefault(key, []).append(node.lineno)
  return literals, blocks


def _section_classes() -> dict[str, type]:
  """Section path -> the dataclass the trainer converts it into: RunConfig's SECTIONS and, inside
  them, every field whose default is itself a section dataclass (rollout.server, ...)."""
  out = {}

  def walk(path, cls):
    out[path] = cls
    for f in dataclasses.fields(cls):
      if dataclasses.is_dataclass(f.default):
        walk(f"{path}.{f.name}", type(f.default))

  for name, cls in SECTIONS.items():
    walk(name, cls)
  return out


def _default(cls, name):
  f = next((f for f in dataclasses.fields(cls) if f.name == name), None)
  if f is None:
    return dataclasses.MISSING
  if f.default_factory is not dataclasses.MISSING:
    return f.default_factory()
  return f.default


def declarations(source: str, config) -> dict[str, list[str]]:
  """Every leaf key of `config` -> where it is declared (one entry per declaration)."""
  literals, blocks = parse_defaults(source)
  values = _flat(config.to_dict())
  classes = {"": RunConfig, **_section_classes()}
  out: dict[str, list[str]] = {key: [] for key in values}
  for key, lines in literals.items():
    out.setdefault(key, []).extend(f"defaults.py:{n}" for n in lines)
    section, _, field = key.rpartition(".")
    cls = None if section in blocks else classes.get(section)  # a block's field is counted below
    if cls is not None and key in values and not dataclasses.is_dataclass(_default(cls, field)):
      default = _default(cls, field)
      if default is not dataclasses.MISSING and default == values[key]:
        out[key].append(f"{cls.__name__}.{field} (the same default, copied)")
  for section, cls in blocks.items():
    for f in dataclasses.fields(cls):
      out.setdefault(f"{section}.{f.name}", []).append(f"{cls.__name__}.{f.name}")
  return out


def _defaults_source() -> str:
  with open(inspect.getsourcefile(defaults)) as f:
    return f.read()


def test_every_key_is_declared_exactly_once():
  found = declarations(_defaults_source(), defaults.get_config("gspo"))
  twice = {k: v for k, v in found.items() if len(v) != 1}
  assert not twice, "keys not declared exactly once: " + "; ".join(f"{k}: {v}" for k, v in sorted(twice.items()))


def test_no_key_is_both_a_literal_and_a_block_field():
  literals, blocks = parse_defaults(_defaults_source())
  fields = {f"{s}.{f.name}" for s, cls in blocks.items() for f in dataclasses.fields(cls)}
  inside = {k for k in literals if any(k.startswith(s + ".") or k == s for s in blocks)}
  assert not set(literals) & fields and not inside, sorted(set(literals) & fields | inside)
  assert {"rollout.server", "rollout.mismatch", "checkpoint", "teacher", "guard", "objective"} <= set(blocks)


def test_section_fields_are_the_keys_of_their_blocks():
  config = defaults.get_config("gspo").to_dict()

  def block(path):
    node = config
    for p in path.split("."):
      node = node[p]
    return node

  _, blocks = parse_defaults(_defaults_source())
  for path, cls in {**_section_classes(), **blocks}.items():
    assert {f.name for f in dataclasses.fields(cls)} == set(block(path)), (path, cls.__name__)
  assert {f.name for f in dataclasses.fields(RunConfig)} == set(config)


# ---- the checker finds what it is for ------------------------------------------------------------

_FLAT_SERVER_KEYS = '''
def get_config(method="gspo"):
  c = ml_collections.ConfigDict()
  c.rollout = ml_collections.ConfigDict()
  c.rollout.server = section_block(ServerConfig)
  c.rollout["overlap"] = False  # a subscript is a literal too
  c.rollout.server.url = ""  # the layout this change removed: a key written here and in its dataclass
  c.task = ml_collections.ConfigDict()
  c.task.name, c.task.digits = "arithmetic", 2
'''


def test_the_checker_counts_a_literal_that_repeats_a_block_field():
  literals, blocks = parse_defaults(_FLAT_SERVER_KEYS)
  assert literals == {"rollout.overlap": [6], "rollout.server.url": [7], "task.name": [9], "task.digits": [9]}
  assert blocks == {"rollout.server": ServerConfig}
  found = declarations(_FLAT_SERVER_KEYS, defaults.get_config("gspo"))
  assert found["rollout.server.url"] == ["defaults.py:7", "ServerConfig.url"]
  assert found["rollout.server.sync"] == ["ServerConfig.sync"]


def test_the_checker_counts_a_default_copied_by_hand(monkeypatch):
  # The rollout section before this change: `c.rollout.server_url = ""` in defaults.py and
  # `server_url: str = ""` in RolloutConfig: two declarations of one key.
  @dataclasses.dataclass(frozen=True)
  class OldRollout:
    staleness: int
    server_url: str = ""

  source = ('def get_config():\n  c.rollout = ml_collections.ConfigDict()\n'
            '  c.rollout.staleness = 0\n  c.rollout.server_url = ""\n')
  config = type("Cfg", (), {"to_dict": lambda self: {"rollout": {"staleness": 0, "server_url": ""}}})()
  monkeypatch.setitem(SECTIONS, "rollout", OldRollout)
  found = declarations(source, config)
  assert found == {"rollout.staleness": ["defaults.py:3"],
                   "rollout.server_url": ["defaults.py:4", "OldRollout.server_url (the same default, copied)"]}


# ---- renamed keys: refused on input, read from an old workdir ------------------------------------

# The rollout section of a config.json as the flat layout wrote it (RolloutConfig's fields before
# rollout.server / rollout.mismatch / rollout.overlap), with values other than the defaults.
OLD_ROLLOUT = {
    "engine": "openai", "prompts_per_step": 8, "group_size": 4, "max_response_len": 5, "temperature": 1.0,
    "top_k": 0, "top_p": 1.0, "sampler_dtype": "float32", "staleness": 1, "record_topk": 0,
    "quant": "none", "quant_group": 64, "noise": 0.0, "noise_seed": 5, "async_": True,
    "sync_every": 2, "server_url": "", "server_model": "policy", "server_command": "llama-server -t 2",
    "server_export": "q8_0", "server_sync": "restart", "server_concurrency": 4, "server_timeout_s": 30.0,
    "server_retries": 5, "server_backoff_s": 0.25, "server_on_failure": "drop", "server_on_exit": "error",
    "server_wait_s": 60.0,
}
# The same settings under their current keys.
NEW_KEYS = {
    "rollout.engine": "openai", "rollout.staleness": 1, "rollout.overlap": True,
    "rollout.mismatch.quant_group": 64, "rollout.mismatch.noise_seed": 5, "rollout.server.sync_every": 2,
    "rollout.server.model": "policy", "rollout.server.command": "llama-server -t 2", "rollout.server.export": "q8_0",
    "rollout.server.concurrency": 4, "rollout.server.timeout_s": 30.0, "rollout.server.retries": 5,
    "rollout.server.backoff_s": 0.25, "rollout.server.on_failure": "drop", "rollout.server.on_exit": "error",
    "rollout.server.wait_s": 60.0,
}


def _old_and_new():
  from run_helpers import load_config, shrink

  from jaxrl_llm.training.config import from_config_dict
  from jaxrl_llm.training.provenance import plain_config

  cfg = from_config_dict(shrink(load_config("grpo"), **NEW_KEYS))
  old = plain_config(cfg)
  old["rollout"] = dict(OLD_ROLLOUT)
  return cfg, old


def test_every_old_key_has_a_new_home():
  from jaxrl_llm.checks import RENAMED_KEYS

  new = _flat(defaults.get_config("gspo").to_dict())
  old_only = {f"rollout.{k}" for k in OLD_ROLLOUT} - set(new)
  assert old_only == set(RENAMED_KEYS) - {"rollout.async"}  # config.json held async_; a config file, async
  assert all(RENAMED_KEYS[k] in new for k in RENAMED_KEYS)


def test_an_old_workdir_config_reads_into_the_new_run_config(tmp_path):
  from jaxrl_llm.evaluate import load_run_config
  from jaxrl_llm.training.config import from_config_dict
  from jaxrl_llm.training.provenance import complete, plain_config

  cfg, old = _old_and_new()
  (tmp_path / "config.json").write_text(json.dumps(old, indent=2))
  for read in (from_config_dict(complete(old)), load_run_config(str(tmp_path))):
    assert read.rollout == cfg.rollout and plain_config(read) == plain_config(cfg)
  ro = cfg.rollout
  assert (ro.overlap, ro.mismatch.quant_group, ro.mismatch.noise_seed, ro.server.sync_every) == (True, 64, 5, 2)
  assert (ro.server.export, ro.server.retries, ro.server.on_failure, ro.server.wait_s) == ("q8_0", 5, "drop", 60.0)
  assert old["rollout"] == OLD_ROLLOUT  # upgrade copies: the saved dict is not changed


def test_an_old_workdir_resumes_with_the_same_settings_and_is_rewritten_in_the_new_layout(tmp_path):
  from jaxrl_llm.checkpointing.provenance import record_config
  from jaxrl_llm.checks import ConfigError
  from jaxrl_llm.training import provenance

  cfg, old = _old_and_new()
  defaults = lambda: provenance.run_defaults(cfg.method)  # noqa: E731 (as the trainer's run shell passes them)
  assert provenance.result_changes(old, provenance.plain_config(cfg)) == {}
  (tmp_path / "config.json").write_text(json.dumps(old))
  record_config(str(tmp_path), cfg, resuming=True, allow_change=False, log=None, defaults=defaults)
  saved = json.loads((tmp_path / "config.json").read_text())
  assert saved == provenance.plain_config(cfg)
  assert saved["rollout"]["server"]["sync_every"] == 2 and "server_url" not in saved["rollout"]
  assert saved["rollout"]["overlap"] is True and "async_" not in saved["rollout"]
  assert not (tmp_path / provenance.HISTORY_FILE).exists()
  # A value changed under its old name is still a change of the new key.
  changed = json.loads(json.dumps(old))
  changed["rollout"]["server_retries"] = 3
  (tmp_path / "config.json").write_text(json.dumps(changed))
  assert provenance.result_changes(changed, provenance.plain_config(cfg)) == {"rollout.server.retries": (3, 5)}
  with pytest.raises(ConfigError, match=r"another config, .*: rollout\.server\.retries: 3 -> 5\. Rerun"):
    record_config(str(tmp_path), cfg, resuming=True, allow_change=False, log=None, defaults=defaults)


@pytest.mark.parametrize("argv,message", [
    (["--config.rollout.async=True"], "config.rollout.async was renamed: use --config.rollout.overlap=True"),
    (['--config.rollout["async"]=True'], "config.rollout.async was renamed: use --config.rollout.overlap=True"),
    (["--config.rollout.server_url=http://h:1"],
     "config.rollout.server_url was renamed: use --config.rollout.server.url=http://h:1"),
    (["--config.rollout.sync_every", "4"],
     "config.rollout.sync_every was renamed: use --config.rollout.server.sync_every=4"),
    (["--config.rollout.quant_group=128"],
     "config.rollout.quant_group was renamed: use --config.rollout.mismatch.quant_group=128"),
])
def test_an_old_key_on_the_command_line_is_refused_naming_the_new_one(argv, message):
  from jaxrl_llm.checks import ConfigError
  from jaxrl_llm.cli import refuse_renamed_flags

  with pytest.raises(ConfigError) as e:
    refuse_renamed_flags(["--config=configs/grpo.py", *argv])
  assert str(e.value) == message
  refuse_renamed_flags(["--config=configs/grpo.py", "--config.rollout.overlap=True", "--config.rollout.server.url=x"])


def test_an_old_key_in_a_config_dict_is_refused_naming_the_new_one():
  from jaxrl_llm.checks import ConfigError
  from jaxrl_llm.training.config import from_config_dict

  d = defaults.get_config("grpo").to_dict()
  d["rollout"]["noise"] = 0.1
  with pytest.raises(ConfigError, match=r"^config\.rollout\.noise was renamed: use config\.rollout\.mismatch\.noise "):
    from_config_dict(d)


@pytest.mark.parametrize("section,key,message", [
    ("rollout", "async", "config.rollout.async was renamed: use config.rollout.overlap (--config.rollout.overlap=... "
                         "on the command line, c.rollout.overlap = ... in a config file)"),
    ("rollout", "server_wait_s", "config.rollout.server_wait_s was renamed: use config.rollout.server.wait_s ("),
    ("teacher", "quant", "unknown config key "),  # not a renamed key: another section's typo
])
def test_a_renamed_key_set_in_a_config_file_is_named(section, key, message):
  from jaxrl_llm import cli

  c = defaults.get_config("grpo")  # locked, as the trainer loads a config file
  with pytest.raises(KeyError) as e:
    c[section][key] = True
  assert cli.is_user_error(e.value) and cli.message(e.value).startswith(message)
