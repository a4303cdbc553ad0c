"""`python -m jaxrl_llm.compile`: a run's programs through the real TPU compiler, and what the plan reads of them.

Each figure the plan prints rests on one of these checks: the collectives'
bytes and the links each is charged (against shard_map programs whose
collectives the test writes), the cost probes' extension to L layers
(against the unrolled program at L), the Mosaic kernels' cost estimate
(against 2 N D V written out), the decode loop's sum over its steps, the
default run's plan end to end with its latency floor, the 7x devices and the
HBM the compiler reports, the v4 refusal. Needs libtpu
(`pip install -e ".[tpu-aot]"`); compiles for v5e:2x2, small shapes.

The runs planned are the default run's config at fewer rows (`SMALL`: 64
samples, not 512): the same nine programs, compiled in about half the time.
A program lowered to the same StableHLO for the same devices is compiled once
in the module (tests/tpu/conftest.py): the plan of selected programs and the
recompute's cost probes are programs the default plan compiled.
"""

import dataclasses
import os

os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import pytest  # noqa: E402

try:
  import libtpu  # noqa: F401,E402
except ImportError:
  pytest.skip('libtpu is not installed: pip install -e ".[tpu-aot]" (compile-only TPU checks)',
              allow_module_level=True)

# slow: compiles (module docstring); one worker: _default_plan() and the programs compiled (compiled_once) are
# shared by the tests that read them, in the order they are written here.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("tpu.test_compile_plan"),
              pytest.mark.usefixtures("compiled_once")]

import functools  # noqa: E402
import json  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

from jaxrl_llm import cli  # noqa: E402
from jaxrl_llm import compile as compile_lib  # noqa: E402
from jaxrl_llm import kernels  # noqa: E402
from jaxrl_llm.tpu import analysis, forecast, plan_report as report, topology as topology_lib  # noqa: E402
from jaxrl_llm.tpu.chips import CHIPS, GIB, KERNEL_LAUNCH_S, PROGRAM_LAUNCH_S  # noqa: E402
from jaxrl_llm.tpu.ici import Links  # noqa: E402
from jaxrl_llm.tpu.programs import lower_recompute, lower_update, param_sds, run_programs  # noqa: E402
from jaxrl_llm.tpu.topology import topology_devices  # noqa: E402
from jaxrl_llm.training.config import from_config_dict  # noqa: E402
from jaxrl_llm.training.defaults import get_config  # noqa: E402

TOPOLOGY = "v5e:2x2"
# The default run at fewer rows: 8 prompts x 8 samples (train.pack=auto still packs 64 rows), SFT and eval by 16.
SMALL = {"rollout.prompts_per_step": 8, "sft.batch_size": 16, "eval.batch_size": 16}


@functools.cache
def _devices():
  return tuple(topology_lib.topology_devices(TOPOLOGY)[0])  # the plans' devices (compiled_once)


def _set(c, values):
  for key, value in values.items():
    section, name = key.split(".")
    setattr(getattr(c, section), name, value)
  return c


def _cfg(**overrides):
  return from_config_dict(_set(get_config("gspo"), {**SMALL, **overrides}))


@functools.cache
def _default_plan():
  return compile_lib.plan(_cfg(), TOPOLOGY, log=lambda s: None)


@functools.cache
def _shapes(small: bool = True):
  cfg = _cfg() if small else from_config_dict(get_config("gspo"))  # SMALL's rows, or the default run's
  return compile_lib.build_shapes(cfg, "", _devices())


# ------------------------------------------------------------ collectives


