"""What ``bench.bench_generation`` shares: measurements, the quiet-machine guard, the daemon."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench._daemon import Running
from bench._support import (
    CpuSnap,
    cpu_snap,
    foreign_cores,
)
from daemon import Daemon, load
from llamad_protocol.v1 import control_pb2
from supervisor import State, StateChange

START_MODELS = ("gemma-3-270m-q4_k_m.gguf", "SmolLM2-135M-Instruct.Q4_1.gguf")
RUNTIMES = ("llama-server", "bundled")
DEFAULT_THREADS = 2
POLL = 0.02  # seconds between retries and readiness polls of the bench itself
STREAM_HEADING = "## Generation streaming: llamad vs direct"
START_HEADING = "## Start and recovery"

# Completion prompts with different first words (so consecutive requests share no
# prefix) that invite long answers.
# -- measurements ----------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """One streamed request, timed on the client."""

    path: str  # "llamad" or "direct"
    round: int
    prompt: int
    ttft: float  # seconds from sending the request to the first non-empty text
    tokens: int  # messages/events that carried text (one token each)
    stream: float  # seconds from the first to the last text
    text: str
    server_ttft: float | None = None  # llamad's own TTFT (Usage), from its handler's start

    @property
    def rate(self) -> float:
        """Decode rate, tokens/s: the tokens after the first over the time they took."""
        return (self.tokens - 1) / self.stream if self.tokens > 1 and self.stream > 0 else 0.0


class Texts:
    """The texts of one streamed request as they arrive, timed on the client from the
    moment it is made (just before the request is sent)."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.sent = time.perf_counter()
        self.first = self.last = 0.0

    def add(self, text: str) -> None:
        """One message or event's text (empty ones do not count as tokens)."""
        if text:
            self.last = time.perf_counter()
            if not self.parts:
                self.first = self.last
            self.parts.append(text)

    def sample(self, path: str, rnd: int, i: int, server: float | None = None) -> Sample:
        """The request's :class:`Sample`; an error if nothing streamed."""
        if not self.parts:
            raise RuntimeError(f"{path} streamed no text for prompt {i}")
        return Sample(path, rnd, i, self.first - self.sent, len(self.parts),
                      self.last - self.first, "".join(self.parts), server)


async def sse_choices(http: httpx.AsyncClient, url: str, body: dict[str, Any],
                      name: str) -> AsyncIterator[dict[str, Any]]:
    """The ``choices`` of an OpenAI-style event stream (``data:`` lines up to ``[DONE]``);
    an error naming ``name`` on a status other than 200."""
    async with http.stream("POST", url, json=body) as resp:
        if resp.status_code != 200:
            await resp.aread()
            raise RuntimeError(f"{name}: HTTP {resp.status_code}: {resp.text[:200]}")
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                break
            for choice in json.loads(payload).get("choices") or ():
                yield choice


@dataclass
class StreamResult:
    runtime: str
    model: str
    samples: list[Sample]

    def of(self, path: str) -> list[Sample]:
        return [s for s in self.samples if s.path == path]

    def pairs(self) -> list[tuple[Sample, Sample]]:
        """(llamad, direct) samples of the same prompt and round."""
        direct = {(s.round, s.prompt): s for s in self.of("direct")}
        return [(s, direct[(s.round, s.prompt)]) for s in self.of("llamad")
                if (s.round, s.prompt) in direct]


@dataclass(frozen=True)
class StartSample:
    """One cold start of a fresh daemon."""

    ready: float  # Daemon.start() until RUNNING and health SERVING, s
    child: float  # supervisor STARTING -> RUNNING, s (launch + readiness probe)


@dataclass(frozen=True)
class KillSample:
    """One SIGKILL of the child, until a one-token Generate succeeds."""

    total: float  # kill until Generate OK, s
    detect: float  # kill until the supervisor entered BACKOFF, s
    backoff: float  # BACKOFF until STARTING (the jittered delay), s
    restart: float  # STARTING until RUNNING, s
    attempts: int  # Generate calls made (all but the last got UNAVAILABLE)


