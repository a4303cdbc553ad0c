"""trm_avg: the `trm_avg` preset of jaxrl_llm.objectives on the shared base."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # configs/ holds the shared base
from base import get_config as _base  # noqa: E402


def get_config():
  return _base("trm_avg")