def test_collectives_are_read_with_their_bytes():
  """An all-gather, a reduce-scatter and an all-reduce over 4 chips, written with shard_map: the
  parser finds each with its group and the bytes a chip moves on a ring."""
  mesh = Mesh(np.array(_devices()), ("x",))
  n, rows, cols = 4, 256, 512  # f32 [256, 512] per chip

  def body(a):
    gathered = jax.lax.all_gather(a, "x", tiled=True)  # [1024, 512]: result 2 MiB
    scattered = jax.lax.psum_scatter(a, "x", tiled=True)  # [64, 512]: result 128 KiB
    total = jax.lax.psum(a * 2.0, "x")  # [256, 512]: 512 KiB
    return jnp.stack([gathered.sum(), scattered.sum(), total.sum()])[None]

  f = jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"))
  x = jax.ShapeDtypeStruct((n * rows, cols), jnp.float32, sharding=NamedSharding(mesh, P("x")))
  hlo = jax.jit(f).lower(x).compile().as_text()
  found = {c["kind"]: c for c in analysis.collectives(hlo, n)}
  assert {"all-gather", "reduce-scatter", "all-reduce"} <= set(found), found
  mib = 1 << 20
  assert found["all-gather"]["group"] == 4 and found["all-gather"]["bytes"] == 2 * mib
  assert found["all-gather"]["moved_bytes"] == 2 * mib * 3 / 4
  assert found["reduce-scatter"]["moved_bytes"] == 128 * 1024 * 3  # (n - 1) x the result
  big = max((c for c in analysis.collectives(hlo, n) if c["kind"] == "all-reduce"), key=lambda c: c["bytes"])
  assert big["bytes"] == 512 * 1024 and big["moved_bytes"] == 2 * 512 * 1024 * 3 / 4


def test_a_one_axis_collective_is_charged_that_axis_links():
  """On a 2 x 2 mesh of the v5e 2x2 slice (no wraparound), a gather over one mesh axis spans one
  physical axis: one link, 50 GB/s one way (Google's 400 GB/s per chip over 2 directions x 4 links),
  1 hop; a gather over both mesh axes has a link along each, 100 GB/s, 2 hops; an all-reduce over one
  axis 2 x 1 hops. Before, every collective was charged half the chip's ICI, 200 GB/s."""
  mesh = Mesh(np.array(_devices()).reshape(2, 2), ("a", "b"))

  def body(x):
    one = jax.lax.all_gather(x, "a", tiled=True)  # f32 [256, 256] result, 1/2 of it moved: 128 KiB
    both = jax.lax.all_gather(x * 3.0, ("a", "b"), tiled=True)  # [512, 256], 3/4 moved: 384 KiB
    total = jax.lax.psum(x * 2.0, "b")  # [128, 256], 2 x 1/2 moved: 128 KiB
    return jnp.stack([one.sum(), both.sum(), total.sum()])[None, None]

  f = jax.shard_map(body, mesh=mesh, in_specs=P("a", "b"), out_specs=P("a", "b"))
  x = jax.ShapeDtypeStruct((256, 512), jnp.float32, sharding=NamedSharding(mesh, P("a", "b")))
  compiled = jax.jit(f).lower(x).compile()
  links = Links.of(mesh.devices.flat, CHIPS["v5e"])
  found = {(c["kind"], c["group"]): c for c in analysis.collectives(compiled.as_text(), 4)}
  kib = 1024
  assert found[("all-gather", 2)]["moved_bytes"] == 128 * kib
  assert found[("all-gather", 4)]["moved_bytes"] == 384 * kib
  assert found[("all-reduce", 2)]["moved_bytes"] == 128 * kib
  assert [links.group_cost(found[k]["ids"]) for k in [("all-gather", 2), ("all-gather", 4), ("all-reduce", 2)]] \
      == [(50e9, 1), (100e9, 2), (50e9, 1)]
  c = analysis.cost(compiled, links)
  assert c["collective_s"] == pytest.approx(128 * kib / 50e9 + 384 * kib / 100e9 + 128 * kib / 50e9)
  assert c["collective_latency_s"] == pytest.approx((1 + 2 + 2 * 1) * 1e-6)
  assert c["collective_s"] > c["collective_bytes"] / 200e9  # the old charge, 2.4x lower here



