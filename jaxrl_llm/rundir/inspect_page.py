"""The token-weight inspector's page: one dumped step as a self-contained HTML file.

`write_page(workdir, step)` reads <workdir>/dumps/step_N.{npz,json} (token_dump.py)
and writes <workdir>/dumps/step_N.html; `python -m jaxrl_llm.inspect` is its
command line, and its docstring says what the page shows.

The page is the template inspect_page.html (HTML, CSS and JS, read as package
data) with `__TITLE__` and `__DATA__` filled in; nothing is fetched from the
network. `__DATA__` is `page_data`'s JSON: the per-token arrays as base64
float32 / integer buffers over the sampled tokens only (a field constant over
the step is one number), which the page's script decodes the first time it
needs one; it renders only the sequences of the visible page, so a batch of
512 responses of 1,000 tokens stays usable. A dump of multi-turn episodes
carries `context_BR` (every response token, the environment's observations
too): the buffers then run over those, `env` marks the environment's tokens,
and the page shows them greyed, in no colour (they weigh zero in the loss).
"""

from __future__ import annotations

import base64
import functools
import html
import importlib.resources
import json
import os

import numpy as np

from jaxrl_llm.rundir import token_dump

TEMPLATE_FILE = "inspect_page.html"  # package data next to this module

# Per-token fields from the loss's factors: (factor key, label, colour scale).
# ratio: diverging around 1 on a log scale; signed: diverging around 0; pos: from 0 up.
FACTOR_FIELDS = (
    ("W", "W = f T", "ratio"), ("T", "T (trust region)", "ratio"), ("f", "f (correction)", "ratio"),
    ("A", "A (advantage)", "signed"), ("lambda", "lambda (aggregation)", "pos"),
    ("lambda_A_W", "lambda A W (gradient weight)", "signed"), ("r", "r = pi_theta / pi_prox", "ratio"),
    ("c", "c = pi_prox / mu (loss)", "ratio"), ("rho", "rho = pi_theta / mu", "ratio"),
    ("log_c", "log c (loss)", "signed"), ("C", "C (Score Centering term)", "signed"),
)
# Teacher diagnostics (TeacherStage.diagnostics) per token.
TEACHER_FIELDS = (
    ("gap", "teacher gap log q - log p", "signed"), ("teacher_logp", "log q(y) (teacher)", "signed"),
    ("student_logp", "log p(y) (student)", "signed"), ("teacher_entropy", "H(q) (teacher entropy)", "pos"),
    ("kl_student_teacher", "KL(p || q)", "pos"), ("tau", "tau (teacher confidence)", "pos"),
    ("gate", "sign gate", "pos"), ("weight", "teacher loss weight", "pos"),
    ("reward_adv", "reward advantage (before the teacher)", "signed"),
)
# The colour menu, in order: (menu key, field key).
COLOUR_CHOICES = (("W", "W"), ("T", "T"), ("f", "f"), ("A", "A"), ("lambda A W", "lambda_A_W"),
                  ("log c", "log_c_measured"), ("teacher gap", "teacher.gap"), ("r", "r"), ("c", "c"),
                  ("rho", "rho"), ("lambda", "lambda"))


