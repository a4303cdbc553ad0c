"""Tool functions of the episode tests, imported by the tool workers (standard library only)."""

import os
import time


def echo(x: str) -> str:
  return x


def hangs() -> str:
  time.sleep(3600)
  return "never"


def crashes() -> str:
  os._exit(3)
