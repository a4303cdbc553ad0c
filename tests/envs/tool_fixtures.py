"""The test pool's limits, and tool functions that misbehave on purpose, imported by the tool workers
of the pool tests (the workers get the test process's sys.path)."""

from jaxrl_llm.envs.pool import ToolLimits

# Short enough that the hang tests are quick, long enough for a calculator call on a loaded machine.
TEST_LIMITS = ToolLimits(timeout_s=2.0, cpu_s=2.0, memory_mb=512, output_chars=4096, file_mb=1)


def returns_int(x: str):
  return 42


def raises(x: str) -> str:
  raise KeyError(x)


def swallows_everything(x: str) -> str:
  """Catches the output cap's interrupt and goes on printing: the pool still reports the overflow."""
  for _ in range(100):
    try:
      print("y" * 10_000)
    except BaseException:  # noqa: BLE001 - on purpose
      pass
  return ""


def echo(x: str) -> str:
  print("printed", end=" ")
  return f"returned {x}"


def writes_file(x: str) -> str:
  with open("big.bin", "wb") as f:
    f.write(b"z" * (4 << 20))  # 4 MiB, past the 1 MiB RLIMIT_FSIZE of the test pool
  return "wrote"


def word_count(text: str) -> str:
  """The recipe's example tool (docs/architecture.md, "... an environment or a tool")."""
  from jaxrl_llm.envs.tool import ToolError

  words = text.split()
  if not words:
    raise ToolError("no words to count")
  return str(len(words))
