"""Generation benchmark: llamad's streaming path against talking to the child directly.

    .venv/bin/python -m bench.bench_generation [--runtime llama-server|bundled|both]
        [--model FILE] [--prompts N] [--max-tokens N] [--threads N] [--rounds N]
        [--starts N] [--llama-bin FILE] [--max-foreign CORES] [--raw FILE]
        [--out bench/RESULTS.md]

For each runtime, in one run:

1. **Streaming.** A real daemon (in-process :class:`daemon.Daemon` on 127.0.0.1:0, the
   embedding child disabled, the generation child on the runtime with 2 threads and one
   slot) streams greedy completions of a fixed prompt list through gRPC ``Generate``;
   the same prompts go straight to the same child as ``POST /v1/completions`` with
   ``stream=true`` (httpx), which is what a user would do without llamad. The request
   body sent directly is the one llamad sends. Requests alternate between the two paths;
   each round sends every prompt once per path, in two passes with the path order
   swapped, so that a prompt is never sent twice in a row (llama.cpp's prompt cache would
   then favour the second) and both paths of a prompt see the same cache state. The first
   round is a warm-up and is discarded.
2. **Cold start.** ``Daemon.start()`` until the generation child is RUNNING and health
   says SERVING, fresh daemon each time, for both models; beside it, the same child
   command started by hand and polled until it answers a one-token completion.
3. **kill -9.** SIGKILL the child, then retry a one-token ``Generate`` every 20 ms until
   it succeeds. Each kill uses a fresh daemon, so each restart is a *first* restart,
   whose backoff is drawn uniformly from [0, restart.backoff_base = 0.5 s] (full jitter).

The machine may be shared (2 cores here; the child's threads use both): before each part,
and before redoing a measurement, the bench waits until processes outside its own process
tree use at most ``--max-foreign`` cores (and the CI log, if any, says the CI run ended);
a measurement during which they used more is redone (a disturbed streaming request after
an unmeasured request of the previous prompt, to restore the child's cache state). The
whole run takes about 8 minutes on a quiet machine.

Results are printed and written into ``--out`` (sections ``## Generation streaming:
llamad vs direct`` and ``## Start and recovery`` are created or replaced; other sections
are kept).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx

from bench._daemon import Running, daemon_log
from bench._support import (
    DEFAULT_MODEL,
    PROMPTS,
    ROOT,
    CpuSnap,
    bench_parser,
    cpu_snap,
    environment,
    foreign_cores,
    model_file,
    table,
    write_sections,
)
from daemon import Daemon, load
from llamad_protocol.v1 import (
    control_pb2,
    inference_pb2,
)
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


# -- streaming ---------------------------------------------------------------------------


def completion_body(prompt: str, max_tokens: int) -> dict[str, Any]:
    """What llamad sends the child for a greedy Generate (supervisor/_client.py)."""
    return {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True}}


async def via_llamad(running: Running, prompt: str, max_tokens: int, rnd: int, i: int) -> Sample:
    request = inference_pb2.GenerateRequest(
        prompt=prompt,
        sampling=inference_pb2.SamplingParams(max_tokens=max_tokens, temperature=0.0),
    )
    parts: list[str] = []
    first = last = 0.0
    server: float | None = None
    sent = time.perf_counter()
    async for msg in running.inference.Generate(request, timeout=300):
        if msg.text:
            last = time.perf_counter()
            if not parts:
                first = last
            parts.append(msg.text)
        if msg.HasField("usage"):
            server = msg.usage.time_to_first_token_ms / 1000
    if not parts:
        raise RuntimeError(f"llamad streamed no text for prompt {i}")
    return Sample("llamad", rnd, i, first - sent, len(parts), last - first, "".join(parts),
                  server)


async def via_direct(http: httpx.AsyncClient, prompt: str, max_tokens: int, rnd: int,
                     i: int) -> Sample:
    parts: list[str] = []
    first = last = 0.0
    sent = time.perf_counter()
    async with http.stream("POST", "/v1/completions",
                           json=completion_body(prompt, max_tokens)) as resp:
        if resp.status_code != 200:
            await resp.aread()
            raise RuntimeError(f"direct: HTTP {resp.status_code}: {resp.text[:200]}")
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                break
            for choice in json.loads(payload).get("choices") or ():
                text = choice.get("text") or ""
                if text:
                    last = time.perf_counter()
                    if not parts:
                        first = last
                    parts.append(text)
    if not parts:
        raise RuntimeError(f"the child streamed no text for prompt {i}")
    return Sample("direct", rnd, i, first - sent, len(parts), last - first, "".join(parts))


class Direct:
    """An HTTP client to the generation child's port, renewed if the child is replaced."""

    def __init__(self) -> None:
        self.port = 0
        self.http: httpx.AsyncClient | None = None

    async def client(self, running: Running) -> httpx.AsyncClient:
        port = (await running.generation()).port
        if self.http is None or port != self.port:
            if self.http is not None:
                await self.http.aclose()
            self.port = port
            self.http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False,
                                          timeout=httpx.Timeout(300.0, connect=5.0))
        return self.http

    async def aclose(self) -> None:
        if self.http is not None:
            await self.http.aclose()


