"""Measuring in ``bench.bench_relay_cost``: lean streaming clients for every path, and the
CPU time of the relaying processes.

CPU is read with ``clock_gettime`` on the process's CPU clock (``CLOCK_PROCESS_CPUTIME_ID``
of another process: ``((~pid) << 3) | 2``, the kernel's ``MAKE_PROCESS_CPUCLOCK``): the same
utime + stime that ``/proc/<pid>/stat`` shows, of every thread, in nanoseconds instead of
10 ms ticks, so that a short round is still measured exactly.

The clients cost little per token themselves (the HTTP ones are llamad's own lean loopback
client, :class:`supervisor.http._loopback.LoopbackHTTP`; the bench process's own CPU is reported
beside), so that on 2 cores they do not take the CPU the relay needs. Tokens are the
counts the stream reports in its usage (the child's, relayed), not events: a relay that
puts several tokens in one event or message is counted right.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import Any

import grpc
import orjson

from llamad_protocol.v1 import inference_pb2, inference_pb2_grpc
from supervisor.http import HTTPTransportError, LoopbackHTTP

DIRECT = "direct"
HTTP = "HTTP chat"
CHAT = "gRPC Chat"
GENERATE = "gRPC Generate"
ROUTER = "router"
RETRIES = 2  # a request dropped before any answer is sent again (counted)


def cpu_ns(pid: int) -> int:
    """CPU time (user + system, all threads) of process ``pid`` so far, ns."""
    return time.clock_gettime_ns(((~pid) << 3) | 2)


@dataclass(frozen=True)
class Stream:
    """One streamed request as its client saw it."""

    tokens: int  # the completion tokens its usage reports
    ttft: float  # request sent to the first text, s
    texts: int  # events or messages that carried text
    gap: float = float("nan")  # mean time between two of them, s (HTTP paths)


@dataclass
class Path:
    """A way to the token source: a name, how to stream one request on it, and the
    processes whose CPU it costs (name -> pid)."""

    name: str
    stream: Callable[[str, int], Awaitable[Stream]]
    processes: dict[str, int] = field(default_factory=dict)


def http_path(name: str, client: LoopbackHTTP, model: str, processes: dict[str, int]) -> Path:
    """Streamed chat completions from ``client`` (``model``: the body's, "" for none)."""

    async def stream(prompt: str, max_tokens: int) -> Stream:
        body: dict[str, Any] = {"model": model} if model else {}
        body |= {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                 "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
        sent = time.perf_counter()
        first = last = 0.0
        tokens = texts = 0
        async with client.stream("POST", "/v1/chat/completions", orjson.dumps(body),
                                 300.0) as answer:
            if answer.status != 200:
                raise RuntimeError(f"{name}: HTTP {answer.status}: {(await answer.read())[:300]!r}")
            pending = b""
            async for piece in answer.body:
                *events, pending = (pending + piece).split(b"\n\n")
                for event in events:
                    if not event.startswith(b"data: {"):
                        continue
                    data = orjson.loads(event[6:])
                    if "error" in data:
                        raise RuntimeError(f"{name}: {data['error']}")
                    usage = data.get("usage")
                    if usage:
                        tokens = int(usage["completion_tokens"])
                    for choice in data.get("choices") or ():
                        if (choice.get("delta") or {}).get("content"):
                            texts += 1
                            last = time.perf_counter()
                            first = first or last
        if not texts:
            raise RuntimeError(f"{name} streamed no text")
        gap = (last - first) / (texts - 1) if texts > 1 else float("nan")
        return Stream(tokens or texts, first - sent, texts, gap)

    return Path(name, stream, processes)


def grpc_path(name: str, stub: inference_pb2_grpc.InferenceServiceStub, *, chat: bool,
              processes: dict[str, int]) -> Path:
    """``Chat`` or ``Generate`` streams (grpc.aio)."""

    async def stream(prompt: str, max_tokens: int) -> Stream:
        sampling = inference_pb2.SamplingParams(max_tokens=max_tokens, temperature=0.0)
        sent = time.perf_counter()
        first = 0.0
        tokens = texts = 0
        if chat:
            calls = stub.Chat(inference_pb2.ChatRequest(
                messages=[inference_pb2.ChatMessage(role=inference_pb2.CHAT_ROLE_USER,
                                                    content=prompt)],
                sampling=sampling), timeout=300)
        else:
            calls = stub.Generate(inference_pb2.GenerateRequest(prompt=prompt,
                                                                sampling=sampling),
                                  timeout=300)
        async for msg in calls:
            if msg.text:
                texts += 1
                if not first:
                    first = time.perf_counter()
            if msg.HasField("usage"):
                tokens = msg.usage.completion_tokens
        if not texts:
            raise RuntimeError(f"{name} streamed no text")
        return Stream(tokens or texts, first - sent, texts)

    return Path(name, stream, processes)


@dataclass(frozen=True)
class Round:
    """``streams`` requests on one path, ``concurrency`` at a time."""

    path: str
    concurrency: int
    tokens: int
    wall: float  # s
    cpu: dict[str, float]  # process name -> CPU s during the round
    client_cpu: float  # this process's CPU s
    ttfts: list[float]
    retried: int = 0  # requests dropped before any answer and sent again
    gaps: list[float] = field(default_factory=list)  # each stream's mean gap, s (HTTP)

    def per_1k(self, process: str) -> float:
        """CPU ms of ``process`` per 1,000 tokens."""
        return self.cpu[process] * 1e6 / self.tokens if self.tokens else float("nan")

    def cores(self, process: str) -> float:
        return self.cpu[process] / self.wall if self.wall > 0 else 0.0

    @property
    def rate(self) -> float:
        return self.tokens / self.wall if self.wall > 0 else 0.0


async def measure(path: Path, concurrency: int, per_worker: int, max_tokens: int, *,
                  tag: str, every: dict[str, int]) -> Round:
    """``concurrency`` workers, each streaming ``per_worker`` requests back to back (each
    prompt different: ``tag``, the worker and the request); the CPU of every process in
    ``every`` (name -> pid) over the whole round."""

    retried: list[str] = []

    async def one(prompt: str) -> Stream:
        for attempt in range(RETRIES + 1):
            try:
                return await path.stream(prompt, max_tokens)
            except (HTTPTransportError, grpc.aio.AioRpcError) as exc:
                if attempt == RETRIES:
                    raise
                retried.append(f"{path.name}: {exc}")
                print(f"  {path.name}: {str(exc)[:200]}; once more", flush=True)
        raise AssertionError("unreachable")

    async def worker(w: int) -> list[Stream]:
        return [await one(f"{tag} worker {w} request {k}: tell a long story")
                for k in range(per_worker)]

    before = {name: cpu_ns(pid) for name, pid in every.items()}
    own = time.process_time()
    began = time.perf_counter()
    done = await asyncio.gather(*(worker(w) for w in range(concurrency)))
    wall = time.perf_counter() - began
    cpu = {name: (cpu_ns(pid) - before[name]) / 1e9 for name, pid in every.items()}
    streams = [s for batch in done for s in batch]
    return Round(path.name, concurrency, sum(s.tokens for s in streams), wall, cpu,
                 time.process_time() - own, [s.ttft for s in streams], len(retried),
                 [s.gap for s in streams if s.gap == s.gap])


def med(values: Sequence[float]) -> float:
    return median(values) if values else float("nan")
