"""A fake llama-server that misbehaves on demand.

Run it as ``python -m supervisor.testing.fake_child`` or, faster, as ``python
path/to/fake_child.py`` (what :func:`supervisor.testing.fake_child_command` builds): the
file imports nothing but the standard library and needs no package around it, so started
by path it answers ``/health`` about 50 ms after exec, while ``-m`` first imports the whole
``supervisor`` package. It binds 127.0.0.1 or a UNIX socket only. All log lines go to
stderr, like llama-server's.

Command line (llama-server's spellings where llama-server has the flag)::

    --port N               1-65535; required unless --host is a socket path
    -m, --model PATH       required; must open for reading (content ignored), else
                           "llama_model_load: error loading model: failed to open PATH: ..."
                           and "main: exiting due to model loading error", exit 1
    --host 127.0.0.1       "localhost" also accepted, or a UNIX socket path ending in
                           ".sock" (as llama-server); anything else is an error (exit 1)
    -a, --alias NAME       model id reported everywhere; default the model file's name
    --embedding            (or --embeddings) embedding mode: /v1/embeddings works and the
                           completion endpoints answer 501, as in llama-server
    --n-embd N             embedding length, default 8
    --load-seconds S       time spent "loading" after binding, default 0 (3 with slow-start)
    --token-delay S        seconds per generated token, streamed or not, default 0.002
    --fault NAME           one of supervisor.testing.FAULTS, see below
    --fault-after N        the count some faults use, see below

``LLAMA_API_KEY`` in the environment (llama-server's ``--api-key``): every request but
``/health`` and ``/v1/health`` then needs ``Authorization: Bearer KEY`` and is answered
401 ``Invalid API Key`` otherwise (once loaded; while loading, 503 comes first, as in
llama-server).

Other flags (``-c 4096``, ``-np 2``, ``-ngl 99``, ``--mlock``, ...) are accepted and
ignored, except ``--bogus-flag``, which is refused like any unknown flag in llama-server:
``error: invalid argument: --bogus-flag`` and exit 1. Our own usage errors (missing
``--port``, a bad number) also exit 1, not argparse's 2.

Start-up, as in llama-server: bind the port (``main: couldn't bind HTTP server socket,
hostname: 127.0.0.1, port: N`` and exit 1 if that fails), then "load" the model for
``--load-seconds``, printing ``llama_model_load: loading tensors ... 37%`` every 0.1 s; while
loading every endpoint except ``/fake/stats`` answers 503 ``{"error": {"code": 503,
"message": "Loading model", "type": "unavailable_error"}}``. Then ``main: server is
listening on http://127.0.0.1:N - starting the main loop``. SIGTERM or SIGINT prints ``srv
operator(): operator(): cleaning up before exit...`` and exits 0, at any stage.

Endpoints (errors are ``{"error": {"code": C, "message": M, "type": T}}``)::

    GET  /health, /v1/health        200 {"status": "ok"}
    GET  /v1/models, /models        {"object": "list", "data": [{"id": ALIAS, ...,
                                     "meta": {"n_ctx_train": 2048, "n_embd": N}}]}
    POST /v1/completions            {"prompt": str, "max_tokens": 16, "stream": false,
                                     "stop": str | [str], ...}; also at /completions
    POST /v1/chat/completions       {"messages": [...]}; also at /chat/completions
    POST /v1/embeddings             {"input": str | [str], "encoding_format": "float" |
                                     "base64"}; also at /embeddings. 501 without --embedding
    POST /tokenize                  {"content": str, "add_special": bool} -> {"tokens": [...]}
    POST /detokenize                {"tokens": [...]} -> {"content": str}
    GET  /fake/stats                {"cancelled": n, "completions": n, "active_streams": n}
    anything else                   404 "File Not Found"

Generated text is :func:`generate_tokens` of the prompt (for chat, of the messages
rendered by :func:`render_chat`), cut at the first ``stop`` string; ``finish_reason`` is
"stop" if cut, else "length". ``max_tokens`` -1 means "until the 2048-token context is
full"; a prompt that alone fills the context is refused with 400. Token counts are one per
whitespace-separated word plus one BOS. Streams are ``text/event-stream`` in chunked
transfer encoding (for an HTTP/1.0 client: unchunked, then the connection is closed): one
``data: {json}`` event per token (chat streams start with a ``{"role": "assistant"}``
delta), a last event with ``finish_reason`` and ``usage``, then ``data: [DONE]``.
Embeddings are :func:`embed_text` (deterministic, L2-normalised).

A client that disconnects while its completion is generating (streamed or not) cancels it:
the fake stops, prints ``srv          stop: cancel task, id_task = N`` (llama-server's
padding) and counts it. ``/fake/stats``: ``cancelled`` counts those; ``completions`` counts
completion and chat requests answered to the end (a streamed one once ``[DONE]`` is sent);
``active_streams`` is the number of streams being written now.

Faults (``--fault NAME``) and what ``--fault-after N`` counts:

``crash-at-start``
    Prints an error line and exits 1 before binding the port.
``crash-mid-stream``
    Serves normally, but the first streamed completion or chat completion is killed by
    SIGSEGV (returncode -11, no core dump) after N token events have been sent (default 3;
    the chat stream's leading role event is not a token). A stream with fewer tokens dies
    before its final event. Non-streamed requests before it are served normally.
``hang``
    N counts HTTP requests (GET, POST, PUT, DELETE, PATCH, OPTIONS) to any path, ``/health``
    and ``/fake/stats`` included, 503 answers while loading included, from start-up on
    (default 0). The first N are answered normally; every later request is read up to its
    headers and never answered, and its connection stays open. So N=1 with no load time
    means "ready, then nothing answers" -- but the port is open a moment before the load
    ends, so a test needing an exact count waits for ``starting the main loop`` on stderr
    before its first request. SIGTERM still works.
``health-503-forever``
    Never finishes loading: 503 "Loading model" on every endpoint and a progress line
    every 0.1 s, forever. SIGTERM still works.
``slow-start``
    Loads for ``--load-seconds`` (3 s if not given) instead of 0.
``ignore-sigterm``
    SIGTERM and SIGINT are ignored (SIG_IGN); only SIGKILL stops it. Otherwise normal.
``flood-stdout``
    Once ready, a thread writes ``flood line N xxx...`` lines to stdout as fast as it can,
    forever, blocking while the pipe is full (it stops if stdout is closed). Serving works.
``usage-error``
    ``error: invalid argument: --usage-error`` and a usage line, exit 1 (nothing bound).
``model-error``
    Binds, then ``llama_model_load: error loading model: invalid magic characters`` and
    ``main: exiting due to model loading error``, exit 1.
``exit-after-ready``
    Becomes ready, then N seconds later (default 1; 0 = at once) prints an error line and
    exits 1: a crash while idle.
``probe-fails``
    Loads and answers ``/health`` and ``/v1/models`` like a healthy server, but every
    completion, chat completion and embedding request answers 500 ``{"error": {"code":
    500, "message": "fake: inference failed", "type": "server_error"}}``: up, yet unusable
    (a model that loads but cannot compute).
``wedge-hang``
    Healthy for the first N inference requests (completions, chat completions,
    embeddings; default 1: the supervisor's readiness request), then stuck as llama.cpp
    #27388 reports a real one: every later inference request is read and never answered
    (its connection stays open), and so is ``GET /lora-adapters`` (a request only the
    serving loop answers); ``/health`` and ``/v1/models`` still answer 200. SIGTERM and
    SIGINT are ignored: only SIGKILL stops it.
``wedge-fail``
    Healthy for the first N inference requests (default 1), then every later one answers
    500 ``{"error": {"code": 500, "message": "fake: wedged", "type": "server_error"}}``
    while ``/health`` answers 200. SIGTERM and SIGINT are ignored.

``GET /lora-adapters`` answers ``[]`` (llama-server's list of adapters, none), from the
serving loop in llama-server.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import select
import signal
import socket
import socketserver
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NamedTuple, NoReturn

__all__ = ["FAULTS", "embed_text", "generate_tokens", "main", "render_chat"]

#: Every value ``--fault`` accepts (``supervisor.testing.FAULTS``). Defined here, so the
#: script run by path needs nothing but the standard library.
FAULTS: tuple[str, ...] = (
    "crash-at-start",
    "crash-mid-stream",
    "hang",
    "health-503-forever",
    "slow-start",
    "ignore-sigterm",
    "flood-stdout",
    "usage-error",
    "model-error",
    "exit-after-ready",
    "probe-fails",
    "wedge-hang",
    "wedge-fail",
)

N_CTX = 2048
"""Context size the fake claims (``n_ctx_train`` in ``/v1/models``)."""
BOS_ID = 1
N_VOCAB = 32000
_DEFAULT_FAULT_AFTER = {"crash-mid-stream": 3, "hang": 0, "exit-after-ready": 1,
                        "wedge-hang": 1, "wedge-fail": 1}
_WEDGES = frozenset({"wedge-hang", "wedge-fail"})
_SLOW_START_SECONDS = 3.0
_PROGRESS_INTERVAL = 0.1
_USAGE = "usage: python -m supervisor.testing.fake_child --port N -m PATH [options]"
_UNAVAILABLE = (503, "Loading model", "unavailable_error")
_NOT_FOUND = (404, "File Not Found", "not_found_error")
_NO_EMBEDDINGS = (
    501,
    "This server does not support embeddings. Start it with `--embeddings`",
    "not_supported_error",
)
_NO_COMPLETIONS = (
    501,
    "This server does not support completions. Start it without `--embeddings`",
    "not_supported_error",
)


# ---------------------------------------------------------------- deterministic "model"


def generate_tokens(prompt: str, n: int) -> list[str]:
    """Return the first ``n`` token texts the fake generates for ``prompt``.

    Words ``w0`` to ``w999``, consecutive from an offset derived from the prompt; every
    token but the first starts with a space, so ``"".join(...)`` reads "w417 w418 w419".
    """
    base = zlib.crc32(prompt.encode())
    return [("" if i == 0 else " ") + f"w{(base + i) % 1000}" for i in range(n)]


def render_chat(messages: list[dict[str, Any]]) -> str:
    """Return the prompt text the fake's "chat template" makes of ``messages``."""
    lines = [f"{m['role']}: {_message_text(m.get('content'))}" for m in messages]
    return "\n".join([*lines, "assistant:"])


