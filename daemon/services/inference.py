"""Inference calls as both APIs make them: gRPC (:mod:`daemon.grpcapi.inference`) and the
OpenAI-compatible HTTP API (:mod:`daemon.httpapi`) validate and translate differently, and
share everything in between, so swaps, drains, queueing and refusals behave the same on
both:

- :func:`admitted_generation`: refuse by name the controls the runtime cannot take (before
  queueing, and again once admitted), then hold a generation slot;
- :class:`Meter`: a stream's tokens, time to first token and inter-token gaps, counted in
  the Prometheus series, and its usage at the end;
- :func:`embed`: admit an embedding call, refuse a text longer than the model's context
  by index, embed and L2-normalise.

Nothing here knows either wire format; errors are the daemon's own (mapped per protocol).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from supervisor import ChildRequestError, Chunk, Sampling, TokenizeUnavailableError

from ..config import Role
from ..errors import InvalidArgument
from ..models import lanes
from ..models.backend import InferenceBackend
from ..models.lanes import Lane
from ..models.router import InferenceRouter
from ..telemetry.metrics import Metrics

Float32Array = np.ndarray[Any, np.dtype[np.float32]]
EmbedInput = str | Sequence[int]
"""A text, or a text already tokenized (token ids, OpenAI's token-array input)."""


@contextlib.asynccontextmanager
async def admitted_generation(router: InferenceRouter, sampling: Sampling,
                              time_remaining: float | None, *, chat: bool,
                              note: Callable[..., None],
                              model: str = "",
                              lane: Lane | None = None) -> AsyncIterator[InferenceBackend]:
    """Hold a slot of the generation model ``model`` ("": the role's default), waiting
    in ``lane`` (None: the one the client asked for, :func:`daemon.models.lanes.asked`),
    for the body; yield the backend to stream from.

    The controls the request sets (``sampling.requested()``, noted as ``controls``) are
    checked against the runtime before queueing, and again once admitted, since a swap or
    a mode switch may have changed it meanwhile.

    Raises:
        UnsupportedParameterError: a control the runtime cannot take.
        Draining, Disabled, ChildNotReadyError, Overloaded, DeadlineUnmeetable: see
            :meth:`daemon.models.router.InferenceRouter.admit`.
    """
    requested = sampling.requested()
    if requested:
        note(controls=",".join(requested))
        if router.fixed(Role.GENERATION, model):  # another may not be loaded yet: checked
            # once admitted
            sampling.check(router.backend(Role.GENERATION).dialect, chat=chat)
    async with router.admit(Role.GENERATION, time_remaining, model=model,
                            lane=lane or lanes.asked()) as backend:
        if requested:
            sampling.check(backend.dialect, chat=chat)
        yield backend


@dataclass(frozen=True)
class Usage:
    """What a finished stream used and how fast it went."""

    prompt_tokens: int
    completion_tokens: int
    ttft_ms: float
    tokens_per_second: float

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class Meter:
    """Times and counts one generation stream of the catalog model ``model`` (from
    ``received``, a :func:`time.perf_counter` reading when the call arrived) in
    ``metrics``.

    The model's series are resolved here, once per call. A streamed token's count and
    inter-token gap are kept here and added to the series together (:meth:`flush`) at
    most :data:`FLUSH_EVERY` seconds apart, at the end (:meth:`finish`) and when the
    caller leaves the stream (:meth:`flush`, from its ``finally``): at a model's pace
    every token comes to a cold process, where the prometheus updates cost more than
    the rest of a token's relay (issue 27)."""

    __slots__ = ("_counted", "_first", "_flushed", "_gaps", "_last", "_received",
                 "_series", "_tokens")

    FLUSH_EVERY = 1.0
    """Longest a streamed token waits, in seconds, before the metrics count it."""

    def __init__(self, metrics: Metrics | None, received: float, model: str = "") -> None:
        self._series = None if metrics is None else metrics.stream(Role.GENERATION, model)
        self._received = received
        self._first: float | None = None
        self._last = 0.0
        self._tokens = 0
        self._counted = 0  # of _tokens, those the series have
        self._gaps: list[float] = []  # inter-token gaps the series do not have yet
        self._flushed = received

    def piece(self, item: Chunk) -> None:
        """Count a chunk that carries text (one without a finish reason)."""
        now = time.perf_counter()
        if self._first is None:
            self._first = now
            if self._series is not None:
                self._series.ttft.observe(max(0.0, now - self._received))
        else:
            self._gaps.append(now - self._last)
        self._last = now
        self._tokens += item.tokens
        if now - self._flushed >= self.FLUSH_EVERY:
            self.flush()

    @property
    def streamed(self) -> int:
        """Tokens streamed so far (a stream left early counts them in its token's quota:
        :mod:`daemon.services.quotas`)."""
        return self._tokens

    def flush(self) -> None:
        """Add what was streamed since the last flush to the metrics (idempotent)."""
        self._flushed = self._last
        series = self._series
        if series is None:
            return
        if self._tokens > self._counted:
            series.tokens.inc(self._tokens - self._counted)
            self._counted = self._tokens
        if self._gaps:
            observe = series.inter_token.observe
            for gap in self._gaps:
                observe(gap)
            self._gaps.clear()

    def finish(self, item: Chunk) -> Usage:
        """The usage of the stream, given its last chunk (the one with a finish reason):
        the runtime's counts where it reports them, else what was streamed."""
        self.flush()
        end = time.perf_counter()
        first = self._first
        completion = item.completion_tokens if item.completion_tokens is not None \
            else self._tokens
        rate = self._tokens / (end - first) if first is not None and end > first else 0.0
        return Usage(item.prompt_tokens or 0, completion,
                     ((first or end) - self._received) * 1000, rate)


@dataclass(frozen=True)
class Embedded:
    """Embeddings of a call: one row of ``matrix`` per input, the model that made them."""

    matrix: Float32Array
    model: str
    prompt_tokens: int


async def embed(router: InferenceRouter, inputs: Sequence[EmbedInput],
                time_remaining: float | None, *, normalize: bool = True,
                model: str = "", lane: Lane | None = None) -> Embedded:
    """Embed ``inputs`` (already validated) with the embedding model ``model`` ("": the
    role's default), waiting in ``lane`` (None: the one the client asked for).

    Raises:
        InvalidArgument: an input longer than the model's context (naming its index).
        Draining, Disabled, ChildNotReadyError, Overloaded, DeadlineUnmeetable: see
            :meth:`daemon.models.router.InferenceRouter.admit`.
        ChildRequestError: the child failed.
    """
    async with router.admit(Role.EMBEDDING, time_remaining, model=model,
                            lane=lane or lanes.asked()) as backend:
        ctx = backend.context_tokens
        await _check_context(backend, inputs, ctx)
        try:
            result = await backend.embed(inputs)
        except ChildRequestError as exc:
            # llama.cpp answers 500 when an input exceeds the context / micro-batch.
            if exc.status == 500 and "too large" in str(exc).lower():
                raise InvalidArgument(
                    f"a text is longer than the embedding model's context "
                    f"({ctx or '?'} tokens); split it", field="texts") from exc
            raise
    matrix = l2_rows(result.matrix) if normalize else result.matrix
    return Embedded(matrix, backend.model_name, result.prompt_tokens)


async def _check_context(backend: InferenceBackend, inputs: Sequence[EmbedInput],
                         ctx: int) -> None:
    """Refuse an input longer than the embedding context (``ctx`` tokens), naming it.

    The bundled runtime silently truncates such a text and llama-server fails the whole
    batch; both hide which input was at fault. A WordPiece/BPE token covers at least
    one character, so only texts longer than the context (in characters) need the
    tokenizer's count. An endpoint without a tokenizer is left to judge for itself.
    """
    if not ctx:
        return
    for i, item in enumerate(inputs):
        if not isinstance(item, str):
            count = len(item)
        elif len(item) + 2 <= ctx:
            continue
        else:
            try:
                count = len(await backend.tokenize(item, add_special=True))
            except TokenizeUnavailableError:
                return
        if count > ctx:
            raise InvalidArgument(
                f"texts[{i}] has {count} tokens; the embedding model's context is {ctx} "
                "tokens: split it", field=f"texts[{i}]")


def l2_rows(matrix: Float32Array) -> Float32Array:
    """Each row scaled to unit length (computed in float64); an all-zero row is kept."""
    wide = matrix.astype(np.float64)
    norms = np.sqrt(np.einsum("ij,ij->i", wide, wide))[:, None]
    unit: Float32Array = np.divide(wide, norms, out=wide, where=norms > 0).astype(np.float32)
    return unit
