"""Measuring in ``bench.bench_http_relay``: the streamed chat requests, the paths and the
relays' own CPU time."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench._generation.common import Guard, Sample, Texts, sse_choices
from bench._support import CLK_TCK, cpu_snap
from llamad_protocol.v1 import inference_pb2, inference_pb2_grpc

DIRECT = "direct"
HTTP = "llamad HTTP"
GRPC = "llamad gRPC"
ROUTER = "router"


def process_ticks(pid: int) -> int:
    """utime + stime of process ``pid`` itself (all its threads, not its children), ticks."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


@dataclass
class Relay:
    """A path to the child and, for a relay, the process whose CPU time is its cost."""

    name: str
    pid: int | None = None  # the relaying process (None: direct)
    http: httpx.AsyncClient | None = None  # HTTP paths
    stub: inference_pb2_grpc.InferenceServiceStub | None = None  # gRPC
    model: str = ""  # the body's "model"


@dataclass
class Cpu:
    """A relay process's CPU time, summed over the requests of each path."""

    ticks: dict[tuple[str, str], int] = field(default_factory=dict)  # (process, path)
    tokens: dict[str, int] = field(default_factory=dict)  # path -> tokens streamed
    seconds: dict[str, float] = field(default_factory=dict)  # path -> wall time

    def add(self, proc: str, path: str, ticks: int) -> None:
        self.ticks[proc, path] = self.ticks.get((proc, path), 0) + ticks

    def per_1k(self, proc: str, path: str) -> float:
        """CPU ms of ``proc`` per 1,000 tokens streamed on ``path``."""
        tokens = self.tokens.get(path, 0)
        ticks = self.ticks.get((proc, path), 0)
        return ticks * 1000 / CLK_TCK / tokens * 1000 if tokens else float("nan")