def embed_text(text: str, n_embd: int) -> list[float]:
    """Return the fake's embedding of ``text``: ``n_embd`` floats, L2 norm 1."""
    raw = [zlib.crc32(f"{j}:{text}".encode()) / 0x7FFFFFFF - 1.0 for j in range(n_embd)]
    norm = math.sqrt(sum(v * v for v in raw))
    if norm == 0.0:
        return [1.0] + [0.0] * (n_embd - 1)
    return [v / norm for v in raw]


def _count_tokens(text: str) -> int:
    """Tokens in a prompt: one per word, plus BOS."""
    return len(text.split()) + 1


def _token_id(word: str) -> int:
    return 2 + zlib.crc32(word.encode()) % (N_VOCAB - 2)


def _message_text(content: object) -> str:
    if isinstance(content, list):  # OpenAI content parts: keep the text ones
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def _plan(prompt: str, limit: int, stops: list[str]) -> tuple[list[str], int, str]:
    """Return (pieces to send, tokens generated, finish reason) for a completion."""
    pieces: list[str] = []
    text = ""
    for n, token in enumerate(generate_tokens(prompt, limit), start=1):
        candidate = text + token
        hits = [candidate.find(s) for s in stops if s and s in candidate]
        if hits:
            cut = min(hits)
            if cut > len(text):
                pieces.append(candidate[len(text) : cut])
            return pieces, n, "stop"
        pieces.append(token)
        text = candidate
    return pieces, len(pieces), "length"


