"""The VMEM budget of the TPU kernels (``_mosaic_budget``): the footprint
formula by hand, the tiles of kernels/README.md's table, and the errors."""

import itertools

import pytest

from jaxrl_llm.checks import ConfigError
from jaxrl_llm.kernels import VocabTiles
from jaxrl_llm.kernels import _mosaic_budget as budget

MIB = 1 << 20


def _operands(n_src, d, itemsize, kind):
  """token_logprobs (one source) or vocab_cross (two, E = D) as the kernels
  see them: K = 1 ids; per-row statistics are (N, 1) columns."""
  dims, sizes = (d,) * n_src, (itemsize,) * n_src
  if kind == "fwd":
    rows, carry = ((1,), (1,) * 4) if n_src == 1 else ((), (1,) * 8)
    return budget.Operands(dims, sizes, sizes, rows, carry)
  rows = (1,) * 6 if n_src == 1 else (1,) * 5
  return budget.Operands(dims, sizes, sizes, rows, out_bytes=itemsize)


def test_footprint_by_hand():
  # Forward of token_logprobs, bf16, D = 576 (lanes: 640), at 512 x 2048:
  #   hidden tiles 2 * 512 * 640 * 2                =  1,310,720
  #   w tiles      2 * 576 * 2048 * 2               =  4,718,592
  #   ids (K = 1)  2 * 512 * 128 * 4                =    524,288
  #   f32 temps    4 * 1 * 512 * 2048 * 4           = 16,777,216
  #   carry        3 * 4 * 512 * 128 * 4            =  3,145,728
  #                                           total = 26,476,544 (25.25 MiB)
  ops = _operands(1, 576, 2, "fwd")
  assert budget.vmem_bytes("fwd", 512, 2048, ops) == 26_476_544
  # d w of the same: the hidden and w tiles and temps as above, the two
  # (N, 1) rows (lse, ...) x 6 instead of ids and carry, plus
  #   f32 accumulator 576 * 2048 * 4 = 4,718,592, bf16 output x2 4,718,592,
  #   masked hidden copy 512 * 640 * 2 = 655,360.
  ops = _operands(1, 576, 2, "dw")
  rows = 6 * 2 * 512 * 128 * 4
  assert budget.vmem_bytes("dw", 512, 2048, ops) == (
      1_310_720 + 4_718_592 + rows + 16_777_216 + 4_718_592 + 4_718_592
      + 655_360)


# kernels/README.md's table: N = 8192 rows, V = 262,144, default budget;
# (block_n, block_v) of the forward, d hidden and d w kernels.
TABLE = {
    (1, "bf16", 576): ((512, 2048), (512, 2048), (256, 2048)),
    (1, "bf16", 2048): ((512, 1024), (512, 512), (128, 1024)),
    (1, "bf16", 4096): ((512, 512), (512, 128), (128, 512)),
    (1, "bf16", 8192): ((512, 256), (256, 128), (128, 256)),
    (1, "f32", 576): ((512, 2048), (512, 1024), (128, 2048)),
    (1, "f32", 2048): ((512, 512), (512, 256), (256, 512)),
    (1, "f32", 4096): ((512, 256), (256, 128), (128, 256)),
    (1, "f32", 8192): ((256, 128), (64, 128), (64, 128)),
    (2, "bf16", 576): ((512, 1024), (512, 1024), (128, 2048)),
    (2, "bf16", 2048): ((512, 512), (512, 256), (256, 512)),
    (2, "bf16", 4096): ((512, 128), (256, 256), (256, 256)),
    (2, "bf16", 8192): ((256, 128), (128, 128), (128, 128)),
    (2, "f32", 576): ((512, 512), (512, 512), (256, 1024)),
    (2, "f32", 2048): ((512, 128), (256, 256), (64, 512)),
    (2, "f32", 4096): ((256, 128), (128, 128), (32, 256)),
    (2, "f32", 8192): ((64, 128), (32, 128), (16, 128)),
}
ITEMSIZE = {"bf16": 2, "f32": 4}