def chat_body(model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    """One body for every HTTP path (only ``model`` differs; none for the child, as llamad
    sends it none): greedy, streamed."""
    body: dict[str, Any] = {"model": model} if model else {}
    return body | {"messages": [{"role": "user", "content": prompt}],
                   "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
                   "stream_options": {"include_usage": True}}


async def via_http(relay: Relay, prompt: str, max_tokens: int, rnd: int, i: int) -> Sample:
    """The same client code for the child, llamad's HTTP API and the router."""
    assert relay.http is not None
    texts = Texts()
    async for choice in sse_choices(relay.http, "/v1/chat/completions",
                                    chat_body(relay.model, prompt, max_tokens), relay.name):
        texts.add((choice.get("delta") or {}).get("content") or "")
    return texts.sample(relay.name, rnd, i)


async def via_grpc(relay: Relay, prompt: str, max_tokens: int, rnd: int, i: int) -> Sample:
    assert relay.stub is not None
    request = inference_pb2.ChatRequest(
        messages=[inference_pb2.ChatMessage(role=inference_pb2.CHAT_ROLE_USER, content=prompt)],
        sampling=inference_pb2.SamplingParams(max_tokens=max_tokens, temperature=0.0))
    texts = Texts()
    async for msg in relay.stub.Chat(request, timeout=300):
        texts.add(msg.text)
    return texts.sample(GRPC, rnd, i)


async def stream_one(relay: Relay, prompt: str, max_tokens: int, rnd: int, i: int) -> Sample:
    if relay.stub is not None:
        return await via_grpc(relay, prompt, max_tokens, rnd, i)
    return await via_http(relay, prompt, max_tokens, rnd, i)


@dataclass(frozen=True)
class Batch:
    """``clients`` requests sent at once on one path."""

    path: str
    round: int
    tokens: int  # over every request
    wall: float  # first request sent to the last text of any, s
    ttfts: list[float]  # each request's, s
    texts: list[str]

    @property
    def rate(self) -> float:
        return self.tokens / self.wall if self.wall > 0 else 0.0


class Meter:
    """Runs measurements, redoing the disturbed ones, and books the relays' CPU time."""

    def __init__(self, relays: Sequence[Relay], guard: Guard, cpu: Cpu) -> None:
        self.relays = relays
        self.guard = guard
        self.cpu = cpu
        self.procs = {r.name: r.pid for r in relays if r.pid is not None}

    def _ticks(self) -> dict[str, int]:
        return {name: process_ticks(pid) for name, pid in self.procs.items()}

    def _book(self, path: str, before: dict[str, int], tokens: int, seconds: float) -> None:
        after = self._ticks()
        for name in self.procs:
            self.cpu.add(name, path, after[name] - before[name])
        self.cpu.tokens[path] = self.cpu.tokens.get(path, 0) + tokens
        self.cpu.seconds[path] = self.cpu.seconds.get(path, 0.0) + seconds

    async def single(self, relay: Relay, prompts: Sequence[str], i: int, rnd: int,
                     max_tokens: int) -> Sample:
        """One request, redone (after an unmeasured request of the previous prompt, which
        restores the child's cache state) while other processes disturbed it."""
        redo = False
        while True:
            if redo:
                await self.guard.quiet()
                await stream_one(self.relays[0], prompts[(i - 1) % len(prompts)], 8, -1, -1)
            snap, ticks, began = cpu_snap(), self._ticks(), time.perf_counter()
            sample = await stream_one(relay, prompts[i], max_tokens, rnd, i)
            if rnd == 0:
                return sample
            if self.guard.kept(snap, f"round {rnd} prompt {i} via {relay.name}"):
                self._book(relay.name, ticks, sample.tokens, time.perf_counter() - began)
                return sample
            redo = True

    async def batch(self, relay: Relay, prompts: Sequence[str], rnd: int, clients: int,
                    max_tokens: int) -> Batch:
        """``clients`` requests at once (prompts in turn), redone while disturbed."""
        while True:
            snap, ticks, began = cpu_snap(), self._ticks(), time.perf_counter()
            samples = await asyncio.gather(*(
                stream_one(relay, prompts[k % len(prompts)], max_tokens, rnd, k)
                for k in range(clients)))
            wall = time.perf_counter() - began
            tokens = sum(s.tokens for s in samples)
            if rnd == 0 or self.guard.kept(snap, f"batch {rnd} via {relay.name}"):
                if rnd > 0:
                    self._book(f"{relay.name} x{clients}", ticks, tokens, wall)
                return Batch(relay.name, rnd, tokens, wall, [s.ttft for s in samples],
                             [s.text for s in samples])
            await self.guard.quiet()


GREEDY_CHAT = {  # Chat's defaults when a request sets none: greedy, no penalties
    "LLAMAD_LIMITS_CHAT_TEMPERATURE": "0", "LLAMAD_LIMITS_CHAT_TOP_P": "1",
    "LLAMAD_LIMITS_CHAT_MIN_P": "0", "LLAMAD_LIMITS_CHAT_REPEAT_PENALTY": "1",
    "LLAMAD_LIMITS_CHAT_DRY_MULTIPLIER": "0", "LLAMAD_LIMITS_CHAT_FREQUENCY_PENALTY": "0",
}


def spawn(command: Sequence[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``command`` in a session of its own, its output in ``log``."""
    with log.open("w") as out:
        return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)



def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def child_command(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_text().rstrip("\0").split("\0")


_DROP_WITH_VALUE = {"-m", "--model", "--port", "--host", "-a", "--alias"}


def router_command(child: Sequence[str], models_dir: Path, port: int, binary: str) -> list[str]:
    """llama-server in router mode with the child's own settings (threads, context, slots,
    ...), but no model of its own: it serves the models of ``models_dir``, one at a time."""
    args: list[str] = []
    skip = False
    for arg in child[1:]:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in _DROP_WITH_VALUE:
            skip = "=" not in arg
            continue
        args.append(arg)
    return [binary or child[0], "--models-dir", str(models_dir), "--models-max", "1",
            "--host", "127.0.0.1", "--port", str(port), *args]


def router_environ(child_pid: int) -> dict[str, str]:
    """This process's environment without LLAMAD_*, plus the child's own OpenMP settings
    (llamad sets ``GOMP_SPINCOUNT`` per role), so that the router's child runs alike."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMAD_")}
    raw = Path(f"/proc/{child_pid}/environ").read_bytes().decode(errors="replace")
    for item in raw.split("\0"):
        key, _, value = item.partition("=")
        if key.startswith(("GOMP_", "OMP_")):
            env[key] = value
    return env