async def measure(running: Running, direct: Direct, prompts: Sequence[str], *, i: int,
                  rnd: int, path: str, max_tokens: int, guard: Guard) -> Sample:
    """One request, redone (after a quiet spell and an unmeasured request of the previous
    prompt, which restores the child's cache state) while it is disturbed; warm-up
    requests are not checked."""
    label = f"round {rnd} prompt {i} via {path}"
    failures = 0
    redo = False
    while True:
        try:
            if redo:
                await guard.quiet()
                filler = prompts[(i - 1) % len(prompts)]
                await via_direct(await direct.client(running), filler, 8, -1, -1)
            http = await direct.client(running)
            before = cpu_snap()
            if path == "llamad":
                sample = await via_llamad(running, prompts[i], max_tokens, rnd, i)
            else:
                sample = await via_direct(http, prompts[i], max_tokens, rnd, i)
        except (grpc.aio.AioRpcError, httpx.HTTPError) as exc:
            # On a shared machine someone else's cleanup may kill our child: wait for
            # llamad to restart it, then redo the request.
            failures += 1
            if failures > 5:
                raise
            guard.redone += 1
            print(f"  {label}: failed ({type(exc).__name__}); redoing it", flush=True)
            await running.wait_serving()
            redo = True
            continue
        if rnd == 0 or guard.kept(before, label):
            return sample
        redo = True


async def bench_stream(runtime: str, model: Path, prompts: Sequence[str], max_tokens: int,
                       rounds: int, *, threads: int, guard: Guard) -> StreamResult:
    """Each round sends every prompt once per path, in two passes; in pass 0 prompt i goes
    to llamad when ``i + round`` is even, in pass 1 to the other path. Consecutive requests
    always carry different prompts, and both requests of a prompt follow the same prompt."""
    samples: list[Sample] = []
    await guard.quiet()
    async with started(runtime, model, threads) as (running, ready):
        direct = Direct()
        try:
            print(f"  [{runtime}] daemon ready in {ready:.2f}s", flush=True)
            for rnd in range(rounds + 1):  # round 0 is the warm-up
                began = time.perf_counter()
                for swap in (0, 1):
                    for i in range(len(prompts)):
                        path = "llamad" if (i + rnd + swap) % 2 == 0 else "direct"
                        sample = await measure(running, direct, prompts, i=i, rnd=rnd,
                                               path=path, max_tokens=max_tokens, guard=guard)
                        if rnd > 0:
                            samples.append(sample)
                what = "warm-up" if rnd == 0 else f"round {rnd}/{rounds}"
                print(f"  [{runtime}] {what}: {time.perf_counter() - began:.1f}s", flush=True)
        finally:
            await direct.aclose()
    return StreamResult(runtime, model.name, samples)


# -- start and recovery -----------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def direct_start(runtime: str, model: Path, threads: int) -> float:
    """The child's own command line (as llamad builds it), started by hand and polled
    every 20 ms until it is healthy and a one-token completion succeeds: the readiness
    llamad waits for, without llamad."""
    child = Daemon(load(None, env=daemon_env(runtime, model, threads))).children["generation"]
    port = free_port()
    argv = child.runtime.command(child.spec, port=port, alias="bench-direct")
    health = child.runtime.api.health_path or "/v1/models"
    began = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False,
                                     timeout=10.0) as http:
            body = {"prompt": "Hello", "max_tokens": 1, "temperature": 0.0}
            for path, method in ((health, "GET"), ("/v1/completions", "POST")):
                while True:
                    if proc.returncode is not None:
                        raise RuntimeError(f"{argv[0]} exited with {proc.returncode}")
                    with contextlib.suppress(httpx.HTTPError):
                        resp = await http.request(method, path,
                                                  json=body if method == "POST" else None)
                        if resp.status_code == 200:
                            break
                    await asyncio.sleep(POLL)
        return time.perf_counter() - began
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()