@pytest.mark.parametrize("case", list(TABLE), ids=lambda c: f"{c[0]}src-{c[1]}-D{c[2]}")
def test_readme_table_and_the_search_contract(case):
  """The README's tiles, each within the budget, TPU-aligned, and the first
  fit in the kernel's preference order (every earlier pair is over)."""
  n_src, dtype, d = case
  n, v, tiles = 8192, 262_144, VocabTiles()
  for kind, expected in zip(budget.KINDS, TABLE[case]):
    ops = _operands(n_src, d, ITEMSIZE[dtype], kind)
    plan = budget.plan(kind, n, v, ops, tiles)
    assert (plan.block_n, plan.block_v) == expected, kind
    assert plan.block_n % 8 == 0 and plan.block_v % 128 == 0
    assert plan.vmem_bytes == budget.vmem_bytes(kind, *expected, ops)
    assert plan.vmem_bytes <= 32 * MIB
    assert plan.vmem_limit_bytes == 40 * MIB
    order = (list(itertools.product(budget.BLOCK_N, budget.BLOCK_V))
             if kind != "dw" else
             [(bn, bv) for bv in budget.BLOCK_V for bn in budget.BLOCK_N])
    for bn, bv in order[:order.index(expected)]:
      assert budget.vmem_bytes(kind, bn, bv, ops) > 32 * MIB, (kind, bn, bv)


def test_short_axes_are_one_whole_block():
  ops = _operands(1, 24, 4, "fwd")
  plan = budget.plan("fwd", 20, 301, ops, VocabTiles())
  assert (plan.block_n, plan.block_v) == (20, 301)
  plan = budget.plan("fwd", 20, 301, ops, VocabTiles(tpu_block_n=8,
                                                     tpu_block_v=128))
  assert (plan.block_n, plan.block_v) == (8, 128)


def test_over_budget_raises_naming_the_budget():
  ops = _operands(2, 65_536, 4, "dw")  # 16x the widest model dim, f32
  with pytest.raises(ValueError, match=r"TPU dw kernel needs .* MiB of VMEM "
                     r"for D=\(65536, 65536\).*tpu_vmem_bytes=33554432"):
    budget.plan("dw", 8192, 262_144, ops, VocabTiles())
  ops = _operands(1, 576, 2, "fwd")
  with pytest.raises(ValueError, match=r"at VocabTiles\(tpu_block_n=512, "
                     r"tpu_block_v=8192\)"):
    budget.plan("fwd", 8192, 262_144, ops,
                VocabTiles(tpu_block_n=512, tpu_block_v=8192))


def test_tile_fields_are_validated():
  with pytest.raises(ConfigError, match=r"VocabTiles.tpu_block_n=12 is "
                     r"invalid: must be a multiple of 8"):
    VocabTiles(tpu_block_n=12)
  with pytest.raises(ConfigError, match=r"VocabTiles.tpu_block_v=100 is out "
                     r"of range"):
    VocabTiles(tpu_block_v=100)
  with pytest.raises(ConfigError, match=r"VocabTiles.tpu_block_v=200 is "
                     r"invalid: must be a multiple of 128"):
    VocabTiles(tpu_block_v=200)
  with pytest.raises(ConfigError, match=r"VocabTiles.tpu_vmem_bytes=1000"):
    VocabTiles(tpu_vmem_bytes=1000)
  with pytest.raises(TypeError, match=r"VocabTiles.tpu_block_n must be an int"):
    VocabTiles(tpu_block_n=8.0)


# device_kind -> the ChipVersion jax's hardware table knows it as.
CHIPS = {"TPU v4": "v4", "TPU v4 lite": "v4i", "TPU v5 lite": "v5e", "TPU v5e": "v5e", "TPU v5": "v5p",
         "TPU v5p": "v5p", "TPU v6 lite": "v6e", "TPU v6e": "v6e", "TPU7": "7", "TPU7x": "7x"}


