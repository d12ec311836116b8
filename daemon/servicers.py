"""gRPC servicers: InferenceService and ControlService.

Handlers validate, ask the router for the current client, call it, and translate. They
hold no state of their own; errors are mapped in :mod:`daemon.errors` by the wrappers of
:mod:`daemon.rpc`, which also write the one summary line per call.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Callable, Mapping

import grpc
from google.protobuf import timestamp_pb2

from clients._pb import common_pb2, control_pb2, control_pb2_grpc, inference_pb2, inference_pb2_grpc
from supervisor import (
    BreakerState,
    ChildRequestError,
    Chunk,
    ExitCause,
    InferenceClient,
    LogLine,
    State,
    SwapInProgressError,
    SwapProgress,
    SwapRefusedError,
)

from . import rpc, validation
from .children import ManagedChild
from .config import Limits
from .errors import InvalidArgument
from .metrics import Metrics
from .router import InferenceRouter
from .swaps import SwapManager, SwapPlan, check_plan_model

ROLE_NAMES: dict[int, str] = {
    common_pb2.CHILD_ROLE_GENERATION: "generation",
    common_pb2.CHILD_ROLE_EMBEDDING: "embedding",
}
ROLE_ENUMS: dict[str, common_pb2.ChildRole] = {
    "generation": common_pb2.CHILD_ROLE_GENERATION,
    "embedding": common_pb2.CHILD_ROLE_EMBEDDING,
}
_FINISH = {
    "stop": inference_pb2.FINISH_REASON_STOP,
    "length": inference_pb2.FINISH_REASON_LENGTH,
}
_STATES = {
    State.IDLE: control_pb2.CHILD_STATE_IDLE,
    State.STARTING: control_pb2.CHILD_STATE_STARTING,
    State.RUNNING: control_pb2.CHILD_STATE_RUNNING,
    State.BACKOFF: control_pb2.CHILD_STATE_BACKOFF,
    State.FAILED: control_pb2.CHILD_STATE_FAILED,
    State.STOPPED: control_pb2.CHILD_STATE_STOPPED,
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
                yield inference_pb2.GenerateResponse(text=item.text, tokens=item.tokens,
                                                     model=model)
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

    @rpc.stream("Generate")
    async def Generate(
        self,
        request: inference_pb2.GenerateRequest,
        context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> AsyncIterator[inference_pb2.GenerateResponse]:
        received = time.perf_counter()
        prompt = validation.prompt(request, self._limits)
        sampling = validation.sampling(request.sampling, self._limits)
        call.note(prompt_chars=len(prompt), max_tokens=sampling.max_tokens)
        async with self._router.admit("generation", context.time_remaining()) as client:
            model = self._router.model_name("generation")
            async for msg in self._stream(client.stream_completion(prompt, sampling), model,
                                          call, received):
                yield msg

    @rpc.stream("Chat")
    async def Chat(
        self,
        request: inference_pb2.ChatRequest,
        context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> AsyncIterator[inference_pb2.GenerateResponse]:
        received = time.perf_counter()
        messages = validation.chat_messages(request, self._limits)
        sampling = validation.sampling(request.sampling, self._limits)
        call.note(messages=len(messages), max_tokens=sampling.max_tokens)
        async with self._router.admit("generation", context.time_remaining()) as client:
            model = self._router.model_name("generation")
            async for msg in self._stream(client.stream_chat(messages, sampling), model, call,
                                          received):
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
        async with self._router.admit("embedding", context.time_remaining()) as client:
            await self._check_embed_context(client, texts)
            try:
                result = await client.embed(texts)
            except ChildRequestError as exc:
                # llama.cpp answers 500 when an input exceeds the context / micro-batch.
                if exc.status == 500 and "too large" in str(exc).lower():
                    raise InvalidArgument(
                        f"a text is longer than the embedding model's context "
                        f"({self._embed_context() or '?'} tokens); split it"
                    ) from exc
                raise
        normalize = request.normalize if request.HasField("normalize") else True
        vectors = [_l2(v) for v in result.vectors] if normalize else result.vectors
        dim = len(vectors[0]) if vectors else 0
        call.note(dimension=dim, prompt_tokens=result.prompt_tokens)
        return inference_pb2.EmbedResponse(
            embeddings=[inference_pb2.Embedding(values=v) for v in vectors],
            model=self._router.model_name("embedding"),
            dimension=dim,
            prompt_tokens=result.prompt_tokens,
        )

    def _embed_context(self) -> int:
        """Tokens one embedding input may have: the model's context, or less if configured."""
        child = self._router.child("embedding")
        model_ctx = child.model.info.context_length if child.model.info else 0
        configured = child.spec.ctx_size
        return min(c for c in (model_ctx, configured) if c) if (model_ctx or configured) else 0

    async def _check_embed_context(self, client: InferenceClient, texts: list[str]) -> None:
        """Refuse a text longer than the embedding context, naming it.

        The bundled runtime silently truncates such a text and llama-server fails the whole
        batch; both hide which input was at fault. A WordPiece/BPE token covers at least
        one character, so only texts longer than the context (in characters) need the
        tokenizer's count.
        """
        ctx = self._embed_context()
        if not ctx:
            return
        for i, text in enumerate(texts):
            if len(text) + 2 <= ctx:
                continue
            count = len(await client.tokenize(text, add_special=True))
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
        client = self._router.client(role)
        tokens = await client.tokenize(request.text, add_special=request.add_special)
        call.note(role=role, tokens=len(tokens))
        return inference_pb2.TokenizeResponse(
            tokens=tokens, count=len(tokens), model=self._router.model_name(role)
        )