async def kill_and_recover(running: Running) -> KillSample:
    old = (await running.generation()).pid
    request = inference_pb2.GenerateRequest(
        prompt="Hello", sampling=inference_pb2.SamplingParams(max_tokens=1, temperature=0.0))
    killed = time.perf_counter()
    os.kill(old, signal.SIGKILL)
    attempts = 0
    while True:
        attempts += 1
        try:
            async for _ in running.inference.Generate(request, timeout=60):
                pass
            break
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE:
                raise
        await asyncio.sleep(POLL)
    done = time.perf_counter()
    new = (await running.generation()).pid
    if new in (0, old):
        raise RuntimeError(f"Generate succeeded but the child pid is {new} (was {old})")
    backoff_at = running.first_after(State.BACKOFF, killed)
    starting_at = running.first_after(State.STARTING, backoff_at)
    running_at = running.first_after(State.RUNNING, starting_at)
    return KillSample(done - killed, backoff_at - killed, starting_at - backoff_at,
                      running_at - starting_at, attempts)


async def bench_start(runtime: str, model: Path, starts: int, *, kill: bool, threads: int,
                      guard: Guard) -> StartResult:
    result = StartResult(runtime, model.name)
    while len(result.llamad) < starts:
        n = len(result.llamad) + 1
        await guard.quiet()
        before = cpu_snap()
        async with started(runtime, model, threads) as (running, ready):
            if not guard.kept(before, f"{model.name} start {n}"):
                continue
            began = running.first_after(State.STARTING, 0.0)
            child = running.first_after(State.RUNNING, began) - began
            line = f"  [{runtime}] {model.name} start {n}: {ready:.2f}s (child {child:.2f}s)"
            if kill:
                await guard.quiet()
                before = cpu_snap()
                k = await kill_and_recover(running)
                if not guard.kept(before, f"kill {n}"):
                    continue
                result.kills.append(k)
                line += (f"; kill -9 -> serving {k.total:.2f}s (backoff {k.backoff:.3f}s, "
                         f"restart {k.restart:.2f}s)")
            result.llamad.append(StartSample(ready, child))
            print(line, flush=True)
    while len(result.direct) < starts:
        await guard.quiet()
        before = cpu_snap()
        seconds = await direct_start(runtime, model, threads)
        if guard.kept(before, f"direct start {len(result.direct) + 1}"):
            result.direct.append(seconds)
            print(f"  [{runtime}] {model.name} direct start {len(result.direct)}: "
                  f"{seconds:.2f}s", flush=True)
    return result


# -- report ------------------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def p90(values: Sequence[float]) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=10, method="inclusive")[-1]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


