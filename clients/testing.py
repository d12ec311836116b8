"""A fake llamad for testing code that uses the client: a real gRPC server, in-process.

:class:`FakeLlamad` serves every llamad RPC on a loopback port (or a unix socket) from
canned, deterministic data, with no model behind it: text streams come from a word list,
search matches words in pushed or scanned documents, Ask answers from those hits. It
records what it was asked and can fail on purpose, so retries, errors, retry hints and
cancellation can be tested against the real gRPC stack::

    >>> from clients import Client
    >>> from clients.testing import FakeLlamad
    >>> import grpc
    >>> with FakeLlamad() as fake, Client(fake.address) as llamad:
    ...     fake.fail("ControlService/Status", grpc.StatusCode.UNAVAILABLE, times=2)
    ...     print(llamad.status().child("generation").state, fake.calls["ControlService/Status"])
    running 3

Method keys are ``"<Service>/<Method>"`` without the package, e.g.
``"InferenceService/Generate"``, ``"RetrievalService/Status"``.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from llamad_protocol.v1 import (
    answer_pb2,
    answer_pb2_grpc,
    common_pb2,
    control_pb2,
    control_pb2_grpc,
    inference_pb2,
    inference_pb2_grpc,
    retrieval_pb2,
    retrieval_pb2_grpc,
)
from llamad_protocol.v1.wire import (
    HEALTH_EMBEDDING,
    HEALTH_GENERATION,
    HEALTH_OVERALL,
    RETRY_AFTER_KEY,
)

__all__ = ["FakeLlamad"]

WORDS = ("The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog", ".")


@dataclass
class _Failure:
    code: grpc.StatusCode
    message: str
    times: int
    retry_after_ms: int | None
    after: int


@dataclass(frozen=True)
class Abort:
    """Yielded by a fake stream: end the call with this status."""

    code: grpc.StatusCode
    message: str


@dataclass
class _Doc:
    id: str
    source_id: str
    title: str
    text: str
    path: str = ""
    kind: str = "text"


class FakeLlamad:
    """llamad's gRPC API with canned answers. Thread-safe; use as a context manager.

    Attributes:
        calls: invocations per method key (every attempt counts, retries included).
        cancelled: streams that ended because the client cancelled, per method key.
        metadata: the invocation metadata of the latest call per method key.
        delay: seconds to wait before answering, per method key.
        endless: make Generate, Chat and Ask stream forever (until cancelled).
        answer: the text Ask streams.
        log_lines: what TailLogs sends.
        last_set_mode: the last SetModeRequest received.
    """

    def __init__(self, listen: str = "127.0.0.1:0", *,
                 credentials: grpc.ServerCredentials | None = None) -> None:
        """Args:
            listen: ``host:port`` (port 0 picks a free one) or ``unix:/path``.
            credentials: serve TLS with these (``grpc.ssl_server_credentials``).
        """
        self.calls: Counter[str] = Counter()
        self.cancelled: Counter[str] = Counter()
        self.metadata: dict[str, dict[str, str]] = {}
        self.delay: dict[str, float] = {}
        self.endless = False
        self.answer = "Rotate the nginx logs [S1]."
        self.log_lines = [f"line {i}" for i in range(1, 31)]
        self.last_set_mode: control_pb2.SetModeRequest | None = None
        self.docs: dict[str, _Doc] = {}
        self.sources: dict[str, retrieval_pb2.Source] = {}
        self._failures: dict[str, list[_Failure]] = {}
        self._lock = threading.Lock()
        self._listen = listen
        self._credentials = credentials
        self._server: grpc.Server | None = None
        self.address = ""

    # --- control of the fake --------------------------------------------------------------

    def fail(self, method: str, code: grpc.StatusCode, message: str = "injected failure", *,
             times: int = 1, retry_after_ms: int | None = None, after: int = 0) -> None:
        """Make the next ``times`` calls of ``method`` fail with ``code``.

        Args:
            retry_after_ms: send this retry hint (trailing ``retry-after-ms``).
            after: for streams, fail after sending this many messages.
        """
        with self._lock:
            self._failures.setdefault(method, []).append(
                _Failure(code, message, times, retry_after_ms, after))

    def start(self) -> str:
        """Listen and serve; return the address to give a client."""
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        inference_pb2_grpc.add_InferenceServiceServicer_to_server(
            _Inference(self), server)
        control_pb2_grpc.add_ControlServiceServicer_to_server(
            _Control(self), server)
        retrieval_pb2_grpc.add_RetrievalServiceServicer_to_server(
            _Retrieval(self), server)
        answer_pb2_grpc.add_AnswerServiceServicer_to_server(
            _Answer(self), server)
        checker = health.HealthServicer()
        for name in (HEALTH_OVERALL, HEALTH_GENERATION, HEALTH_EMBEDDING):
            checker.set(name, health_pb2.HealthCheckResponse.SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(checker, server)
        if self._credentials is not None:
            port = server.add_secure_port(self._listen, self._credentials)
        else:
            port = server.add_insecure_port(self._listen)
        server.start()
        self._server = server
        if self._listen.startswith("unix:"):
            self.address = self._listen
        else:
            self.address = f"{self._listen.rpartition(':')[0]}:{port}"
        return self.address

    def stop(self) -> None:
        """Stop serving at once (running calls are cancelled)."""
        if self._server is not None:
            self._server.stop(None).wait()
            self._server = None

    def __enter__(self) -> FakeLlamad:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- plumbing for the servicers -------------------------------------------------------

    def enter(self, method: str, context: grpc.ServicerContext) -> _Failure | None:
        """Count the call; return the failure to inject now, if any (``after`` = 0 aborts
        here)."""
        with self._lock:
            self.calls[method] += 1
            self.metadata[method] = {k: v for k, v in context.invocation_metadata()
                                     if isinstance(v, str)}
            queue = self._failures.get(method, [])
            failure = queue[0] if queue else None
            if failure is not None:
                failure.times -= 1
                if failure.times <= 0:
                    queue.pop(0)
            delay = self.delay.get(method, 0.0)
        if delay:
            time.sleep(delay)
        if failure is not None and failure.after == 0:
            abort(context, failure)
        return failure

    def stream(self, method: str, context: grpc.ServicerContext,
               items: Iterator[Any]) -> Iterator[Any]:
        """Serve ``items`` as a stream, with failures and cancellations accounted.

        ``items`` may yield an :class:`Abort` to end the call with that status.
        """
        ended = threading.Event()

        def on_termination() -> None:
            if not ended.is_set():  # neither finished nor aborted by us: cancelled
                with self._lock:
                    self.cancelled[method] += 1

        context.add_callback(on_termination)
        try:
            failure = self.enter(method, context)
        except BaseException:
            ended.set()
            raise
        for sent, item in enumerate(items):
            if failure is not None and sent == failure.after:
                ended.set()
                abort(context, failure)
            if isinstance(item, Abort):
                ended.set()
                context.abort(item.code, item.message)
            yield item
        ended.set()
        if failure is not None:
            abort(context, failure)

    def wait_cancelled(self, method: str, timeout: float = 5.0) -> bool:
        """Wait until a stream of ``method`` ended by cancellation; True if it did."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if self.cancelled[method]:
                    return True
            time.sleep(0.01)
        return False

    def until_cancelled(self, context: grpc.ServicerContext) -> Iterator[None]:
        """Yield every 10 ms while the call is alive."""
        while context.is_active():
            yield None
            time.sleep(0.01)