def _l2(vector: list[float]) -> list[float]:
    norm = math.sqrt(math.fsum(x * x for x in vector))
    return [x / norm for x in vector] if norm > 0 else vector


def _exit_cause(cause: ExitCause | None) -> control_pb2.ExitCause | None:
    if cause is None:
        return None
    msg = control_pb2.ExitCause(
        kind=cause.kind, signal=cause.signal, permanent=cause.permanent,
        message=cause.message, at=_timestamp(cause.at),
    )
    if cause.exit_code is not None:
        msg.exit_code = cause.exit_code
    return msg


def _log_line(role: str, line: LogLine) -> control_pb2.LogLine:
    return control_pb2.LogLine(
        role=ROLE_ENUMS[role], pid=line.pid, stream=line.stream, text=line.text,
        time=_timestamp(line.time), seq=line.seq,
    )


_SWAP_STAGES = {
    "validating": control_pb2.SWAP_STAGE_VALIDATING,
    "launching": control_pb2.SWAP_STAGE_LAUNCHING,
    "loading": control_pb2.SWAP_STAGE_LOADING,
    "probing": control_pb2.SWAP_STAGE_PROBING,
    "swapping": control_pb2.SWAP_STAGE_SWAPPING,
    "draining": control_pb2.SWAP_STAGE_DRAINING,
    "done": control_pb2.SWAP_STAGE_DONE,
    "failed": control_pb2.SWAP_STAGE_FAILED,
}


