"""The forecast's model without a compiler: the chips' per-device figures, the ICI links and hops a
collective's group is charged, the kernels counted in an HLO module, the latency floor, the labels.

No libtpu needed: the devices are stand-ins with a chip's coordinates and core, the HLO is text.
"""

import dataclasses
import types

import pytest

from jaxrl_llm.tpu import analysis, forecast, plan_report as report
from jaxrl_llm.tpu.chips import CHIPS, GB, GIB, ICI_HOP_S, KERNEL_LAUNCH_S, PROGRAM_LAUNCH_S, chip_for
from jaxrl_llm.tpu.ici import Links


# ------------------------------------------------------------ the chip table, per device


def test_7x_figures_are_per_device_half_a_chip():
  """libtpu makes two devices of a 7x chip (one per TensorCore): each has half of what Google's tpu7x
  page gives per chip (2,307 TFLOP/s bf16, 192 GiB of HBM at 7,380 GB/s, 1,200 GB/s of ICI)."""
  c = CHIPS["7x"]
  assert c.devices_per_chip == 2 and chip_for("TPU7x") is c
  assert c.peak_bf16_flops == 2307e12 / 2 == 1153.5e12
  assert c.hbm_bytes == 192 * GIB // 2 == 96 * GIB
  assert c.hbm_bytes_per_s == 7380 * GB / 2
  assert c.ici_bytes_per_s == 1200 * GB / 2
  # One direction of one of a 3D torus chip's 6 links, shared by its 2 devices: 1,200 / 2 / 6 / 2 GB/s.
  assert c.link_bytes_per_s == 1200 * GB / 2 / 6 / 2 == 50 * GB


@pytest.mark.parametrize("gen, flops, hbm, hbm_bw, ici, links", [
    ("v4", 275e12, 32 * GIB, 1200 * GB, 540 * GB, 6),  # megacore: one device per chip
    ("v5e", 197e12, 16 * GIB, 819 * GB, 400 * GB, 4),
    ("v5p", 459e12, 95 * GIB, 2765 * GB, 1200 * GB, 6),  # megacore
    ("v6e", 918e12, 32 * GIB, 1638 * GB, 800 * GB, 4),
])
def test_one_device_per_chip_has_the_whole_chip(gen, flops, hbm, hbm_bw, ici, links):
  c = CHIPS[gen]
  assert c.devices_per_chip == 1
  assert (c.peak_bf16_flops, c.hbm_bytes, c.hbm_bytes_per_s, c.ici_bytes_per_s) == (flops, hbm, hbm_bw, ici)
  assert c.link_bytes_per_s == pytest.approx(ici / 2 / links)  # both directions of `links` links summed on the page
  # v5e: the scaling book's 4.5e10 B/s one way per link is the same order (50e9 here, from Google's 400 GB/s)
  assert 4e10 <= c.link_bytes_per_s <= 1e11


# ------------------------------------------------------------ the ICI a group is charged


def _slice(extents, cores_per_chip=1):
  """Stand-ins for a slice's devices, x fastest, then each chip's cores."""
  devs = []
  for z in range(extents[2]):
    for y in range(extents[1]):
      for x in range(extents[0]):
        for core in range(cores_per_chip):
          devs.append(types.SimpleNamespace(coords=(x, y, z), core_on_chip=core))
  return devs


def test_a_one_axis_group_has_that_axis_links_only():
  """v5e 2x2 (no wraparound below 16 chips an axis): a pair along x has one link (the edge chip's only
  x neighbour), 50 GB/s one way, 1 hop; all 4 chips have one link per axis, 100 GB/s, 2 hops. Before,
  every collective was charged half the chip's ICI (200 GB/s): 4x too fast for the pair."""
  links = Links.of(_slice((2, 2, 1)), CHIPS["v5e"])
  assert links.wraps == (False, False, False)
  assert links.group_cost([0, 1]) == (50e9, 1)  # (0,0) and (1,0): x
  assert links.group_cost([0, 2]) == (50e9, 1)  # (0,0) and (0,1): y
  assert links.group_cost([0, 1, 2, 3]) == (100e9, 2)
  assert links.group_cost(None) == (100e9, 2)  # no group in the HLO: every device
  assert links.group_cost([3]) == (0.0, 0)
  # an all-gather moving 1 MB per device over x, and an all-reduce over all four: twice the hops
  assert links.seconds("all-gather", 1e6, [0, 1]) == (1e6 / 50e9, 1 * ICI_HOP_S)
  assert links.seconds("all-reduce", 1e6, [0, 1, 2, 3]) == (1e6 / 100e9, 2 * 2 * ICI_HOP_S)