def abort(context: grpc.ServicerContext, failure: _Failure) -> None:
    if failure.retry_after_ms is not None:
        context.set_trailing_metadata(((RETRY_AFTER_KEY, str(failure.retry_after_ms)),))
    context.abort(failure.code, failure.message)


def _usage(n: int) -> inference_pb2.Usage:
    return inference_pb2.Usage(prompt_tokens=5, completion_tokens=n, total_tokens=5 + n,
                               time_to_first_token_ms=12.5, tokens_per_second=100.0)


class _Inference(inference_pb2_grpc.InferenceServiceServicer):
    MODEL = "fake-model.gguf"

    def __init__(self, fake: FakeLlamad) -> None:
        self.fake = fake

    def _text(self, max_tokens: int, context: grpc.ServicerContext) -> Iterator[Any]:
        if self.fake.endless:
            for _ in self.fake.until_cancelled(context):
                yield inference_pb2.GenerateResponse(text=" more", tokens=1, model=self.MODEL)
            return
        words = [WORDS[i % len(WORDS)] for i in range(max_tokens or len(WORDS))]
        for word in words:
            yield inference_pb2.GenerateResponse(text=word, tokens=1, model=self.MODEL)
        reason = (inference_pb2.FINISH_REASON_LENGTH if max_tokens
                  else inference_pb2.FINISH_REASON_STOP)
        yield inference_pb2.GenerateResponse(model=self.MODEL, finish_reason=reason,
                                             usage=_usage(len(words)))

    def Generate(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        if not request.prompt:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "prompt is empty")
        return self.fake.stream("InferenceService/Generate", context,
                                self._text(request.sampling.max_tokens, context))

    def Chat(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        if not request.messages:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "messages is empty")
        return self.fake.stream("InferenceService/Chat", context,
                                self._text(request.sampling.max_tokens, context))

    def Embed(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.enter("InferenceService/Embed", context)
        vectors = [inference_pb2.Embedding(values=[b / 255 for b in
                                                   hashlib.sha256(t.encode()).digest()[:8]])
                   for t in request.texts]
        return inference_pb2.EmbedResponse(embeddings=vectors, model="fake-embed.gguf",
                                           dimension=8, prompt_tokens=len(request.texts))

    def Tokenize(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.enter("InferenceService/Tokenize", context)
        ids = [len(w) for w in request.text.split()]
        return inference_pb2.TokenizeResponse(tokens=ids, count=len(ids), model=self.MODEL)


def _child(role: common_pb2.ChildRole.ValueType, model: str, port: int) -> control_pb2.ChildStatus:
    return control_pb2.ChildStatus(
        role=role, state=control_pb2.CHILD_STATE_RUNNING, pid=4242 + role,
        model_path=f"/models/{model}", runtime="llama-server", port=port, uptime_seconds=75.0,
        restarts=1, breaker=control_pb2.BREAKER_STATE_CLOSED, enabled=True,
        model_architecture="llama", model_context_length=2048, in_flight=1, queued=0,
        slots=2 if role == common_pb2.CHILD_ROLE_GENERATION else 1,
        queue_ahead=0 if role == common_pb2.CHILD_ROLE_GENERATION else 2,
        last_exit=control_pb2.ExitCause(kind="crash", exit_code=1, message="boom"))


class _Control(control_pb2_grpc.ControlServiceServicer):
    def __init__(self, fake: FakeLlamad) -> None:
        self.fake = fake

    def Status(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.enter("ControlService/Status", context)
        return control_pb2.StatusResponse(
            children=[_child(common_pb2.CHILD_ROLE_GENERATION, "fake-model.gguf", 40001),
                      _child(common_pb2.CHILD_ROLE_EMBEDDING, "fake-embed.gguf", 40002)],
            version="0.0.0-fake", daemon_uptime_seconds=3725.0)

    def TailLogs(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        lines = self.fake.log_lines[-request.lines:] if request.lines else self.fake.log_lines
        role = request.role or common_pb2.CHILD_ROLE_GENERATION

        def items() -> Iterator[Any]:
            for seq, text in enumerate(lines, 1):
                yield control_pb2.LogLine(role=role, pid=4243, stream="stderr", text=text,
                                          seq=seq)
            if request.follow:
                # Nothing more to send: wait (in this worker) until the client cancels.
                while context.is_active():
                    time.sleep(0.01)

        return self.fake.stream("ControlService/TailLogs", context, items())

    def Swap(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        path = request.model_path
        if path and not path.startswith("/"):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "model_path must be absolute")

        def items() -> Iterator[Any]:
            yield control_pb2.SwapProgress(stage=control_pb2.SWAP_STAGE_VALIDATING,
                                           message="checking the model")
            if path and not Path(path).is_file():
                cause = control_pb2.ExitCause(kind="invalid_model", permanent=True,
                                              message=f"{path}: no such file")
                yield control_pb2.SwapProgress(stage=control_pb2.SWAP_STAGE_FAILED,
                                               message=cause.message, cause=cause,
                                               elapsed_seconds=0.01)
                yield Abort(grpc.StatusCode.ABORTED,
                            f"swap failed: {path}: no such file; the old child keeps serving")
                return
            for stage in (control_pb2.SWAP_STAGE_LAUNCHING, control_pb2.SWAP_STAGE_PROBING,
                          control_pb2.SWAP_STAGE_SWAPPING, control_pb2.SWAP_STAGE_DONE):
                yield control_pb2.SwapProgress(stage=stage, elapsed_seconds=0.1 * stage)

        return self.fake.stream("ControlService/Swap", context, items())

    def SetMode(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        self.fake.last_set_mode = request

        def items() -> Iterator[Any]:
            for stage in (control_pb2.SWAP_STAGE_VALIDATING, control_pb2.SWAP_STAGE_PROBING,
                          control_pb2.SWAP_STAGE_SWAPPING, control_pb2.SWAP_STAGE_DONE):
                yield control_pb2.SwapProgress(stage=stage, elapsed_seconds=0.1 * stage)

        return self.fake.stream("ControlService/SetMode", context, items())

    def Reset(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.enter("ControlService/Reset", context)
        return control_pb2.ResetResponse(state=control_pb2.CHILD_STATE_STARTING)


class _Retrieval(retrieval_pb2_grpc.RetrievalServiceServicer):
    def __init__(self, fake: FakeLlamad) -> None:
        self.fake = fake

    def _doc(self, d: _Doc) -> retrieval_pb2.Document:
        return retrieval_pb2.Document(id=d.id, source_id=d.source_id, title=d.title,
                                      kind=d.kind, path=d.path,
                                      state=retrieval_pb2.DOCUMENT_STATE_INDEXED)

    def UpsertDocument(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.enter("RetrievalService/UpsertDocument", context)
        if not request.text.strip():
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "text is empty")
        doc_id = request.id or hashlib.sha256(request.text.encode()).hexdigest()[:16]
        doc = _Doc(doc_id, request.source_id, request.title or doc_id, request.text,
                   kind=request.kind or "text")
        self.fake.docs[doc_id] = doc
        return retrieval_pb2.UpsertDocumentResponse(document=self._doc(doc))

    def DeleteDocument(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.enter("RetrievalService/DeleteDocument", context)
        return retrieval_pb2.DeleteDocumentResponse(
            deleted=self.fake.docs.pop(request.id, None) is not None)

    def GetDocument(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.enter("RetrievalService/GetDocument", context)
        doc = self.fake.docs.get(request.id)
        if doc is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no document {request.id!r}")
        return self._doc(doc)  # type: ignore[arg-type]

    def ListDocuments(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.enter("RetrievalService/ListDocuments", context)
        docs = [self._doc(d) for d in self.fake.docs.values()
                if not request.source_id or d.source_id == request.source_id]
        return retrieval_pb2.ListDocumentsResponse(documents=docs)

    def AddSource(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.enter("RetrievalService/AddSource", context)
        if request.path and not Path(request.path).is_dir():
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{request.path} is not a directory")
        source = retrieval_pb2.Source(id=request.id,
                                      kind="directory" if request.path else "push",
                                      path=request.path, category=request.category,
                                      tags=request.tags)
        self.fake.sources[request.id] = source
        return source

    def RemoveSource(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.enter("RetrievalService/RemoveSource", context)
        self.fake.sources.pop(request.id, None)
        gone = [k for k, d in self.fake.docs.items() if d.source_id == request.id]
        for key in gone:
            del self.fake.docs[key]
        return retrieval_pb2.RemoveSourceResponse(chunks_removed=len(gone))

    def ListSources(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.enter("RetrievalService/ListSources", context)
        return retrieval_pb2.ListSourcesResponse(sources=self._sources())

    def _sources(self) -> list[retrieval_pb2.Source]:
        out = []
        for s in self.fake.sources.values():
            copy = retrieval_pb2.Source()
            copy.CopyFrom(s)
            copy.documents = sum(d.source_id == s.id for d in self.fake.docs.values())
            out.append(copy)
        return out

    def Reindex(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        sources = [s for s in self.fake.sources.values() if s.kind == "directory"
                   and (not request.source_id or s.id == request.source_id)]
        if request.source_id and not sources:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"no directory source {request.source_id!r}")

        def items() -> Iterator[Any]:
            for source in sources:
                files = sorted(p for p in Path(source.path).rglob("*") if p.is_file())
                added = 0
                for n, path in enumerate(files, 1):
                    rel = str(path.relative_to(source.path))
                    doc_id = f"{source.id}:{rel}"
                    added += doc_id not in self.fake.docs
                    self.fake.docs[doc_id] = _Doc(doc_id, source.id, path.stem,
                                                  path.read_text(errors="replace"), rel)
                    yield retrieval_pb2.ReindexProgress(source_id=source.id, seen=n,
                                                        added=added)
                yield retrieval_pb2.ReindexProgress(
                    source_id=source.id, seen=len(files), added=added,
                    unchanged=len(files) - added, done=True)

        return self.fake.stream("RetrievalService/Reindex", context, items())

    def hits(self, query: str, top_k: int) -> list[retrieval_pb2.SearchHit]:
        words = {w.lower() for w in query.split()}
        scored = sorted(((sum(w in d.text.lower() for w in words), d)
                         for d in self.fake.docs.values()), key=lambda x: -x[0])
        hits = []
        for rank, (score, d) in enumerate([s for s in scored if s[0]][: top_k or 5], 1):
            hits.append(retrieval_pb2.SearchHit(
                chunk_id=f"{d.id}#0", document_id=d.id, title=d.title, source_id=d.source_id,
                path=d.path, text=d.text, snippet=d.text[:80],
                search_source=retrieval_pb2.SEARCH_SOURCE_HYBRID, fused_score=1 / (60 + rank),
                text_rank=rank, text_score=float(score), vector_rank=rank,
                vector_score=0.5))
        return hits

    def Search(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.enter("RetrievalService/Search", context)
        if not request.query.strip():
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "query is empty")
        return retrieval_pb2.SearchResponse(hits=self.hits(request.query, request.top_k),
                                            mode=retrieval_pb2.SEARCH_MODE_HYBRID)

    def Status(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.enter("RetrievalService/Status", context)
        n = len(self.fake.docs)
        return retrieval_pb2.RetrievalStatusResponse(
            sources=len(self.fake.sources), chunks=n, documents_by_state={"indexed": n},
            embedded_chunks=n, vectors=n, embedding_model="fake-embed.gguf@0123",
            disk_bytes=4096, source_list=self._sources())


class _Answer(answer_pb2_grpc.AnswerServiceServicer):
    def __init__(self, fake: FakeLlamad, retrieval: _Retrieval | None = None) -> None:
        self.fake = fake
        self.retrieval = retrieval or _Retrieval(fake)

    def Ask(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        if not request.question.strip():
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "question is empty")
        hits = self.retrieval.hits(request.question, request.top_k)

        def items() -> Iterator[Any]:
            if self.fake.endless:
                for _ in self.fake.until_cancelled(context):
                    yield answer_pb2.AskResponse(text=" more")
                return
            answer = self.fake.answer if hits else "The knowledge base has nothing on it."
            for word in answer.split(" "):
                yield answer_pb2.AskResponse(text=word + " ")
            yield answer_pb2.AskResponse(sources=answer_pb2.AskSources(
                citations=[answer_pb2.Citation(label=f"S{i}", chunk_id=h.chunk_id,
                                               document_id=h.document_id, title=h.title,
                                               path=h.path, score=h.fused_score,
                                               snippet=h.snippet)
                           for i, h in enumerate(hits, 1)],
                retrieval_mode=retrieval_pb2.SEARCH_MODE_HYBRID))
            yield answer_pb2.AskResponse(done=answer_pb2.AskDone(
                usage=_usage(len(answer.split())), prompt_sha256="0" * 64,
                no_context=not hits, finish_reason=inference_pb2.FINISH_REASON_STOP,
                template_version="fake-1"))

        return self.fake.stream("AnswerService/Ask", context, items())
