"""The wheel: `pip wheel .` holds every module (kernels/ as jaxrl_llm.kernels) and the package data,
and every entry point answers --help when the package is imported from the installed wheel.

The wheel is built from a copy of the sources in a temporary folder, so the build's build/ and
*.egg-info never land in the checkout and no stale build/lib of an earlier build can slip into it.

The dependencies come from the environment that runs the tests, whatever it is (a virtual
environment, conda, the system interpreter): the test's venv is made without them and a .pth file
in its site-packages chains to the running interpreter's site directories (`site.addsitedir` of
each, as `--system-site-packages` does for the base interpreter only), so nothing is downloaded.
That is also where this checkout's editable install lives, and it must not answer for the wheel:

* an editable install's finder (`__editable___jaxrl_llm_*_finder.py`, loaded by a .pth file in the
  chained site-packages) is appended to sys.meta_path, after the path-based finder, and the venv's
  own site-packages comes before the chained ones on sys.path, so the wheel's copy is found first
  (a `compat` editable install's .pth path entry also comes after the venv's site-packages);
* `python -m` puts the working directory first on sys.path, so every command runs from a
  temporary folder, not the repository root, and without PYTHONPATH;
* pip in the venv sees the editable jaxrl_llm as installed: `--force-reinstall` installs the wheel
  anyway (pip leaves the install outside the venv alone).

Each of these is checked, not assumed: every entry point's module resolves inside the venv.
"""

import ast
import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Source folder -> the package it installs as (pyproject.toml's package-dir).
SOURCES = {"jaxrl_llm": "jaxrl_llm", "kernels": "jaxrl_llm/kernels"}
# `python -m <name>` -> a flag its --help names. Every module with an `if __name__ == "__main__":`
# block and every package with a __main__.py (test_every_entry_point_is_listed).
ENTRY_POINTS = {
    "jaxrl_llm.train": "--config",
    "jaxrl_llm.compile": "--topology",
    "jaxrl_llm.evaluate": "--workdir",
    "jaxrl_llm.report": "--workdir",
    "jaxrl_llm.inspect": "--step",
    "jaxrl_llm.convert": "--debug",
    "jaxrl_llm.lab": "--methods",
    "jaxrl_llm.objectives": "--help",  # no flags of its own
    "jaxrl_llm.reward_model": "--config",
}
# Files the package reads at run time, besides its modules.
DATA_FILES = ("jaxrl_llm/rundir/inspect_page.html",)


def _source_files() -> dict[str, str]:
  """Path inside the wheel -> path in the checkout, for every .py file and every DATA_FILES entry."""
  out = {}
  for folder, installed in SOURCES.items():
    for dirpath, dirnames, files in os.walk(os.path.join(REPO, folder)):
      dirnames[:] = [d for d in dirnames if d != "__pycache__"]
      for f in files:
        rel = os.path.relpath(os.path.join(dirpath, f), os.path.join(REPO, folder)).replace(os.sep, "/")
        name = f"{installed}/{rel}"
        if f.endswith(".py") or name in DATA_FILES:
          out[name] = os.path.join(dirpath, f)
  return out


def _discovered_entry_points() -> set[str]:
  """`python -m` names: modules with a top-level `if __name__ == "__main__":`, packages with __main__.py."""
  found = set()
  for name, path in _source_files().items():
    if not name.endswith(".py"):
      continue
    module = name[:-3].replace("/", ".")
    if module.endswith(".__main__"):
      found.add(module.removesuffix(".__main__"))
    elif any(isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'"
             for node in ast.parse(open(path).read()).body):
      found.add(module)
  return found


def test_every_entry_point_is_listed():
  assert _discovered_entry_points() == set(ENTRY_POINTS)


def _site_dirs() -> list[str]:
  """The site directories the running interpreter imports from: its own (a venv's or conda's), and
  the base interpreter's or the user's where it sees them."""
  dirs = [*site.getsitepackages(), *([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])]
  return [d for d in dict.fromkeys(dirs + [p for p in sys.path if os.path.basename(p) in
                                            ("site-packages", "dist-packages")]) if os.path.isdir(d)]


def _run(cmd, cwd, env):
  return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_the_wheel_installs_every_module_and_entry_point(tmp_path):
  src = tmp_path / "src"
  ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
  for folder in SOURCES:
    shutil.copytree(os.path.join(REPO, folder), src / folder, ignore=ignore)
  for f in ("pyproject.toml", "setup.py", "README.md"):
    shutil.copy(os.path.join(REPO, f), src / f)
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}

  build = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
                str(tmp_path / "dist"), str(src)], tmp_path, env)
  assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
  (wheel,) = (tmp_path / "dist").iterdir()
  names = set(zipfile.ZipFile(wheel).namelist())
  for must in ("jaxrl_llm/lab/__init__.py", "jaxrl_llm/kernels/__init__.py", *DATA_FILES):
    assert must in names, must
  assert not set(_source_files()) - names, "modules left out of the wheel"
  assert not {n for n in names if n.startswith("kernels/")}, "kernels/ installed under its folder's name"

  venv = tmp_path / "venv"
  made = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path, env)
  assert made.returncode == 0, made.stderr[-3000:]
  python = str(venv / "bin" / "python")
  own = _run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], tmp_path, env)
  assert own.returncode == 0, own.stderr[-3000:]
  (Path(own.stdout.strip()) / "_chain_test_environment.pth").write_text(
      "import site; " + "; ".join(f"site.addsitedir({d!r})" for d in _site_dirs()) + "\n")
  # The venv has no pip of its own: the running environment's, run by the venv's interpreter,
  # installs into the venv.
  inst = _run([python, "-m", "pip", "install", "--no-deps", "--no-index", "--force-reinstall", str(wheel)],
              tmp_path, env)
  assert inst.returncode == 0, inst.stdout[-3000:] + inst.stderr[-3000:]

  where = _run([python, "-c", "import importlib.util, sys\n"
                "from jaxrl_llm.rundir.inspect_page import page_template\n"
                "assert page_template().startswith('<!doctype html>')\n"
                "for name in sys.argv[1:]:\n"
                "  print(importlib.util.find_spec(name).origin)",
                "jaxrl_llm", "jaxrl_llm.kernels", *ENTRY_POINTS], tmp_path, env)
  assert where.returncode == 0, where.stderr[-3000:]
  origins = where.stdout.split()
  assert len(origins) == 2 + len(ENTRY_POINTS)
  assert all(os.path.realpath(o).startswith(os.path.realpath(venv) + os.sep) for o in origins), origins

  for name, flag in ENTRY_POINTS.items():
    res = _run([python, "-m", name, "--help"], tmp_path, env)
    assert res.returncode == 0, f"{name}: {res.stdout[-2000:]}{res.stderr[-2000:]}"
    assert flag in res.stdout, f"{name} --help does not name {flag}: {res.stdout[-2000:]}"