def test_a_chain_of_async_collective_fusions_is_one_collective():
  """XLA:TPU overlaps a gather with compute as a chain of async collective fusions (one chain_id),
  each naming the whole result (lines of SmolLM2's head gather in a compiled probe): one all-gather,
  not one per link; another chain, or one without a chain_id, counts on its own."""
  link = ('  %all-gather.{i} = f32[576,49152]{{1,0:T(8,128)}} all-gather(%param_0.{i}), channel_id=1, '
          'replica_groups={{{{0,1,2,3,4,5,6,7}}}}, dimensions={{0}}, use_global_device_ids=true, '
          'frontend_attributes={{chain_id="{c}"}}')
  plain = "  %all-gather.9 = f32[64,512]{1,0} all-gather(f32[8,512]{1,0} %p), replica_groups={{0,1,2,3,4,5,6,7}}"
  hlo = "\n".join([link.format(i=i, c=0) for i in range(12)] + [link.format(i=20, c=1), plain])
  found = analysis.collectives(hlo, 8)
  assert [c["bytes"] for c in found] == [576 * 49152 * 4, 576 * 49152 * 4, 64 * 512 * 4]
  assert found[0]["moved_bytes"] == 576 * 49152 * 4 * 7 / 8

# ------------------------------------------------------------ cost probes


def test_combine_is_bilinear():
  """combine() on a cost that is a + b L + c m + d L m gives it back at any (L, m)."""
  f = lambda l, m: {"flops": 5.0 + 3.0 * l + 7.0 * m + 2.0 * l * m}  # noqa: E731
  probes = {(l, m): f(l, m) for l in (1, 2) for m in (1, 2)}
  assert analysis.combine(probes, 36, 8) == f(36, 8)
  # probes at 4 and 8 iterations (a packed update whose buffers split over the shards only from 4 on)
  probes = {(l, m): f(l, m) for l in (1, 2) for m in (4, 8)}
  assert analysis.combine(probes, 36, 6, (4, 8)) == f(36, 6) and analysis.combine(probes, 3, 1, (4, 8)) == f(3, 1)


def test_mosaic_kernels_report_their_cost():
  """XLA sees no FLOPs inside a custom call; the Mosaic kernels' cost_estimate gives them: the
  token_logprobs forward's 2 N D V FLOPs and N V exponentials are in the compiled cost analysis."""
  n, d, v = 256, 576, 49_152
  mesh = Mesh(np.array(_devices()[:1]), ("x",))
  whole = NamedSharding(mesh, P())
  h = jax.ShapeDtypeStruct((n, d), jnp.bfloat16, sharding=whole)
  w = jax.ShapeDtypeStruct((d, v), jnp.bfloat16, sharding=whole)
  t = jax.ShapeDtypeStruct((n,), jnp.int32, sharding=whole)
  with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
    compiled = jax.jit(lambda h, w, t: kernels.token_logprobs(h, w, t, temperature=1.0).logp).lower(
        h, w, t).compile()
  c = analysis.cost(compiled, Links.of(mesh.devices.flat, CHIPS["v5e"]))
  assert 2 * n * d * v <= c["flops"] <= 2 * n * d * v * 1.01
  assert n * v <= c["transcendentals"] <= n * v * 1.01
  # w read once per block of rows, the hidden states once: at least the bytes of w and h.
  assert c["bytes"] >= d * v * 2 + n * d * 2


# ------------------------------------------------------------ the default run's plan


