"""One process of the two-process test (tests/model/test_distributed.py).

Run as: python multihost_worker.py PROCESS_ID PORT OUT_JSON
Each process owns 4 fake CPU devices; together they form a (2, 2, 2) mesh.
"""

import json
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402

from jaxrl_llm.model.distributed import DistributedConfig, initialize  # noqa: E402


def main():
  process_id, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
  assert initialize(DistributedConfig(f"127.0.0.1:{port}", 2, process_id,
                                      initialization_timeout_s=60))
  # Imported after initialize: nothing may touch a device before it.
  sys.path.insert(0, os.path.dirname(__file__))
  import multihost_step  # noqa: E402
  from jaxrl_llm.model.sharding import MeshConfig, make_mesh  # noqa: E402

  assert jax.process_count() == 2 and jax.device_count() == 8 and jax.local_device_count() == 4
  mesh = make_mesh(MeshConfig(2, 2, 2))
  result = multihost_step.run(mesh)
  result["process_index"] = jax.process_index()
  with open(out, "w") as f:
    json.dump(result, f)
  jax.distributed.shutdown()


if __name__ == "__main__":
  main()
