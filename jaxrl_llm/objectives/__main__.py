"""`python -m jaxrl_llm.objectives`: print the master-equation method table."""

import argparse

from jaxrl_llm.objectives.presets import method_table


def main(argv: list[str] | None = None) -> None:
  # No flags: the parser answers --help and refuses stray arguments.
  argparse.ArgumentParser(prog="python -m jaxrl_llm.objectives", description=__doc__).parse_args(argv)
  print("Master equation (docs/objectives.md eq. 9.1), loss = -J:")
  print()
  print("    grad J = E_mu[ sum_{i,t} lambda_{i,t} A_{i,t} (W_{i,t} s_y - kappa sum_v mu(v) W_v s_v) ],"
        "  W = f * T")
  print()
  print(method_table())


if __name__ == "__main__":
  main()
