"""A tiny OpenAI-compatible HTTP server for tests: what a strict server (or a gateway)
does that llama-server does not — it rejects some optional parameters and has no
``/tokenize`` — served for real on a loopback port by a thread."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Seen = list[tuple[str, dict[str, Any], str]]
"""Each request: path (or "GET"), JSON body, Authorization header."""


class FakeOpenAI(BaseHTTPRequestHandler):
    """One model, ``tiny-chat``; chat and text completions (streamed or not); no
    embeddings and no tokenizer; 400 for ``stream_options`` and ``top_k``, one parameter
    at a time, as strict servers answer."""

    seen: Seen
    key: str | None
    prefix: str
    reject = ("stream_options", "top_k")

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, status: int, body: object, content_type: str = "application/json") -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorised(self) -> bool:
        if self.key is None or self.headers.get("Authorization") == f"Bearer {self.key}":
            return True
        self._send(401, {"error": {"message": "Invalid API Key"}})
        return False

    def do_GET(self) -> None:
        self.seen.append(("GET", {}, self.headers.get("Authorization", "")))
        if not self._authorised():
            return
        if self.path == f"{self.prefix}/v1/models":
            self._send(200, {"object": "list", "data": [
                {"id": "tiny-chat", "object": "model", "max_model_len": 2048}]})
        else:
            self._send(404, b"<html>not here</html>", "text/html")

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append((self.path, body, self.headers.get("Authorization", "")))
        if not self._authorised():
            return
        bad = [p for p in self.reject if p in body]
        if bad:
            self._send(400, {"error": {"message": f"Unrecognized request argument: {bad[0]}"}})
            return
        chat = self.path == f"{self.prefix}/v1/chat/completions"
        if not chat and self.path != f"{self.prefix}/v1/completions":
            self._send(404, {"error": {"message": "Not Found"}})
            return
        text = "The answer is 42."
        if body.get("stream"):
            words = text.split(" ")
            choices: list[dict[str, Any]] = [
                {"delta": {"content": w + " "}, "finish_reason": None} if chat
                else {"text": w + " ", "finish_reason": None}
                for w in words[:body.get("max_tokens", len(words))]]
            events: list[dict[str, Any]] = [{"choices": [c]} for c in choices]
            events.append({"choices": [{"delta": {}, "finish_reason": "stop"}]})
            data = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
            self._send(200, data.encode(), "text/event-stream")
        elif chat:
            self._send(200, {"choices": [{"message": {"content": text.split(" ", 1)[0]},
                                          "finish_reason": "length"}]})
        else:
            self._send(200, {"choices": [{"text": text.split(" ", 1)[0],
                                          "finish_reason": "length"}]})


@contextlib.contextmanager
def serve_fake_openai(*, key: str | None = None, prefix: str = "",
                      reject: tuple[str, ...] = FakeOpenAI.reject,
                      ) -> Iterator[tuple[str, Seen]]:
    """Serve :class:`FakeOpenAI` on a free loopback port; yield its ``…/v1`` URL and the
    list of requests it saw. ``reject``: the parameters it answers 400 for."""
    seen: Seen = []
    handler = type("Handler", (FakeOpenAI,), {"seen": seen, "key": key, "prefix": prefix,
                                              "reject": reject})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}{prefix}/v1", seen
    finally:
        httpd.shutdown()
        httpd.server_close()
