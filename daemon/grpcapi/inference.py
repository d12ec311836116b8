"""gRPC servicer of InferenceService (ControlService is in :mod:`daemon.grpcapi.control`).

Handlers validate, ask the router for the role's current backend
(:class:`daemon.models.backend.InferenceBackend`), call it, and translate. They
hold no state of their own; errors are mapped in :mod:`daemon.errors` by the wrappers of
:mod:`daemon.grpcapi.rpc`, which also write the one summary line per call.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable

import grpc
from google.protobuf import timestamp_pb2

from llamad_protocol.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from supervisor import Chunk, Sampling, TokenLogprob, TokenLogprobs, ToolCallDelta

from ..checks import tools, validation
from ..config import Limits, Role
from ..errors import InvalidArgument
from ..models.backend import InferenceBackend
from ..models.router import InferenceRouter
from ..services.inference import Float32Array, Meter, Usage, admitted_generation, embed
from ..telemetry.metrics import Metrics
from . import rpc

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
    "tool_calls": inference_pb2.FINISH_REASON_TOOL_CALLS,
}

def _role(value: int, default: str = Role.GENERATION) -> str:
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

    async def _generate(
        self,
        params: inference_pb2.SamplingParams,
        context: grpc.aio.ServicerContext,
        call: rpc.Call,
        start: Callable[[InferenceBackend, Sampling], AsyncIterator[Chunk]],
        *,
        chat: bool,
        model: str = "",
    ) -> None:
        """Validate the sampling, admit the call on the generation role (refusing by name
        the controls its runtime cannot take:
        :func:`daemon.services.inference.admitted_generation`), start its stream there and relay it
        (time to first token counts from here).

        Each message is sent with ``context.write`` from this one coroutine: no generator
        of ours runs per message (issue 27: at a model's pace every layer runs once per
        token on a cold process). A write returns once grpc has taken the message, so
        what the child sends meanwhile is read as one chunk, one message."""
        received = time.perf_counter()
        sampling = validation.sampling(
            params, self._limits,
            defaults=validation.chat_defaults(self._limits) if chat else None)
        name = self._router.model_name(Role.GENERATION, model)
        meter = Meter(self.metrics, received, name)
        call.note(max_tokens=sampling.max_tokens, model=name)
        async with admitted_generation(self._router, sampling, context.time_remaining(),
                                       chat=chat, note=call.note, model=model) as backend:
            chunks = start(backend, sampling)
            served = backend.model_name
            write = context.write
            try:
                async for item in chunks:
                    if item.finish_reason is None:
                        meter.piece(item)
                        await write(_piece(item, served, name))
                        continue
                    usage = meter.finish(item)
                    call.note(tokens=usage.completion_tokens,
                              prompt_tokens=usage.prompt_tokens,
                              ttft_ms=round(usage.ttft_ms, 2), finish=item.finish_reason)
                    await write(_last(item, usage, served, name))
            finally:
                meter.flush()  # a stream left early: what it streamed still counts
                call.fields.setdefault("tokens", meter.streamed)  # its line, its quota
                await chunks.aclose()  # type: ignore[attr-defined]

    # The generated stub types a streaming method as a generator; grpc.aio takes a
    # coroutine that writes as well (rpc.writes).
    @rpc.writes("Generate")
    async def Generate(  # type: ignore[override]
        self,
        request: inference_pb2.GenerateRequest,
        context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> None:
        prompt = validation.prompt(request, self._limits)
        call.note(prompt_chars=len(prompt))
        await self._generate(
            request.sampling, context, call,
            lambda backend, sampling: backend.stream_completion(prompt, sampling),
            chat=False, model=request.model)

    @rpc.writes("Chat")
    async def Chat(  # type: ignore[override]
        self,
        request: inference_pb2.ChatRequest,
        context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> None:
        messages = validation.chat_messages(request, self._limits)
        offered = tools.chat_tools(request, self._limits)
        call.note(messages=len(messages))
        if offered is not None:
            call.note(tools=len(offered.tools), tool_choice=offered.choice)
        await self._generate(
            request.sampling, context, call,
            lambda backend, sampling: backend.stream_chat(messages, sampling, offered),
            chat=True, model=request.model)

    @rpc.unary("Embed")
    async def Embed(
        self,
        request: inference_pb2.EmbedRequest,
        context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> inference_pb2.EmbedResponse:
        texts = validation.embed_texts(request.texts, self._limits)
        call.note(texts=len(texts))
        normalize = request.normalize if request.HasField("normalize") else True
        name = self._router.model_name(Role.EMBEDDING, request.model)
        result = await embed(self._router, texts, context.time_remaining(),
                             normalize=normalize, model=request.model)
        matrix = result.matrix
        dim = int(matrix.shape[1]) if matrix.size else 0
        call.note(dimension=dim, prompt_tokens=result.prompt_tokens)
        return inference_pb2.EmbedResponse(
            embeddings=[_embedding(row) for row in matrix],
            model=result.model,
            dimension=dim,
            prompt_tokens=result.prompt_tokens,
            model_name=name,
        )

    @rpc.unary("Tokenize")
    async def Tokenize(
        self,
        request: inference_pb2.TokenizeRequest,
        context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> inference_pb2.TokenizeResponse:
        self._within_limit(len(request.text), "characters", "text")
        role, name, backend = await self._tokenizer(request, context)
        tokens = await backend.tokenize(request.text, add_special=request.add_special)
        call.note(role=role, tokens=len(tokens), model=name)
        return inference_pb2.TokenizeResponse(
            tokens=tokens, count=len(tokens), model=backend.model_name, model_name=name
        )

    @rpc.unary("Detokenize")
    async def Detokenize(
        self,
        request: inference_pb2.DetokenizeRequest,
        context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> inference_pb2.DetokenizeResponse:
        self._within_limit(len(request.tokens), "ids", "tokens")
        role, name, backend = await self._tokenizer(request, context)
        text = await backend.detokenize(list(request.tokens))
        call.note(role=role, tokens=len(request.tokens), model=name)
        return inference_pb2.DetokenizeResponse(text=text, model=backend.model_name,
                                                model_name=name)

    def _within_limit(self, size: int, unit: str, field: str) -> None:
        if size > self._limits.max_prompt_chars:
            raise InvalidArgument(f"{field} has {size} {unit}; the limit is "
                                  f"{self._limits.max_prompt_chars} (limits.max_prompt_chars)",
                                  field=field)

    async def _tokenizer(
        self, request: inference_pb2.TokenizeRequest | inference_pb2.DetokenizeRequest,
        context: grpc.aio.ServicerContext,
    ) -> tuple[str, str, InferenceBackend]:
        """The role, served name and backend whose tokenizer the request names."""
        # A model named without a role: its own role.
        role = (self._router.role_of(request.model) if request.model and not request.role
                else _role(request.role))
        name = self._router.model_name(role, request.model)
        return role, name, await self._router.backend_of(role, request.model,
                                                         context.time_remaining())


def _piece(item: Chunk, model: str, name: str) -> inference_pb2.GenerateResponse:
    """The message of a chunk without a finish reason."""
    msg = inference_pb2.GenerateResponse(text=item.text, tokens=item.tokens, model=model,
                                         model_name=name)
    if item.logprobs:
        msg.logprobs.extend(_logprobs(entry) for entry in item.logprobs)
    if item.tool_calls:
        msg.tool_calls.extend(_tool_call(delta) for delta in item.tool_calls)
    return msg


def _last(item: Chunk, usage: Usage, model: str, name: str) -> inference_pb2.GenerateResponse:
    """The message of the last chunk: its finish reason and the stream's usage."""
    return inference_pb2.GenerateResponse(
        text=item.text,
        tokens=item.tokens,
        model=model,
        model_name=name,
        finish_reason=_FINISH.get(item.finish_reason or "", inference_pb2.FINISH_REASON_STOP),
        usage=inference_pb2.Usage(
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            total_tokens=usage.total_tokens,
            time_to_first_token_ms=usage.ttft_ms,
            tokens_per_second=usage.tokens_per_second,
        ),
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


def _tool_call(delta: ToolCallDelta) -> inference_pb2.ToolCallDelta:
    return inference_pb2.ToolCallDelta(index=delta.index, id=delta.id, name=delta.name,
                                       arguments=delta.arguments)


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
