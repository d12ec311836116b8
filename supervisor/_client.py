"""The inference client: the one small interface between llamad and a child's HTTP API.

Both runtimes speak the OpenAI-compatible API on loopback; what differs (where health and
tokenization live) is described by :class:`ApiShape`, owned by the runtime adapter.
Foreign exceptions (httpx's, and :mod:`supervisor.http._loopback`'s for a launched child's unary
requests) are mapped here, at the boundary, into :mod:`supervisor.errors`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import enum
import functools
import json
import ssl
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from ._sampling import LLAMA_CPP, Dialect, Sampling
from ._tokenizer import TokenizerCalls
from ._tools import (
    Message,
    ToolUse,
    messages_json,
)
from ._transport import (
    Activity,
    ChildAddress,
    HttpxTransport,
    LoopbackTransport,
    UnaryTransport,
)
from .errors import ChildBadRequestError, ChildRequestError
from .http import HTTPTransportError, NotAJsonObject, Response, json_object
from .http._events import Chunk, int_or_none, sse_chunks
from .http._read import Silence

_END_WITHIN = 1.0
"""Seconds a loopback child's stream may take, after ``[DONE]``, to end its body before
its connection is closed instead of reused (llama-server ends it at once)."""


@dataclass(frozen=True)
class ApiShape:
    """Where a runtime keeps the endpoints that are not OpenAI-standard.

    Attributes:
        health_path: a path answering 200 when loaded and 503 while loading, or None
            when the runtime has none (then ``/v1/models`` answering means loaded).
        tokenize_path: the tokenizer endpoint.
        tokenize_field: the JSON field that carries the text.
        tokenize_special_field: the JSON field for "add special tokens", or None.
        detokenize_path: the endpoint that turns token ids back into text.
        detokenize_field: the JSON field of its answer that carries the text.
        apply_template_path: the endpoint that renders the chat template for a chat
            body, or None when the runtime has none.
        embed_base64: ``/v1/embeddings`` answers ``encoding_format: base64`` (raw
            little-endian float32): no float printed as text by the child nor parsed
            here, and the child's exact values.
        dialect: which generation parameters it takes, and in which form.
    """

    health_path: str | None
    tokenize_path: str
    tokenize_field: str
    tokenize_special_field: str | None
    detokenize_path: str = "/detokenize"
    detokenize_field: str = "content"
    apply_template_path: str | None = "/apply-template"
    embed_base64: bool = False
    dialect: Dialect = LLAMA_CPP


class Health(enum.Enum):
    READY = "ready"
    LOADING = "loading"
    DOWN = "down"


@dataclass(frozen=True)
class EmbedResult:
    """Embeddings, one row of ``matrix`` (float32, ``texts x dimension``) per text."""

    matrix: np.ndarray[Any, np.dtype[np.float32]]
    prompt_tokens: int


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """httpx's default TLS context (certifi's roots), built once: building it reads the
    whole CA bundle (~17 ms of CPU), and every child start makes a client, on the path of
    a model loaded on demand."""
    return httpx.create_ssl_context()


class InferenceClient(TokenizerCalls):
    """HTTP client for one child (or any OpenAI-compatible server at ``base_url``).

    Every coroutine is cancellable: cancelling closes the HTTP connection, which makes a
    llama.cpp server stop the generation it was running for that request.
    """

    _api: ApiShape

    def __init__(
        self,
        base_url: str,
        *,
        model_id: str,
        api: ApiShape,
        model_name: str = "",
        headers: Mapping[str, str] | None = None,
        connect_timeout: float = 2.0,
        read_timeout: float = 300.0,
        max_connections: int = 64,
        max_idle: int = 16,
        stream_interval: float = 0.0,
        stream_interval_max: float = 0.0,
        loopback: bool = False,
        child: ChildAddress | None = None,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        """Args:
            base_url: the server's root (paths such as ``/v1/completions`` are appended).
            model_id: the id the server knows the model by (a child's per-launch alias).
            api: where the runtime keeps its non-standard endpoints.
            model_name: what callers are told served them (default: ``model_id``).
            headers: sent with every request (an endpoint's ``Authorization``).
            loopback: a server on ``http://127.0.0.1:<port>`` llamad trusts (a test's): its
                requests go through the lean :class:`LoopbackTransport` instead of httpx.
            child: a child llamad launched: every request (health probes too) goes to its
                private UNIX socket with its key, the lean transport's where it has them;
                ``base_url`` is then only the Host header (see
                :attr:`ChildAddress.BASE_URL`).
            now: the monotonic clock activity is recorded on (the supervisor's).
            max_connections: requests open at once.
            max_idle: the lean transport's connections kept open between requests.
            stream_interval: seconds the lean transport's streams wait, after a chunk was
                handed on, before they read the child again (0: never): what came
                meanwhile is one chunk (see :class:`supervisor.http._read.Silence`).
            stream_interval_max: the longest such wait, for a stream slower than a token
                per interval (below ``stream_interval``: no longer wait).
        """
        self.base_url = base_url
        self.model_id = model_id
        self.model_name = model_name or model_id
        self.context_length = 0
        """Tokens one request may hold, when the server said so (0: unknown)."""
        self._api = api
        self.dialect = api.dialect
        """Which generation parameters the server takes (an endpoint may learn more)."""
        self.tools_refusal = (
            "llama-server did not report its chat template's capabilities (GET /props)"
            if api.dialect.llama_cpp else
            f"{api.dialect.runtime} does not pass tools to a Jinja chat template")
        """Why a chat with tools cannot be served ("": it can). A child's is learnt once
        it is ready (:meth:`read_chat_caps`); an endpoint decides for itself."""
        self._read_timeout = read_timeout
        self._stream_interval = stream_interval
        self._stream_interval_max = stream_interval_max
        # trust_env=False: an HTTP(S)_PROXY in the daemon's environment must never
        # capture loopback traffic to our own child.
        limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections)
        timeouts = httpx.Timeout(read_timeout, connect=connect_timeout)
        if child is not None:
            if headers:
                raise ValueError("a child takes no headers (its key is its address's)")
            self._http = httpx.AsyncClient(
                base_url=base_url,
                headers={"Authorization": f"Bearer {child.key}"},
                transport=httpx.AsyncHTTPTransport(uds=child.socket, limits=limits),
                trust_env=False,
                timeout=timeouts,
            )
        else:
            self._http = httpx.AsyncClient(
                base_url=base_url,
                headers=dict(headers or {}),
                trust_env=False,
                verify=_tls_context(),
                timeout=timeouts,
                limits=limits,
            )
        self.activity = Activity(now)
        self._unary: UnaryTransport
        if loopback or child is not None:
            if headers:
                raise ValueError("a loopback child takes no headers")
            self._unary = LoopbackTransport(base_url, connect_timeout=connect_timeout,
                                            max_connections=max_connections, max_idle=max_idle,
                                            child=child)
        else:
            self._unary = HttpxTransport(self._http, self._transport_error)

    @property
    def in_flight(self) -> int:
        """Requests running now."""
        return self.activity.in_flight

    async def aclose(self) -> None:
        await self._unary.aclose()
        await self._http.aclose()

    # -- health ---------------------------------------------------------------------

    async def health(self, timeout: float = 2.0) -> Health:
        """READY, LOADING (the child says it is loading) or DOWN (no useful answer)."""
        path = self._api.health_path or "/v1/models"
        try:
            # A launched child's through the lean transport (idle cost: one every
            # probe_interval; httpx's request cost several times as much, issue 27).
            status = (await self._unary.request("GET", path, None, timeout)).status
        except ChildRequestError:
            return Health.DOWN
        if status == 200:
            return Health.READY
        if status == 503:
            return Health.LOADING
        return Health.DOWN

    async def loop_answers(self, timeout: float) -> bool:
        """Whether llama-server's serving loop answers within ``timeout`` seconds.

        ``GET /lora-adapters`` is answered by the loop that also samples every slot's next
        token (a task it takes between steps), unlike ``/health``, which its HTTP threads
        answer even while that loop is stuck inside one token. Any answer counts.
        """
        try:
            async with asyncio.timeout(timeout):
                await self._request("GET", "/lora-adapters", None, timeout)
        except (TimeoutError, ChildRequestError):
            return False
        return True

    async def read_chat_caps(self, timeout: float = 2.0) -> None:
        """Learn whether the chat template renders tools from llama-server's
        ``GET /props`` (``chat_template_caps.supports_tool_calls``), into
        :attr:`tools_refusal`. An answer without it leaves tools refused."""
        try:
            data = await self._json("GET", "/props", None, timeout=timeout)
        except ChildRequestError as exc:
            self.tools_refusal = f"its chat template's capabilities are unknown ({exc})"
            return
        caps = data.get("chat_template_caps")
        if isinstance(caps, dict) and caps.get("supports_tool_calls") is True:
            self.tools_refusal = ""
        else:
            self.tools_refusal = (
                "its chat template does not render tools (llama-server's /props says "
                "supports_tool_calls false); a ChatML model can be given llamad's tool "
                "template: chat_template = \"chatml-tools\" in its [models.NAME] table")

    async def model_ids(self, timeout: float = 2.0) -> list[str]:
        """The model ids the server reports on ``/v1/models``."""
        data = await self._json("GET", "/v1/models", None, timeout=timeout)
        return [str(m.get("id", "")) for m in data.get("data", []) if isinstance(m, dict)]

    # -- hooks for servers llamad does not run (supervisor.endpoint._client) -------------------

    def _prepare(self, body: dict[str, Any]) -> dict[str, Any]:
        """The request body as sent (an endpoint adds its model id)."""
        return body

    def _retry_body(
        self, body: dict[str, Any], error: ChildBadRequestError
    ) -> dict[str, Any] | None:
        """A smaller body to retry with after ``error`` (an HTTP 4xx), or None: do not
        retry. Each retry must drop a field, so a request is retried at most once per
        rejected field."""
        return None

    def _transport_error(self, method: str, path: str, exc: httpx.HTTPError) -> ChildRequestError:
        """The error for a request that got no answer."""
        return ChildRequestError(f"{method} {path}: {_describe(exc)}")

    def _status_error(self, status: int, content: bytes, path: str) -> ChildRequestError:
        """The error for an HTTP error answer (status >= 400) with body ``content``."""
        message = error_message(content)
        cls = ChildBadRequestError if 400 <= status < 500 else ChildRequestError
        return cls(f"{path}: HTTP {status}: {message}", status=status)

    # -- requests -------------------------------------------------------------------

    async def _json(
        self, method: str, path: str, body: dict[str, Any] | None, *, timeout: float | None = None
    ) -> dict[str, Any]:
        if body is None:
            return await self._json_once(method, path, None, timeout)
        body = self._prepare(body)
        while True:  # each retry drops a field: bounded by the body's size
            try:
                return await self._json_once(method, path, body, timeout)
            except ChildBadRequestError as exc:
                retry = self._retry_body(body, exc)
                if retry is None or len(retry) >= len(body):
                    raise
                body = retry

    async def _json_once(
        self, method: str, path: str, body: dict[str, Any] | None, timeout: float | None
    ) -> dict[str, Any]:
        answer = await self._request(method, path, body, timeout)
        status, content = answer.status, answer.body
        if status >= 400:
            raise self._status_error(status, content, path)
        try:
            return json_object(content)
        except NotAJsonObject as exc:
            raise ChildRequestError(f"{path}: the answer {exc}", status=status) from exc

    async def _request(
        self, method: str, path: str, body: dict[str, Any] | None, timeout: float | None
    ) -> Response:
        """One whole request, counted as activity."""
        activity = self.activity
        activity.in_flight += 1
        activity.heard()
        try:
            answer = await self._unary.request(
                method, path, body, self._read_timeout if timeout is None else timeout)
            activity.heard()
            return answer
        finally:
            activity.in_flight -= 1

    async def complete(self, prompt: str, sampling: Sampling) -> str:
        """A whole (non-streamed) completion; used for readiness checks."""
        body = {"prompt": prompt, "stream": False, **sampling.to_json(self.dialect)}
        data = await self._json("POST", "/v1/completions", body)
        try:
            return str(data["choices"][0]["text"])
        except (KeyError, IndexError, TypeError) as exc:
            raise ChildRequestError("/v1/completions: malformed answer") from exc

    async def complete_chat(self, messages: Sequence[Message], sampling: Sampling) -> str:
        """A whole (non-streamed) chat completion; used for readiness checks."""
        body = {
            "messages": messages_json(messages),
            "stream": False,
            **sampling.to_json(self.dialect, chat=True),
        }
        data = await self._json("POST", "/v1/chat/completions", body)
        try:
            return str(data["choices"][0]["message"].get("content") or "")
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise ChildRequestError("/v1/chat/completions: malformed answer") from exc

    def stream_completion(self, prompt: str, sampling: Sampling) -> AsyncIterator[Chunk]:
        """Stream a completion of ``prompt``.

        Raises:
            UnsupportedParameterError: at once, for a parameter the server cannot take.
        """
        body = {"prompt": prompt, **sampling.to_json(self.dialect)}
        return self._stream("/v1/completions", body, chat=False, sampling=sampling)

    def stream_chat(
        self, messages: Sequence[Message], sampling: Sampling, tools: ToolUse | None = None
    ) -> AsyncIterator[Chunk]:
        """Stream a chat completion of ``messages`` (``(role, content)`` pairs, or
        :class:`~supervisor._tools.Turn` with tool calls), with ``tools`` the model may
        call (passed through: the server's chat template renders them and its parser
        streams the calls back as :attr:`Chunk.tool_calls`).

        Raises:
            UnsupportedParameterError: at once, for a parameter the server cannot take.
        """
        body = {
            "messages": messages_json(messages),
            **sampling.to_json(self.dialect, chat=True),
            **(tools.to_json() if tools is not None else {}),
        }
        return self._stream("/v1/chat/completions", body, chat=True, sampling=sampling)

    async def _stream(self, path: str, body: dict[str, Any], *, chat: bool,
                      sampling: Sampling) -> AsyncIterator[Chunk]:
        body = self._prepare({**body, "stream": True, "stream_options": {"include_usage": True}})
        activity = self.activity
        activity.in_flight += 1
        activity.heard()
        top = sampling.top_logprobs if sampling.logprobs else None
        try:
            while True:  # each retry drops a field: bounded by the body's size
                async with self._post_stream(path, body) as (status, data, pace):
                    if status == 200:
                        events = self._events(data, path, chat=chat, top=top, pace=pace)
                        async with contextlib.aclosing(events) as it:
                            async for chunk in it:
                                yield chunk
                        return
                    content = b"".join([piece async for piece in data])
                error = self._status_error(status, content, path)
                retry = (self._retry_body(body, error)
                         if isinstance(error, ChildBadRequestError) else None)
                if retry is None or len(retry) >= len(body):
                    raise error
                body = retry
        except httpx.HTTPError as exc:
            raise self._transport_error("POST", path, exc) from exc
        except HTTPTransportError as exc:  # the lean transport's, reading the body
            raise ChildRequestError(f"POST {path}: {exc}") from exc
        finally:
            activity.in_flight -= 1

    @contextlib.asynccontextmanager
    async def _post_stream(self, path: str, body: dict[str, Any]
                           ) -> AsyncIterator[tuple[int, AsyncIterator[bytes], Silence | None]]:
        """POST ``body`` for a streamed answer; yield its status, its body's bytes as
        they come and its pace: through the lean loopback client for a child llamad
        launched (httpx cost as much CPU per streamed token as the rest of the relay; its
        connection is reused once the body was read to its end, and its reading paced by
        the stream interval), else httpx (an endpoint's stream: its connection is closed
        after ``[DONE]``; no pace, None)."""
        if isinstance(self._unary, LoopbackTransport):
            async with self._unary.stream(path, body, self._read_timeout,
                                          self._stream_interval,
                                          self._stream_interval_max) as answer:
                yield answer.status, answer.body, answer.pace
            return
        async with self._http.stream("POST", path, json=body) as resp:
            yield resp.status_code, resp.aiter_bytes(), None

    def _events(
        self, data: AsyncIterator[bytes], path: str, *, chat: bool, top: int | None,
        pace: Silence | None = None,
    ) -> AsyncGenerator[Chunk, None]:
        """The chunks of one server-sent-events answer (:func:`._events.sse_chunks`); a
        paced one is the lean transport's, whose connection is reused after its end."""
        return sse_chunks(data, path, chat=chat, top=top, heard=self.activity.heard,
                          end_within=_END_WITHIN if pace is not None else None, pace=pace)

    async def embed(self, texts: Sequence[str | Sequence[int]]) -> EmbedResult:
        """Embed ``texts`` (one vector each, in order); an item may be token ids (sent
        as OpenAI's token-array input, which llama-server and OpenAI take)."""
        body: dict[str, Any] = {"input": list(texts)}
        if self._api.embed_base64:
            body["encoding_format"] = "base64"
        data = await self._json("POST", "/v1/embeddings", body)
        try:
            items = sorted(data["data"], key=lambda d: int(d.get("index", 0)))
            rows = [_vector(item["embedding"]) for item in items]
        except (KeyError, TypeError, ValueError, binascii.Error) as exc:
            raise ChildRequestError("/v1/embeddings: malformed answer") from exc
        if len(rows) != len(texts):
            raise ChildRequestError(
                f"/v1/embeddings: asked for {len(texts)} vectors, got {len(rows)}"
            )
        if len({len(row) for row in rows}) > 1:
            raise ChildRequestError("/v1/embeddings: vectors of different dimensions")
        matrix = np.stack(rows) if rows else np.zeros((0, 0), dtype=np.float32)
        usage = data.get("usage") or {}
        return EmbedResult(matrix, int_or_none(usage.get("prompt_tokens")) or 0)


def _vector(value: object) -> np.ndarray[Any, np.dtype[np.float32]]:
    """An embedding as JSON numbers, or as base64 of little-endian float32."""
    if isinstance(value, str):
        raw = base64.b64decode(value, validate=True)
        if len(raw) % 4:
            raise ValueError("base64 embedding is not whole float32s")
        return np.frombuffer(raw, dtype="<f4").astype(np.float32)
    if not isinstance(value, list):
        raise TypeError(f"embedding is a {type(value).__name__}")
    return np.array([float(x) for x in value], dtype=np.float32)


def _describe(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.ConnectError):
        return "connection refused (child not listening)"
    if isinstance(exc, httpx.TimeoutException):
        return f"timed out ({type(exc).__name__})"
    if isinstance(exc, httpx.RemoteProtocolError):
        return "connection dropped by the child"
    return f"{type(exc).__name__}: {exc}"


def error_message(content: bytes) -> str:
    """The server's own words for an error answer (OpenAI's ``error.message``), clipped."""
    message = content.decode("utf-8", "replace")[:300]
    try:
        err = json.loads(content).get("error")
        if isinstance(err, dict) and err.get("message"):
            message = str(err["message"])[:300]
        elif isinstance(err, str):
            message = err[:300]
    except (ValueError, AttributeError):
        pass
    return message