@dataclass
class StartResult:
    runtime: str
    model: str
    llamad: list[StartSample] = field(default_factory=list)
    direct: list[float] = field(default_factory=list)
    kills: list[KillSample] = field(default_factory=list)


# -- a shared machine: measure only while nothing else runs -------------------------------


@dataclass
class Guard:
    """Waits for a quiet machine, and tells whether a measurement was disturbed.

    Quiet: the CI log (if any) ends with an ``exit=`` line, and processes outside this
    benchmark used at most ``max_foreign`` cores over ``window`` seconds. A measurement
    during which they used more is disturbed, and is redone.
    """

    max_foreign: float = 0.05
    ci_log: Path | None = None
    window: float = 2.0
    waited: float = 0.0
    redone: int = 0
    worst: float = 0.0  # most foreign CPU seen in a kept measurement, cores

    def ci_busy(self) -> bool:
        if self.ci_log is None or not self.ci_log.is_file():
            return False
        lines = [ln for ln in self.ci_log.read_text(errors="replace").splitlines() if ln.strip()]
        return bool(lines) and not lines[-1].startswith("exit=")

    async def quiet(self) -> None:
        began = time.monotonic()
        told = 0.0
        while True:
            before = cpu_snap()
            await asyncio.sleep(self.window)
            share = foreign_cores(before, cpu_snap())
            if not self.ci_busy() and share <= self.max_foreign:
                self.waited += time.monotonic() - began
                return
            if time.monotonic() - told > 30:
                told = time.monotonic()
                why = "a CI run is going" if self.ci_busy() else (
                    f"other processes use {share:.2f} cores")
                print(f"  waiting for a quiet machine: {why}", flush=True)

    def kept(self, before: CpuSnap, label: str) -> bool:
        """Whether the measurement that began at ``before`` may be kept."""
        share = foreign_cores(before, cpu_snap())
        if share <= self.max_foreign:
            self.worst = max(self.worst, share)
            return True
        self.redone += 1
        print(f"  {label}: other processes used {share:.2f} cores meanwhile; redoing it",
              flush=True)
        return False


# -- the daemon under test --------------------------------------------------------------


EXTRA_ENV: dict[str, str] = {}
"""Set by :func:`main`: the state directory (a temporary one), ``--llama-bin``."""


def daemon_env(runtime: str, model: Path, threads: int) -> dict[str, str]:
    """Production defaults, except: port 0, no embedding child (so no retrieval either),
    ``threads``, one slot, a temporary state directory."""
    return EXTRA_ENV | {
        "LLAMAD_LISTEN": "127.0.0.1:0",
        "LLAMAD_GENERATION_MODEL": str(model),
        "LLAMAD_GENERATION_RUNTIME": runtime,
        "LLAMAD_GENERATION_THREADS": str(threads),
        "LLAMAD_GENERATION_PARALLEL": "1",
        "LLAMAD_EMBEDDING_ENABLED": "false",
        "LLAMAD_RETRIEVAL_ENABLED": "false",
        "LLAMAD_CHILD_STOP_GRACE": "3",
        "LLAMAD_DRAIN_GRACE": "5",
        "LLAMAD_LOG_FORMAT": "json",
    }


@contextlib.asynccontextmanager
async def started(runtime: str, model: Path, threads: int
                  ) -> AsyncIterator[tuple[Running, float]]:
    """Yield ``(running, seconds from Daemon.start() to RUNNING + SERVING)``."""
    daemon = Daemon(load(None, env=daemon_env(runtime, model, threads)))
    events: list[tuple[State, float]] = []

    def record(change: StateChange) -> None:
        events.append((change.new, time.perf_counter()))

    daemon.children["generation"].supervisor.subscribe(record)
    began = time.perf_counter()
    address = await daemon.start()
    running = Running(daemon, address, events)
    try:
        await running.wait_serving()
        status = await running.generation()
        if status.state != control_pb2.CHILD_STATE_RUNNING:
            raise RuntimeError(f"health SERVING but the child is in state {status.state}")
        ready = time.perf_counter() - began
        yield running, ready
    finally:
        await running.close()
