"""A pure-Python stand-in for llama.cpp's server, speaking the part of its HTTP API the `openai` engine uses.

Endpoints: GET /health, /v1/models (with meta.n_vocab), /props (n_ctx per
slot, `model_path`); POST /tokenize, /completion (only its
`generation_settings`, the applied sampling fields; `override` makes it apply
others), /v1/completions (token-id prompts, llama.cpp's `logprobs.content`
with ids and post-sampling probabilities, or with `post_sampling_probs:
false` the raw logits' `logprob`; `logit_bias` pairs, false or a number),
and SGLang's POST /update_weights_from_disk (with `weight_version`) and GET
/get_weight_version. Its sampling "model" is a bigram table: the logits of
the next token are row `last token` of `logits_VV`. Sampling follows
SamplingConfig's order (temperature, top-k, top-p, min-p) in float64, so a
test can recompute mu independently.

The raw log-probs (the engine's sync check scores its probe with them) come
from `scorer(prefix ids) -> logits`: the bigram row by default, or a real
decoder (numpy_llama.py) on the weights the server loaded: `load(path)` makes
one from a Hugging Face directory at /update_weights_from_disk.

Faults, set by a test on the server object: `script` (a list of actions for
the next completion requests: "500", "503", "timeout", "reset", "garbage",
"400"), `bad_seeds` (requests with these seeds always answer 500), `down`
(every request answers 503 like a server loading a model), `stale` (an
update answers success but changes nothing: "all" keeps the weights and the
reported version, "weights" reports the new version and keeps the weights),
`update_s` (seconds an update takes).

Run as a program it takes llama-server's flags (-m MODEL.gguf --port P
--alias NAME ...), samples from the bigram E E^T / sqrt(D) of the exported
embedding and scores raw log-probs with the exported decoder itself
(numpy_llama.from_gguf): a stand-in for the engine's own process management
(start, restart on new weights, a crash with --die-after N, a server that
keeps the first file it was started on with --stale MARKER, one slow to
load with --load-s S).
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import socket
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy_llama  # noqa: E402


def process(logits: np.ndarray, req: dict) -> np.ndarray:
  """Probabilities after the logit bias, temperature, top-k, top-p, min-p (zeros where truncated)."""
  x = logits.astype(np.float64)
  for sid in req.get("bias_off", ()):
    x[sid] = -np.inf
  for sid, bias in req.get("bias", ()):
    x[sid] += bias
  if req["temperature"] == 0:
    p = np.zeros_like(x)
    p[int(np.argmax(x))] = 1.0
    return p
  x = x / req["temperature"]
  order = np.argsort(-x, kind="stable")
  keep = np.ones_like(x, bool)
  if req["top_k"] > 0:
    keep[order[req["top_k"]:]] = False
  p = np.exp(x - x[keep].max()) * keep
  p /= p.sum()
  if req["top_p"] < 1.0:
    cum = np.cumsum(p[order])
    last = int(np.searchsorted(cum, req["top_p"]))  # the first index where the mass reaches top_p
    drop = order[last + 1:]
    p[drop] = 0.0
    p /= p.sum()
  if req["min_p"] > 0:
    p[p < req["min_p"] * p.max()] = 0.0
    p /= p.sum()
  return p


class FakeServer(http.server.ThreadingHTTPServer):
  daemon_threads = True

  def __init__(self, logits_VV: np.ndarray, *, eos_ids=(1,), model_id="fake-model", encode=None,
               n_ctx=4096, port=0):
    super().__init__(("127.0.0.1", port), _Handler)
    self.logits_VV, self.eos_ids, self.model_id, self.encode = logits_VV, set(eos_ids), model_id, encode
    self.n_ctx, self.script, self.bad_seeds, self.down = n_ctx, [], set(), False
    self.override = {}  # generation settings the server applies whatever the request says
    self.requests, self.answers, self.loaded = [], {}, []
    self.lock = threading.Lock()
    self.die_after = None  # completions before the process exits (program mode)
    self.scorer = lambda prefix: self.logits_VV[prefix[-1]]  # raw logits after a prefix (the sync probe's)
    self.load = None  # path -> scorer, for /update_weights_from_disk (None: the scorer stays)
    self.model_path, self.weight_version = "", None  # what /props and /get_weight_version report
    self.stale, self.update_s = "", 0.0  # faults of an update (module docstring)
    self.probes = 0  # raw log-prob requests answered

  @property
  def url(self) -> str:
    return f"http://127.0.0.1:{self.server_address[1]}"

  def handle_error(self, request, client_address):  # an injected reset is not worth a traceback
    pass

  def start(self) -> "FakeServer":
    threading.Thread(target=self.serve_forever, daemon=True).start()
    return self

  def stop(self) -> None:
    self.shutdown()
    self.server_close()

  def update(self, req: dict) -> dict:
    """SGLang's /update_weights_from_disk: load `model_path` (a Hugging Face directory)."""
    time.sleep(self.update_s)
    ok = os.path.isfile(os.path.join(req["model_path"], "config.json"))
    self.loaded.append(req["model_path"])
    if ok and self.stale != "all":
      if self.stale != "weights" and self.load is not None:
        self.scorer = self.load(req["model_path"])
      self.weight_version = req.get("weight_version")
    return {"success": ok, "message": "loaded" if ok else "no config.json"}

  def complete(self, req: dict) -> dict:
    rng = np.random.default_rng(req["seed"])
    V = self.logits_VV.shape[0]
    bias_off = [i for i, b in req.get("logit_bias", []) if b is False]
    bias = [(i, float(b)) for i, b in req.get("logit_bias", []) if not isinstance(b, bool)]
    spec = dict(temperature=req["temperature"], top_k=req["top_k"], top_p=req["top_p"], min_p=req["min_p"],
                bias_off=bias_off, bias=bias)
    raw = req.get("post_sampling_probs") is False  # llama.cpp: log-probs of the raw logits, as `logprob`
    prefix, content, finish = list(req["prompt"]), [], "length"
    for _ in range(req["max_tokens"]):
      logits = self.scorer(prefix) if raw else self.logits_VV[prefix[-1]]
      p = process(logits, spec)
      tok = int(rng.choice(V, p=p)) if req["temperature"] > 0 else int(np.argmax(p))
      if raw:
        logq = numpy_llama.log_softmax(np.asarray(logits, np.float64))
        top = np.argsort(-logq, kind="stable")[:req["n_probs"]]
        content.append({"id": tok, "token": str(tok), "logprob": float(logq[tok]),
                        "top_logprobs": [{"id": int(i), "token": str(i), "logprob": float(logq[i])} for i in top]})
      else:
        order = [int(i) for i in np.argsort(-p, kind="stable")[:req["n_probs"]] if p[i] > 0]
        content.append({"id": tok, "token": str(tok), "prob": float(p[tok]),
                        "top_probs": [{"id": i, "token": str(i), "prob": float(p[i])} for i in order]})
      prefix.append(tok)
      if tok in self.eos_ids:
        finish = "stop"
        break
    return {"choices": [{"text": "", "index": 0, "logprobs": {"content": content}, "finish_reason": finish}],
            "model": self.model_id, "object": "text_completion"}