def test_default_run_plan():
  head, reports, step, chip = _default_plan()
  by_name = {r.name: r for r in reports}
  assert list(by_name) == ["rollout/prefill", "rollout/decode", "recompute", "recompute/packed", "update",
                           "update/packed", "sft", "eval/prefill", "eval/decode"]
  # train.pack=auto: the bound on the packings it runs, planned beside the padded programs (they replace them
  # where it packs: not in the step's forecast)
  assert by_name["update/packed"].calls_per_step == 0 == by_name["recompute/packed"].calls_per_step
  assert "buffers of" in by_name["update/packed"].note and by_name["update/packed"].mosaic_kernels == 3
  assert head["chips"] == 4 and head["mesh"] == "data 4xfsdp 1xtensor 1" and chip.generation == "v5e"
  # impl=auto on a TPU topology: the update runs token_logprobs' Mosaic forward, d hidden and d w
  # kernels, the recompute its forward; the sampler computes whole logits (no kernel).
  assert by_name["update"].mosaic_kernels == 3 and by_name["recompute"].mosaic_kernels == 1
  assert by_name["rollout/decode"].mosaic_kernels == 0
  assert by_name["recompute"].calls_per_step == 2  # pi_prox and pi_ref (gspo's KL to the reference is logged)
  assert all(r.fits and 0 < r.memory["peak"] < r.hbm_bytes for r in reports)
  # The decode forecast sums R - 1 steps (token 0 comes from the prefill), each at least the weights'
  # matmuls for every row: 2 x (layer + head weights) x rows, split over the chips.
  shapes = _shapes()
  mc = shapes.model_cfg
  layer_w, head_w = forecast._matmul_params(mc)  # pylint: disable=protected-access
  rows, R = shapes.rows, shapes.response_len
  assert by_name["rollout/decode"].cost["flops"] >= (R - 1) * 2 * (layer_w + head_w) * rows / 4
  # Where a decode step's bytes go, at the shortest and the full cache: the layers and the rest add up
  # to the step's bytes; each layer reads at least its share of the KV cache (k and v of every row over
  # the step's slots, in the sampler's dtype: f32 here, split over the 4 chips).
  lo, hi = by_name["rollout/decode"].cost["decode_steps"]
  cache_itemsize = jnp.dtype(shapes.cfg.rollout.sampler_dtype).itemsize
  for d in (lo, hi):
    assert d["bytes"] == pytest.approx(mc.n_layers * d["per_layer_bytes"] + d["outside_layers_bytes"])
    kv_layer = 2 * rows * mc.n_kv_heads * mc.head_dim * d["slots"] * cache_itemsize / 4
    assert d["kv_bytes"] == pytest.approx(mc.n_layers * kv_layer)
    assert d["per_layer_bytes"] >= kv_layer
  assert lo["slots"] < hi["slots"]
  assert step["seconds"] > 0 and step["fits"]
  assert step["seconds"] == pytest.approx(sum(r.calls_per_step * r.seconds["forecast"] for r in reports))
  # The latency floor: each program's launch, its kernels in sequence and its collectives' hops; the
  # forecast is the largest floor. The decode loop runs at least one kernel per layer per step.
  for r in reports:
    s = r.seconds
    assert s["latency"] == pytest.approx(PROGRAM_LAUNCH_S + r.cost["kernels"] * KERNEL_LAUNCH_S
                                         + r.cost["collective_latency_s"])
    assert s["forecast"] == max(s["compute"], s["memory"], s["collectives"], s["latency"])
    assert (r.mfu is None) == (r.bound != "compute")  # MFU only where compute binds
  assert by_name["rollout/decode"].cost["kernels"] >= (R - 1) * mc.n_layers
  in_step = [r for r in reports if r.calls_per_step]
  assert step["latency_floor_s"] == pytest.approx(sum(r.calls_per_step * r.seconds["latency"] for r in in_step))
  assert step["seconds"] >= step["latency_floor_s"] >= sum(r.calls_per_step for r in in_step) * PROGRAM_LAUNCH_S
  # Each floor is at least the one before this change (whole-chip ICI, no latency term): per program the
  # largest of compute, memory and its collectives' bytes at 200 GB/s. (At the default run's 512 samples
  # that step forecast was 1.67 ms, this one 1.68 ms; at SMALL's 64, measured 1.04 ms.)
  before = sum(r.calls_per_step * max(r.seconds["compute"], r.seconds["memory"], r.cost["collective_bytes"] / 200e9)
               for r in in_step)
  assert step["seconds"] >= before and step["seconds"] > 1.03e-3
  assert (step["mfu"] is None) == any(r.bound != "compute" for r in in_step)
  # The fit check's HBM is the compiler's: 15.75 GiB per v5e device (Google's page: 16 GiB).
  assert all(r.hbm_bytes == int(15.75 * GIB) for r in reports) and head["hbm_per_device"] == "15.75 GiB (the compiler)"
  # JSON and markdown: every program, and the labels.
  js = json.loads(json.dumps(report.as_json(head, reports, step, chip)))
  assert [p["name"] for p in js["programs"]] == list(by_name) and "not a measurement" in js["label"]
  assert "lower bound on time" in js["label"] and "upper bound on tokens/s" in js["label"]
  md = report.plan_markdown(head, reports, step, chip)
  assert all(f"| {name} |" in md for name in by_name)
  assert "RL step forecast (roofline lower bound)" in md and "sampled tokens/s/chip (upper bound)" in md
  assert report.misfits(reports, head) == []


