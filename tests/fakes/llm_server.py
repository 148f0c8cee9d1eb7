"""A scripted OpenAI-compatible chat-completions server on loopback: real HTTP for the real openai client.

The script is a list of `Reply` rules; each request gets the first rule whose `match` (a substring of the request's
messages, or a tuple of substrings all present) fits, whose `unless` (a substring) does not, whose `model` (if set)
is the request's, and that has uses left.
A rule can answer with content (`{request}` in it becomes the request's number: distinct answers from one rule) and
usage counts (and a reported cost), end as a model cut off or filtered would (`finish_reason`), answer with reasoning
and no content, send an HTTP error with headers and its own error body (429 with Retry-After, 500, a 400 saying the
context is exceeded, ...), or answer after a delay (a reasoning model thinking, or past the client's timeout).
Every request is recorded (path, headers by lower-case name, JSON body, the status sent, when it came and when it was
answered) so tests can assert what the prompts held and what they never held, and which requests overlapped.
When nothing matches, the server answers 400 "script exhausted", which the client does not retry.
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
    match: str | tuple[str, ...] | None = None  # a tuple: every one of its substrings
    times: int | None = None  # None: any number of uses
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    prompt_tokens: int = 100
    completion_tokens: int = 200
    unless: str | None = None  # the rule does not fit a request holding this substring
    model: str | None = None  # the rule fits only requests for this model
    finish_reason: str = "stop"
    reasoning: str | None = None  # sent as message.reasoning_content (vLLM, DeepSeek)
    error: dict[str, Any] | None = None  # the error object of a non-200 answer
    cost: float | None = None  # reported as usage.cost (OpenRouter)


@dataclass
class Request:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    status: int
    at: float
    done_at: float = 0.0  # when the answer was sent

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

    def _pick(self, text: str, model: str | None = None) -> Reply | None:
        with self._lock:
            for r in self.script:
                wanted = (r.match,) if isinstance(r.match, str) else r.match or ()
                fits = all(w in text for w in wanted) and (r.unless is None or r.unless not in text) and (
                    r.model is None or r.model == model)
                if fits and (r.times is None or r.times > 0):
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
                r = owner._pick(req.text, body.get("model"))
                req.status = 400 if r is None else r.status
                owner.requests.append(req)
                if r is None:
                    return self._send(400, {"error": {"message": "script exhausted", "type": "invalid_request"}}, {})
                if r.delay_s:
                    time.sleep(r.delay_s)
                if r.status != 200:
                    err = {"error": r.error or {"message": f"scripted {r.status}", "type": "server_error",
                                                "code": r.status}}
                    self._send(r.status, err, r.headers)
                    req.done_at = time.time()
                    return None
                content = r.content.replace("{request}", str(len(owner.requests)))
                message: dict[str, Any] = {"role": "assistant", "content": content}
                if r.reasoning is not None:
                    message["reasoning_content"] = r.reasoning
                usage: dict[str, Any] = {"prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens,
                                         "total_tokens": r.prompt_tokens + r.completion_tokens}
                if r.cost is not None:
                    usage["cost"] = r.cost
                self._send(200, {
                    "id": f"chatcmpl-{len(owner.requests)}", "object": "chat.completion", "created": int(time.time()),
                    "model": body.get("model", "scripted"),
                    "choices": [{"index": 0, "finish_reason": r.finish_reason, "message": message}],
                    "usage": usage,
                }, r.headers)
                req.done_at = time.time()
                return None

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