class _Handler(http.server.BaseHTTPRequestHandler):
  server: FakeServer

  def log_message(self, *args):  # quiet
    pass

  def _send(self, status: int, body) -> None:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    self.send_response(status)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    self.wfile.write(data)

  def do_GET(self):
    srv = self.server
    if srv.down:
      return self._send(503, {"error": {"message": "Loading model", "code": 503}})
    if self.path == "/health":
      return self._send(200, {"status": "ok"})
    if self.path == "/v1/models":
      return self._send(200, {"object": "list", "data": [
          {"id": srv.model_id, "object": "model", "meta": {"n_vocab": int(srv.logits_VV.shape[0])}}]})
    if self.path == "/props":
      return self._send(200, {"default_generation_settings": {"n_ctx": srv.n_ctx}, "model_path": srv.model_path})
    if self.path == "/get_weight_version" and srv.weight_version is not None:
      return self._send(200, {"weight_version": srv.weight_version})
    self._send(404, {"error": {"message": "File Not Found", "code": 404}})

  def do_POST(self):
    srv = self.server
    req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
    if srv.down:
      return self._send(503, {"error": {"message": "Loading model", "code": 503}})
    if self.path == "/tokenize":
      if srv.encode is None:
        return self._send(404, {"error": {"message": "File Not Found", "code": 404}})
      return self._send(200, {"tokens": srv.encode(req["content"])})
    if self.path == "/completion":  # llama.cpp's native endpoint: here only its echo of the applied settings
      known = ("dry", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")  # llama.cpp drops other names
      applied = {k: v for k, v in req.items() if k != "prompt"}
      applied.update(samplers=[x for x in req.get("samplers", []) if x in known], ignore_eos=False, min_keep=0)
      applied.update(srv.override)
      return self._send(200, {"content": "", "generation_settings": applied})
    if self.path == "/update_weights_from_disk":
      return self._send(200, srv.update(req))
    if self.path != "/v1/completions":
      return self._send(404, {"error": {"message": "File Not Found", "code": 404}})
    if req.get("post_sampling_probs") is False:  # the sync check's probe: outside the scripted faults and records
      with srv.lock:
        srv.probes += 1
      return self._send(200, srv.complete(req))
    with srv.lock:
      srv.requests.append(req)
      action = srv.script.pop(0) if srv.script else None
    if req.get("seed") in srv.bad_seeds or action in ("500", "503"):
      return self._send(int(action or 500), {"error": {"message": "injected failure", "code": 500}})
    if action == "400":
      return self._send(400, {"error": {"message": "Unsupported param: injected", "code": 400}})
    if action == "timeout":
      time.sleep(2.0)
    if action == "reset":
      self.connection.shutdown(socket.SHUT_RDWR)
      return
    if action == "garbage":
      return self._send(200, b"{not json")
    answer = srv.complete(req)
    with srv.lock:
      srv.answers.setdefault(req["seed"], answer)
      if srv.die_after is not None:
        srv.die_after -= 1
        if srv.die_after <= 0:
          os._exit(9)  # a crash: no answer for this request
    self._send(200, answer)


def _program(argv) -> None:
  """llama-server's command line: sampling from the bigram of the GGUF file's embedding, raw log-probs from
  its decoder."""
  ap = argparse.ArgumentParser()
  ap.add_argument("-m", dest="model", required=True)
  ap.add_argument("--host", default="127.0.0.1")
  ap.add_argument("--port", type=int, required=True)
  ap.add_argument("--alias", default="fake-model")
  ap.add_argument("-c", dest="ctx", type=int, default=4096)
  ap.add_argument("-np", dest="slots", type=int, default=1)
  for flag in ("-ctk", "-ctv", "-fa"):  # precision flags: nothing to change in numpy
    ap.add_argument(flag)
  ap.add_argument("--die-after", type=int, default=0, help="exit after N completions unless --die-marker exists")
  ap.add_argument("--die-marker", default="")
  ap.add_argument("--stale", default="", help="serve (and report) the file named in this marker, written at the "
                  "first start: a server that silently keeps its first weights")
  ap.add_argument("--load-s", type=float, default=0.0, help="seconds before the server listens (a slow load)")
  args, _ = ap.parse_known_args(argv)
  import gguf

  if args.stale:
    if not os.path.exists(args.stale):
      with open(args.stale, "w") as f:
        f.write(args.model)
    with open(args.stale) as f:
      args.model = f.read()
  time.sleep(args.load_s)
  reader = gguf.GGUFReader(args.model)
  model = numpy_llama.from_gguf(args.model)
  E = model["embed"].astype(np.float32)
  logits = E @ E.T / np.sqrt(E.shape[1]) * 30.0  # sharp enough to depend on the weights
  tokens = reader.fields["tokenizer.ggml.tokens"].contents()
  stoi = {t: i for i, t in enumerate(tokens)}
  plain = {chr(b): chr(b) for b in range(33, 127)}
  plain.update({" ": "\u0120", "\n": "\u010a"})  # GPT-2's byte alphabet for the character vocabulary
  srv = FakeServer(logits, eos_ids=(int(reader.fields["tokenizer.ggml.eos_token_id"].contents()),),
                   model_id=args.alias, encode=lambda text: [stoi[plain[c]] for c in text],
                   n_ctx=args.ctx // max(args.slots, 1), port=args.port)
  srv.model_path = args.model
  srv.scorer = lambda prefix: numpy_llama.llama_logits(model, prefix)
  if args.die_after and not (args.die_marker and os.path.exists(args.die_marker)):
    if args.die_marker:
      open(args.die_marker, "w").close()
    srv.die_after = args.die_after
  srv.serve_forever()


if __name__ == "__main__":
  _program(sys.argv[1:])
