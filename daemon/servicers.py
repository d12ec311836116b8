"""gRPC servicer of InferenceService (ControlService is in :mod:`daemon.control`).

Handlers validate, ask the router for the role's current backend
(:class:`daemon.backend.InferenceBackend`), call it, and translate. They
hold no state of their own; errors are mapped in :mod:`daemon.errors` by the wrappers of
:mod:`daemon.rpc`, which also write the one summary line per call.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import numpy as np
from google.protobuf import timestamp_pb2

from llamad_protocol.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from supervisor import (
    ChildRequestError,
    Chunk,
    Sampling,
    TokenizeUnavailableError,
    TokenLogprob,
    TokenLogprobs,
)

from . import rpc, validation
from .backend import InferenceBackend
from .config import Limits
from .errors import InvalidArgument
from .metrics import Metrics
from .router import InferenceRouter

Float32Array = np.ndarray[Any, np.dtype[np.float32]]

ROLE_NAMES: dict[int, str] = {
    common_pb2.CHILD_ROLE_GENERATION: "generation",
    common_pb2.CHILD_ROLE_EMBEDDING: "embedding",
}
ROLE_ENUMS: dict[str, common_pb2.ChildRole.ValueType] = {
    "generation": common_pb2.CHILD_ROLE_GENERATION,
    "embedding": common_pb2.CHILD_ROLE_EMBEDDING,
}
_FINISH = {
    "stop": inference_pb2.FINISH_REASON_STOP,
    "length": inference_pb2.FINISH_REASON_LENGTH,
}

def _role(value: int, default: str = "generation") -> str:
    if value == common_pb2.CHILD_ROLE_UNSPECIFIED:
        return default
    try:
        return ROLE_NAMES[value]
    except KeyError:
        raise InvalidArgument(f"unknown role {value}") from None


def _timestamp(seconds: float) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


class InferenceServicer(inference_pb2_grpc.InferenceServiceServicer):
    """Generate, Chat, Embed and Tokenize, served by the current children."""

    def __init__(self, router: InferenceRouter, limits: Limits,
                 metrics: Metrics | None = None) -> None:
        self._router = router
        self._limits = limits
        self.metrics = metrics

    def set_limits(self, limits: Limits) -> None:
        """Apply new request limits (a reload); calls already running keep theirs."""
        self._limits = limits

    async def _stream(
        self,
        chunks: AsyncIterator[Chunk],
        model: str,
        call: rpc.Call,
        received: float,
    ) -> AsyncIterator[inference_pb2.GenerateResponse]:
        first: float | None = None
        last = 0.0
        tokens = 0
        metrics = self.metrics
        async for item in chunks:
            if item.finish_reason is None:
                now = time.perf_counter()
                if metrics is not None:
                    metrics.tokens("generation", item.tokens)
                    if first is None:
                        metrics.time_to_first_token("generation", now - received)
                    else:
                        metrics.inter_token("generation", now - last)
                last = now
                if first is None:
                    first = now
                tokens += item.tokens
                msg = inference_pb2.GenerateResponse(text=item.text, tokens=item.tokens,
                                                     model=model)
                if item.logprobs:
                    msg.logprobs.extend(_logprobs(entry) for entry in item.logprobs)
                yield msg
                continue
            end = time.perf_counter()
            completion = item.completion_tokens if item.completion_tokens is not None else tokens
            prompt_tokens = item.prompt_tokens or 0
            ttft = ((first or end) - received) * 1000
            rate = tokens / (end - first) if first is not None and end > first else 0.0
            call.note(tokens=completion, prompt_tokens=prompt_tokens,
                      ttft_ms=round(ttft, 2), finish=item.finish_reason)
            yield inference_pb2.GenerateResponse(
                text=item.text,
                tokens=item.tokens,
                model=model,
                finish_reason=_FINISH.get(item.finish_reason, inference_pb2.FINISH_REASON_STOP),
                usage=inference_pb2.Usage(
                    prompt_tokens=prompt_tokens,
                    completion_tokens=completion,
                    total_tokens=prompt_tokens + completion,
                    time_to_first_token_ms=ttft,
                    tokens_per_second=rate,
                ),
            )

    async def _generate(
        self,
        params: inference_pb2.SamplingParams,
        context: grpc.aio.ServicerContext,
        call: rpc.Call,
        start: Callable[[InferenceBackend, Sampling], AsyncIterator[Chunk]],
        *,
        chat: bool,
    ) -> AsyncIterator[inference_pb2.GenerateResponse]:
        """Validate the sampling, refuse by name the parameters the role's runtime cannot
        take (before queueing, and again once admitted: a swap or a mode switch may have
        changed it meanwhile), admit the call on the generation role, start its stream
        there and relay it (time to first token counts from here)."""
        received = time.perf_counter()
        sampling = validation.sampling(params, self._limits)
        call.note(max_tokens=sampling.max_tokens)
        requested = sampling.requested()
        if requested:
            call.note(controls=",".join(requested))
            sampling.check(self._router.backend("generation").dialect, chat=chat)
        async with self._router.admit("generation", context.time_remaining()) as backend:
            if requested:
                sampling.check(backend.dialect, chat=chat)
            async for msg in self._stream(start(backend, sampling), backend.model_name, call,
                                          received):
                yield msg

    @rpc.stream("Generate")
    async def Generate(
        self,
        request: inference_pb2.GenerateRequest,
        context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> AsyncIterator[inference_pb2.GenerateResponse]:
        prompt = validation.prompt(request, self._limits)
        call.note(prompt_chars=len(prompt))
        async for msg in self._generate(
                request.sampling, context, call,
                lambda backend, sampling: backend.stream_completion(prompt, sampling),
                chat=False):
            yield msg

    @rpc.stream("Chat")
    async def Chat(
        self,
        request: inference_pb2.ChatRequest,
        context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> AsyncIterator[inference_pb2.GenerateResponse]:
        messages = validation.chat_messages(request, self._limits)
        call.note(messages=len(messages))
        async for msg in self._generate(
                request.sampling, context, call,
                lambda backend, sampling: backend.stream_chat(messages, sampling),
                chat=True):
            yield msg

    @rpc.unary("Embed")
    async def Embed(
        self,
        request: inference_pb2.EmbedRequest,
        context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> inference_pb2.EmbedResponse:
        texts = validation.embed_texts(request.texts, self._limits)
        call.note(texts=len(texts))
        async with self._router.admit("embedding", context.time_remaining()) as backend:
            ctx = backend.context_tokens
            await self._check_embed_context(backend, texts, ctx)
            try:
                result = await backend.embed(texts)
            except ChildRequestError as exc:
                # llama.cpp answers 500 when an input exceeds the context / micro-batch.
                if exc.status == 500 and "too large" in str(exc).lower():
                    raise InvalidArgument(
                        f"a text is longer than the embedding model's context "
                        f"({ctx or '?'} tokens); split it"
                    ) from exc
                raise
        normalize = request.normalize if request.HasField("normalize") else True
        matrix = _l2_rows(result.matrix) if normalize else result.matrix
        dim = int(matrix.shape[1]) if matrix.size else 0
        call.note(dimension=dim, prompt_tokens=result.prompt_tokens)
        return inference_pb2.EmbedResponse(
            embeddings=[_embedding(row) for row in matrix],
            model=backend.model_name,
            dimension=dim,
            prompt_tokens=result.prompt_tokens,
        )

    async def _check_embed_context(self, backend: InferenceBackend, texts: list[str],
                                   ctx: int) -> None:
        """Refuse a text longer than the embedding context (``ctx`` tokens), naming it.

        The bundled runtime silently truncates such a text and llama-server fails the whole
        batch; both hide which input was at fault. A WordPiece/BPE token covers at least
        one character, so only texts longer than the context (in characters) need the
        tokenizer's count. An endpoint without a tokenizer is left to judge for itself.
        """
        if not ctx:
            return
        for i, text in enumerate(texts):
            if len(text) + 2 <= ctx:
                continue
            try:
                count = len(await backend.tokenize(text, add_special=True))
            except TokenizeUnavailableError:
                return
            if count > ctx:
                raise InvalidArgument(
                    f"texts[{i}] has {count} tokens; the embedding model's context is {ctx} "
                    "tokens: split it"
                )

    @rpc.unary("Tokenize")
    async def Tokenize(
        self,
        request: inference_pb2.TokenizeRequest,
        context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> inference_pb2.TokenizeResponse:
        role = _role(request.role)
        if len(request.text) > self._limits.max_prompt_chars:
            raise InvalidArgument(
                f"text has {len(request.text)} characters; the limit is "
                f"{self._limits.max_prompt_chars} (limits.max_prompt_chars)"
            )
        backend = self._router.backend(role)
        tokens = await backend.tokenize(request.text, add_special=request.add_special)
        call.note(role=role, tokens=len(tokens))
        return inference_pb2.TokenizeResponse(
            tokens=tokens, count=len(tokens), model=backend.model_name
        )


def _token(token: TokenLogprob) -> inference_pb2.TokenLogprob:
    msg = inference_pb2.TokenLogprob(token=token.token, logprob=token.logprob,
                                     bytes=token.bytes)
    if token.id is not None:
        msg.id = token.id
    return msg


def _logprobs(entry: TokenLogprobs) -> inference_pb2.TokenLogprobs:
    return inference_pb2.TokenLogprobs(chosen=_token(entry.chosen),
                                       top_logprobs=[_token(t) for t in entry.top])


def _l2_rows(matrix: Float32Array) -> Float32Array:
    """Each row scaled to unit length (computed in float64); an all-zero row is kept."""
    wide = matrix.astype(np.float64)
    norms = np.sqrt(np.einsum("ij,ij->i", wide, wide))[:, None]
    unit: Float32Array = np.divide(wide, norms, out=wide, where=norms > 0).astype(np.float32)
    return unit


def _embedding(row: Float32Array) -> inference_pb2.Embedding:
    """An Embedding message straight from the float32 values.

    ``values`` is a packed ``repeated float`` (field 1): on the wire, the tag byte 0x0A,
    the byte length as a varint, then the little-endian float32s. Parsing those bytes
    fills the field in C, without a Python float per value.
    """
    raw = row.astype("<f4", copy=False).tobytes()
    return inference_pb2.Embedding.FromString(b"\x0a" + _varint(len(raw)) + raw)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)
