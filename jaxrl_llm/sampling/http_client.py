"""JSON over HTTP to an inference server, with the two kinds of failure an engine must tell apart.

`ServerUnavailable`: nothing usable came back (connection refused or reset,
a timeout, HTTP 5xx or 503 while loading, a body that is not JSON): worth a
retry after a back-off, or a restart of the server. `ServerRejected`: HTTP
4xx: the server understood the request and refused it (an option it does
not know, a prompt longer than its context); a retry would fail the same
way, so it is a configuration error.

One `http.client` connection per call: the server is on the loopback or a
fast network, and a fresh connection per request keeps threads independent
(a server restart leaves no stale keep-alive socket behind).
"""

from __future__ import annotations

import http.client
import json
import socket
import urllib.parse

from jaxrl_llm.checks import ConfigError


class ServerUnavailable(Exception):
  """No usable answer: retry, wait, or restart the server."""


class ServerRejected(ConfigError):
  """HTTP 4xx: the request itself is wrong for this server."""


def parse_base_url(url: str, field: str = "config.rollout.server.url") -> tuple[str, int, str]:
  """(host, port, path prefix) of an http:// base URL, or a ConfigError naming `field`."""
  parts = urllib.parse.urlsplit(url)
  if parts.scheme != "http" or not parts.hostname:
    raise ConfigError(f"{field}={url!r} is invalid: expected http://HOST:PORT (an OpenAI-compatible server)")
  try:
    port = parts.port or 80
  except ValueError:
    raise ConfigError(f"{field}={url!r} is invalid: the port is not a number") from None
  return parts.hostname, port, parts.path.rstrip("/")


class ServerClient:
  """GET / POST JSON to one server (`base_url` like http://127.0.0.1:8080)."""

  def __init__(self, base_url: str, timeout_s: float):
    self.base_url = base_url.rstrip("/")
    self.host, self.port, self.prefix = parse_base_url(self.base_url)
    self.timeout_s = timeout_s

  def get(self, path: str, timeout_s: float | None = None) -> dict:
    return self._call("GET", path, None, timeout_s)

  def post(self, path: str, payload: dict, timeout_s: float | None = None) -> dict:
    return self._call("POST", path, payload, timeout_s)

  def _call(self, method: str, path: str, payload, timeout_s) -> dict:
    where = f"{self.base_url}{path}"
    conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout_s or self.timeout_s)
    try:
      body = None if payload is None else json.dumps(payload).encode()
      conn.request(method, self.prefix + path, body=body, headers={"Content-Type": "application/json"})
      resp = conn.getresponse()
      raw = resp.read()
    except (OSError, http.client.HTTPException) as e:  # refused, reset, timed out (socket.timeout is an OSError)
      kind = "timed out" if isinstance(e, socket.timeout) else type(e).__name__
      raise ServerUnavailable(f"{method} {where}: {kind} ({e})") from None
    finally:
      conn.close()
    text = raw.decode("utf-8", "replace")
    if 400 <= resp.status < 500:
      raise ServerRejected(f"{method} {where}: the server refused the request (HTTP {resp.status}: "
                           f"{_message(text)})")
    if resp.status != 200:
      raise ServerUnavailable(f"{method} {where}: HTTP {resp.status} ({_message(text)})")
    try:
      return json.loads(text)
    except ValueError:
      raise ServerUnavailable(f"{method} {where}: the answer is not JSON ({text[:80]!r})") from None


def _message(text: str) -> str:
  """The error message of a JSON error body ({"error": {"message": ...}} or {"error": "..."}), else the text."""
  try:
    err = json.loads(text).get("error", text)
  except (ValueError, AttributeError):
    return text[:200]
  if isinstance(err, dict):
    err = err.get("message", err)
  return str(err)[:200]