# ---------------------------------------------------------------------------- logging


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _log(line: str) -> None:
    """Write one line to stderr, unbuffered (safe from any thread and before os._exit)."""
    # stderr closed by the parent: keep serving, like a child whose log goes nowhere.
    with contextlib.suppress(OSError):
        _write_all(2, (line + "\n").encode())


def _srv(func: str, message: str) -> str:
    """Format a line the way llama-server's ``SRV_*`` macros do."""
    return f"srv  {func:>12}: {message}"


# --------------------------------------------------------------------------- the server


class _Config:
    """Settings from the command line, fixed for the process's life."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.port: int = args.port or 0
        self.socket: str | None = args.host if args.host.endswith(".sock") else None
        self.where = self.socket or f"127.0.0.1, port: {self.port}"
        self.key: str | None = os.environ.get("LLAMA_API_KEY") or None
        self.alias: str = args.alias or os.path.basename(args.model)
        self.embedding: bool = args.embedding
        self.n_embd: int = args.n_embd
        self.token_delay: float = args.token_delay
        self.fault: str | None = args.fault
        default = _DEFAULT_FAULT_AFTER.get(args.fault or "", 0)
        self.fault_after: int = default if args.fault_after is None else args.fault_after


class _State:
    """Mutable state shared by the request threads; guarded by ``lock``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ready = False
        self.requests = 0
        self.inferences = 0
        self.completions = 0
        self.cancelled = 0
        self.active_streams = 0
        self.next_task_id = 0
        self.crash_claimed = False
        self.vocab: dict[int, str] = {}

    def new_task(self) -> int:
        with self.lock:
            self.next_task_id += 1
            return self.next_task_id - 1


