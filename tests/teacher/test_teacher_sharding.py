"""A teacher loaded from a Hugging Face folder is placed like the policy: on the
student's mesh, by model/sharding.py's rules for its own shapes, so no device
holds its whole [D, V] head (the fake 8-device CPU mesh of tests/conftest.py)."""

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding

from jaxrl_llm import model as model_lib
from jaxrl_llm import teacher as tlib
from jaxrl_llm.model.io import hf_io
from jaxrl_llm.model.sharding import MeshConfig, init_sharded_params, make_mesh, param_shardings

V = 64
STUDENT = model_lib.ModelConfig.tiny(V, d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, head_dim=16, d_ff=64)
# Wider than the student, with a head of its own: its shardings follow its own shapes, not the student's.
TEACHER = model_lib.ModelConfig.tiny(V, d_model=48, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=12, d_ff=96,
                                     tie_embeddings=False)


# The module-scoped fixtures run once: the module's tests go to one pytest-xdist worker.
pytestmark = pytest.mark.xdist_group("teacher.test_teacher_sharding")


@pytest.fixture(scope="module")
def mesh():
  return make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))


def _save(cfg, tmp_path, name="teacher"):
  host = model_lib.init_params(cfg, jax.random.key(1))
  hf_io.save_hf(host, cfg, str(tmp_path / name))
  return host, str(tmp_path / name)


@pytest.mark.slow
def test_hf_teacher_carries_the_policy_shardings(mesh, tmp_path):
  host, path = _save(TEACHER, tmp_path)
  student = init_sharded_params(STUDENT, jax.random.key(0), mesh)
  params, cfg = tlib.load_teacher_checkpoint(path, student, STUDENT)
  assert (cfg.d_model, cfg.n_layers, cfg.vocab_size, cfg.tie_embeddings) == (48, 2, V, False)
  # The specs a policy of these shapes gets (`model.build.make_model` loads with the same rule).
  want = param_shardings(cfg, mesh)
  assert jax.tree.structure(params) == jax.tree.structure(want)
  for (path_, x), w in zip(jax.tree_util.tree_flatten_with_path(params)[0], jax.tree.leaves(want)):
    name = jax.tree_util.keystr(path_)
    assert isinstance(x.sharding, NamedSharding) and x.sharding.mesh == mesh, name
    assert x.sharding.spec == w.spec, name
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), params, host)
  # The head [D, V] = [48, 64] is split over the vocabulary (tensor = 2) and D (fsdp = 2): every
  # device holds a [24, 32] block, none the whole head.
  head = model_lib.lm_head(params, cfg)
  assert head.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor")
  assert {s.data.shape for s in head.addressable_shards} == {(48 // 2, V // 2)}


@pytest.mark.slow
def test_hf_teacher_that_does_not_split_over_the_mesh_is_an_error(mesh, tmp_path):
  _, path = _save(TEACHER.replace(n_kv_heads=1), tmp_path)
  student = init_sharded_params(STUDENT, jax.random.key(0), mesh)
  with pytest.raises(ValueError, match=r"config.teacher.checkpoint=.* cannot be split over the student's mesh: "
                                       r"ModelConfig.n_kv_heads=1 is not divisible by the 'tensor' mesh axis"):
    tlib.load_teacher_checkpoint(path, student, STUDENT)