def flag_reasons(objective: dict) -> dict[str, str]:
  """flag key -> why a token with that flag was masked or clipped, for this run's objective knobs."""
  o = objective
  x = "r" if o["trust_level"] == "token" else "s_i (the answer's geometric mean of r)"
  y = "c" if o["correction_ratio"] == "c" else "rho"
  y = {"token": y, "seq_product": f"{y}_i (product over the answer)",
       "seq_geomean": f"{y}bar_i (geometric mean over the answer)"}[o["correction_level"]]
  lo, hi = 1 - o["eps_low"], 1 + o["eps_high"]
  if o["trust_region"] == "truncate":
    lo_t, hi_t = (lo, hi) if o["truncate_bounds"] == "relative" else (0.0, o["truncate_cap"])
    trust_low = f"trust region: {x} < {lo_t:g}, weight raised to {lo_t:g} (truncated)"
    trust_high = f"trust region: {x} > {hi_t:g}, weight capped at {hi_t:g} (truncated)"
  else:
    trust_low = f"trust region: A < 0 and {x} < {lo:g} (masked)"
    trust_high = f"trust region: A > 0 and {x} > {hi:g} (masked)"
  kind = o["correction"]
  masked = {"mis": f"correction mask: {y} > {o['is_cap']:g} (masked)",
            "band": f"correction mask: {y} outside [{o['band_low']:g}, {o['band_high']:g}] (masked)",
            "band_indicator": f"correction mask: {y} outside [{o['band_low']:g}, {o['band_high']:g}] (masked)",
            "dppo_tv": f"DPPO: |mu - pi| > {o['dppo_delta']:g} in A's direction (masked)",
            "dppo_kl": f"DPPO: binary KL(mu, pi) > {o['dppo_delta']:g} in A's direction (masked)",
            "trm": "TRM: the answer's token KL(mu || pi) passes its bound (whole answer masked)"}.get(kind, "masked")
  high = {"tis": f"correction: {y} > {o['is_cap']:g}, weight capped at {o['is_cap']:g} (truncated)",
          "topr": "TOPR: A < 0 and rho_i > 1, weight tapered to 1 (truncated)",
          "ppo": f"correction clip: A > 0 and {y} > {hi:g} (masked)"}.get(kind, "correction clipped high")
  return {
      "trust/clip_low": trust_low, "trust/clip_high": trust_high,
      "trust/dual_clip": f"dual clip: A < 0 and {x} > {o['dual_clip_c']} (masked)",
      "correction/clip_low": f"correction clip: A < 0 and {y} < {lo:g} (masked)",
      "correction/clip_high": high,
      "correction/dual_clip": f"correction dual clip: A < 0 and {y} > {o['dual_clip_c']} (masked)",
      "correction/masked": masked,
  }


def _buffer(values: np.ndarray) -> dict:
  """A flat array as the page reads it: {"const": x} when constant, else base64 of its bytes."""
  if values.dtype == bool:
    values = values.astype(np.uint8)
  if values.size and values.dtype.kind == "f" and np.all(values == values.flat[0]) \
      and np.isfinite(values.flat[0]):
    return {"const": float(values.flat[0])}
  kind = {np.dtype(np.float32): "f32", np.dtype(np.uint8): "u8", np.dtype(np.uint16): "u16",
          np.dtype(np.int32): "i32"}[values.dtype]
  return {"dtype": kind, "b64": base64.b64encode(np.ascontiguousarray(values).tobytes()).decode("ascii")}


def _per_pass(v_KBR: np.ndarray, sampled_BR: np.ndarray) -> list[dict]:
  """One buffer per pass over the sampled tokens, or one for all when the passes agree."""
  flat = [np.ascontiguousarray(v[sampled_BR]) for v in v_KBR]
  if all(np.array_equal(flat[0], f) for f in flat[1:]):
    flat = flat[:1]
  return [_buffer(f) for f in flat]


