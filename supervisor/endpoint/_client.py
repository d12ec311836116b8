"""External OpenAI-compatible endpoints: the client, its URL and key, and failures named.

An endpoint is a server llamad does not run (a shared llama-server, vLLM, Ollama, LM
Studio). :class:`EndpointClient` is an :class:`~supervisor.InferenceClient` with:

* a root URL normalised from what the operator wrote: ``http://host:8080``,
  ``http://host:8080/``, ``http://host:8080/v1`` and ``http://host:8080/v1/`` are the
  same endpoint; a path prefix (``https://gateway/llm/v1``) is kept;
* an ``Authorization: Bearer`` header with a key read from a file that is not
  world-readable, or from an environment variable named in configuration — never from
  the command line, never logged (:func:`read_api_key`);
* the model id picked from ``GET /v1/models``, sent with every request;
* one retry without an optional parameter when the server rejects it (an HTTP 400 whose
  message names it, e.g. ``stream_options`` on older servers), remembered afterwards (a
  server that names one rejected parameter at a time gets one retry per parameter);
  never a parameter the caller asked for and would silently lose (seed,
  response_format): the server's refusal reaches the caller;
* the generation parameters it takes (:class:`~supervisor.Dialect`): OpenAI's own, or
  all of llama.cpp's when ``/v1/models`` says the model is ``owned_by: llamacpp``;
* failures named — :class:`~supervisor.errors.EndpointError` with a ``kind`` from
  :data:`ENDPOINT_KINDS` — instead of a generic "request failed".

Credentials in the URL itself (``https://user:pass@host``) are used as HTTP basic auth
but never shown: :func:`display_url` is what Status and logs print.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
import stat
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx
import structlog

from .._client import ApiShape, InferenceClient, error_message
from .._sampling import LLAMA_CPP, OPENAI
from .._tools import Message, ToolUse
from ..errors import (
    ChildBadRequestError,
    ChildRequestError,
    EndpointError,
    TokenizeUnavailableError,
)

_log = structlog.get_logger("llamad.endpoint")
_T = TypeVar("_T")

ENDPOINT_KINDS: dict[str, bool] = {
    # kind: permanent (retrying the same settings cannot help; the breaker opens at once)
    "refused": False,         # nothing listens at host:port
    "unreachable": False,     # DNS failure, no route, connect timeout
    "timeout": False,         # connected, but no answer in time
    "endpoint_error": False,  # HTTP 5xx, a dropped connection, a model still loading
    "tls": True,              # handshake failed or certificate not trusted
    "auth": True,             # HTTP 401/403: key missing or wrong
    "api_key": True,          # the key file or variable is missing, unsafe or malformed
    "not_openai": True,       # GET /v1/models is not an OpenAI model list (HTML, 404, ...)
    "unknown_model": True,    # the configured model is not offered (or several, none chosen)
    "not_chat": True,         # the model does not answer chat completions
    "no_embeddings": True,    # the endpoint has no embeddings API
}

ENDPOINT_API = ApiShape(
    # No health path: GET /v1/models answering a model list is the sign of life.
    health_path=None,
    # llama-server's tokenizer (at the server root); other servers have none we can use.
    tokenize_path="/tokenize",
    tokenize_field="content",
    tokenize_special_field="add_special",
    dialect=OPENAI,
)

OPTIONAL_PARAMS = ("stream_options", "top_k")
"""Request fields a server may reject; dropped (once asked, then always) when it does."""

_API_SUFFIXES = ("/chat/completions", "/completions", "/embeddings", "/models")
_MAX_KEY_FILE = 4096


def normalise_url(url: str) -> str:
    """The endpoint's root URL: scheme, credentials, host, port and path prefix, without
    a trailing ``/v1`` or slash.

    Raises:
        ValueError: not an http(s) URL with a host, or it carries a query, a fragment or
            an API path (``…/v1/chat/completions``); the message never shows credentials.
    """
    text = url.strip()
    try:
        parts = urllib.parse.urlsplit(text)
        port = parts.port  # validates the port
    except ValueError as exc:
        raise ValueError(f"{display_url(text)!r} is not a valid URL ({exc})") from None
    shown = display_url(text)
    if parts.scheme.lower() not in ("http", "https"):
        raise ValueError(f"{shown!r}: the scheme must be http or https")
    if not parts.hostname:
        raise ValueError(f"{shown!r}: no host")
    if parts.query or parts.fragment:
        raise ValueError(f"{shown!r}: must not carry a query or a fragment")
    path = parts.path.rstrip("/")
    if path.endswith(_API_SUFFIXES):
        raise ValueError(f"{shown!r}: give the server's base URL (e.g. http://host:8080/v1), "
                         "not an API path")
    path = path.removesuffix("/v1").rstrip("/")
    del port
    return urllib.parse.urlunsplit((parts.scheme.lower(), parts.netloc, path, "", ""))


def display_url(url: str) -> str:
    """``url`` without its userinfo (``user:password@``): safe to show and to log."""
    try:
        parts = urllib.parse.urlsplit(url.strip())
    except ValueError:
        return "<invalid URL>"
    netloc = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, parts.query,
                                    parts.fragment))


def read_api_key(api_key_file: str = "", api_key_env: str = "",
                 environ: Mapping[str, str] | None = None) -> str | None:
    """The API key from a file or an environment variable; None when neither is set.

    The file must be a regular file owned by the daemon's user or root, neither readable
    nor writable by group or others, at most 4 KiB, holding exactly one key line (lines
    starting with ``#`` are comments, as in llama-server's ``--api-key-file``): printable
    ASCII without spaces. Error messages name the file or variable and the rule, never
    anything read from it (no key, no line count, no first bytes): a caller who may name
    a file learns nothing of one that is not a key file.

    Raises:
        EndpointError: kind ``api_key``.
    """
    def fail(message: str) -> EndpointError:
        return EndpointError("api_key", message, permanent=True)

    if api_key_file and api_key_env:
        raise fail("set api_key_file or api_key_env, not both")
    if api_key_file:
        path = Path(api_key_file).expanduser()
        not_a_key = fail(f"API key file {path} is not a key file (one key of printable "
                         f"ASCII without spaces on one line, # comments, at most "
                         f"{_MAX_KEY_FILE} bytes)")
        try:
            # Check the file we read, not the name (no race with a rename in between).
            fd = os.open(path, os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK)
        except OSError as exc:
            raise fail(f"API key file {path}: {exc.strerror}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise fail(f"API key file {path} is not a regular file")
            if st.st_uid not in (os.geteuid(), 0):
                raise fail(f"API key file {path} is owned by uid {st.st_uid}, neither the "
                           "daemon's user nor root")
            if st.st_mode & 0o066:
                raise fail(f"API key file {path} is readable or writable by group or others "
                           f"(mode {stat.S_IMODE(st.st_mode):04o}); chmod 600 it")
            if st.st_size > _MAX_KEY_FILE:
                raise not_a_key
            raw = os.read(fd, _MAX_KEY_FILE + 1)
        except OSError as exc:
            raise fail(f"API key file {path}: {exc.strerror}") from None
        finally:
            os.close(fd)
        try:
            text = raw.decode("ascii")
        except UnicodeDecodeError:
            raise not_a_key from None
        lines = [ln.strip() for ln in text.splitlines()
                 if ln.strip() and not ln.lstrip().startswith("#")]
        if len(lines) != 1 or not _is_key(lines[0]):
            raise not_a_key
        return lines[0]
    if api_key_env:
        key = (os.environ if environ is None else environ).get(api_key_env, "").strip()
        if not key:
            raise fail(f"environment variable {api_key_env} (api_key_env) is not set or empty")
        if not _is_key(key):
            raise fail(f"environment variable {api_key_env} (api_key_env) holds no key "
                       "(printable ASCII without spaces)")
        return key
    return None


def _is_key(text: str) -> bool:
    """Printable ASCII without spaces: what an Authorization header can carry as is."""
    return all("!" <= c <= "~" for c in text)


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and every exception it was raised from (httpx wraps the OS error twice)."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def transport_error(exc: BaseException, where: str) -> EndpointError:
    """Name a request that got no HTTP answer: refused, unreachable, TLS, timeout."""
    chain = _chain(exc)

    def find(kind: type[BaseException]) -> BaseException | None:
        return next((e for e in chain if isinstance(e, kind)), None)

    if isinstance(cert := find(ssl.SSLCertVerificationError), ssl.SSLCertVerificationError):
        # verify_message and reason are set by the ssl module, not by every constructor.
        why = (getattr(cert, "verify_message", None) or getattr(cert, "reason", None)
               or str(cert))
        return EndpointError("tls", f"{where}: TLS certificate not trusted ({why})",
                             permanent=True)
    if isinstance(tls := find(ssl.SSLError), ssl.SSLError):
        why = getattr(tls, "reason", None) or str(tls)
        return EndpointError("tls", f"{where}: TLS handshake failed ({why}); is it really an "
                             "https endpoint?", permanent=True)
    if find(ConnectionRefusedError) is not None:
        return EndpointError("refused", f"{where}: connection refused (nothing listens there)",
                             permanent=False)
    if find(socket.gaierror) is not None:
        return EndpointError("unreachable", f"{where}: cannot resolve the host name",
                             permanent=False)
    if isinstance(exc, httpx.ConnectTimeout):
        return EndpointError("unreachable", f"{where}: connecting timed out", permanent=False)
    if isinstance(exc, httpx.TimeoutException):
        return EndpointError("timeout", f"{where}: no answer in time ({type(exc).__name__})",
                             permanent=False)
    if isinstance(exc, httpx.RemoteProtocolError):
        return EndpointError("endpoint_error", f"{where}: the endpoint dropped the connection",
                             permanent=False)
    if isinstance(exc, httpx.ConnectError):
        return EndpointError("unreachable", f"{where}: cannot connect ({exc})", permanent=False)
    return EndpointError("endpoint_error", f"{where}: {type(exc).__name__}: {exc}",
                         permanent=False)


def auth_error(status: int, message: str, *, has_key: bool) -> EndpointError:
    """HTTP 401/403 in words: no key configured, or the key was refused."""
    if has_key:
        text = f"the endpoint refused the API key (HTTP {status}: {message})"
    else:
        text = (f"the endpoint needs an API key (HTTP {status}: {message}); set api_key_file "
                "or api_key_env")
    return EndpointError("auth", text, permanent=True, status=status)


class EndpointClient(InferenceClient):
    """An :class:`InferenceClient` for an external OpenAI-compatible server.

    Construct it, then :meth:`discover` the models and :meth:`use_model` one (the
    launcher in :mod:`supervisor.endpoint._launch` does both as its readiness check).
    """

    def __init__(self, url: str, *, api_key: str | None, model_id: str = "",
                 connect_timeout: float = 5.0, read_timeout: float = 300.0,
                 max_connections: int = 64, now: Callable[[], float] = time.monotonic) -> None:
        base = normalise_url(url)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        super().__init__(base, model_id=model_id, api=ENDPOINT_API, headers=headers,
                         connect_timeout=connect_timeout, read_timeout=read_timeout,
                         max_connections=max_connections, now=now)
        self.display_url = display_url(base)
        self.dialect = OPENAI.named(f"the endpoint {self.display_url} (not llama.cpp)")
        self.has_key = api_key is not None
        self.model_meta: dict[str, Any] = {}
        self._rejected: set[str] = set()
        self._no_tokenizer: dict[str, str] = {}  # path: why it is not there
        # Tools are passed through: the endpoint's own API takes or refuses them.
        self.tools_refusal = ""

    def __repr__(self) -> str:  # never the key, never the URL's credentials
        return f"EndpointClient({self.display_url!r}, model={self.model_id!r})"

    @property
    def identity(self) -> str:
        """Names the model's output space (vectors, cached answers): model id and root."""
        host = self.display_url.split("://", 1)[-1]
        return f"{self.model_id}@{host}"

    def use_model(self, model_id: str, meta: Mapping[str, Any]) -> None:
        """Send ``model_id`` from now on; take the context length from its metadata."""
        self.model_id = self.model_name = model_id
        self.model_meta = dict(meta)
        self.context_length = _context_length(meta)
        # llama-server's own /v1/models entries say owned_by "llamacpp".
        self.dialect = (LLAMA_CPP.named(f"the llama.cpp endpoint {self.display_url}")
                        if meta.get("owned_by") == "llamacpp" else
                        OPENAI.named(f"the endpoint {self.display_url} (not llama.cpp)"))

    # -- hooks ----------------------------------------------------------------------------

    def _prepare(self, body: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in body.items() if k not in self._rejected}
        if self.model_id:
            out["model"] = self.model_id
        return out

    def _retry_body(
        self, body: dict[str, Any], error: ChildBadRequestError
    ) -> dict[str, Any] | None:
        if error.status not in (400, 422):
            return None
        text = str(error).lower()
        rejected = [p for p in OPTIONAL_PARAMS if p in body and p in text]
        if not rejected:
            return None
        self._rejected.update(rejected)
        _log.info("endpoint rejected optional parameters; retrying without them",
                  endpoint=self.display_url, params=rejected)
        return {k: v for k, v in body.items() if k not in rejected}

    def _transport_error(self, method: str, path: str, exc: httpx.HTTPError) -> ChildRequestError:
        return transport_error(exc, f"{method} {self.display_url}{path}")

    def _status_error(self, status: int, content: bytes, path: str) -> ChildRequestError:
        if status in (401, 403):
            return auth_error(status, error_message(content), has_key=self.has_key)
        return super()._status_error(status, content, path)

    # -- requests -------------------------------------------------------------------------

    async def discover(self, timeout: float = 10.0) -> list[dict[str, Any]]:
        """The model entries of ``GET /v1/models``.

        Raises:
            EndpointError: with the reason named (refused, tls, auth, not_openai, ...).
        """
        where = f"GET {self.display_url}/v1/models"
        try:
            resp = await self._http.get("/v1/models", timeout=timeout)
        except httpx.HTTPError as exc:
            error = transport_error(exc, where)
            if isinstance(exc, httpx.ConnectTimeout) and await self._tcp_answers():
                error = EndpointError("tls", f"{where}: the TLS handshake never completed; is "
                                      "it really an https endpoint?", permanent=True)
            raise error from exc
        if resp.status_code in (401, 403):
            raise self._status_error(resp.status_code, resp.content, "/v1/models")
        if resp.status_code >= 500:
            raise EndpointError(
                "endpoint_error",
                f"{where}: HTTP {resp.status_code}: {error_message(resp.content)}",
                permanent=False, status=resp.status_code)
        kind = resp.headers.get("content-type", "?").split(";")[0]
        not_openai = (f"{self.display_url} is not an OpenAI-compatible endpoint: GET /v1/models "
                      f"answered HTTP {resp.status_code} ({kind})")
        if resp.status_code != 200:
            raise EndpointError("not_openai", not_openai, permanent=True, status=resp.status_code)
        try:
            data = resp.json()
        except ValueError:
            raise EndpointError("not_openai", not_openai + ", not JSON", permanent=True,
                                status=200) from None
        if not isinstance(data, dict) or not isinstance(data.get("data"), list):
            raise EndpointError("not_openai", not_openai + " without a model list ('data')",
                                permanent=True, status=200)
        return [m for m in data["data"] if isinstance(m, dict) and m.get("id")]

    async def _tcp_answers(self) -> bool:
        """Whether a plain TCP connection to the endpoint succeeds (tells a stalled TLS
        handshake from an unreachable host)."""
        url = httpx.URL(self.base_url)
        if url.scheme != "https" or not url.host:
            return False
        try:
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(url.host, url.port or 443), 2.0)
        except (OSError, TimeoutError):
            return False
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True

    async def model_ids(self, timeout: float = 2.0) -> list[str]:
        return [str(m["id"]) for m in await self.discover(timeout)]

    async def tokenize(self, text: str, *, add_special: bool = False) -> list[int]:
        """Token ids from llama-server's ``/tokenize``.

        Raises:
            TokenizeUnavailableError: the endpoint has no (compatible) tokenizer; known
                after the first try, so later calls fail at once.
        """
        return await self._tokenizer(
            "/tokenize", lambda: super(EndpointClient, self).tokenize(
                text, add_special=add_special))

    async def detokenize(self, tokens: Sequence[int]) -> str:
        """Text from llama-server's ``/detokenize`` (unavailable as :meth:`tokenize`)."""
        return await self._tokenizer(
            "/detokenize", lambda: super(EndpointClient, self).detokenize(tokens))

    async def apply_template(self, messages: Sequence[Message],
                             tools: ToolUse | None = None) -> str:
        """The prompt from llama-server's ``/apply-template`` (unavailable as
        :meth:`tokenize`)."""
        return await self._tokenizer(
            "/apply-template", lambda: super(EndpointClient, self).apply_template(
                messages, tools))

    async def _tokenizer(self, path: str, send: Callable[[], Awaitable[_T]]) -> _T:
        if path in self._no_tokenizer:
            raise TokenizeUnavailableError(self._no_tokenizer[path])
        try:
            return await send()
        except EndpointError:
            raise
        except ChildRequestError as exc:
            # 404/405 (no such route), 400/422 (another API under that name), 501, or a
            # 200 that is not JSON: no tokenizer. Other 5xx may pass: let them through.
            missing = exc.status is not None and (exc.status < 500 or exc.status == 501)
            if not missing:
                raise
            why = self._no_tokenizer[path] = (
                f"tokenization not available from this endpoint ({self.display_url}: "
                f"POST {path} answered HTTP {exc.status})")
            raise TokenizeUnavailableError(why) from exc


def _context_length(meta: Mapping[str, Any]) -> int:
    """Tokens per request from a ``/v1/models`` entry: vLLM's ``max_model_len``, or
    llama-server's ``meta.n_ctx`` (capped by ``n_ctx_train``); 0 when not said."""
    for value in (meta.get("max_model_len"), meta.get("context_length")):
        if isinstance(value, int) and value > 0:
            return value
    info = meta.get("meta")
    if isinstance(info, dict):
        sizes = [v for v in (info.get("n_ctx"), info.get("n_ctx_train"))
                 if isinstance(v, int) and v > 0]
        if sizes:
            return min(sizes)
    return 0