class _FakeServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, config: _Config) -> None:
        self.config = config
        self.state = _State()
        if config.socket is not None:
            self.address_family = socket.AF_UNIX
            super().__init__(config.socket, _Handler)  # type: ignore[arg-type]
        else:
            super().__init__(("127.0.0.1", config.port), _Handler)

    def server_bind(self) -> None:
        if self.address_family == socket.AF_UNIX:
            socketserver.TCPServer.server_bind(self)  # no host name and port to look up
            self.server_name, self.server_port = "localhost", 0
            return
        super().server_bind()


_PUBLIC_PATHS = frozenset({"/health", "/v1/health"})  # llama-server's, without a key
_INFERENCE_PATHS = frozenset({"/v1/completions", "/completions", "/v1/chat/completions",
                              "/chat/completions", "/v1/embeddings", "/embeddings"})


class _Reply(NamedTuple):
    """A completion to send: the common fields, its object kind, the pieces, why it
    ended and the token usage."""

    head: dict[str, Any]
    kind: str
    pieces: list[str]
    finish: str
    usage: dict[str, int]


class _BadRequest(Exception):
    """Raised by request parsing; answered with 400 invalid_request_error."""


class _ClientGone(Exception):
    """The client closed its connection while its task was generating."""


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive and chunked streams, as cpp-httplib
    server: _FakeServer

    # ---------------------------------------------------------------- plumbing

    def send_response(self, code: int, message: str | None = None) -> None:
        """Send the status line without the ``Server``/``Date`` headers llama-server lacks."""
        self.log_request(code)
        self.send_response_only(code, message)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        """Log like llama-server: one line per request, health checks left out."""
        path = getattr(self, "path", "")  # unset when the request line itself was bad
        if not path.startswith("/health"):
            _log(_srv("log_server_r", f"request: {self.command} {path} 127.0.0.1 {code}"))

    def log_message(self, format: str, *args: Any) -> None:
        """Route http.server's own messages (malformed requests) to our log format."""
        _log(_srv("log_server_r", format % args))

    def do_GET(self) -> None:
        """Dispatch a GET."""
        self._dispatch()

    def do_POST(self) -> None:
        """Dispatch a POST."""
        self._dispatch()

    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_GET

    def _dispatch(self) -> None:
        config, state = self.server.config, self.server.state
        with state.lock:
            state.requests += 1
            n_request = state.requests
        if config.fault == "hang" and n_request > config.fault_after:
            threading.Event().wait()  # never answer; the connection stays open
        path = self.path.split("?", 1)[0]
        try:
            body = self._read_body()
            route = _ROUTES.get((self.command, path))
            if path != "/fake/stats" and not state.ready:
                self._error(*_UNAVAILABLE)
            elif config.key is not None and path not in _PUBLIC_PATHS and not self._keyed():
                self._error(401, "Invalid API Key", "authentication_error")
            elif config.fault == "probe-fails" and path in _INFERENCE_PATHS:
                self._error(500, "fake: inference failed", "server_error")
            elif config.fault in _WEDGES and self._wedged(path):
                if config.fault == "wedge-fail":
                    self._error(500, "fake: wedged", "server_error")
                else:
                    threading.Event().wait()  # stuck: never answered, connection open
            elif route is None:
                self._error(*_NOT_FOUND)
            else:
                route(self, body)
        except _BadRequest as exc:
            self._error(400, str(exc), "invalid_request_error")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _wedged(self, path: str) -> bool:
        """Whether this request finds the child wedged (counting inference requests)."""
        state, config = self.server.state, self.server.config
        if path == "/lora-adapters":
            with state.lock:
                return config.fault == "wedge-hang" and state.inferences >= config.fault_after
        if path not in _INFERENCE_PATHS:
            return False
        with state.lock:
            state.inferences += 1
            return state.inferences > config.fault_after

    def _keyed(self) -> bool:
        given = self.headers.get("Authorization") or self.headers.get("X-Api-Key") or ""
        return given.removeprefix("Bearer ") == self.server.config.key

    def _read_body(self) -> bytes:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            self.close_connection = True  # the rest of the stream cannot be framed
            raise _BadRequest("invalid Content-Length") from None
        return self.rfile.read(length) if length > 0 else b""

    def _send_json(self, code: int, obj: dict[str, Any]) -> None:
        body = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, code: int, message: str, kind: str) -> None:
        self._send_json(code, {"error": {"code": code, "message": message, "type": kind}})

    def _client_gone(self) -> bool:
        """Whether the client has closed its end (the check cpp-httplib makes)."""
        try:
            data = self.connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        except OSError:
            return True
        return len(data) == 0

    def _write_chunk(self, data: bytes) -> None:
        """Send one chunk of a stream (raw when the client speaks HTTP/1.0: no chunking)."""
        if self.request_version == "HTTP/1.1":
            data = f"{len(data):x}\r\n".encode() + data + b"\r\n"
        self.wfile.write(data)
        self.wfile.flush()

    # ---------------------------------------------------------------- simple endpoints

    def _health(self, _body: bytes) -> None:
        self._send_json(200, {"status": "ok"})

    def _lora_adapters(self, _body: bytes) -> None:
        body = b"[]"
        self.send_response(200)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _models(self, _body: bytes) -> None:
        config = self.server.config
        meta = {"n_ctx_train": N_CTX, "n_embd": config.n_embd}
        model = {"id": config.alias, "object": "model", "owned_by": "llamacpp", "meta": meta}
        self._send_json(200, {"object": "list", "data": [model]})

    def _stats(self, _body: bytes) -> None:
        state = self.server.state
        with state.lock:
            stats = {
                "cancelled": state.cancelled,
                "completions": state.completions,
                "active_streams": state.active_streams,
            }
        self._send_json(200, stats)

    def _tokenize(self, body: bytes) -> None:
        request = _json_object(body)
        content = request.get("content")
        if not isinstance(content, str):
            raise _BadRequest('"content" must be a string')
        words = content.split()
        ids = [_token_id(w) for w in words]
        state = self.server.state
        with state.lock:
            state.vocab.update(zip(ids, words, strict=True))
        tokens = [BOS_ID, *ids] if request.get("add_special") else ids
        self._send_json(200, {"tokens": tokens})

    def _detokenize(self, body: bytes) -> None:
        tokens = _json_object(body).get("tokens", [])
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise _BadRequest('"tokens" must be a list of integers')
        state = self.server.state
        with state.lock:
            words = [state.vocab.get(t, f"<{t}>") for t in tokens if t != BOS_ID]
        self._send_json(200, {"content": " ".join(words)})

    def _embeddings(self, body: bytes) -> None:
        config = self.server.config
        if not config.embedding:
            self._error(*_NO_EMBEDDINGS)
            return
        request = _json_object(body)
        raw = request.get("input", request.get("content"))
        texts = [raw] if isinstance(raw, str) else raw
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise _BadRequest('"input" must be a string or a non-empty list of strings')
        as_base64 = request.get("encoding_format") == "base64"
        self.server.state.new_task()
        data = []
        for index, text in enumerate(texts):
            vector = embed_text(text, config.n_embd)
            encoded: object = _base64_floats(vector) if as_base64 else vector
            data.append({"object": "embedding", "index": index, "embedding": encoded})
        n_prompt = sum(_count_tokens(t) for t in texts)
        usage = {"prompt_tokens": n_prompt, "total_tokens": n_prompt}
        self._send_json(
            200, {"object": "list", "model": config.alias, "data": data, "usage": usage}
        )

    # ---------------------------------------------------------------- completions

    def _completion(self, body: bytes) -> None:
        request = _json_object(body)
        prompt = request.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise _BadRequest('"prompt" must be a string (the fake serves one prompt a request)')
        self._generate(request, prompt, chat=False)

    def _chat(self, body: bytes) -> None:
        request = _json_object(body)
        messages = request.get("messages")
        if (
            not isinstance(messages, list)
            or not messages
            or not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages)
        ):
            raise _BadRequest('"messages" must be a non-empty list of {"role", "content"}')
        self._generate(request, render_chat(messages), chat=True)

    def _generate(self, request: dict[str, Any], prompt: str, *, chat: bool) -> None:
        config = self.server.config
        if config.embedding:
            self._error(*_NO_COMPLETIONS)
            return
        n_prompt = _count_tokens(prompt)
        if n_prompt >= N_CTX:
            raise _BadRequest(
                f"the request exceeds the available context size ({n_prompt} tokens, "
                f"context {N_CTX}), try increasing it"
            )
        limit = _max_tokens(request, room=N_CTX - n_prompt)
        pieces, n_generated, finish = _plan(prompt, limit, _stops(request.get("stop")))
        usage = {
            "prompt_tokens": n_prompt,
            "completion_tokens": n_generated,
            "total_tokens": n_prompt + n_generated,
        }
        kind = "chat.completion" if chat else "text_completion"
        head = {
            "id": ("chatcmpl-" if chat else "cmpl-") + os.urandom(12).hex(),
            "created": int(time.time()),
            "model": config.alias,
            "system_fingerprint": "b0-fake",
        }
        task_id = self.server.state.new_task()
        try:
            reply = _Reply(head, kind, pieces, finish, usage)
            if request.get("stream"):
                self._stream(reply)
            else:
                self._answer(reply)
        except (_ClientGone, BrokenPipeError, ConnectionResetError):
            self.close_connection = True
            state = self.server.state
            with state.lock:
                state.cancelled += 1
            _log(_srv("stop", f"cancel task, id_task = {task_id}"))
            return
        with self.server.state.lock:
            self.server.state.completions += 1

    def _answer(self, reply: _Reply) -> None:
        """Generate without streaming; raise _ClientGone if the client leaves meanwhile."""
        head, kind, pieces, finish, usage = reply
        for _ in pieces:
            self._tick()
        text = "".join(pieces)
        if kind == "chat.completion":
            message = {"role": "assistant", "content": text}
            choice: dict[str, Any] = {"finish_reason": finish, "index": 0, "message": message}
        else:
            choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": finish}
        self._send_json(200, {**head, "object": kind, "choices": [choice], "usage": usage})

    def _stream(self, reply: _Reply) -> None:
        """Stream one event per piece, then the final event and ``[DONE]``."""
        head, kind, pieces, finish, usage = reply
        config, state = self.server.config, self.server.state
        chat = kind == "chat.completion"
        crash_at = -1
        if config.fault == "crash-mid-stream":
            with state.lock:
                if not state.crash_claimed:
                    state.crash_claimed = True
                    crash_at = min(config.fault_after, len(pieces))

        def chunk(text: str | None, reason: str | None) -> dict[str, Any]:
            if chat:
                delta = {} if text is None else {"content": text}
                choice = {"finish_reason": reason, "index": 0, "delta": delta}
                return {**head, "object": "chat.completion.chunk", "choices": [choice]}
            choice = {"text": text or "", "index": 0, "logprobs": None, "finish_reason": reason}
            return {**head, "object": "text_completion", "choices": [choice]}

        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        if self.request_version == "HTTP/1.1":
            self.send_header("Transfer-Encoding", "chunked")
        else:  # HTTP/1.0 has no chunking: the end of the body is the end of the connection
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        with state.lock:
            state.active_streams += 1
        try:
            if chat:
                first = chunk(None, None)
                first["choices"][0]["delta"] = {"role": "assistant", "content": None}
                self._write_chunk(_event(first))
            for sent in range(len(pieces) + 1):
                if sent == crash_at:
                    _segfault()
                if sent == len(pieces):
                    break
                self._tick()
                self._write_chunk(_event(chunk(pieces[sent], None)))
            self._write_chunk(_event({**chunk(None, finish), "usage": usage}))
            self._write_chunk(b"data: [DONE]\n\n")
            if self.request_version == "HTTP/1.1":
                self.wfile.write(b"0\r\n\r\n")
        finally:
            with state.lock:
                state.active_streams -= 1

    def _tick(self) -> None:
        """Spend one token's time; raise _ClientGone if the client has left."""
        delay = self.server.config.token_delay
        if delay > 0:
            time.sleep(delay)
        if self._client_gone():
            raise _ClientGone