def page_data(arrays: dict, info: dict) -> dict:
  """The JSON the page embeds (module docstring): sequences, flat per-token buffers, pieces, config."""
  policy = arrays["sampled_BR"].astype(bool)
  # The tokens shown: the sampled ones, or an episode's every token (the environment's greyed).
  sampled = arrays["context_BR"].astype(bool) if "context_BR" in arrays else policy
  B, R = sampled.shape
  lengths = sampled.sum(axis=1)
  offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(int)
  tokens = arrays["tokens_BR"][sampled]
  tokens = tokens.astype(np.uint16 if tokens.size == 0 or tokens.max() < 65536 else np.int32)
  objective = info["config"]["objective"]
  fields = []
  for key, label, scale in FACTOR_FIELDS:
    if key == "C" and objective["kappa"] == 0:
      continue  # no Score Centering term in this loss
    if f"factor_{key}_KBR" in arrays:
      fields.append({"key": key, "label": label, "scale": scale,
                     "passes": _per_pass(arrays[f"factor_{key}_KBR"], sampled)})
  if info.get("prox_recomputed"):
    for key, label, src in (("log_c_measured", "log c = log pi_prox - log mu (measured)", "measured_log_c_BR"),
                            ("logp_prox", "log pi_prox(y)", "prox_logp_BR")):
      fields.append({"key": key, "label": label, "scale": "signed", "passes": _per_pass(arrays[src][None], sampled)})
  fields.append({"key": "logp_mu", "label": "log mu(y) (sampler)", "scale": "signed",
                 "passes": _per_pass(arrays["behav_logp_BR"][None], sampled)})
  for ext in info.get("extensions", []):
    known = {k: (label, scale) for k, label, scale in TEACHER_FIELDS} if ext == "teacher" else {}
    prefix = f"ext_{ext}__"
    order = list(known)  # the table's order first, then any other signal by name
    names = sorted((k[len(prefix):] for k in arrays if k.startswith(prefix)),
                   key=lambda n: (order.index(n) if n in order else len(order), n))
    for name in names:
      v = arrays[prefix + name]
      if v.ndim == 2:
        label, scale = known.get(name, (f"{ext}: {name}", "signed"))
        fields.append({"key": f"{ext}.{name}", "label": label, "scale": scale,
                       "passes": _per_pass(v.astype(np.float32)[None], sampled)})
  reasons = flag_reasons(objective)
  flags = [{"key": key, "reason": reasons.get(key, key),
            "passes": _per_pass(arrays[f"flag_{key.replace('/', '__')}_KBR"], sampled)}
           for key in info.get("flags", []) if arrays[f"flag_{key.replace('/', '__')}_KBR"].any()]
  overlong, filler = arrays["overlong_masked_B"].astype(bool), arrays["filler_B"].astype(bool)
  seq = {
      "reward": arrays["reward_B"].tolist(), "correct": arrays["correct_B"].tolist(),
      "adv": arrays["seq_adv_B"].tolist(), "log_c": arrays["log_c_seq_B"].tolist(),
      "length": arrays["length_B"].tolist(), "group": arrays["group_B"].tolist(),
      "finish": ["length" if t else "eos" for t in arrays["truncated_B"]],
      "off": ["overlong filter: cut at max_response_len" if o else
              "dynamic sampling: a filler group without signal" if f else "" for o, f in zip(overlong, filler)],
      "prompt": info["prompts"], "answer": info["answers"], "tag": info["tags"],
  }
  if "statuses" in info:  # episodes: why each ended (envs/base.py)
    seq["status"] = info["statuses"]
  for ext in info.get("extensions", []):
    for name in ("routed_B", "has_teacher_B"):
      key = f"ext_{ext}__{name}"
      if key in arrays:
        seq[f"{ext}.{name[:-2]}"] = arrays[key].astype(float).tolist()
  meta = {"step": info["step"], "run_name": info["run_name"], "method": info["method"], "passes": info["passes"],
          "group_size": info["group_size"], "extensions": info.get("extensions", []), "B": int(B), "R": int(R),
          "n_tokens": int(offsets[-1]), "n_loss_tokens": int(arrays["loss_mask_BR"].sum()),
          "objective": objective, "rollout": info["config"].get("rollout", {}),
          "train": info["config"].get("train", {}), "teacher": info["config"].get("teacher"),
          "metrics": info.get("metrics", {})}
  present = {f["key"] for f in fields}
  log_c = "log_c_measured" if "log_c_measured" in present else "log_c"  # without a recompute: the loss's
  colours = [[name, log_c if name == "log c" else key] for name, key in COLOUR_CHOICES]
  colours = [c for c in colours if c[1] in present]
  out = {"meta": meta, "offsets": offsets.tolist(), "seq": seq, "tokens": _buffer(tokens),
         "in_loss": _buffer(arrays["loss_mask_BR"][sampled]), "pieces": info["pieces"], "fields": fields,
         "flags": flags, "colours": colours}
  if "context_BR" in arrays:
    out["env"] = _buffer(~policy[sampled])
    meta["n_env_tokens"] = int((sampled & ~policy).sum())
  return out


@functools.cache
def page_template() -> str:
  """inspect_page.html, read once from the installed package."""
  return importlib.resources.files(__package__).joinpath(TEMPLATE_FILE).read_text(encoding="utf-8")


def render(arrays: dict, info: dict) -> str:
  """The page's HTML for one dump."""
  data = json.dumps(page_data(arrays, info), separators=(",", ":")).replace("</", "<\\/")
  title = html.escape(f"step {info['step']} - {info['run_name']} ({info['method']})")
  return page_template().replace("__TITLE__", title).replace("__DATA__", data)


def write_page(workdir: str, step: int, out: str | None = None) -> str:
  """Renders step `step` of `workdir` to `out` (default <workdir>/dumps/step_N.html); -> the path."""
  arrays, info = token_dump.read_dump(workdir, step)
  out = out or os.path.splitext(token_dump.dump_paths(workdir, step)[1])[0] + ".html"
  text = render(arrays, info)
  tmp = f"{out}.tmp.{os.getpid()}"
  with open(tmp, "w", encoding="utf-8") as f:
    f.write(text)
  os.replace(tmp, out)
  return out
