"""The package's layout rules, read from the source (docs/architecture.md states them).

* no import cycle between modules (imports inside functions count too);
* the layers: objectives/ imports nothing else of the package; envs/
  imports only tasks/ and checks; learn/ (the one optimizer step and run shell)
  only model/, objectives/, kernels/, checkpointing/, rundir/, checks and faults; model/, sampling/, tasks/, envs/,
  kernels/, checkpointing/ and teacher/ never import training/; rundir/
  imports nothing else of the package, and lab/ only checks, cli and
  rundir; only training/loop.py and the entry points name the Trainer;
* the entry points (`python -m jaxrl_llm.<name>`, listed below) sit on top:
  no module imports one;
* one name per concept: no public class, function or constant is defined in
  two modules (re-exports and aliases are not definitions).
"""

import ast
import collections
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Every module with an `if __name__ == "__main__":` block (test_entry_points_are_listed).
ENTRY_POINTS = ("jaxrl_llm.train", "jaxrl_llm.compile", "jaxrl_llm.evaluate", "jaxrl_llm.report", "jaxrl_llm.convert",
                "jaxrl_llm.inspect", "jaxrl_llm.objectives.__main__", "jaxrl_llm.lab.__main__",
                "jaxrl_llm.reward_model.__main__")


def _modules() -> dict[str, str]:
  """module name -> file, for jaxrl_llm/ and kernels/ (installed as jaxrl_llm.kernels)."""
  out = {}
  for folder, package in (("jaxrl_llm", "jaxrl_llm"), ("kernels", "jaxrl_llm.kernels")):
    for dirpath, _, files in os.walk(os.path.join(REPO, folder)):
      for f in files:
        if f.endswith(".py"):
          rel = os.path.relpath(os.path.join(dirpath, f), os.path.join(REPO, folder))[:-3].replace(os.sep, ".")
          name = package if rel == "__init__" else f"{package}.{rel.removesuffix('.__init__')}"
          out[name] = os.path.join(dirpath, f)
  return out


MODULES = _modules()


def _imports(name: str, path: str) -> set[str]:
  """Modules of the package that `name` imports, anywhere in the file."""
  is_pkg = path.endswith("__init__.py")
  found = set()
  for node in ast.walk(ast.parse(open(path).read())):
    if isinstance(node, ast.Import):
      targets = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        parts = name.split(".") if is_pkg else name.split(".")[:-1]
        base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
      # `from pkg import sub` imports the submodule; `from pkg import name` the package.
      subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES]
      targets = subs if len(subs) == len(node.names) else [base] + subs
    else:
      continue
    found.update(t for t in targets if t in MODULES and t != name)
  return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _cycle():
  state, stack = {}, []

  def visit(u):
    state[u] = 1
    stack.append(u)
    for v in sorted(GRAPH[u]):
      if v.startswith(u + ".") or u.startswith(v + "."):
        continue  # a package and its own submodules
      if state.get(v) == 1:
        return stack[stack.index(v):] + [v]
      if not state.get(v):
        found = visit(v)
        if found:
          return found
    stack.pop()
    state[u] = 2
    return None

  for m in sorted(GRAPH):
    if not state.get(m):
      found = visit(m)
      if found:
        return found
  return None


def test_graph_is_read():
  # The walk finds the package: a typo in the paths above would make every rule pass vacuously.
  assert "jaxrl_llm.training.loop" in GRAPH and "jaxrl_llm.kernels.token_logprobs" in GRAPH
  assert "jaxrl_llm.training.step" in GRAPH["jaxrl_llm.training.loop"]


def test_no_import_cycle():
  assert _cycle() is None, " -> ".join(_cycle())


@pytest.mark.parametrize("package,allowed", [
    ("jaxrl_llm.objectives", ("jaxrl_llm.objectives", "jaxrl_llm.checks")),
    ("jaxrl_llm.kernels", ("jaxrl_llm.kernels", "jaxrl_llm.checks")),
    ("jaxrl_llm.model", ("jaxrl_llm.model", "jaxrl_llm.kernels", "jaxrl_llm.checks")),
    ("jaxrl_llm.sampling", ("jaxrl_llm.sampling", "jaxrl_llm.model", "jaxrl_llm.kernels", "jaxrl_llm.checks",
                            "jaxrl_llm.faults")),
    ("jaxrl_llm.tasks", ("jaxrl_llm.tasks", "jaxrl_llm.checks", "jaxrl_llm.faults")),
    ("jaxrl_llm.envs", ("jaxrl_llm.envs", "jaxrl_llm.tasks", "jaxrl_llm.checks")),
    ("jaxrl_llm.learn", ("jaxrl_llm.learn", "jaxrl_llm.model", "jaxrl_llm.objectives", "jaxrl_llm.kernels",
                         "jaxrl_llm.checkpointing", "jaxrl_llm.rundir", "jaxrl_llm.checks", "jaxrl_llm.faults")),
    ("jaxrl_llm.rundir", ("jaxrl_llm.rundir",)),
    ("jaxrl_llm.lab", ("jaxrl_llm.lab", "jaxrl_llm.checks", "jaxrl_llm.cli", "jaxrl_llm.rundir")),
])
def test_lower_layers_import_only_below_them(package, allowed):
  bad = {m: sorted(d for d in deps if not d.startswith(allowed))
         for m, deps in GRAPH.items() if m == package or m.startswith(package + ".")}
  assert not {m: d for m, d in bad.items() if d}