def test_rings_where_the_slice_wraps():
  """A v5p slice of whole 4x4x4 cubes wraps every axis: a group around x (4 chips) has both x links,
  2 x 100 GB/s, and 4 // 2 = 2 hops; half of that axis is a line: 1 link, 1 hop. A 2x2x2 slice does
  not wrap. A v5e axis of 16 wraps (8 hops of a bidirectional ring), one of 8 does not (7 hops)."""
  v5p = Links.of(_slice((4, 4, 4)), CHIPS["v5p"])
  assert v5p.wraps == (True, True, True)
  assert v5p.group_cost([0, 1, 2, 3]) == (200e9, 2)
  assert v5p.group_cost([0, 1]) == (100e9, 1)
  assert v5p.group_cost([0, 4, 8, 12]) == (200e9, 2)  # around y
  assert v5p.group_cost(None) == (3 * 200e9, 6)
  assert Links.of(_slice((2, 2, 2)), CHIPS["v5p"]).group_cost(None) == (3 * 100e9, 3)
  v5e = Links.of(_slice((16, 8, 1)), CHIPS["v5e"])
  assert v5e.wraps == (True, False, False)
  assert v5e.group_cost(list(range(16))) == (100e9, 8)
  assert v5e.group_cost(list(range(0, 128, 16))) == (50e9, 7)


def test_the_two_devices_of_a_7x_chip():
  """7x 2x2x1: 8 devices, 2 per chip. The pair on one chip exchanges through it (one link's worth and
  one hop: an assumption); a group of one core per chip uses the chip's links at the device's share."""
  links = Links.of(_slice((2, 2, 1), cores_per_chip=2), CHIPS["7x"])
  assert links.n == 8 and links.extents == (2, 2, 1)
  assert links.group_cost([0, 1]) == (50e9, 1)  # cores 0 and 1 of chip (0,0)
  assert links.group_cost([0, 2]) == (50e9, 1)  # core 0 of (0,0) and of (1,0): x
  assert links.group_cost(list(range(8))) == (3 * 50e9, 3)


# ------------------------------------------------------------ kernels in sequence, the latency floor

# A v5e program compiled from shard_map (trimmed): a fusion, an all-reduce, a scalar copy, an all-gather,
# a scan of 3 (its body: a scalar add and a fusion; its condition a scalar compare), a reduce to a scalar,
# a bitcast, a final all-reduce. Fused computations and reducers are not run on their own.
_HLO = """HloModule jit_body, is_scheduled=true, entry_computation_layout={(f32[128,512]{1,0:T(8,128)})->f32[1,1]}

%fused_computation.1 (param_0.3: f32[128,512]) -> f32[128,512] {
  %param_0.3 = f32[128,512]{1,0:T(8,128)} parameter(0)
  %constant.3.clone.2 = f32[]{:T(128)} constant(2)
  %mul.19 = f32[128,512]{1,0:T(8,128)} broadcast(%constant.3.clone.2), dimensions={}
  ROOT %mul.18 = f32[128,512]{1,0:T(8,128)S(1)} multiply(%param_0.3, %mul.19)
}

%region_0.0 (psum_invariant.0: f32[], psum_invariant.1: f32[]) -> f32[] {
  %psum_invariant.1 = f32[]{:T(128)} parameter(1)
  %psum_invariant.0 = f32[]{:T(128)} parameter(0)
  ROOT %add.0 = f32[]{:T(128)} add(%psum_invariant.0, %psum_invariant.1)
}

%wide.region_1.2_spmd.sunk (wide.param.2: (s32[], f32[256,512], s32[])) -> (s32[], f32[256,512], s32[]) {
  %constant.4.clone.1..sunk = s32[]{:T(128)} constant(1)
  %wide.param.2 = (s32[]{:T(128)}, f32[256,512]{1,0:T(8,128)S(1)}, s32[]{:T(128)}) parameter(0)
  %get-tuple-element.35 = s32[]{:T(128)} get-tuple-element(%wide.param.2), index=0
  %add.8 = s32[]{:T(128)} add(%get-tuple-element.35, %constant.4.clone.1..sunk)
  %get-tuple-element.36 = f32[256,512]{1,0:T(8,128)S(1)} get-tuple-element(%wide.param.2), index=1
  %sine_multiply_fusion.2 = f32[256,512]{1,0:T(8,128)S(1)} fusion(%get-tuple-element.36), kind=kLoop, calls=%fused_computation.1
  ROOT %tuple.17 = (s32[]{:T(128)}, f32[256,512]{1,0:T(8,128)S(1)}, s32[]{:T(128)}) tuple(%add.8, %sine_multiply_fusion.2, %get-tuple-element.35)
}

%wide.region_2.3_spmd (wide.param.1: (s32[], f32[256,512], s32[])) -> pred[] {
  %constant.7.clone.1 = s32[]{:T(128)} constant(3)
  %wide.param.1 = (s32[]{:T(128)}, f32[256,512]{1,0:T(8,128)S(1)}, s32[]{:T(128)}) parameter(0)
  %get-tuple-element.21 = s32[]{:T(128)} get-tuple-element(%wide.param.1), index=0
  ROOT %lt.3 = pred[]{:T(512)} compare(%get-tuple-element.21, %constant.7.clone.1), direction=LT
}

ENTRY %main.7_spmd (param.3: f32[128,512]) -> f32[1,1] {
  %constant.2.clone.1 = s32[]{:T(128)} constant(0)
  %constant.12.clone.1 = f32[]{:T(128)} constant(0)
  %param.3 = f32[128,512]{1,0:T(8,128)} parameter(0), sharding={devices=[2,2]<=[4]}
  %broadcast_multiply_fusion = f32[128,512]{1,0:T(8,128)S(1)} fusion(%param.3), kind=kLoop, calls=%fused_computation.1
  %psum.14 = f32[128,512]{1,0:T(8,128)S(1)} all-reduce(%broadcast_multiply_fusion), channel_id=1, replica_groups={{0,2},{1,3}}, use_global_device_ids=true, to_apply=%region_0.0
  %copy.9 = s32[]{:T(128)} copy(%constant.2.clone.1)
  %all-gather.4 = f32[256,512]{1,0:T(8,128)S(1)} all-gather(%psum.14), channel_id=1, replica_groups=[2,2]<=[2,2]T(1,0), dimensions={0}, use_global_device_ids=true
  %tuple.15 = (s32[]{:T(128)}, f32[256,512]{1,0:T(8,128)S(1)}, s32[]{:T(128)}) tuple(%copy.9, %all-gather.4, %copy.9)
  %while.10 = (s32[]{:T(128)}, f32[256,512]{1,0:T(8,128)S(1)}, s32[]{:T(128)}) while(%tuple.15), condition=%wide.region_2.3_spmd, body=%wide.region_1.2_spmd.sunk
  %get-tuple-element.14 = f32[256,512]{1,0:T(8,128)S(1)} get-tuple-element(%while.10), index=1
  %reduce_sum.9 = f32[]{:T(128)} reduce(%get-tuple-element.14, %constant.12.clone.1), dimensions={0,1}, to_apply=%region_0.0
  %bitcast = f32[1,1]{1,0:T(1,128)} bitcast(%reduce_sum.9)
  ROOT %psum.15 = f32[1,1]{1,0:T(1,128)} all-reduce(%bitcast), channel_id=1, replica_groups=[2,2]<=[4], use_global_device_ids=true, to_apply=%region_0.0
}
"""


