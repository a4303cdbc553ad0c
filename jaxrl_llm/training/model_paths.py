"""`.gguf` files wherever a run's config names a model checkpoint.

`config.model.hf_path`, `config.teacher.checkpoint`, each path of
`config.teacher.route_by_tag` and `config.init_checkpoint` may name a GGUF
file; `resolve_model_paths` (called once by `from_config_dict`) replaces each
by the Hugging Face directory converted from it (model/io/gguf_io.py, cached
under the model cache), so everything after the config sees a directory.
With data.chat_template the student's GGUF must carry a chat template that
renders. A bad file fails here, before any workdir exists.
"""

from __future__ import annotations

import dataclasses

from jaxrl_llm.model.io.gguf_io import resolve_model_path


def resolve_model_paths(cfg):
  """`cfg` (a RunConfig) with every `.gguf` checkpoint path replaced by its converted directory."""
  changes = {}
  hf_path = resolve_model_path(cfg.model.hf_path, field="config.model.hf_path",
                               chat_template=cfg.data.chat_template)
  if hf_path != cfg.model.hf_path:
    changes["model"] = dataclasses.replace(cfg.model, hf_path=hf_path)
  teacher = cfg.teacher
  checkpoint = resolve_model_path(teacher.checkpoint, field="config.teacher.checkpoint")
  routes = [(tag, resolve_model_path(path, field=f"config.teacher.route_by_tag[{tag}]"))
            for tag, path in teacher.routes]
  route_by_tag = teacher.route_by_tag
  if routes != list(teacher.routes):
    route_by_tag = ",".join(f"{tag}={path}" for tag, path in routes)
  if checkpoint != teacher.checkpoint or route_by_tag != teacher.route_by_tag:
    changes["teacher"] = dataclasses.replace(teacher, checkpoint=checkpoint, route_by_tag=route_by_tag)
  init = resolve_model_path(cfg.init_checkpoint, field="config.init_checkpoint")
  if init != cfg.init_checkpoint:
    changes["init_checkpoint"] = init
  return dataclasses.replace(cfg, **changes) if changes else cfg
