"""The synchronous llamad client.

Example:
    >>> from clients import Client
    >>> with Client("127.0.0.1:50051") as llamad:            # doctest: +SKIP
    ...     for chunk in llamad.generate("The capital of France is", max_tokens=8):
    ...         print(chunk.text, end="", flush=True)
    ...     hits = llamad.search("disk full on web01").hits
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from llamad_protocol.v1 import (
    answer_pb2_grpc,
    control_pb2,
    control_pb2_grpc,
    inference_pb2_grpc,
    retrieval_pb2,
    retrieval_pb2_grpc,
)

from . import _convert as cv
from . import _requests as rq
from ._channel import DEFAULT, ChannelSettings, Timeout, _Default, settings
from ._stream import AskStream, Stream, TextStream
from ._types import (
    DaemonStatus,
    Document,
    Embeddings,
    LogLine,
    Mode,
    ReindexProgress,
    RetrievalStatus,
    Role,
    SearchResult,
    Source,
    SwapProgress,
    Task,
    Tokens,
)
from .errors import NotFound, Unavailable, from_rpc_error

__all__ = ["DEFAULT", "Client"]


class Client:
    """A blocking client for llamad's gRPC API over one channel. Thread-safe.

    Every call has a deadline: ``timeout`` seconds for unary calls (default 30) and
    ``stream_timeout`` for streams (default None: no deadline), or the per-call
    ``timeout=`` (None: no deadline). A passed deadline raises
    :class:`~clients.errors.DeadlineExceeded`, and the daemon stops the work.
    UNAVAILABLE is retried by gRPC itself (see :mod:`clients._channel`); every other
    failure raises a :class:`~clients.errors.LlamadError` subclass at once.

    Args:
        address: ``host:port`` or ``unix:/path``; default ``$LLAMAD_ADDRESS``, else
            ``127.0.0.1:50051``.
        timeout: default deadline of unary calls, seconds (None: none).
        stream_timeout: default deadline of streaming calls, seconds (None: none).
        tls: use TLS (implied by any of the certificate files).
        ca_file: PEM roots to verify the daemon (default: the system's).
        cert_file: PEM client certificate chain, for mutual TLS (with ``key_file``).
        key_file: PEM private key of ``cert_file``.
        token: bearer token sent as ``authorization: Bearer <token>``.
        token_file: file holding the token (read once, stripped).
        server_name: expected name in the daemon's certificate, when it differs from
            the address's host.
        options: extra gRPC channel options.

    Raises:
        ValueError: invalid connection options (unreadable files, empty token, ...).

    Example:
        >>> from clients import Client
        >>> llamad = Client(timeout=10)                       # doctest: +SKIP
        >>> llamad.status().child("generation").state         # doctest: +SKIP
        'running'
        >>> llamad.close()                                    # doctest: +SKIP
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        timeout: float | None = 30.0,
        stream_timeout: float | None = None,
        tls: bool = False,
        ca_file: str | os.PathLike[str] | None = None,
        cert_file: str | os.PathLike[str] | None = None,
        key_file: str | os.PathLike[str] | None = None,
        token: str | None = None,
        token_file: str | os.PathLike[str] | None = None,
        server_name: str | None = None,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        self._settings: ChannelSettings = settings(
            address, tls=tls, ca_file=ca_file, cert_file=cert_file, key_file=key_file,
            token=token, token_file=token_file, server_name=server_name, options=options)
        self.timeout = timeout
        self.stream_timeout = stream_timeout
        s = self._settings
        if s.secure:
            self._channel = grpc.secure_channel(s.target, s.credentials, options=s.options)
        else:
            self._channel = grpc.insecure_channel(s.target, options=s.options)
        # The generated *_grpc modules carry no type hints.
        self._inference = inference_pb2_grpc.InferenceServiceStub(self._channel)
        self._control = control_pb2_grpc.ControlServiceStub(self._channel)
        self._retrieval = retrieval_pb2_grpc.RetrievalServiceStub(self._channel)
        self._answer = answer_pb2_grpc.AnswerServiceStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    @property
    def address(self) -> str:
        """The gRPC target this client talks to."""
        return self._settings.target

    def close(self) -> None:
        """Close the channel; running calls are cancelled."""
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- plumbing -------------------------------------------------------------------------

    def _deadline(self, timeout: Timeout, stream: bool) -> float | None:
        if isinstance(timeout, _Default):
            return self.stream_timeout if stream else self.timeout
        return timeout

    def _unary(self, method: Any, request: Any, timeout: Timeout) -> Any:
        try:
            return method(request, timeout=self._deadline(timeout, False),
                          metadata=self._settings.metadata)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from exc

    def _call(self, method: Any, request: Any, timeout: Timeout) -> Any:
        return method(request, timeout=self._deadline(timeout, True),
                      metadata=self._settings.metadata)

    # --- InferenceService -----------------------------------------------------------------

    def generate(
        self,
        prompt: str,
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        seed: int | None = None,
        stop: Sequence[str] = (),
        timeout: Timeout = DEFAULT,
    ) -> TextStream:
        """Stream the completion of a raw prompt.

        Sampling arguments left as None use the daemon's defaults (``temperature=0`` is
        greedy). The stream yields :class:`~clients.GenerateChunk` s as the model produces
        them; the last one has ``finish_reason`` and ``usage``. Breaking out of the loop,
        closing the stream or its deadline passing stops the generation in the child.

        Example:
            >>> with Client() as llamad:                                  # doctest: +SKIP
            ...     for chunk in llamad.generate("Once upon a time", max_tokens=16):
            ...         print(chunk.text, end="")
            ...     result = llamad.generate("2 + 2 =", max_tokens=4).collect()
            ...     print(result.text, result.usage.completion_tokens)
        """
        request = rq.generate(prompt, max_tokens=max_tokens, temperature=temperature,
                              top_p=top_p, top_k=top_k, seed=seed, stop=stop)
        return TextStream(self._call(self._inference.Generate, request, timeout),
                          cv.generate_chunk)

    def chat(
        self,
        messages: Iterable[cv.ChatInput],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        seed: int | None = None,
        stop: Sequence[str] = (),
        timeout: Timeout = DEFAULT,
    ) -> TextStream:
        """Stream a chat completion; the model's chat template formats the messages.

        Args:
            messages: :class:`~clients.Message` s, ``(role, content)`` tuples or
                ``{"role": ..., "content": ...}`` dicts; roles are ``system``, ``user``
                and ``assistant``.

        Raises:
            ValueError: an unknown role (before anything is sent).

        Example:
            >>> answer = Client().chat([("system", "Be terse."),            # doctest: +SKIP
            ...                         ("user", "Name a colour.")]).collect().text
        """
        request = rq.chat(messages, max_tokens=max_tokens, temperature=temperature,
                          top_p=top_p, top_k=top_k, seed=seed, stop=stop)
        return TextStream(self._call(self._inference.Chat, request, timeout),
                          cv.generate_chunk)

    def embed(self, texts: str | Sequence[str], *, normalize: bool | None = None,
              timeout: Timeout = DEFAULT) -> Embeddings:
        """Embed texts with the embedding model, one vector per text, in order.

        Args:
            texts: the texts (a single string is one text).
            normalize: L2-normalise the vectors (the daemon's default is true).

        Example:
            >>> Client().embed(["disk full", "no space left"]).dimension    # doctest: +SKIP
            384
        """
        request = rq.embed(texts, normalize)
        return cv.embeddings(self._unary(self._inference.Embed, request, timeout))

    def tokenize(self, text: str, *, role: Role = "generation", add_special: bool = False,
                 timeout: Timeout = DEFAULT) -> Tokens:
        """Tokenize ``text`` with the ``role`` model's own tokenizer.

        Example:
            >>> Client().tokenize("hello world").count                      # doctest: +SKIP
            2
        """
        request = rq.tokenize(text, role, add_special)
        return cv.tokens(self._unary(self._inference.Tokenize, request, timeout))

    # --- ControlService -------------------------------------------------------------------

    def status(self, *, timeout: Timeout = DEFAULT) -> DaemonStatus:
        """A snapshot of every child (state, model, breaker, slots, queue) and the daemon.

        Example:
            >>> for child in Client().status().children:                    # doctest: +SKIP
            ...     print(child.role, child.state, child.model_path)
        """
        resp = self._unary(self._control.Status, control_pb2.StatusRequest(), timeout)
        return cv.daemon_status(resp)

    def tail_logs(self, role: Role = "generation", *, lines: int = 0, follow: bool = False,
                  timeout: Timeout = DEFAULT) -> Stream[LogLine]:
        """Stream a child's buffered output lines, oldest first.

        Args:
            lines: how many of the latest lines to send first (0: all buffered).
            follow: keep streaming new lines until the stream is closed, its deadline
                passes, or the daemon stops.

        Example:
            >>> for line in Client().tail_logs("generation", lines=20):     # doctest: +SKIP
            ...     print(line.text)
        """
        request = rq.tail_logs(role, lines, follow)
        return Stream(self._call(self._control.TailLogs, request, timeout), cv.log_line)

    def swap(
        self,
        role: Role = "generation",
        model_path: str | os.PathLike[str] = "",
        *,
        extra_args: str | None = None,
        ctx_size: int | None = None,
        rollback: bool = False,
        stop_old_first: bool = False,
        reason: str = "",
        timeout: Timeout = DEFAULT,
    ) -> Stream[SwapProgress]:
        """Replace a child's model and/or arguments, make-before-break, streaming stages.

        The stream yields :class:`~clients.SwapProgress` from ``validating`` to ``done``.
        A failed swap yields the ``failed`` stage (with its cause), then raises
        :class:`~clients.errors.Aborted`; the old child keeps serving. A concurrent swap
        or a model that does not fit beside the running one raises
        :class:`~clients.errors.FailedPrecondition` (unless ``stop_old_first``).
        Closing the stream early abandons the swap.

        Args:
            model_path: absolute path of the new GGUF model; empty keeps the current one.
            extra_args: replace the runtime's extra arguments (space separated).
            ctx_size: replace the context size per slot.
            rollback: return to the model and arguments before the last swap.
            stop_old_first: stop the old child first when both cannot fit in memory.
            reason: why, recorded in Status.

        Example:
            >>> for p in Client().swap("generation", "/models/new.gguf"):   # doctest: +SKIP
            ...     print(p.stage, p.message)
        """
        request = rq.swap(role, model_path, extra_args=extra_args, ctx_size=ctx_size,
                          rollback=rollback, stop_old_first=stop_old_first, reason=reason)
        return Stream(self._call(self._control.Swap, request, timeout), cv.swap_progress)

    def set_mode(
        self,
        role: Role,
        mode: Mode,
        *,
        endpoint_url: str = "",
        endpoint_model: str = "",
        api_key_file: str = "",
        api_key_env: str = "",
        model_path: str | os.PathLike[str] = "",
        reason: str = "",
        timeout: Timeout = DEFAULT,
    ) -> Stream[SwapProgress]:
        """Switch a role between a supervised child (``embedded``), an external
        OpenAI-compatible ``endpoint``, and ``disabled``, make-before-break like
        :meth:`swap`, streaming the stages.

        A failed switch yields the ``failed`` stage (its cause names the reason: refused,
        auth, tls, not_openai, unknown_model, ...), then raises
        :class:`~clients.errors.Aborted`; the old mode keeps serving. A switch racing a
        swap or another switch raises :class:`~clients.errors.FailedPrecondition`.

        Args:
            endpoint_url: for ``endpoint``: base URL (empty: the role's configured one).
            endpoint_model: for ``endpoint``: model id (empty: the only one offered).
            api_key_file: a file on the daemon's machine holding the API key (the key
                itself is never sent over this API).
            api_key_env: or the name of an environment variable of the daemon.
            model_path: for ``embedded``: an absolute GGUF path (empty: the current one).
            reason: why, logged.

        Example:
            >>> for p in Client().set_mode("generation", "endpoint",        # doctest: +SKIP
            ...                            endpoint_url="http://10.0.0.5:8080/v1"):
            ...     print(p.stage, p.message)
        """
        request = rq.set_mode(role, mode, endpoint_url=endpoint_url,
                              endpoint_model=endpoint_model, api_key_file=api_key_file,
                              api_key_env=api_key_env, model_path=model_path, reason=reason)
        return Stream(self._call(self._control.SetMode, request, timeout), cv.swap_progress)

    def reset(self, role: Role = "generation", *, timeout: Timeout = DEFAULT) -> str:
        """Close a child's circuit breaker and retry its start now; return its state."""
        request = rq.reset(role)
        return cv.child_state(self._unary(self._control.Reset, request, timeout).state)

    # --- RetrievalService -----------------------------------------------------------------

    def search(
        self,
        query: str,
        *,
        top_k: int = 0,
        sources: Sequence[str] = (),
        kinds: Sequence[str] = (),
        categories: Sequence[str] = (),
        tags: Sequence[str] = (),
        indexed_since: datetime | None = None,
        indexed_until: datetime | None = None,
        timeout: Timeout = DEFAULT,
    ) -> SearchResult:
        """Hybrid search (BM25 and vectors fused by RRF; BM25 only without embeddings).

        Args:
            top_k: hits to return (0: the daemon's default, 5).
            sources, kinds, categories, tags: keep only hits matching any of each
                (tags: any of them).
            indexed_since, indexed_until: keep hits indexed within this window.

        Raises:
            InvalidArgument: an empty or oversized query, ``top_k`` above the limit.

        Example:
            >>> for hit in Client().search("disk full web01").hits:          # doctest: +SKIP
            ...     print(hit.chunk_id, hit.title, round(hit.fused_score, 3))
        """
        request = rq.search(query, top_k=top_k, sources=sources, kinds=kinds,
                            categories=categories, tags=tags, indexed_since=indexed_since,
                            indexed_until=indexed_until)
        return cv.search_result(self._unary(self._retrieval.Search, request, timeout))

    def upsert_document(
        self,
        source_id: str,
        text: str,
        *,
        document_id: str = "",
        title: str = "",
        kind: str = "text",
        category: str = "",
        tags: Sequence[str] = (),
        timeout: Timeout = DEFAULT,
    ) -> Document:
        """Index a document of a push source, replacing its previous version atomically;
        returns once it is durable and searchable. Idempotent.

        Args:
            source_id: a push source (see :meth:`add_source` without a path).
            document_id: your id for it; empty derives one from the content.
            kind: ``markdown``, ``text``, ``html`` or ``config``.

        Example:
            >>> llamad = Client()                                             # doctest: +SKIP
            >>> llamad.add_source("notes")                                    # doctest: +SKIP
            >>> doc = llamad.upsert_document("notes", "web01 disk is full",   # doctest: +SKIP
            ...                              title="web01")
        """
        request = rq.upsert_document(source_id, text, document_id=document_id, title=title,
                                     kind=kind, category=category, tags=tags)
        resp = self._unary(self._retrieval.UpsertDocument, request, timeout)
        return cv.document(resp.document)

    def delete_document(self, document_id: str, *, timeout: Timeout = DEFAULT) -> bool:
        """Delete a document; return whether it existed."""
        request = retrieval_pb2.DeleteDocumentRequest(id=document_id)
        return bool(self._unary(self._retrieval.DeleteDocument, request, timeout).deleted)

    def get_document(self, document_id: str, *, timeout: Timeout = DEFAULT) -> Document:
        """A document's metadata and pipeline state.

        Raises:
            NotFound: no document with this id.
        """
        request = retrieval_pb2.GetDocumentRequest(id=document_id)
        return cv.document(self._unary(self._retrieval.GetDocument, request, timeout))

    def list_documents(self, source_id: str = "", *,
                       timeout: Timeout = DEFAULT) -> list[Document]:
        """Every document of a source (or of every source)."""
        request = retrieval_pb2.ListDocumentsRequest(source_id=source_id)
        resp = self._unary(self._retrieval.ListDocuments, request, timeout)
        return [cv.document(d) for d in resp.documents]

    def add_source(self, source_id: str, path: str | os.PathLike[str] = "", *,
                   category: str = "", tags: Sequence[str] = (),
                   timeout: Timeout = DEFAULT) -> Source:
        """Add (or update) a source: a directory to scan, or without ``path`` a source of
        pushed documents. Call :meth:`reindex` to scan a directory.

        Args:
            path: absolute path of a directory on the daemon's machine.

        Example:
            >>> llamad = Client()
            >>> llamad.add_source("runbooks", "/srv/runbooks")        # doctest: +SKIP
            >>> progress = list(llamad.reindex("runbooks"))          # doctest: +SKIP
        """
        request = rq.add_source(source_id, path, category=category, tags=tags)
        return cv.source(self._unary(self._retrieval.AddSource, request, timeout))

    def remove_source(self, source_id: str, *, timeout: Timeout = DEFAULT) -> int:
        """Remove a source and its documents; return how many chunks were removed."""
        request = retrieval_pb2.RemoveSourceRequest(id=source_id)
        resp = self._unary(self._retrieval.RemoveSource, request, timeout)
        return int(resp.chunks_removed)

    def list_sources(self, *, timeout: Timeout = DEFAULT) -> list[Source]:
        """Every source, with its document count and last scan."""
        resp = self._unary(self._retrieval.ListSources, retrieval_pb2.ListSourcesRequest(),
                           timeout)
        return [cv.source(s) for s in resp.sources]

    def reindex(self, source_id: str = "", *,
                timeout: Timeout = DEFAULT) -> Stream[ReindexProgress]:
        """Rescan directory sources (all, or one) incrementally, streaming progress: at
        most two messages a second per source, then one with ``done`` set.

        Raises:
            InvalidArgument: ``source_id`` is not a directory source.
        """
        request = retrieval_pb2.ReindexRequest(source_id=source_id)
        return Stream(self._call(self._retrieval.Reindex, request, timeout),
                      cv.reindex_progress)

    def retrieval_status(self, *, timeout: Timeout = DEFAULT) -> RetrievalStatus:
        """Sizes of the retrieval index: sources, documents by state, chunks, vectors."""
        resp = self._unary(self._retrieval.Status, retrieval_pb2.RetrievalStatusRequest(),
                           timeout)
        return cv.retrieval_status(resp)

    # --- AnswerService --------------------------------------------------------------------

    def ask(
        self,
        question: str,
        *,
        top_k: int = 0,
        sources: Sequence[str] = (),
        kinds: Sequence[str] = (),
        categories: Sequence[str] = (),
        tags: Sequence[str] = (),
        history: Iterable[cv.ChatInput] = (),
        task: Task = "answer",
        attachment: str = "",
        max_tokens: int | None = None,
        temperature: float | None = None,
        seed: int | None = None,
        no_cache: bool = False,
        timeout: Timeout = DEFAULT,
    ) -> AskStream:
        """A grounded answer about your documents, streamed, with its sources.

        The stream yields :class:`~clients.AskText` events as the answer is generated,
        then one :class:`~clients.AskSources` (citations ``S1``..``Sn`` in rank order),
        then one :class:`~clients.AskDone` (usage, prompt SHA-256, cache, mode).

        Args:
            top_k: sources to retrieve (0: the daemon's default, 5).
            history: recent conversation turns, oldest first.
            task: ``answer``, ``explain_output``, ``diagnose`` or ``summarize``.
            attachment: text the question is about (e.g. a command's output).
            no_cache: skip the daemon's response cache.

        Raises:
            OutOfRange: the question, template and task cannot fit the context.

        Example:
            >>> llamad = Client()
            >>> result = llamad.ask("Fix disk full on web01?").collect()  # doctest: +SKIP
            >>> print(result.answer)                                      # doctest: +SKIP
            >>> for c in result.citations:                                # doctest: +SKIP
            ...     print(f"[{c.label}] {c.title} — {c.path}")
        """
        request = rq.ask(question, top_k=top_k, sources=sources, kinds=kinds,
                         categories=categories, tags=tags, history=history, task=task,
                         attachment=attachment, max_tokens=max_tokens,
                         temperature=temperature, seed=seed, no_cache=no_cache)
        return AskStream(self._call(self._answer.Ask, request, timeout), cv.ask_event)

    # --- health ---------------------------------------------------------------------------

    def health(self, service: str = "", *, timeout: Timeout = DEFAULT) -> str:
        """The gRPC health of ``service``: ``serving``, ``not_serving`` or
        ``service_unknown``. ``""`` is the whole daemon; ``generation`` and ``embedding``
        are the children.

        Example:
            >>> Client().health("generation")                               # doctest: +SKIP
            'serving'
        """
        request = health_pb2.HealthCheckRequest(service=service)
        try:
            resp = self._unary(self._health.Check, request, timeout)
        except NotFound:
            return "service_unknown"
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)).lower()

    def wait_serving(self, service: str = "", *, timeout: float = 120.0) -> None:
        """Block until ``service`` is SERVING, waiting for the daemon to come up too.

        Raises:
            DeadlineExceeded: not serving within ``timeout`` seconds.
        """
        request = health_pb2.HealthCheckRequest(service=service)
        call = self._health.Watch(request, timeout=timeout, wait_for_ready=True,
                                  metadata=self._settings.metadata)

        def serving(msg: Any) -> bool | None:
            return True if msg.status == health_pb2.HealthCheckResponse.SERVING else None

        with Stream(call, serving) as updates:
            for _ in updates:
                return
        raise Unavailable("the health watch ended before the service was serving",
                          code="UNAVAILABLE")