def test_kernels_in_sequence():
  """Entry: the fusion, 2 all-reduces, the all-gather, the reduce (5; the scalar copy, the bitcast, the
  constants, the tuple and the while start none); the loop body once: its fusion (the scalar add and
  the condition's compare are bookkeeping). 6."""
  assert analysis.kernels(_HLO) == 6


def test_replica_groups_in_each_form():
  """Explicit groups, and the iota form with and without a transpose: [2,2]<=[2,2]T(1,0) is
  arange(4).reshape(2,2).T = {{0,2},{1,3}}; [2,2]<=[4] is {{0,1},{2,3}}."""
  found = analysis.collectives(_HLO, 4)
  assert [(c["kind"], c["ids"], c["group"]) for c in found] == [
      ("all-reduce", [0, 2], 2), ("all-gather", [0, 2], 2), ("all-reduce", [0, 1], 2)]


def test_latency_floor():
  """A program's floor is its launch, its kernels one after another and its collectives' hops; the
  forecast is the largest of the four floors, and MFU is only given where compute binds."""
  c = {"flops": 1e6, "bytes": 1e6, "collective_s": 0.0, "kernels": 120.0, "collective_latency_s": 6e-6}
  floor = PROGRAM_LAUNCH_S + 120 * KERNEL_LAUNCH_S + 6e-6
  assert forecast.latency_floor(c) == pytest.approx(floor) == pytest.approx(7e-6 + 60e-6 + 6e-6)
  secs, bound = forecast.roofline(c, CHIPS["v5e"])
  assert bound == "latency" and secs["forecast"] == secs["latency"] == pytest.approx(floor)
  assert secs["memory"] == pytest.approx(1e6 / 819e9) and secs["compute"] == pytest.approx(1e6 / 197e12)
  big = dict(c, flops=1e12)  # 5.1 ms of compute at 197 TFLOP/s: compute binds
  secs, bound = forecast.roofline(big, CHIPS["v5e"])
  assert bound == "compute" and secs["forecast"] == pytest.approx(1e12 / 197e12)
  r = forecast.ProgramReport(name="p", note="", calls_per_step=1, memory={"peak": 0}, outside_bytes=0,
                             mosaic_kernels=0, collectives={}, cost=big, seconds=secs, bound=bound,
                             model_flops=0.5 * secs["forecast"], compile_s=0.0, hbm_bytes=1, hbm_bytes_per_s=1.0)
  assert r.mfu == pytest.approx(0.5)
  assert dataclasses.replace(r, bound="memory").mfu is None


def test_labels_say_lower_and_upper_bound():
  assert "lower bound on time" in report.LABEL and "upper bound on tokens/s" in report.LABEL
  assert report.fits_text(True, 1) == "yes"
  assert report.fits_text(True, 16) == ("yes (multi-controller run verified with several processes on CPU, "
                                        "not on a pod)")
