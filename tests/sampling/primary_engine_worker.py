"""One process of tests/sampling/test_primary_engine.py: `PrimaryEngine` over a stand-in engine that
records what it gets, in a run of 2 processes (argv: process id, port, out.json)."""

import json
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
import jax  # noqa: E402
import numpy as np  # noqa: E402

from jaxrl_llm.model import distributed  # noqa: E402


class StandIn:
  """Counts its calls; `generate` returns the prompts' ids plus draws from the key; raises on request."""

  def __init__(self):
    self.version, self.calls, self.synced = -1, [], []

  def wants_params(self, version):
    return version % 2 == 0  # odd versions: not due

  def sync(self, params, version):
    self.calls.append("sync")
    self.synced.append(None if params is None else {k: np.asarray(v).tolist() for k, v in params.items()})
    self.version = version

  def generate(self, prompts, key):
    self.calls.append("generate")
    if prompts == "fail":
      raise ValueError("the server said no")
    if prompts == "unpicklable":
      return {"ids": lambda: 0}
    return {"ids": [p + 1 for p in prompts], "draw": np.asarray(jax.random.randint(key, (3,), 0, 1000))}

  def metrics(self):
    return {"engine/requests": float(len(self.calls))}

  def turn_sampler(self, player, key):
    def sample_round(contexts, budgets, rnd):
      self.calls.append("turn")
      return [(c, b, rnd, int(jax.random.randint(jax.random.fold_in(key, rnd), (), 0, 1000))) for c, b in
              zip(contexts, budgets)]
    return sample_round

  def close(self):
    self.calls.append("close")


def main():
  pid, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
  distributed.initialize(distributed.DistributedConfig(f"127.0.0.1:{port}", 2, pid))
  from jaxrl_llm.sampling.primary_engine import PrimaryEngine  # pylint: disable=import-outside-toplevel

  made = []
  eng = PrimaryEngine(lambda: made.append(StandIn()) or made[-1])
  mesh = jax.make_mesh((2,), ("data",), devices=jax.devices())
  sharded = jax.make_array_from_process_local_data(jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data")),
                                                   np.array([10.0 * (pid + 1)], np.float32), (2,))
  # the key as the trainer holds it: replicated over the mesh, so not addressable from one process alone
  data = np.asarray(jax.random.key_data(jax.random.key(3)))
  key = jax.random.wrap_key_data(jax.make_array_from_process_local_data(
      jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()), data, data.shape))
  assert not key.is_fully_addressable
  result = {"made_here": len(made), "version0": eng.version}
  eng.sync({"w": sharded}, 2)  # due: gathered, process 0 exports [10, 20]
  eng.sync({"w": sharded}, 3)  # not due: nothing gathered
  result["version"] = eng.version
  batch = eng.generate([1, 2], key)
  result["batch"] = {"ids": batch["ids"], "draw": np.asarray(batch["draw"]).tolist()}
  result["metrics"] = eng.metrics()
  rounds = eng.turn_sampler(player=None, key=key)
  result["turns"] = [rounds([[7], [8]], [4, 0], r) for r in range(2)]
  try:
    eng.generate("fail", key)
    result["error"] = None
  except ValueError as e:
    result["error"] = str(e)
  try:  # a result that cannot be sent: an error in every process, not a hang
    eng.generate("unpicklable", key)
    result["unsent"] = None
  except Exception as e:  # pylint: disable=broad-except
    result["unsent"] = type(e).__name__
  eng.close()
  if made:
    result["calls"], result["synced"] = made[0].calls, made[0].synced
  with open(out, "w") as f:
    json.dump(result, f)


if __name__ == "__main__":
  main()