def test_a_program_the_compiler_refuses_is_a_misfit_not_a_crash():
  """XLA:TPU refuses to compile a program whose temporaries exceed the chip's HBM (the warm start of
  Qwen3-0.6B at 128 rows of 5,120 tokens on v6e-8 asked for 113 GiB): the plan reports it as not
  fitting, with the compiler's figure and what to change, and goes on."""
  head, reports, step, _ = compile_lib.plan(_cfg(**{"sft.batch_size": 1 << 20}), TOPOLOGY, programs="sft",
                                            log=lambda s: None)
  (r,) = reports
  assert r.error == "XLA:TPU ran out of HBM compiling it" and not r.fits and not step["fits"]
  assert r.memory["temp"] > 100 * 2**30  # the compiler's own figure, far above the chip's 16 GB
  (line,) = report.misfits(reports, head)
  assert line.startswith("sft does not fit on v5e:2x2: needs at least ") and "set sft.micro_batch_size" in line
  assert analysis.out_of_hbm("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
                             "temporaries (113.31G) exceeds available HBM (31.25G).") == (
                                 int(113.31 * 2**30), int(31.25 * 2**30))
  assert analysis.out_of_hbm("Ran out of memory in memory space hbm. Used 40.5G of 31.25G hbm.") == (
      int(40.5 * 2**30), int(31.25 * 2**30))
  assert analysis.out_of_hbm("Ran out of memory in memory space vmem. Used 17.39M of 16.00M vmem") is None


def test_programs_compiles_only_those_named():
  """`--programs=rollout/decode` compiles the decode loop and the prefill it starts from, with the same
  forecast as in the whole plan; the step sums them alone; a name no program has is refused."""
  from jaxrl_llm.checks import ConfigError
  head, reports, step, _ = compile_lib.plan(_cfg(), TOPOLOGY, programs="rollout/decode", log=lambda s: None)
  assert [r.name for r in reports] == ["rollout/prefill", "rollout/decode"] == head["programs"]
  whole = {r.name: r for r in _default_plan()[1]}
  for r in reports:
    assert r.seconds["forecast"] == pytest.approx(whole[r.name].seconds["forecast"], rel=1e-6)
  assert step["seconds"] == pytest.approx(sum(r.seconds["forecast"] for r in reports))
  names = [p.name for p in compile_lib.select_programs(run_programs(_shapes()), "eval, update")]
  assert names == ["update", "update/packed", "eval/prefill", "eval/decode"]  # a prefix names its packed program too
  with pytest.raises(ConfigError, match=r"--programs='rolout': 'rolout' names no program of this run; its "
                                        r"programs: rollout/prefill, rollout/decode, recompute"):
    compile_lib.select_programs(run_programs(_shapes()), "rolout")


@pytest.mark.parametrize("program", ["recompute", "update"])
def test_probes_extend_exactly_to_more_layers(program):
  """The cost at L = 3 extended from the 1- and 2-layer probes equals the 3-layer program's own (all
  layers unrolled, no loop: XLA counts every op), FLOPs to 1e-6 and bytes to 5% (fusion choices differ).
  The recompute at SMALL's rows: its 1- and 2-layer programs are test_default_run_plan's probes, compiled
  once. The update at the default run's 512 samples: its bytes' extension is off by 13% at 64 (5.8% at 256)."""
  shapes = _shapes(small=program == "recompute")
  mc = shapes.model_cfg
  lower = {"recompute": lambda m, p: lower_recompute(shapes, m, p, shapes.cfg.micro_batch_size),
           "update": lambda m, p: lower_update(shapes, m, p, 1)}[program]
  costs, links = {}, Links.of(shapes.mesh.devices.flat, CHIPS["v5e"])
  for n in (1, 2, 3):
    m = mc.replace(n_layers=n)
    costs[n] = analysis.cost(lower(m, param_sds(m, shapes.mesh, unstacked=True)).compile(), links)
  extended = analysis.combine({(1, 1): costs[1], (2, 1): costs[2]}, 3, 1)
  np.testing.assert_allclose(extended["flops"], costs[3]["flops"], rtol=1e-6)
  # measured: 0.04% (recompute) and 3.3% (the update with shared prompts; 1.7% without)
  np.testing.assert_allclose(extended["bytes"], costs[3]["bytes"], rtol=0.05)
  assert costs[3]["flops"] > costs[2]["flops"] > costs[1]["flops"] > 0