# llama-server answers its OpenAI routes with and without the "/v1" prefix.
_ROUTES = {
    (method, prefix + path): handler
    for method, path, handler in (
        ("GET", "/health", _Handler._health),
        ("GET", "/models", _Handler._models),
        ("POST", "/completions", _Handler._completion),
        ("POST", "/chat/completions", _Handler._chat),
        ("POST", "/embeddings", _Handler._embeddings),
    )
    for prefix in ("", "/v1")
} | {
    ("GET", "/fake/stats"): _Handler._stats,
    ("GET", "/lora-adapters"): _Handler._lora_adapters,
    ("POST", "/tokenize"): _Handler._tokenize,
    ("POST", "/detokenize"): _Handler._detokenize,
}


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        request = json.loads(body or b"{}")
    except ValueError as exc:
        raise _BadRequest(f"invalid JSON body: {exc}") from None
    if not isinstance(request, dict):
        raise _BadRequest("the request body must be a JSON object")
    return request


def _max_tokens(request: dict[str, Any], room: int) -> int:
    value = request.get("max_tokens", request.get("max_completion_tokens"))
    value = request.get("n_predict", 16) if value is None else value
    if not isinstance(value, int) or isinstance(value, bool) or value < -1:
        raise _BadRequest('"max_tokens" must be an integer >= -1')
    return room if value == -1 else min(value, room)


