"""`python -m jaxrl_llm.objectives`: print the master-equation method table."""

from jaxrl_llm.objectives.presets import method_table


def main() -> None:
  print("Master equation (spec 002, section 6), loss = -J:")
  print()
  print("    grad J = E_mu[ sum_{i,t} lambda_{i,t} A_{i,t} (W_{i,t} s_y - kappa sum_v mu(v) W_v s_v) ],"
        "  W = f * T")
  print()
  print(method_table())


if __name__ == "__main__":
  main()