def stream_section(results: Sequence[StreamResult], env: list[str], *, prompts: int,
                   max_tokens: int, rounds: int, threads: int, max_foreign: float) -> list[str]:
    model = results[0].model if results else "?"
    out = [STREAM_HEADING, "", *env,
           f"- Model `{model}`, {threads} threads, one slot (generation.parallel = 1); "
           f"{prompts} prompts x {rounds} rounds per path (+1 warm-up round, discarded); "
           f"max_tokens {max_tokens}, temperature 0; same child, requests alternating "
           "between the paths.",
           "- llamad: gRPC `Generate` (grpc.aio client) to an in-process daemon. direct: "
           "`POST /v1/completions` with `stream: true` (httpx) to the child's port, with "
           "the body llamad sends.",
           "- TTFT: client side, request sent to first non-empty text. tokens/s: "
           "(tokens - 1) / (last text - first text), per request; medians over requests.",
           "- Requests during which other processes used more than "
           f"{max_foreign:g} cores are redone. Absolute tokens/s still drift between runs "
           "on a shared VM (the host can take a vCPU away unseen; the child then runs at "
           "about its one-thread speed): the ratios, from adjacent requests, are the result.",
           ""]
    rows = []
    for r in results:
        for path, label in (("llamad", "llamad (gRPC)"), ("direct", "direct (HTTP SSE)")):
            s = r.of(path)
            rows.append([r.runtime, label, str(len(s)), f"{median([x.tokens for x in s]):g}",
                         ms(median([x.ttft for x in s])), f"{median([x.rate for x in s]):.2f}"])
    out += table(["runtime", "path", "requests", "median tokens", "median TTFT ms",
                  "median tokens/s"], rows)
    out.append("")
    rows = []
    for r in results:
        pairs = r.pairs()
        ratio = median([x.rate for x in r.of("llamad")]) / median([x.rate for x in r.of("direct")])
        paired = median([a.rate / b.rate for a, b in pairs if b.rate > 0])
        added = [a.ttft - b.ttft for a, b in pairs]
        same = sum(a.text == b.text for a, b in pairs)
        rows.append([
            r.runtime,
            f"**{ratio:.3f}** {'ok' if ratio >= 0.98 else 'MISS'}",
            f"{paired:.3f}",
            f"**{ms(median(added))}** {'ok' if median(added) <= 0.005 else 'MISS'}",
            ms(p90(added)),
            f"{same}/{len(pairs)}",
        ])
    out += table(["runtime", "tokens/s llamad/direct (>= 0.98)", "median of per-pair ratios",
                  "added TTFT median ms (<= 5)", "added TTFT p90 ms",
                  "identical text (pairs)"], rows)
    out += ["", "Where the added TTFT goes, per pair: *in the daemon* is llamad's own TTFT "
            "(`Usage.time_to_first_token_ms`, from its handler's start to the first chunk from "
            "the child) minus the direct TTFT; *gRPC hops* is the client's TTFT minus llamad's "
            "own (request in, first message out).", ""]
    rows = []
    for r in results:
        pairs = [(a, b) for a, b in r.pairs() if a.server_ttft is not None]
        inside = [(a.server_ttft or 0.0) - b.ttft for a, b in pairs]
        hops = [a.ttft - (a.server_ttft or 0.0) for a, _ in pairs]
        rows.append([r.runtime, ms(median(inside)), ms(p90(inside)), ms(median(hops)),
                     ms(p90(hops))])
    out += table(["runtime", "in the daemon, median ms", "p90 ms", "gRPC hops, median ms",
                  "p90 ms"], rows)
    return out


def start_section(results: Sequence[StartResult], env: list[str], starts: int,
                  threads: int) -> list[str]:
    out = [START_HEADING, "", *env,
           f"- Production restart and probe settings; {threads} threads, one slot, embedding "
           f"child disabled; medians of {starts} runs, a fresh daemon each.",
           "- llamad cold start: `Daemon.start()` until Status says RUNNING and health "
           "(`generation`) says SERVING. RUNNING means the child answered its health "
           "endpoint, reported llamad's alias and generated one token. *child* is the "
           "supervisor's STARTING -> RUNNING. direct: the same child command line started "
           "by hand, polled every 20 ms until healthy and a one-token completion succeeds.",
           ""]
    rows = []
    for r in results:
        rows.append([r.runtime, f"`{r.model}`",
                     f"**{median([s.ready for s in r.llamad]):.2f}**",
                     f"{median([s.child for s in r.llamad]):.2f}",
                     f"{median(r.direct):.2f}",
                     f"{median([s.ready for s in r.llamad]) - median(r.direct):+.2f}",
                     ", ".join(f"{s.ready:.2f}" for s in r.llamad)])
    out += table(["runtime", "model", "llamad cold start s", "child STARTING->RUNNING s",
                  "direct start s", "llamad - direct s", "llamad runs s"], rows)
    out += ["",
            "kill -9 of the generation child (pid from Status) until a one-token `Generate` "
            "succeeds, retried every 20 ms on UNAVAILABLE. Each kill is a first restart, "
            "whose backoff is **random, uniform in [0, 0.5 s]** (full jitter, "
            "restart.backoff_base = 0.5): reported as is, and broken down.",
            ""]
    rows = []
    for r in results:
        if not r.kills:
            continue
        k = r.kills
        rows.append([r.runtime, f"`{r.model}`", f"**{median([x.total for x in k]):.2f}**",
                     ms(median([x.detect for x in k])),
                     ", ".join(f"{x.backoff:.3f}" for x in k),
                     f"{median([x.restart for x in k]):.2f}",
                     f"{median([x.total - x.backoff for x in k]):.2f}",
                     ", ".join(f"{x.total:.2f}" for x in k)])
    out += table(["runtime", "model", "kill -9 -> serving s", "detect ms",
                  "backoff drawn s", "restart s", "total minus backoff s", "runs s"], rows)
    return out


