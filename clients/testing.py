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

import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from llamad_protocol.v1 import (
    answer_pb2_grpc,
    control_pb2,
    control_pb2_grpc,
    inference_pb2_grpc,
    retrieval_pb2,
    retrieval_pb2_grpc,
)
from llamad_protocol.v1.wire import HEALTH_EMBEDDING, HEALTH_GENERATION, HEALTH_OVERALL

from ._fake._answer import FakeAnswer
from ._fake._control import FakeControl
from ._fake._faults import Abort, Failure, abort
from ._fake._inference import WORDS, FakeInference  # noqa: F401 (WORDS: importable here, as before)
from ._fake._retrieval import Doc, FakeRetrieval

__all__ = ["FakeLlamad"]


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
        requests: the latest request message per method key of Generate, Chat, Embed,
            Tokenize, Search and Ask (what a client sent: its model, tools, options).
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
        self.requests: dict[str, Any] = {}
        self.docs: dict[str, Doc] = {}
        self.sources: dict[str, retrieval_pb2.Source] = {}
        self.pruned = 0  # history records pruned (the fake's Status.pruned)
        self._failures: dict[str, list[Failure]] = {}
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
                Failure(code, message, times, retry_after_ms, after))

    def start(self) -> str:
        """Listen and serve; return the address to give a client."""
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        inference_pb2_grpc.add_InferenceServiceServicer_to_server(
            FakeInference(self), server)
        control_pb2_grpc.add_ControlServiceServicer_to_server(
            FakeControl(self), server)
        retrieval_pb2_grpc.add_RetrievalServiceServicer_to_server(
            FakeRetrieval(self), server)
        answer_pb2_grpc.add_AnswerServiceServicer_to_server(
            FakeAnswer(self), server)
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

    def enter(self, method: str, context: grpc.ServicerContext) -> Failure | None:
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
