"""The package list, found rather than written out (pyproject.toml holds the rest of the build)."""

from setuptools import find_packages, setup

# Every package under jaxrl_llm/, so a new folder cannot be left out of the wheel, and
# kernels/ with any subpackage as jaxrl_llm.kernels (pyproject.toml's package-dir maps the folder).
setup(packages=find_packages(include=["jaxrl_llm", "jaxrl_llm.*"])
      + ["jaxrl_llm.kernels" + (f".{p}" if p else "") for p in ["", *find_packages("kernels")]])
