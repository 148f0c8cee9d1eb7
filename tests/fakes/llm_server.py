"""A scripted OpenAI-compatible chat-completions server on loopback: real HTTP for the real openai client.

The script is a list of `Reply` rules; each request gets the first rule whose `match` (a substring of the request's
messages) fits and that has uses left. A rule can answer with content and usage counts, an HTTP error with headers
(429 with Retry-After, 500, ...), or sleep past the client's timeout. Every request is recorded (path, headers by
lower-case name, JSON body, the status sent, the time) so tests can assert what the prompts held and what they never
held. When nothing matches, the server answers 400 "script exhausted", which the client does not retry.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    content: str = ""
    match: str | None = None
    times: int | None = None  # None: any number of uses
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    prompt_tokens: int = 100
    completion_tokens: int = 200


@dataclass
class Request:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    status: int
    at: float

    @property
    def text(self) -> str:
        """All message contents of the request, joined."""
        return "\n".join(str(m.get("content", "")) for m in self.body.get("messages", []))


class ScriptedLLM:
    def __init__(self, script: list[Reply]):
        self.script = list(script)
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def _pick(self, text: str) -> Reply | None:
        with self._lock:
            for r in self.script:
                if (r.match is None or r.match in text) and (r.times is None or r.times > 0):
                    if r.times is not None:
                        r.times -= 1
                    return r
        return None

    def _handler(self):
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, status: int, payload: dict, headers: dict[str, str]) -> None:
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout): that is the point of a delayed reply

            def do_POST(self):  # noqa: N802
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                req = Request(self.path, {k.lower(): v for k, v in self.headers.items()}, body, 0, time.time())
                if self.path.rstrip("/") != "/v1/chat/completions":
                    req.status = 404
                    owner.requests.append(req)
                    return self._send(404, {"error": {"message": "not found"}}, {})
                r = owner._pick(req.text)
                req.status = 400 if r is None else r.status
                owner.requests.append(req)
                if r is None:
                    return self._send(400, {"error": {"message": "script exhausted", "type": "invalid_request"}}, {})
                if r.delay_s:
                    time.sleep(r.delay_s)
                if r.status != 200:
                    err = {"error": {"message": f"scripted {r.status}", "type": "server_error", "code": r.status}}
                    return self._send(r.status, err, r.headers)
                self._send(200, {
                    "id": f"chatcmpl-{len(owner.requests)}", "object": "chat.completion", "created": int(time.time()),
                    "model": body.get("model", "scripted"),
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": r.content}}],
                    "usage": {"prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens,
                              "total_tokens": r.prompt_tokens + r.completion_tokens},
                }, r.headers)

        return Handler

    def start(self) -> ScriptedLLM:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> ScriptedLLM:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def completions(self) -> list[Request]:
        return [r for r in self.requests if r.path.rstrip("/") == "/v1/chat/completions"]


def dump_requests(server: ScriptedLLM) -> list[dict]:
    return [asdict(r) for r in server.requests]