def _stops(value: object) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return value
    raise _BadRequest('"stop" must be a string or a list of strings')


def _base64_floats(vector: list[float]) -> str:
    import base64  # noqa: PLC0415 (rarely needed; keep start-up imports minimal)
    import struct  # noqa: PLC0415

    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


def _segfault() -> NoReturn:
    """Die of SIGSEGV; main() reset its disposition to the default and disabled core files."""
    os.kill(os.getpid(), signal.SIGSEGV)
    while True:  # the signal is delivered asynchronously; nothing else may happen meanwhile
        time.sleep(1)


# ---------------------------------------------------------------------------- start-up


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """Report a usage error as llama-server does: on stderr, exit status 1."""
        _log(f"error: {message}")
        _log(_USAGE)
        sys.exit(1)


def _parse_args(argv: list[str]) -> argparse.Namespace:
    parser = _Parser(prog="fake_child", add_help=False, allow_abbrev=False)
    parser.add_argument("--help", action="help")
    parser.add_argument("--port", type=int)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--model", required=True)
    parser.add_argument("--alias")
    parser.add_argument("--embedding", "--embeddings", action="store_true")
    parser.add_argument("--n-embd", type=int, default=8)
    parser.add_argument("--load-seconds", type=float)
    parser.add_argument("--token-delay", type=float, default=0.002)
    parser.add_argument("--fault", choices=FAULTS)
    parser.add_argument("--fault-after", type=int)
    # Only exact short flags are rewritten: argparse would read llama-server's "-md x" as
    # "-m d", and "-hf repo" as "-h".
    short = {"-m": "--model", "-a": "--alias", "-h": "--help"}
    args, unknown = parser.parse_known_args([short.get(a, a) for a in argv])
    if any(a == "--bogus-flag" or a.startswith("--bogus-flag=") for a in unknown):
        parser.error("invalid argument: --bogus-flag")
    if args.fault == "usage-error":
        parser.error("invalid argument: --usage-error")
    if args.host.endswith(".sock"):
        pass  # a UNIX socket: --port is ignored, as by llama-server
    elif args.host not in ("127.0.0.1", "localhost"):
        parser.error(f"the fake binds 127.0.0.1 or a socket only, not {args.host}")
    elif args.port is None:
        parser.error("the following arguments are required: --port")
    elif not 0 < args.port < 65536:
        parser.error(f"invalid port {args.port}")
    if args.n_embd < 1:
        parser.error("--n-embd must be at least 1")
    for name in ("load_seconds", "token_delay", "fault_after"):
        if (getattr(args, name) or 0) < 0:
            parser.error(f"--{name.replace('_', '-')} must not be negative")
    return args


