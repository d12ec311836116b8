"""The load of ``bench.bench_swap``: clients streaming completions, each attempt recorded."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from dataclasses import dataclass

import grpc

from bench._support import PROMPTS, RETRY_KEY, RETRYABLE
from llamad_protocol.v1 import inference_pb2, inference_pb2_grpc

# -- the load ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Attempt:
    """One Generate call, timed on the client (perf_counter)."""

    client: int
    request: int  # the client's request number; retries of a request share it
    retry: int  # 0 for the first try
    prompt: int
    start: float
    end: float
    code: str  # "OK" or the status code's name
    first: float  # first non-empty text, 0.0 if none
    tokens: int  # messages that carried text
    model: str  # GenerateResponse.model of the last message
    text: str
    retry_after_ms: int | None  # trailing metadata retry-after-ms, when sent
    details: str

    @property
    def latency(self) -> float:
        return self.end - self.start

    @property
    def ttft(self) -> float:
        return self.first - self.start if self.first else math.nan


class Load:
    """``clients`` grpc.aio clients sending greedy Generate calls back to back.

    A client retries a call refused with UNAVAILABLE or RESOURCE_EXHAUSTED after the
    hinted delay (``retry-after-ms``; 1 s without one); any other failure is recorded and
    the client moves on to its next call after 0.5 s.
    """

    def __init__(self, address: str, *, clients: int, max_tokens: int, deadline: float) -> None:
        self.channel = grpc.aio.insecure_channel(address)
        self.stub = inference_pb2_grpc.InferenceServiceStub(self.channel)
        self.clients = clients
        self.max_tokens = max_tokens
        self.deadline = deadline
        self.attempts: list[Attempt] = []
        self.first_tokens: list[tuple[float, float]] = []  # (call sent, first text), live
        self._running: dict[int, float] = {}  # client -> when its current call was sent
        self._ended = asyncio.Condition()  # notified whenever a call ends
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._client(c), name=f"load-{c}")
                       for c in range(self.clients)]

    async def stop(self) -> None:
        """No new calls; wait for the running ones (each bounded by its deadline)."""
        self._stop.set()
        await asyncio.gather(*self._tasks)
        await self.channel.close()

    async def settled(self, before: float) -> None:
        """Wait until no call sent before ``before`` is still running."""
        async with self._ended:
            await self._ended.wait_for(
                lambda: all(sent >= before for sent in self._running.values()))

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)

    async def _client(self, cid: int) -> None:
        n = 0
        while not self._stop.is_set():
            prompt = (cid + n) % len(PROMPTS)
            retry = 0
            while not self._stop.is_set():
                a = await self._call(cid, n, retry, prompt)
                self.attempts.append(a)
                if a.code == "OK":
                    break
                if a.code not in RETRYABLE:
                    await self._pause(0.5)
                    break
                await self._pause(a.retry_after_ms / 1000 if a.retry_after_ms is not None
                                  else 1.0)
                retry += 1
            n += 1

    async def _call(self, cid: int, n: int, retry: int, prompt: int) -> Attempt:
        request = inference_pb2.GenerateRequest(
            prompt=PROMPTS[prompt],
            sampling=inference_pb2.SamplingParams(max_tokens=self.max_tokens, temperature=0.0))
        parts: list[str] = []
        first = 0.0
        model = ""
        code, hint, details = "OK", None, ""
        start = time.perf_counter()
        self._running[cid] = start
        try:
            async for msg in self.stub.Generate(request, timeout=self.deadline):
                if msg.text:
                    if not parts:
                        first = time.perf_counter()
                        self.first_tokens.append((start, first))
                    parts.append(msg.text)
                model = msg.model or model
        except grpc.aio.AioRpcError as exc:
            code = exc.code().name
            details = exc.details() or ""
            for key, value in exc.trailing_metadata() or ():
                if key == RETRY_KEY:
                    hint = int(value)
        finally:
            del self._running[cid]
            async with self._ended:
                self._ended.notify_all()
        return Attempt(cid, n, retry, prompt, start, time.perf_counter(), code, first,
                       len(parts), model, "".join(parts), hint, details)