def test_a_program_that_does_not_fit_is_named_with_what_to_change():
  head, reports, _, _ = _default_plan()
  small = [dataclasses.replace(r, hbm_bytes=r.memory["peak"] // 2) if r.name == "update" else r for r in reports]
  (line,) = report.misfits(small, head)
  assert line.startswith("update does not fit on v5e:2x2: needs ") and "the device has" in line
  assert "micro_batch_size" in line or "mesh.fsdp" in line
  small = [dataclasses.replace(r, hbm_bytes=r.memory["temp"] // 2, outside_bytes=0) if r.name == "eval/prefill"
           else r for r in reports]
  (line,) = report.misfits(small, head)
  assert line.startswith("eval/prefill does not fit on v5e:2x2: ") and "lower eval.batch_size" in line


# ------------------------------------------------------------ bad input


@pytest.mark.parametrize("name, match", [
    ("v5e", "not a TPU topology; give <generation>:<chips per axis>"),
    ("v9:2x2", "libtpu refuses it"),
    ("v5e:3x3", "libtpu refuses it"),
])
def test_unknown_topology(name, match):
  from jaxrl_llm.tpu.topology import TopologyError

  with pytest.raises(TopologyError, match=match):
    topology_devices(name)


def test_accelerator_types_map_to_topologies():
  from jaxrl_llm.tpu.topology import resolve_name

  assert resolve_name("v5e-8") == "v5e:2x4" and resolve_name("v5p-8") == "v5p:2x2x1"
  assert resolve_name("v5p-64") == "v5p:2x4x4" and resolve_name("v6e-8") == "v6e:2x4"


def test_libtpu_missing_or_mismatched(monkeypatch):
  import importlib.metadata
  import importlib.util

  from jaxrl_llm.tpu import topology

  real_find, real_version = importlib.util.find_spec, importlib.metadata.version
  monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "libtpu" else real_find(n, *a))
  with pytest.raises(topology.TopologyError, match=r'libtpu is not installed.*pip install -e "\.\[tpu-aot\]"'):
    topology.check_libtpu()
  monkeypatch.setattr(importlib.util, "find_spec", real_find)
  monkeypatch.setattr(importlib.metadata, "version",
                      lambda n: "0.0.1" if n == "libtpu" else real_version(n))
  with pytest.raises(topology.TopologyError, match=r"libtpu 0\.0\.1 is installed but jax .* pins libtpu=="):
    topology.check_libtpu()


def test_lock_held(monkeypatch):
  from jax.experimental import topologies

  from jaxrl_llm.tpu import topology

  def held(**_):
    raise RuntimeError("ABORTED: Internal error when accessing libtpu multi-process lockfile. Run ...")

  monkeypatch.setattr(topologies, "get_topology_desc", held)
  # topology_devices as imported: the module's attribute gives the devices made before (compiled_once)
  with pytest.raises(topology.TopologyError, match="another process holds libtpu's lock .*ALLOW_MULTIPLE_LIBTPU_LOAD=1"):
    topology_devices("v5e:2x2")


def test_config_that_does_not_divide_the_topology():
  from jaxrl_llm.checks import ConfigError

  with pytest.raises(ConfigError, match=r"fsdp=3 .*4 devices"):
    compile_lib.build_shapes(_cfg(**{"mesh.fsdp": 3}), "", _devices())
  with pytest.raises(ConfigError, match=r"n_heads=9 is not divisible by the 'tensor' mesh axis of size 2"):
    compile_lib.build_shapes(_cfg(**{"mesh.tensor": 2}), "smollm2_135m", _devices())


def test_a_multi_host_slice_compiles_from_one_process():
  """v5p:2x2x2 is 8 chips on 2 hosts; the default run's programs (at SMALL's rows) compile for it here
  (fit only), with an fsdp x tensor mesh."""
  head, reports, step, chip = compile_lib.plan(_cfg(**{"mesh.fsdp": 4, "mesh.tensor": 2, "mesh.data": 1,
                                                       "model.vocab_multiple": 2}),
                                               "v5p:2x2x2", probes=False, log=lambda s: None)
  assert (head["chips"], head["hosts"], chip.generation) == (8, 2, "v5p")
  assert head["mesh"] == "data 1xfsdp 4xtensor 2" and step["fits"]
  assert {r.name for r in reports} >= {"rollout/prefill", "rollout/decode", "update", "recompute"}
  md = report.plan_markdown(head, reports, step, chip)
  assert "fits: yes (multi-controller run verified with several processes on CPU, not on a pod)" in md


def test_7x_devices_are_half_chips_with_the_compilers_hbm():
  """libtpu makes TPU7x:2x2x1 8 devices of 4 chips, cores 0 and 1 of each: the chip table's
  devices_per_chip. The compiler gives each 94.75 GiB of HBM (half of 192 GiB, less what it keeps),
  a v5e device 15.75 GiB: the figures the fit check uses."""
  devices, _ = topology_devices("TPU7x:2x2x1")
  chips = {tuple(d.coords) for d in devices}
  assert (len(devices), len(chips), {d.core_on_chip for d in devices}) == (8, 4, {0, 1})
  assert len(devices) // len(chips) == CHIPS["7x"].devices_per_chip
  assert analysis.compiler_hbm(devices[0]) == int(94.75 * GIB) < CHIPS["7x"].hbm_bytes
  assert analysis.compiler_hbm(_devices()[0]) == int(15.75 * GIB)


def test_v4_is_refused_in_one_line(capsys):
  """libtpu makes a v4-8 8 devices (one per TensorCore of 4 chips), where a v4 runs megacore and jax
  meshes it only so (it asserted "requires one device per chip"): the command ends with one line
  naming the topology and what is allowed, status 2, no traceback."""
  with pytest.raises(SystemExit) as e:
    cli.guard(compile_lib.plan, _cfg(), "v4-8")
  assert e.value.code == 2
  assert capsys.readouterr().err.splitlines() == [
      "error: --topology='v4-8': libtpu makes 8 devices of its 4 TPU v4 chips (one per TensorCore), but a v4 "
      "runs one megacore device per chip and jax meshes it only so; v4 is not planned: give a v5e, v5p, v6e or "
      "TPU7x topology (v5e:2x4, v5p:2x2x1, v6e:2x4, TPU7x:2x2x1)",
      "(--debug shows the traceback)"]


def test_the_teacher_pass_compiles_with_its_vocabulary_kernels():
  """A teacher method's scoring pass (teacher/stage.py) is one of the run's programs: with a hint context
  and top-k the teacher reads P + 64 tokens, and the pass runs token_logprobs twice, vocab_cross and
  vocab_topk as Mosaic kernels (its rows, under 128 tokens, keep the XLA attention under
  model.attention_impl=auto); the update holds the distillation loss term. Those are compiled (fit only,
  SMALL's rows); the run's other programs are the default run's (test_default_run_plan)."""
  from run_helpers import load_config

  c = _set(load_config("sdpo"), SMALL)  # configs/sdpo.py: the self-teacher reading a hint
  c.teacher.topk = 8
  cfg = from_config_dict(c)
  padded = [p.name for p in run_programs(compile_lib.build_shapes(cfg, "", _devices())) if "/packed" not in p.name]
  assert padded[:5] == ["rollout/prefill", "rollout/decode", "recompute", "teacher", "update"]
  _, reports, _, _ = compile_lib.plan(cfg, TOPOLOGY, probes=False, programs="teacher,update", log=lambda s: None)
  by_name = {r.name: r for r in reports}
  assert list(by_name) == ["teacher", "update", "update/packed"]
  t = by_name["teacher"]
  assert t.mosaic_kernels == 4 and t.fits and t.calls_per_step == 1 and 0 < t.memory["peak"] < t.hbm_bytes
  # The update holds the distillation term on the teacher's top-k (teacher/loss.py): 3 more kernels than
  # the policy loss's forward, d hidden and d w (test_default_run_plan's 3).
  assert by_name["update"].mosaic_kernels == 6 == by_name["update/packed"].mosaic_kernels  # packed: the same term


def test_reward_model_training_is_planned(objective="dpo"):
  """`--config=configs/dpo.py` (reward_model.py, process_reward_model.py alike): the run's optimizer step
  in micro-batches and its held-out step, compiled and forecast; the step trains rows x 2 sequences of
  the data's length. (Each objective's programs are the run's: tests/training/test_program_identity.py.)"""
  from jaxrl_llm.reward_model.config import reward_config_from_dict
  from jaxrl_llm.reward_model.defaults import reward_model_config
  from jaxrl_llm.training.tiny import apply_settings

  # 16 pairs in 2 micro-batches (default 128 in 16): the loop the cost probes extend, at fewer rows
  cd = apply_settings(reward_model_config(), {"objective": objective, "train.batch_size": 16,
                                              "train.micro_batch_size": 8, "train.center_coef": 0.0, "export": False})
  assert compile_lib.is_reward_config(cd) and not compile_lib.is_reward_config(get_config("gspo"))
  cfg = reward_config_from_dict(cd)
  head, reports, step, chip = compile_lib.plan(cfg, TOPOLOGY, log=lambda s: None)
  assert [r.name for r in reports] == ["reward/train", "reward/eval"]
  train = reports[0]
  assert train.calls_per_step == 1 and all(r.fits and r.memory["peak"] > 0 for r in reports)
  assert f"{cfg.train.batch_size // 8} micro-batches of 8 pairs" in train.note
  assert step["tokens"] == "trained" and step["seconds"] == pytest.approx(train.seconds["forecast"])
  T = head["seq_len"]
  assert step["tokens_per_s_per_chip"] == pytest.approx(cfg.train.batch_size * 2 * T / step["seconds"] / 4)
  # The model FLOPs: the trunk over every token x 3 (DPO: its head too, and pi_ref's forward)
  mc = compile_lib.build_reward_shapes(cfg, "", _devices()).model_cfg
  seqs = cfg.train.batch_size * 2
  head_rows = seqs * T if objective == "dpo" else 0
  want = forecast.model_flops(mc, rows=seqs, seq=T, head_rows=head_rows, train=True)
  want += forecast.model_flops(mc, rows=seqs, seq=T, head_rows=head_rows, train=False) if objective == "dpo" else 0
  assert train.model_flops == pytest.approx(want / 4 / chip.peak_bf16_flops)
  md = report.plan_markdown(head, reports, step, chip)
  assert "Reward-model step forecast (roofline lower bound)" in md and "trained tokens/s/chip" in md
  assert "| reward/train |" in md and report.misfits(reports, head) == []


def test_the_exact_mode_compiles():
  """rollout.exact (issue 43): log mu, the tokens' verification and the recompute by the row-wise program, compiled
  by XLA:TPU with the vocabulary kernel the recompute runs (Mosaic), in f32 and with a bf16 sampler."""
  for sampler_dtype in ("float32", "bfloat16"):
    cfg = _cfg(**{"rollout.exact": True, "rollout.sampler_dtype": sampler_dtype})
    _, reports, _, _ = compile_lib.plan(cfg, TOPOLOGY, probes=False,
                                        programs="rollout/exact,rollout/verify,recompute", log=lambda s: None)
    by_name = {r.name: r for r in reports}
    assert list(by_name) == ["rollout/exact", "rollout/verify", "recompute"]  # row by row: no packed recompute
    assert "row by row" in by_name["recompute"].note and by_name["rollout/exact"].calls_per_step > 0
    for r in reports:
      kernels = 0 if r.name == "rollout/verify" else 1  # the draws read the f32 logits (sampling/verify.py)
      assert r.fits and 0 < r.memory["peak"] < r.hbm_bytes and r.mosaic_kernels == kernels, (sampler_dtype, r)