def test_vmem_table_is_jax_s():
  """target.TPU_VMEM_BYTES equals jax's per-core VMEM (pltpu.get_tpu_info_for_chip, the source of
  docs.jax.dev's TPU hardware reference) for every device kind it lists."""
  from jax.experimental.pallas import tpu as pltpu
  from jaxrl_llm.kernels import target

  assert set(target.TPU_VMEM_BYTES) == set(CHIPS)
  for kind, chip in CHIPS.items():
    info = pltpu.get_tpu_info_for_chip(pltpu.ChipVersion(chip), 1)
    assert target.TPU_VMEM_BYTES[kind] == info.vmem_capacity_bytes, kind


@pytest.mark.parametrize("kind,budget_mib,limit_mib", [
    ("TPU v4", 12, 16),  # 3/4 of 16 MiB; the limit is all of it
    ("TPU v5 lite", 32, 64), ("TPU v5", 32, 64), ("TPU v6 lite", 32, 64), ("TPU7x", 32, 64),
    ("cpu", 32, 40),  # the interpreter: the budget and limit of before
    ("TPU v99", 32, 40),  # a chip the table does not know
])
def test_default_budget_per_generation(kind, budget_mib, limit_mib):
  assert budget.budget_and_limit(VocabTiles(), kind) == (budget_mib * MIB, limit_mib * MIB)
  # An explicit budget overrides the chip's; the limit stays within its VMEM.
  assert budget.budget_and_limit(VocabTiles(tpu_vmem_bytes=8 * MIB), kind)[0] == 8 * MIB
  assert budget.budget_and_limit(VocabTiles(tpu_vmem_bytes=100 * MIB), "TPU v4") == (100 * MIB, 16 * MIB)
  ops = _operands(1, 576, 2, "fwd")
  plan = budget.plan("fwd", 8192, 262_144, ops, VocabTiles(), kind)
  assert plan.vmem_bytes <= budget_mib * MIB and plan.vmem_limit_bytes == limit_mib * MIB


def test_v4_tiles_are_smaller_and_the_error_names_the_chip():
  # token_logprobs' forward, bf16, D = 576: 512 x 512 in 12 MiB (9.9 MiB by the formula) on v4,
  # 512 x 2048 in 32 MiB (25.25 MiB, the README's table) elsewhere.
  ops = _operands(1, 576, 2, "fwd")
  tiles = {kind: budget.plan("fwd", 8192, 262_144, ops, VocabTiles(), kind) for kind in ("TPU v4", "TPU v5")}
  assert {k: (p.block_n, p.block_v) for k, p in tiles.items()} == {"TPU v4": (512, 512), "TPU v5": (512, 2048)}
  with pytest.raises(ValueError, match=r"TPU dw kernel needs 17.3 MiB of VMEM .* over the default for device "
                                       r"kind 'TPU v4': tpu_vmem_bytes=12582912 \(12.0 MiB\): raise "
                                       r"VocabTiles.tpu_vmem_bytes \(up to 16 MiB, this chip's VMEM per core\)"):
    budget.plan("dw", 8192, 262_144, _operands(2, 8192, 2, "dw"), VocabTiles(), "TPU v4")


def test_the_plan_reads_the_chip_of_the_mesh_in_context():
  """Without a device_kind the plan asks target.target_device_kind: the mesh in context's chip, else
  the default device (CPU here: the interpreter's 32 MiB)."""
  import jax
  from jax.sharding import AbstractDevice, AbstractMesh

  ops = _operands(1, 576, 2, "fwd")
  assert budget.plan("fwd", 8192, 262_144, ops, VocabTiles()).vmem_limit_bytes == 40 * MIB
  v4 = AbstractMesh((4,), ("data",), abstract_device=AbstractDevice(device_kind="TPU v4", num_cores=1,
                                                                      platform="tpu"))
  with jax.sharding.use_abstract_mesh(v4):
    assert budget.plan("fwd", 8192, 262_144, ops, VocabTiles()).vmem_limit_bytes == 16 * MIB