class _StopFlag:
    """Set by the SIGTERM/SIGINT handler, polled by the main thread.

    A plain attribute rather than a threading.Event: setting an Event takes a lock the
    interrupted main thread may hold.
    """

    requested = False


def _on_stop_signal(_signum: int, _frame: object) -> None:
    _StopFlag.requested = True


def _sleep_unless_stopped(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not _StopFlag.requested and (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 0.05))


def _idle_until_stopped() -> None:
    """Block until a stop signal's handler ran, using no CPU meanwhile (as an idle or
    wedged llama-server: the outcome watch reads a child's CPU time to tell a computing
    child from a stuck one, so the fake must not poll). The handler's wakeup byte ends
    the wait; with the signals ignored (the wedges), it never ends."""
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    while not _StopFlag.requested:
        select.select([wake_read], [], [])
        os.read(wake_read, 512)


def _flood_stdout() -> None:
    pad = "x" * 64
    n = 0
    while True:
        batch = "".join(f"flood line {i} {pad}\n" for i in range(n, n + 512))
        n += 512
        try:
            _write_all(1, batch.encode())
        except OSError:
            return  # stdout closed: nothing left to flood


def _exit_after(seconds: float) -> None:
    time.sleep(seconds)
    _log("main: fault injection (exit-after-ready): exiting with status 1")
    os._exit(1)