# -- main -------------------------------------------------------------------------------


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = bench_parser("bench.bench_generation", __doc__)
    p.add_argument("--runtime", choices=(*RUNTIMES, "both"), default="both")
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"GGUF for the streaming and kill runs (default {DEFAULT_MODEL})")
    p.add_argument("--prompts", type=int, default=len(PROMPTS),
                   help=f"prompts per round, at most {len(PROMPTS)}")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=DEFAULT_THREADS,
                   help=f"generation.threads of the child (default {DEFAULT_THREADS})")
    p.add_argument("--rounds", type=int, default=3, help="measured rounds (after a warm-up)")
    p.add_argument("--starts", type=int, default=3,
                   help="cold starts and kills per case (0: skip that part)")
    p.add_argument("--raw", type=Path, help="also write every measurement to this JSON file")
    p.add_argument("--llama-bin", default=os.environ.get("LLAMAD_LLAMA_BIN", ""),
                   help="llama-server binary (default: LLAMAD_LLAMA_BIN, else llamad's choice)")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "RESULTS.md")
    p.add_argument("--max-foreign", type=float, default=0.05, metavar="CORES",
                   help="redo a measurement during which other processes used more CPU "
                   "(default 0.05 cores)")
    p.add_argument("--ci-log", type=Path, default=Path("/tmp/ci/run.log"),  # noqa: S108 (only read)
                   help="wait while this log's last line is not 'exit=...' (a CI run is "
                   "going); ignored if missing")
    args = p.parse_args(argv)
    if not 1 <= args.prompts <= len(PROMPTS):
        p.error(f"--prompts must be in 1..{len(PROMPTS)}")
    if args.rounds < 1 or args.starts < 0 or args.threads < 1 or args.max_tokens < 2:
        p.error("--rounds and --threads must be >= 1, --starts >= 0, --max-tokens >= 2")
    return args


async def run(args: argparse.Namespace, command: str) -> None:
    runtimes = RUNTIMES if args.runtime == "both" else (args.runtime,)
    model = model_file(args.model)
    prompts = PROMPTS[: args.prompts]
    streams: list[StreamResult] = []
    starts: list[StartResult] = []
    guard = Guard(max_foreign=args.max_foreign, ci_log=args.ci_log)
    began = time.perf_counter()
    for runtime in runtimes:
        print(f"{runtime}: streaming, {model.name}", flush=True)
        streams.append(await bench_stream(runtime, model, prompts, args.max_tokens, args.rounds,
                                          threads=args.threads, guard=guard))
    for runtime in runtimes if args.starts else ():
        for name in dict.fromkeys((model.name, *START_MODELS)):
            print(f"{runtime}: cold start{' and kill -9' if name == model.name else ''}, "
                  f"{name}", flush=True)
            starts.append(await bench_start(runtime, model_file(name), args.starts,
                                            kill=name == model.name, threads=args.threads,
                                            guard=guard))
    total = time.perf_counter() - began
    print(f"total {total:.0f}s, of which {guard.waited:.0f}s waiting for a quiet machine; "
          f"{guard.redone} measurements redone\n", flush=True)
    env = environment(command, EXTRA_ENV.get("LLAMAD_LLAMA_BIN"))
    sections = [stream_section(streams, env, prompts=len(prompts), max_tokens=args.max_tokens,
                               rounds=args.rounds, threads=args.threads,
                               max_foreign=args.max_foreign)]
    if starts:
        sections.append(start_section(starts, env, args.starts, args.threads))
    for section in sections:
        print("\n".join(section), end="\n\n")
    write_sections(args.out, sections)
    print(f"written to {args.out}")
    if args.raw:
        raw = {"command": command, "streams": [asdict(r) for r in streams],
               "starts": [asdict(r) for r in starts]}
        args.raw.write_text(json.dumps(raw, indent=1) + "\n")
        print(f"raw measurements in {args.raw}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    shown = sys.argv[1:] if argv is None else list(argv)
    command = " ".join([".venv/bin/python -m bench.bench_generation", *map(shlex.quote, shown)])
    with daemon_log(), tempfile.TemporaryDirectory(prefix="llamad-bench-state-") as state:
        EXTRA_ENV["LLAMAD_STATE_DIR"] = state
        if args.llama_bin:
            EXTRA_ENV["LLAMAD_LLAMA_BIN"] = args.llama_bin
        asyncio.run(run(args, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