def _has_main_block(path: str) -> bool:
  return any(isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'"
             for node in ast.parse(open(path).read()).body)


def test_entry_points_are_listed():
  # A new entry point is added to ENTRY_POINTS (and to tests/test_wheel.py), not found by accident.
  assert sorted(m for m, path in MODULES.items() if _has_main_block(path)) == sorted(ENTRY_POINTS)


def test_no_module_imports_an_entry_point():
  # Entry points parse flags and call the package; what they call lives below them (rundir/, training/, ...).
  users = {m: sorted(set(ENTRY_POINTS) & deps) for m, deps in GRAPH.items()}
  assert not {m: d for m, d in users.items() if d}


# Above training, like an entry point: tpu/ builds the trainer's own programs to compile them for a TPU
# topology (python -m jaxrl_llm.compile), and only entry points import it.
ABOVE_TRAINING = ("jaxrl_llm.tpu",)


def test_nothing_outside_training_imports_it():
  users = {m: sorted(d for d in deps if d.startswith("jaxrl_llm.training"))
           for m, deps in GRAPH.items() if not m.startswith(("jaxrl_llm.training",) + ABOVE_TRAINING)
           and m not in ENTRY_POINTS}
  assert not {m: d for m, d in users.items() if d}


def test_only_entry_points_import_what_sits_above_training():
  users = {m: sorted(d for d in deps if d.startswith(ABOVE_TRAINING))
           for m, deps in GRAPH.items() if not m.startswith(ABOVE_TRAINING) and m not in ENTRY_POINTS}
  assert not {m: d for m, d in users.items() if d}


def test_only_the_loop_and_entry_points_name_the_trainer():
  named = []
  for m, path in MODULES.items():
    if m in ENTRY_POINTS or m == "jaxrl_llm.training.loop":
      continue
    if any(isinstance(n, ast.Name) and n.id == "Trainer" or isinstance(n, ast.alias) and n.name == "Trainer"
           for n in ast.walk(ast.parse(open(path).read()))):
      named.append(m)
  assert not named


def _definitions():
  """public name -> modules defining it (classes, functions, UPPER_CASE constants; no aliases)."""
  defs = collections.defaultdict(list)
  for m, path in MODULES.items():
    if m.rsplit(".", 1)[-1].startswith("_"):
      continue  # private modules: interchangeable implementations behind one public op
    for node in ast.parse(open(path).read()).body:
      names = []
      if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        names = [node.name]
      elif isinstance(node, (ast.Assign, ast.AnnAssign)) and not isinstance(node.value, (ast.Name, ast.Attribute)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        names = [t.id for t in targets if isinstance(t, ast.Name) and t.id.isupper()]
      for n in names:
        if not n.startswith("_"):
          defs[n].append(m)
  return defs


def test_one_definition_per_name():
  twice = {n: ms for n, ms in _definitions().items() if len(ms) > 1 and n != "main"}
  assert not twice


# ---- the base install provides every runtime import -----------------------------------

# Imported only by an optional feature, with an error saying what to install.
OPTIONAL_IMPORTS = {"pyarrow": "parquet data files (tasks/files.py)"}


def _third_party_imports() -> dict[str, list[str]]:
  import sys

  out = collections.defaultdict(list)
  for m, path in MODULES.items():
    for node in ast.walk(ast.parse(open(path).read())):
      if isinstance(node, ast.Import):
        roots = [a.name.split(".")[0] for a in node.names]
      elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
        roots = [node.module.split(".")[0]]
      else:
        continue
      for r in roots:
        if r not in sys.stdlib_module_names and r != "jaxrl_llm":
          out[r].append(m)
  return out


def _base_install() -> set[str]:
  """Distributions (normalised names) of pyproject's [project].dependencies and everything they require."""
  import importlib.metadata as md
  import re
  import tomllib

  from packaging.requirements import Requirement

  def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()

  with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
    todo = [Requirement(d) for d in tomllib.load(f)["project"]["dependencies"]]
  seen = set()
  while todo:
    req = todo.pop()
    name = norm(req.name)
    if name in seen or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
      continue  # seen, or not installed here (another Python, or an extra of that package)
    seen.add(name)
    todo.extend(Requirement(r) for r in md.requires(name) or [])
  return seen


def test_runtime_imports_come_from_the_base_install():
  import importlib.metadata as md
  import re

  provided = _base_install()
  dists = md.packages_distributions()
  missing = {}
  for module, users in _third_party_imports().items():
    owners = {re.sub(r"[-_.]+", "-", d).lower() for d in dists.get(module, [])}
    if module in OPTIONAL_IMPORTS:
      continue
    if not owners & provided:
      missing[module] = sorted(set(users))[:3]
  assert "jax" in provided and "ml-dtypes" in provided  # the closure is read, with what jax requires
  assert not missing, f"imported by the package but not in its base install: {missing}"