class ControlServicer(control_pb2_grpc.ControlServiceServicer):
    """Status, TailLogs, Swap and Reset."""

    def __init__(
        self,
        children: Mapping[str, ManagedChild],
        version: str,
        started: float,
        draining: Callable[[], bool],
        *,
        swaps: SwapManager,
        metrics: Metrics | None = None,
    ) -> None:
        self._children = children
        self._version = version
        self._started = started
        self._draining = draining
        self._swaps = swaps
        self.metrics = metrics

    def child_status(self, role: str) -> control_pb2.ChildStatus:
        child = self._children.get(role)
        if child is None:
            return control_pb2.ChildStatus(role=ROLE_ENUMS[role], enabled=False,
                                           state=control_pb2.CHILD_STATE_STOPPED)
        sup = child.supervisor
        info = child.model.info
        status = control_pb2.ChildStatus(
            role=ROLE_ENUMS[role],
            state=_STATES[sup.state],
            pid=sup.pid,
            model_path=str(child.spec.model),
            model_sha256=child.model.sha256,
            runtime=child.runtime.name,
            port=sup.port,
            uptime_seconds=sup.uptime(),
            restarts=sup.restarts,
            breaker=(control_pb2.BREAKER_STATE_OPEN if sup.breaker.state is BreakerState.OPEN
                     else control_pb2.BREAKER_STATE_CLOSED),
            consecutive_failures=sup.breaker.failures,
            enabled=True,
            model_architecture=info.architecture if info else "",
            model_context_length=info.context_length if info else 0,
            in_flight=child.admission.in_flight,
            queued=child.admission.queued,
            slots=child.admission.limit,
        )
        cause = _exit_cause(sup.last_exit)
        if cause is not None:
            status.last_exit.CopyFrom(cause)
        if child.previous is not None:
            status.previous_model_path = str(child.previous.spec.model)
        if child.last_swap is not None:
            swap = child.last_swap
            status.last_swap.CopyFrom(control_pb2.SwapInfo(
                from_model=swap.old, to_model=swap.new, at=_timestamp(swap.at),
                reason=swap.reason, duration_seconds=swap.seconds,
            ))
        return status

    @rpc.unary("Status")
    async def Status(
        self,
        request: control_pb2.StatusRequest,
        context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> control_pb2.StatusResponse:
        return control_pb2.StatusResponse(
            children=[self.child_status(r) for r in ("generation", "embedding")],
            version=self._version,
            daemon_uptime_seconds=time.monotonic() - self._started,
            draining=self._draining(),
        )

    @rpc.stream("Swap")
    async def Swap(
        self,
        request: control_pb2.SwapRequest,
        context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> AsyncIterator[control_pb2.SwapProgress]:
        role = _role(request.role)
        if role not in self._children:
            raise InvalidArgument(f"the {role} child is disabled; it cannot be swapped")
        check_plan_model(request.model_path)
        if request.HasField("ctx_size") and request.ctx_size > 1 << 20:
            raise InvalidArgument("ctx_size must be at most 1048576")
        plan = SwapPlan(
            model=request.model_path,
            extra_args=tuple(request.extra_args.split()) if request.HasField("extra_args")
            else None,
            ctx_size=request.ctx_size if request.HasField("ctx_size") else None,
            rollback=request.rollback,
            stop_old_first=request.stop_old_first,
            reason=request.reason[:200],
        )
        call.note(role=role, rollback=plan.rollback)
        began = time.monotonic()
        queue: asyncio.Queue[SwapProgress | None] = asyncio.Queue()

        async def run() -> None:
            outcome = "failed"
            try:
                await self._swaps.swap(role, plan, queue.put_nowait)
                outcome = "ok"
            except (SwapInProgressError, SwapRefusedError, InvalidArgument):
                outcome = "rejected"
                raise
            finally:
                if self.metrics is not None:
                    self.metrics.swap(role, outcome, time.monotonic() - began)
                queue.put_nowait(None)

        task = asyncio.create_task(run(), name=f"swap-{role}")
        try:
            while (event := await queue.get()) is not None:
                msg = control_pb2.SwapProgress(
                    stage=_SWAP_STAGES.get(event.stage, control_pb2.SWAP_STAGE_UNSPECIFIED),
                    message=event.message,
                    elapsed_seconds=time.monotonic() - began,
                )
                cause = _exit_cause(event.cause)
                if cause is not None:
                    msg.cause.CopyFrom(cause)
                yield msg
            await task  # raises the swap's error, mapped by the wrapper
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    @rpc.unary("Reset")
    async def Reset(
        self,
        request: control_pb2.ResetRequest,
        context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> control_pb2.ResetResponse:
        role = _role(request.role)
        child = self._children.get(role)
        if child is None:
            raise InvalidArgument(f"the {role} child is disabled")
        child.supervisor.reset()
        call.note(role=role)
        return control_pb2.ResetResponse(state=_STATES[child.supervisor.state])

    @rpc.stream("TailLogs")
    async def TailLogs(
        self,
        request: control_pb2.TailLogsRequest,
        context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> AsyncIterator[control_pb2.LogLine]:
        role = _role(request.role)
        child = self._children.get(role)
        if child is None:
            raise InvalidArgument(f"the {role} child is disabled; it has no logs")
        call.note(role=role, follow=request.follow)
        if request.follow:
            async for line in child.ring.follow(request.lines):
                yield _log_line(role, line)
        else:
            for line in child.ring.tail(request.lines):
                yield _log_line(role, line)
