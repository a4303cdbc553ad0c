"""mis_sc: the `mis_sc` preset of jaxrl_llm.objectives on the shared base."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # configs/ holds the shared base
from base import get_config as _base  # noqa: E402


def get_config():
  c = _base("mis_sc")
  # Score Centering's drift term needs the sampler's next-token distribution:
  # its top-k log-probs (k = 32 matched the full sum in the paper).
  c.rollout.record_topk = 32
  return c