def main(argv: list[str] | None = None) -> int:
    """Run the fake until a signal or a fault ends it.

    Args:
        argv: the arguments, without the program name; default ``sys.argv[1:]``.

    Returns:
        The exit status. Faults that kill the process (SIGSEGV, ``os._exit``) never return.
    """
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    config = _Config(args)
    if config.fault in ("ignore-sigterm", *_WEDGES):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, _on_stop_signal)
        signal.signal(signal.SIGINT, _on_stop_signal)
    if config.fault == "crash-mid-stream":
        import faulthandler  # noqa: PLC0415 (only this fault needs it)
        import resource  # noqa: PLC0415

        faulthandler.disable()  # PYTHONFAULTHANDLER would otherwise catch the SIGSEGV
        signal.signal(signal.SIGSEGV, signal.SIG_DFL)
        _, hard = resource.getrlimit(resource.RLIMIT_CORE)
        resource.setrlimit(resource.RLIMIT_CORE, (0, hard))  # no core files from tests

    _log("build: 0 (fake) with python for fake_child (supervisor.testing)")
    if config.fault == "crash-at-start":
        _log("main: fault injection (crash-at-start): exiting before the server starts")
        return 1
    try:
        server = _FakeServer(config)
    except OSError:
        _log(f"main: couldn't bind HTTP server socket, hostname: {config.where}")
        return 1
    # Nothing calls shutdown(): the poll interval only sets how often an idle server wakes.
    threading.Thread(target=server.serve_forever, args=(5.0,), daemon=True).start()
    _log(f"main: HTTP server is listening, hostname: {config.where}")
    _log("main: loading model")
    _log(_srv("load_model", f"loading model '{args.model}'"))
    try:
        with open(args.model, "rb"):
            pass
    except OSError as exc:
        _log(f"llama_model_load: error loading model: failed to open {args.model}: {exc.strerror}")
        _log("main: exiting due to model loading error")
        return 1
    if config.fault == "model-error":
        _log("llama_model_load: error loading model: invalid magic characters")
        _log("main: exiting due to model loading error")
        return 1

    seconds = args.load_seconds
    if seconds is None:
        seconds = _SLOW_START_SECONDS if config.fault == "slow-start" else 0.0
    forever = config.fault == "health-503-forever"
    started = time.monotonic()
    ticks = 0
    while not _StopFlag.requested:
        elapsed = time.monotonic() - started
        if not forever and elapsed >= seconds:
            break
        percent = min(ticks, 99) if forever else int(100 * elapsed / seconds)
        _log(f"llama_model_load: loading tensors ... {percent}%")
        ticks += 1
        left = math.inf if forever else seconds - elapsed
        _sleep_unless_stopped(min(_PROGRESS_INTERVAL, left))
    if not _StopFlag.requested:
        _log("llama_model_load: loading tensors ... 100%")
        with server.state.lock:
            server.state.ready = True
        _log("main: model loaded")
        url = (f"unix://{config.socket}" if config.socket is not None
               else f"http://127.0.0.1:{args.port}")
        _log(f"main: server is listening on {url} - starting the main loop")
        _log(_srv("update_slots", "all slots are idle"))
        if config.fault == "flood-stdout":
            threading.Thread(target=_flood_stdout, daemon=True).start()
        if config.fault == "exit-after-ready":
            threading.Thread(target=_exit_after, args=(config.fault_after,), daemon=True).start()

    _idle_until_stopped()
    _log(_srv("operator()", "operator(): cleaning up before exit..."))
    return 0


if __name__ == "__main__":
    # os._exit: daemon threads may be blocked writing to a full pipe or holding sockets;
    # a normal interpreter shutdown could wait on them or abort. All output is unbuffered.
    os._exit(main())
