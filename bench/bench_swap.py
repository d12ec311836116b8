"""Swaps and crashes under load, and Embed through llamad against the child directly.

    .venv/bin/python -m bench.bench_swap [--quick] [--clients 8] [--max-tokens 48]
        [--swaps 20] [--steady 45] [--kills 5] [--cold-starts 3]
        [--out bench/RESULTS.md] [--raw FILE]

One run, three parts, each against a real in-process :class:`daemon.Daemon` on
127.0.0.1:0 (llama-server runtime, 2 threads, RetrievalService off, production restart,
probe, swap and admission settings unless said otherwise):

1. **Swap under load.** Generation child on ``gemma-3-270m`` with 4 slots
   (generation.parallel = 4), no embedding child. ``--clients`` grpc.aio clients stream
   greedy ``Generate`` calls (``--max-tokens``, 8 prompts in rotation) back to back for
   the whole part. After a warm-up, a steady window on gemma with no swap; swap 1 to
   SmolLM2-135M; a steady window on SmolLM2; then the remaining swaps back and forth,
   each started once every call running at the end of the previous one has ended, and
   ``--gap`` seconds after that, so that no call spans two swaps (``ControlService/Swap``
   with an explicit ``model_path``). A request is *steady* when it lies inside a steady
   window, *during* when its span overlaps a swap (Swap RPC sent until its stream ended,
   drain included), *between* otherwise. Which model served a request is read from
   ``GenerateResponse.model`` and checked against its text: greedy output is
   deterministic per model and prompt, so the text is matched (longest common prefix)
   against the steady-window texts of both models; the text decides.
2. **Crash under load.** Cold start of the daemon on gemma (``Daemon.start()`` until the
   child is RUNNING and health ``generation`` is SERVING, no load, fresh daemon each
   time). Then the same load with a 30 s deadline per call, and ``kill -9`` of the
   generation child (pid from ``ControlService/Status``) ``--kills`` times, each once the
   child has run ``--kill-spacing`` seconds. Clients retry UNAVAILABLE and
   RESOURCE_EXHAUSTED after the ``retry-after-ms`` trailing metadata (1 s when absent),
   like a real client. ``restart.breaker_reset`` is lowered to 10 s (production: 60 s)
   so that every kill is an isolated crash after stable running, with the production
   first-restart backoff (uniform in [0, 0.5 s]); five crashes within 60 s would open
   the breaker (by design). Recovery: kill until a call sent after the kill streams its
   first token (and until one completes).
3. **Embed: llamad vs direct.** Embedding child only (all-MiniLM-L6-v2, 2 slots).
   Sentences of 20-60 tokens (the child's own tokenizer) cut from the CISI corpus;
   batches of 1, 16 and 64 through gRPC ``Embed`` (default request, as a user sends it)
   and as ``POST /v1/embeddings`` (httpx) to the child's port from Status, twice: JSON
   numbers parsed into vectors (a client's default), and ``encoding_format: base64``
   decoded with numpy (what llamad asks its child for). Each round sends the same
   batches the three ways, each way as a block of back-to-back calls (20 at batch 1, 2 at
   16, 1 at 64), the order rotating round by round; a warm-up round per size is
   discarded. Throughput is a block's calls over its time; a block is what a client
   embedding a corpus does, whereas alternating single calls mostly measures how long
   each path takes to wake after the others ran (reported: the first call of a block).
   Then 4 concurrent clients of batch-1 calls (10 each per way per round); last, isolated
   batch-1 calls, each after 0.1 s without any call: one query now and then.

Before each part the bench waits (up to ``--wait-others`` seconds) until no other
benchmark runs (``pgrep -fa 'bench\\.'``), and records ``uptime`` and the CPU that other
processes used during the part. Results are printed and written into ``--out``: the
sections ``## Swap under load``, ``## Crash under load`` and ``## Embedding: llamad vs
direct`` are created or replaced; other sections are kept.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import math
import os
import re
import shlex
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
from grpc_health.v1 import health_pb2

from bench._daemon import DaemonProcess, Running, daemon_log, wait_ready
from bench._support import (
    DEFAULT_MODEL,
    EMBED_MODEL,
    MONITOR,
    PROMPTS,
    RETRY_KEY,
    RETRYABLE,
    ROOT,
    SMALL_MODEL,
    PartNote,
    add_quiet_options,
    begin_part,
    bench_parser,
    end_part,
    environment,
    f3,
    model_file,
    pct,
    short,
    table,
    write_sections,
)
from daemon import Daemon, load
from llamad_protocol.v1 import (
    common_pb2,
    control_pb2,
    control_pb2_grpc,
    inference_pb2,
    inference_pb2_grpc,
)
from supervisor import State, StateChange

CORPUS = Path("/work/shared/data/cisi/corpus.jsonl")
THREADS = 2
# The order of the three embedding paths, rotating round by round (each first equally often).
ORDERS = (("llamad", "direct", "direct64"), ("direct", "direct64", "llamad"),
          ("direct64", "llamad", "direct"), ("llamad", "direct64", "direct"),
          ("direct", "llamad", "direct64"), ("direct64", "direct", "llamad"))
POLL = 0.02
GEN = common_pb2.CHILD_ROLE_GENERATION
EMB = common_pb2.CHILD_ROLE_EMBEDDING

SWAP_HEADING = "## Swap under load"
CRASH_HEADING = "## Crash under load"
EMBED_HEADING = "## Embedding: llamad vs direct"


# -- the machine -------------------------------------------------------------------------


# -- the daemon --------------------------------------------------------------------------


def base_env(state_dir: Path) -> dict[str, str]:
    return {
        "LLAMAD_LISTEN": "127.0.0.1:0",
        "LLAMAD_RETRIEVAL_ENABLED": "false",
        "LLAMAD_STATE_DIR": str(state_dir),
        "LLAMAD_CHILD_STOP_GRACE": "3",
        "LLAMAD_DRAIN_GRACE": "5",
        "LLAMAD_LOG_FORMAT": "json",
    }


def generation_env(state_dir: Path, model: Path, extra_args: str = "",
                   **extra: str) -> dict[str, str]:
    """gemma or SmolLM2 on llama-server, 2 threads, 4 slots; no embedding child."""
    env = {**base_env(state_dir),
           "LLAMAD_GENERATION_MODEL": str(model),
           "LLAMAD_GENERATION_RUNTIME": "llama-server",
           "LLAMAD_GENERATION_THREADS": str(THREADS),
           "LLAMAD_GENERATION_PARALLEL": "4",
           "LLAMAD_EMBEDDING_ENABLED": "false",
           **extra}
    if extra_args:
        env["LLAMAD_GENERATION_EXTRA_ARGS"] = extra_args
    return env


def embedding_env(state_dir: Path, model: Path) -> dict[str, str]:
    """The embedding child only, on llama-server, production defaults (2 slots)."""
    return {**base_env(state_dir),
            "LLAMAD_GENERATION_ENABLED": "false",
            "LLAMAD_EMBEDDING_MODEL": str(model),
            "LLAMAD_EMBEDDING_RUNTIME": "llama-server",
            "LLAMAD_EMBEDDING_THREADS": str(THREADS)}


@contextlib.asynccontextmanager
async def started(env: dict[str, str], role: str = "generation"
                  ) -> AsyncIterator[tuple[Running, float]]:
    """Yield ``(running, seconds from Daemon.start() to RUNNING + health SERVING)``."""
    daemon = Daemon(load(None, env=env))
    events: list[tuple[State, float]] = []

    def record(change: StateChange) -> None:
        events.append((change.new, time.perf_counter()))

    daemon.children[role].supervisor.subscribe(record)
    began = time.perf_counter()
    address = await daemon.start()
    running = Running(daemon, address, events)
    try:
        request = health_pb2.HealthCheckRequest(service=role)
        async for resp in running.health.Watch(request, timeout=300):
            if resp.status == health_pb2.HealthCheckResponse.SERVING:
                break
        ready = time.perf_counter() - began
        state = (await child_status(running, role)).state
        if state != control_pb2.CHILD_STATE_RUNNING:
            raise RuntimeError(f"health SERVING but the {role} child is in state {state}")
        yield running, ready
    finally:
        await running.close()


async def child_status(running: Running, role: str) -> control_pb2.ChildStatus:
    want = GEN if role == "generation" else EMB
    resp = await running.control.Status(control_pb2.StatusRequest(), timeout=10)
    for child in resp.children:
        if child.role == want:
            found: control_pb2.ChildStatus = child
            return found
    raise RuntimeError(f"Status lists no {role} child")


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


# -- statistics ---------------------------------------------------------------------------


def med(values: Sequence[float]) -> float:
    return pct(values, 50)


def f2(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.2f}"


def verdict(good: bool, value: float) -> str:
    return "" if math.isnan(value) else ("ok" if good else "MISS")


def common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


# -- part 1: swap under load ---------------------------------------------------------------


@dataclass(frozen=True)
class SwapRun:
    index: int
    target: str
    start: float
    end: float
    stages: dict[str, float]  # stage -> perf_counter when the client received it
    error: str

    @property
    def total(self) -> float:
        return self.end - self.start

    @property
    def switch(self) -> float:
        """Swap sent until the new child took over (the 'draining' stage arrived)."""
        at = self.stages.get("draining", self.stages.get("done", math.nan))
        return at - self.start

    @property
    def drain(self) -> float:
        return self.end - self.stages.get("draining", math.nan)


@dataclass
class SwapResult:
    clients: int
    max_tokens: int
    warm_end: float
    steady_a: tuple[float, float]
    steady_b: tuple[float, float]
    swaps: list[SwapRun]
    attempts: list[Attempt]
    ready: float
    extra_args: str = ""
    gap: float = 3.0  # seconds between a swap's last call ending and the next swap
    served_by: list[str] = field(default_factory=list)  # per attempt: the model (text)
    foreign: list[float] = field(default_factory=list)  # per attempt: other processes' cores
    swap_foreign: list[float] = field(default_factory=list)  # per swap: the same
    mislabelled: list[int] = field(default_factory=list)  # attempt indexes


async def do_swap(running: Running, index: int, target: Path) -> SwapRun:
    request = control_pb2.SwapRequest(role=GEN, model_path=str(target),
                                      reason=f"bench swap {index}")
    stages: dict[str, float] = {}
    error = ""
    began = time.perf_counter()
    try:
        async for p in running.control.Swap(request, timeout=300):
            name = control_pb2.SwapStage.Name(p.stage).removeprefix("SWAP_STAGE_").lower()
            stages.setdefault(name, time.perf_counter())
    except grpc.aio.AioRpcError as exc:
        error = f"{exc.code().name}: {exc.details()}"
    return SwapRun(index, target.name, began, time.perf_counter(), stages, error)


async def bench_swap(args: argparse.Namespace, state_dir: Path) -> SwapResult:
    models = (model_file(DEFAULT_MODEL), model_file(SMALL_MODEL))
    async with started(generation_env(state_dir, models[0], args.extra_args)) as (
            running, ready):
        print(f"  daemon ready in {ready:.2f}s on {models[0].name}", flush=True)
        load_ = Load(running.daemon.address, clients=args.clients, max_tokens=args.max_tokens,
                     deadline=args.swap_deadline)
        load_.start()
        await asyncio.sleep(args.warmup)
        warm_end = time.perf_counter()
        print(f"  steady window on {models[0].name}: {args.steady:.0f}s", flush=True)
        await asyncio.sleep(args.steady)
        swaps: list[SwapRun] = []
        steady_b = (math.nan, math.nan)
        for i in range(args.swaps):
            target = models[(i + 1) % 2]
            run = await do_swap(running, i + 1, target)
            swaps.append(run)
            print(f"  swap {i + 1}/{args.swaps} -> {target.name}: "
                  f"{'ok' if not run.error else run.error} in {run.total:.2f}s "
                  f"(switched after {run.switch:.2f}s, drain {run.drain:.2f}s)", flush=True)
            if i == 0:
                b_start = time.perf_counter() + args.settle
                print(f"  steady window on {target.name}: {args.steady:.0f}s", flush=True)
                await asyncio.sleep(args.settle + args.steady)
                steady_b = (b_start, time.perf_counter())
            else:
                # Each call sees at most one swap: the next starts once every call running
                # at the end of this one has ended, and a gap after that.
                await load_.settled(run.end)
                await asyncio.sleep(args.gap)
        await load_.stop()
        if len(swaps) == 1:
            steady_b = (steady_b[0], min(steady_b[1], max(a.end for a in load_.attempts)))
    result = SwapResult(args.clients, args.max_tokens, warm_end, (warm_end, swaps[0].start),
                        steady_b, swaps, load_.attempts, ready, args.extra_args, args.gap)
    tag_models(result)
    result.foreign = [MONITOR.foreign(a.start, a.end) for a in result.attempts]
    result.swap_foreign = [MONITOR.foreign(s.start, s.end) for s in result.swaps]
    return result


def window_of(r: SwapResult, a: Attempt) -> str:
    """'warmup', 'steady', 'during' (overlaps a swap) or 'between'."""
    if a.start < r.warm_end:
        return "warmup"
    if any(a.start < s.end and a.end > s.start for s in r.swaps):
        return "during"
    for lo, hi in (r.steady_a, r.steady_b):
        if a.start >= lo and a.end <= hi:
            return "steady"
    return "between"


def swap_phase(r: SwapResult, a: Attempt) -> str:
    """For a call during a swap: 'launch' if it overlaps only the launch of the new child
    (Swap sent until the switch), 'drain' if only the drain (switch until the Swap ended),
    'both' otherwise."""
    launch = drain = False
    for s in r.swaps:
        switched = s.start + s.switch if not math.isnan(s.switch) else s.end
        launch |= a.start < switched and a.end > s.start
        drain |= a.start < s.end and a.end > switched
    return "both" if launch and drain else ("launch" if launch else "drain")


def tag_models(r: SwapResult) -> None:
    """Which model served each call: its text against the steady texts of each model."""
    refs: dict[tuple[str, int], list[str]] = {}
    for a in r.attempts:
        if a.code == "OK" and window_of(r, a) == "steady" and a.text:
            refs.setdefault((a.model, a.prompt), []).append(a.text)
    models = sorted({m for m, _ in refs})
    r.served_by = []
    r.mislabelled = []
    for i, a in enumerate(r.attempts):
        best = {m: max((common_prefix(a.text, t) for t in refs.get((m, a.prompt), ())),
                       default=0) for m in models}
        ranked = sorted(best.items(), key=lambda kv: kv[1], reverse=True)
        served = a.model
        if ranked and ranked[0][1] >= 12 and (len(ranked) == 1 or ranked[0][1] > ranked[1][1]):
            served = ranked[0][0]
        r.served_by.append(served)
        if a.code == "OK" and served != a.model:
            r.mislabelled.append(i)


def swap_section(r: SwapResult, env: list[str], note: PartNote, command: str) -> list[str]:
    measured = [(a, r.served_by[i], window_of(r, a)) for i, a in enumerate(r.attempts)
                if window_of(r, a) != "warmup"]
    ok = [(a, m, w) for a, m, w in measured if a.code == "OK"]
    busy = {id(a) for a, f in zip(r.attempts, r.foreign, strict=True) if f > MONITOR.busy}
    completed = sum(a.code == "OK" for a in r.attempts)  # the warm-up included
    failed = [a for a in r.attempts if a.code != "OK"]
    swaps_ok = [s for s in r.swaps if not s.error]
    models = sorted({m for _, m, _ in ok})
    steady_med = {m: med([a.latency for a, mm, w in ok if mm == m and w == "steady"])
                  for m in models}
    out = [SWAP_HEADING, "", *env, note.line(),
           f"- Daemon: generation child on llama-server, {THREADS} threads, 4 slots "
           "(generation.parallel = 4), embedding child disabled, production swap settings "
           "(drain_timeout 30 s, ready_timeout 90 s)"
           + (f"; generation.extra_args `{r.extra_args}`." if r.extra_args else "."),
           f"- Load: {r.clients} grpc.aio clients (one channel), each sending greedy `Generate` "
           f"calls back to back (8 prompts in rotation, max_tokens {r.max_tokens}, deadline "
           "60 s) for the whole part; a call refused with UNAVAILABLE or RESOURCE_EXHAUSTED "
           "is retried after its `retry-after-ms`.",
           f"- Timeline: warm-up, steady window on gemma-3-270m "
           f"({r.steady_a[1] - r.steady_a[0]:.0f} s), swap 1 to SmolLM2-135M, steady window "
           f"on SmolLM2-135M ({r.steady_b[1] - r.steady_b[0]:.0f} s), then swaps 2..{len(r.swaps)}"
           " back and forth, each sent once every call running at the end of the previous "
           f"one has ended, and {r.gap:g} s more, so that no call spans two swaps "
           "(`ControlService/Swap` with `model_path`). *steady*: the call lies in a steady "
           "window; *during*: its span overlaps a swap (Swap sent until its stream ended, "
           "drain included); *between*: neither (after swap 2 began).",
           "- The serving model of each call is its text's: greedy output is deterministic "
           "per model and prompt, so each text is matched against the steady-window texts "
           "of both models (`GenerateResponse.model` is compared with it below).",
           ""]
    codes = Counter(a.code for a in failed)
    hinted = Counter(a.code for a in failed if a.retry_after_ms is not None)
    rows = [[str(completed), f"**{len(failed)}** {'ok' if not failed else 'MISS'}",
             ", ".join(f"{c} x{n} ({hinted[c]} with retry-after-ms)" for c, n in codes.items())
             or "none",
             f"{len(swaps_ok)}/{len(r.swaps)}",
             f"{len(r.mislabelled)}"]]
    out += table(["calls completed (whole part)", "failed (target 0)", "failures by status",
                  "swaps done", "OK calls whose `model` is not the model that served them"],
                 rows)
    out += [f"- swap {s.index} to {s.target} failed: {s.error[:200]}" for s in r.swaps
            if s.error]
    if failed:
        out += ["", "Failures:", ""]
        out += [f"- {a.code} at +{a.start - r.warm_end:.1f}s after {a.latency:.2f}s: "
                f"{a.details[:160]}" for a in failed[:20]]
    out += ["", "Latency of completed calls (client side: sent until the stream ended, "
            "queueing for a slot included), s:", ""]
    rows = []
    for w in ("steady", "during", "between"):
        for m in [*models, "all"]:
            lat = [a.latency for a, mm, ww in ok if ww == w and (m in ("all", mm))]
            ttft = [a.ttft for a, mm, ww in ok if ww == w and (m in ("all", mm))]
            if not lat:
                continue
            disturbed = sum(id(a) in busy for a, mm, ww in ok if ww == w and m in ("all", mm))
            rows.append([w, short(m) if m != "all" else "both", str(len(lat)), f2(med(lat)),
                         f2(pct(lat, 90)), f2(pct(lat, 99)), f2(max(lat)), f2(med(ttft)),
                         f2(pct(ttft, 99)), str(disturbed)])
    out += table(["window", "model", "calls", "p50", "p90", "p99", "max", "TTFT p50",
                  "TTFT p99", f"disturbed (others > {MONITOR.busy} cores)"], rows)

    def p99(window: str, model: str | None = None, normalise: bool = False,
            quiet: bool = False) -> float:
        vals = [a.latency / (steady_med.get(m, math.nan) if normalise else 1.0)
                for a, m, w in ok if w == window and (model is None or m == model)
                and not (quiet and id(a) in busy)]
        return pct(vals, 99)

    out += ["", "p99(during) / p99(steady), target <= 1.2. *raw*: all calls pooled (the "
            "models differ in speed, and the mix differs between the windows); *per model*: "
            "each model's calls against its own steady window; *normalised*: every call's "
            "latency divided by the steady median of the model that served it, then pooled.",
            ""]
    rows = []
    for label, model, normalise in [("raw", None, False),
                                    *[(f"per model: {short(m)}", m, False) for m in models],
                                    ("normalised", None, True)]:
        ratio = p99("during", model, normalise) / p99("steady", model, normalise)
        quiet = (p99("during", model, normalise, quiet=True)
                 / p99("steady", model, normalise, quiet=True))
        rows.append([label, f"**{f3(ratio)}** {verdict(ratio <= 1.2, ratio)}",
                     f"{f3(quiet)} {verdict(quiet <= 1.2, quiet)}"])
    out += table(["ratio", "p99 during / p99 steady, all calls",
                  "undisturbed calls only"], rows)
    out += ["", "Calls during swaps by the phase they overlap: *launch* (the new child starts "
            "beside the old one, which still serves), *drain* (the new child takes new calls "
            "while the old one finishes its own), *both*. Normalised: latency / steady median "
            "of the serving model.", ""]
    rows = []
    for phase in ("launch", "drain", "both"):
        calls = [(a, m) for a, m, w in ok if w == "during" and swap_phase(r, a) == phase]
        if not calls:
            continue
        lat = [a.latency for a, _ in calls]
        norm = [a.latency / steady_med.get(m, math.nan) for a, m in calls]
        rows.append([phase, str(len(calls)), f2(med(lat)), f2(pct(lat, 99)), f2(med(norm)),
                     f2(pct(norm, 99))])
    out += table(["phase", "calls", "p50 s", "p99 s", "normalised p50", "normalised p99"],
                 rows)
    out += ["", "The same calls by the swap they overlap (its direction) and by when they were "
            "sent: *before the switch* (the call ran on the old child while the new one "
            "loaded, or waited behind the old child's calls and then ran on the new one) or "
            "*after* (the new child only). A call served by the faster model that waited "
            "behind the slower model's calls, or ran beside the slower model's load, counts "
            "against the faster model's steady state.", ""]
    rows = []
    groups: dict[tuple[str, str, str], list[tuple[Attempt, str]]] = {}
    for a, m, w in ok:
        if w != "during":
            continue
        sw = next(s for s in r.swaps if a.start < s.end and a.end > s.start)
        switched = sw.start + sw.switch if not math.isnan(sw.switch) else sw.end
        when = "before the switch" if a.start < switched else "after the switch"
        groups.setdefault((short(sw.target), short(m), when), []).append((a, m))
    for (to, served, when), calls in sorted(groups.items()):
        lat = [a.latency for a, _ in calls]
        norm = [a.latency / steady_med.get(m, math.nan) for a, m in calls]
        rows.append([f"to {to}", served, when, str(len(calls)), f2(med(lat)), f2(max(lat)),
                     f2(med(norm)), f2(max(norm))])
    out += table(["swap", "served by", "sent", "calls", "p50 s", "max s", "normalised p50",
                  "normalised max"], rows)
    out += ["", "Swap durations (client side), s: *total* is the Swap RPC (validate, launch "
            "and load the new child beside the old one, readiness probe, switch, drain the "
            "old child's calls, stop it); *to switch* ends when the new child takes new calls "
            "(stage DRAINING); *drain* is the rest.", ""]
    rows = []
    quiet_swaps = [s for s, f in zip(r.swaps, r.swap_foreign, strict=True)
                   if not f > MONITOR.busy]
    for label, pick in (("all", r.swaps), ("to SmolLM2-135M", [s for s in r.swaps
                                                             if s.target == SMALL_MODEL]),
                        ("to gemma-3-270m", [s for s in r.swaps if s.target != SMALL_MODEL]),
                        ("undisturbed", quiet_swaps)):
        done = [s for s in pick if not s.error]
        if not done:
            continue
        rows.append([label, str(len(done)), f2(med([s.total for s in done])),
                     f2(pct([s.total for s in done], 90)), f2(med([s.switch for s in done])),
                     f2(pct([s.switch for s in done], 90)), f2(med([s.drain for s in done])),
                     f2(pct([s.drain for s in done], 90))])
    out += table(["swaps", "n", "total median", "total p90", "to switch median",
                  "to switch p90", "drain median", "drain p90"], rows)
    out += ["", "Each swap: the calls overlapping it (completed), the slowest of them "
            "normalised, and the other processes' CPU meanwhile.", ""]
    rows = []
    for sw, f in zip(r.swaps, r.swap_foreign, strict=True):
        calls = [(a, m) for a, m, w in ok if a.start < sw.end and a.end > sw.start]
        worst = max((a.latency / steady_med.get(m, math.nan) for a, m in calls),
                    default=math.nan)
        rows.append([str(sw.index), short(sw.target), f2(sw.total), f2(sw.switch),
                     f2(sw.drain), str(len(calls)), f2(worst), f2(f)])
    out += table(["swap", "to", "total s", "to switch s", "drain s", "calls",
                  "slowest call, normalised", "others' cores"], rows)
    out += ["", f"Reproduce: `{command}`"]
    return out


# -- part 2: crash under load --------------------------------------------------------------


@dataclass
class KillRun:
    index: int
    pid: int
    at: float  # perf_counter of the kill
    detect: float  # kill until BACKOFF, s
    backoff: float  # BACKOFF until STARTING, s
    restart: float  # STARTING until RUNNING, s
    first_token: float  # kill until a call sent after it streamed a token, s
    first_ok: float  # kill until a call sent after it completed, s
    foreign: float = math.nan  # other processes' cores from the kill until service was back


@dataclass
class CrashResult:
    clients: int
    deadline: float
    cold: list[float]  # Daemon.start() until RUNNING + SERVING, s
    cold_child: list[float]  # the supervisor's STARTING -> RUNNING in those starts, s
    kills: list[KillRun]
    attempts: list[Attempt]
    warm_end: float
    restarts: int
    extra_args: str = ""


async def cold_start(env: dict[str, str]) -> tuple[float, float]:
    async with started(env) as (running, ready):
        began = running.first_after(State.STARTING, 0.0)
        return ready, running.first_after(State.RUNNING, began) - began


async def bench_crash(args: argparse.Namespace, state_dir: Path) -> CrashResult:
    model = model_file(DEFAULT_MODEL)
    env = generation_env(state_dir, model, args.extra_args, LLAMAD_RESTART_BREAKER_RESET="10")
    cold: list[float] = []
    cold_child: list[float] = []
    for i in range(args.cold_starts):
        ready, child = await cold_start(env)
        cold.append(ready)
        cold_child.append(child)
        print(f"  cold start {i + 1}/{args.cold_starts}: {ready:.2f}s (child {child:.2f}s)",
              flush=True)
    kills: list[KillRun] = []
    async with started(env) as (running, ready):
        began = running.first_after(State.STARTING, 0.0)
        cold_child.append(running.first_after(State.RUNNING, began) - began)
        load_ = Load(running.daemon.address, clients=args.clients, max_tokens=args.max_tokens,
                     deadline=args.crash_deadline)
        load_.start()
        await asyncio.sleep(args.warmup)
        warm_end = time.perf_counter()
        for k in range(args.kills):
            while True:
                status = await child_status(running, "generation")
                if (status.state == control_pb2.CHILD_STATE_RUNNING
                        and status.uptime_seconds >= args.kill_spacing):
                    break
                await asyncio.sleep(0.2)
            killed = time.perf_counter()
            os.kill(status.pid, signal.SIGKILL)
            first_token = first_ok = math.nan
            limit = killed + 120
            while time.perf_counter() < limit and (math.isnan(first_token)
                                                    or math.isnan(first_ok)):
                if math.isnan(first_token):
                    firsts = [f for s, f in load_.first_tokens if s > killed]
                    if firsts:
                        first_token = min(firsts) - killed
                if math.isnan(first_ok):
                    oks = [a.end for a in load_.attempts if a.start > killed and a.code == "OK"]
                    if oks:
                        first_ok = min(oks) - killed
                await asyncio.sleep(POLL)
            try:
                backoff_at = running.first_after(State.BACKOFF, killed)
                starting_at = running.first_after(State.STARTING, backoff_at)
                running_at = running.first_after(State.RUNNING, starting_at)
                times = (backoff_at - killed, starting_at - backoff_at, running_at - starting_at)
            except RuntimeError:
                times = (math.nan, math.nan, math.nan)
            run = KillRun(k + 1, status.pid, killed, *times, first_token, first_ok)
            kills.append(run)
            print(f"  kill {k + 1}/{args.kills} (pid {status.pid}): first token after "
                  f"{first_token:.2f}s, first completed call after {first_ok:.2f}s (detect "
                  f"{run.detect * 1000:.0f}ms, backoff {run.backoff:.3f}s, restart "
                  f"{run.restart:.2f}s)", flush=True)
        await asyncio.sleep(2.0)
        await load_.stop()
        restarts = int((await child_status(running, "generation")).restarts)
    for run in kills:
        run.foreign = MONITOR.foreign(run.at, run.at + (
            run.first_token if not math.isnan(run.first_token) else 120.0))
    return CrashResult(args.clients, args.crash_deadline, [*cold, ready], cold_child, kills,
                       load_.attempts, warm_end, restarts, args.extra_args)


def crash_section(r: CrashResult, env: list[str], note: PartNote, command: str) -> list[str]:
    measured = [a for a in r.attempts if a.start >= r.warm_end]
    cold = med(r.cold)
    out = [CRASH_HEADING, "", *env, note.line(),
           f"- Daemon: gemma-3-270m on llama-server, {THREADS} threads, 4 slots, embedding "
           "child disabled; production restart settings (backoff base 0.5 s, probe every "
           "5 s) except restart.breaker_reset = 10 s (production 60 s), so that each kill is "
           "an isolated crash after stable running: its restart is a *first* restart, whose "
           "backoff is drawn uniformly from [0, 0.5 s]"
           + (f"; generation.extra_args `{r.extra_args}`." if r.extra_args else "."),
           f"- Load: {r.clients} grpc.aio clients, greedy `Generate` (max_tokens as in the "
           f"swap part), deadline {r.deadline:.0f} s per call; UNAVAILABLE and "
           "RESOURCE_EXHAUSTED are retried after `retry-after-ms` (1 s without one), other "
           "failures are counted and the client moves on.",
           "- Cold start: `Daemon.start()` until Status says RUNNING and health `generation` "
           f"says SERVING, no load, a fresh daemon each ({len(r.cold)} runs, the last one is "
           "the daemon then crashed). Recovery: `kill -9` of the child (pid from Status) "
           "until a call sent after the kill streams its first token (*service back*), and "
           "until such a call completes.",
           ""]
    rows = []
    for k in r.kills:
        rows.append([str(k.index), f"**{f2(k.first_token)}** "
                     f"{'ok' if k.first_token <= cold + 1 else 'MISS'}",
                     f2(k.first_ok), f"{k.detect * 1000:.0f}", f3(k.backoff), f2(k.restart),
                     f2(k.first_token - k.detect - k.backoff - k.restart), f2(k.foreign)])
    out += table(["kill", "kill -> service back s (<= cold start + 1 s)",
                  "kill -> first completed call s", "detect ms", "backoff drawn s",
                  "restart (STARTING->RUNNING) s", "clients' lag after RUNNING s",
                  "others' cores"], rows)
    tok = [k.first_token for k in r.kills]
    out += ["", "Against the cold start of the same model in the same run:", ""]
    out += table(["cold start median s", "runs s", "child STARTING->RUNNING median s",
                  "kill -> service back median s", "max s", "target (cold + 1 s)"],
                 [[f"**{f2(cold)}**", ", ".join(f2(x) for x in r.cold), f2(med(r.cold_child)),
                   f"**{f2(med(tok))}**", f2(max(tok, default=math.nan)),
                   f"{'ok' if med(tok) <= cold + 1 else 'MISS'} (median); "
                   f"{sum(t <= cold + 1 for t in tok)}/{len(tok)} kills within"]])
    ok = [a for a in measured if a.code == "OK"]
    unavailable = [a for a in measured if a.code == "UNAVAILABLE"]
    exhausted = [a for a in measured if a.code == "RESOURCE_EXHAUSTED"]
    deadline = [a for a in measured if a.code == "DEADLINE_EXCEEDED"]
    others = [a for a in measured if a.code not in ("OK", *RETRYABLE, "DEADLINE_EXCEEDED")]
    hung = [a for a in measured if a.latency > r.deadline + 1]
    mid = [a for a in unavailable if a.tokens]
    hints = [a.retry_after_ms for a in unavailable if a.retry_after_ms is not None]
    out += ["", f"Outcomes of every call attempt after the warm-up ({len(measured)} "
            f"attempts, {r.restarts} restarts in Status):", ""]
    out += table(
        ["completed", "UNAVAILABLE with retry-after-ms", "UNAVAILABLE without",
         "of which mid-stream", "RESOURCE_EXHAUSTED with / without hint",
         "DEADLINE_EXCEEDED", "past deadline + 1 s (hung)", "other", "longest attempt s"],
        [[str(len(ok)), f"{len(hints)} (hint median {med([float(h) for h in hints]):.0f} ms, "
          f"range {min(hints, default=0)}-{max(hints, default=0)})",
          str(len(unavailable) - len(hints)), str(len(mid)),
          f"{sum(a.retry_after_ms is not None for a in exhausted)} / "
          f"{sum(a.retry_after_ms is None for a in exhausted)}",
          str(len(deadline)), f"**{len(hung)}** {'ok' if not hung else 'MISS'}",
          ", ".join(f"{c} x{n}" for c, n in Counter(a.code for a in others).items()) or "0",
          f2(max((a.latency for a in measured), default=math.nan))]])
    reasons = Counter(re.sub(r"\d+(\.\d+)?", "N", a.details)[:110] for a in unavailable)
    if reasons:
        out += ["", "UNAVAILABLE messages (numbers replaced by N):", ""]
        out += [f"- {n} x `{text}`" for text, n in reasons.most_common(6)]
    out += ["", f"Reproduce: `{command}`"]
    return out


# -- part 3: embeddings --------------------------------------------------------------------


@dataclass
class EmbedRound:
    """One round: a block of ``calls`` back-to-back calls each way (seconds are per call,
    the block's time over its calls; ``calls_s`` each call's own time)."""

    size: int
    rep: int
    calls: int
    llamad: float
    direct: float  # JSON numbers, as a client gets by default
    direct64: float  # encoding_format base64, as llamad asks the child
    calls_s: dict[str, list[float]]  # path -> seconds of each call of its block
    order: tuple[str, ...]
    start: float  # perf_counter
    end: float
    foreign: float = math.nan  # other processes' cores during the round (filled in later)


@dataclass
class EmbedResult:
    rounds: list[EmbedRound]
    tokens: dict[int, float]  # batch size -> mean tokens per text
    sentences: int
    agreement: float  # smallest cosine between llamad's and the child's vectors
    daemon: str = "process"  # the daemon ran as its own process, or "in-process"
    isolated: dict[str, list[float]] = field(default_factory=dict)  # path -> call seconds
    concurrent: list[dict[str, float]] = field(default_factory=list)  # per round: path -> s


def corpus_sentences(path: Path, limit: int) -> list[str]:
    """Sentences of 60-400 characters from the corpus texts, in corpus order."""
    out: list[str] = []
    seen: set[str] = set()
    with path.open() as fh:
        for line in fh:
            text = " ".join(str(json.loads(line).get("text") or "").split())
            for s in re.split(r"(?<=[.!?])\s+(?=[A-Z])", text):
                if 60 <= len(s) <= 400 and s not in seen:
                    seen.add(s)
                    out.append(s)
                    if len(out) >= limit:
                        return out
    return out


async def token_counts(http: httpx.AsyncClient, texts: Sequence[str]) -> list[int]:
    counts = []
    for text in texts:
        resp = await http.post("/tokenize", json={"content": text, "add_special": True})
        resp.raise_for_status()
        counts.append(len(resp.json()["tokens"]))
    return counts


async def embed_llamad(stub: Any, batch: Sequence[str]) -> list[list[float]]:
    resp = await stub.Embed(inference_pb2.EmbedRequest(texts=list(batch)), timeout=120)
    return [list(e.values) for e in resp.embeddings]


async def embed_direct(http: httpx.AsyncClient, batch: Sequence[str]) -> list[list[float]]:
    resp = await http.post("/v1/embeddings", json={"input": list(batch)})
    resp.raise_for_status()
    data = resp.json()["data"]
    return [list(d["embedding"]) for d in sorted(data, key=lambda d: int(d["index"]))]


async def embed_direct64(http: httpx.AsyncClient, batch: Sequence[str]) -> list[list[float]]:
    """As :func:`embed_direct`, asking for base64 float32 (what llamad asks its child for)."""
    resp = await http.post("/v1/embeddings",
                           json={"input": list(batch), "encoding_format": "base64"})
    resp.raise_for_status()
    data = resp.json()["data"]
    return [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4").tolist()
            for d in sorted(data, key=lambda d: int(d["index"]))]


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = math.fsum(x * y for x, y in zip(a, b, strict=True))
    na = math.sqrt(math.fsum(x * x for x in a))
    nb = math.sqrt(math.fsum(y * y for y in b))
    return dot / (na * nb) if na and nb else 0.0


@contextlib.asynccontextmanager
async def daemon_process(env: dict[str, str], state_dir: Path
                         ) -> AsyncIterator[tuple[Any, Any, float]]:
    """``python -m daemon serve`` as operators run it (its own process; log in
    ``state_dir``); yield ``(inference stub, control stub, seconds until ready)``."""
    began = time.perf_counter()
    proc = DaemonProcess(env, state_dir / "daemon.log")
    try:
        address = await proc.address()
        async with grpc.aio.insecure_channel(address) as channel:
            await wait_ready(channel)
            ready = time.perf_counter() - began
            yield (inference_pb2_grpc.InferenceServiceStub(channel),
                   control_pb2_grpc.ControlServiceStub(channel),
                   ready)
    finally:
        await proc.stop()


@contextlib.asynccontextmanager
async def embedding_daemon(args: argparse.Namespace, state_dir: Path
                           ) -> AsyncIterator[tuple[Any, int, float]]:
    """The embedding-only daemon, in its own process (``--embed-daemon process``, as it
    runs in production) or in this one; yield ``(inference stub, child port, ready s)``."""
    env = embedding_env(state_dir, model_file(EMBED_MODEL))
    if args.embed_daemon == "process":
        async with daemon_process(env, state_dir) as (inference, control, ready):
            status = await control.Status(control_pb2.StatusRequest(), timeout=10)
            port = next(c.port for c in status.children if c.role == EMB)
            yield inference, port, ready
    else:
        async with started(env, "embedding") as (running, ready):
            yield running.inference, (await child_status(running, "embedding")).port, ready


ISOLATED_IDLE = 0.1  # seconds without a call before each isolated call
CONCURRENT = (4, 10)  # clients, batch-1 calls each, per way per round
# Calls per path per round: ~0.25 s of work at batch 1, ~0.3 s at 16, ~0.6 s at 64.
EMBED_BLOCK = {1: 20, 16: 2, 64: 1}
EMBED_PATHS: dict[str, Callable[[Any, Sequence[str]], Awaitable[list[list[float]]]]] = {
    "llamad": embed_llamad, "direct": embed_direct, "direct64": embed_direct64}


async def bench_embed(args: argparse.Namespace, state_dir: Path) -> EmbedResult:
    pool = corpus_sentences(args.corpus, 1500)
    reps = {1: args.embed_reps[0], 16: args.embed_reps[1], 64: args.embed_reps[2]}
    async with embedding_daemon(args, state_dir) as (inference, port, ready):
        print(f"  daemon ready in {ready:.2f}s ({args.embed_daemon}); child on port {port}",
              flush=True)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False,
                                     timeout=httpx.Timeout(120.0, connect=5.0)) as http:
            counts = await token_counts(http, pool)
            texts = [t for t, n in zip(pool, counts, strict=True) if 20 <= n <= 60]
            ntok = dict(zip(pool, counts, strict=True))
            print(f"  {len(texts)} sentences of 20-60 tokens (of {len(pool)} cut)", flush=True)
            if len(texts) < 64:
                raise SystemExit(f"bench: only {len(texts)} sentences of 20-60 tokens in "
                                 f"{args.corpus}")
            target = {"llamad": inference, "direct": http, "direct64": http}
            rounds: list[EmbedRound] = []
            tokens: dict[int, float] = {}
            agreement = 1.0
            offset = 0
            for size, n in reps.items():
                block = EMBED_BLOCK[size]
                used: list[int] = []
                for rep in range(max(1, n // block) + 1):  # rep 0 is the warm-up
                    batches = [[texts[(offset + k * size + j) % len(texts)]
                                for j in range(size)] for k in range(block)]
                    offset += block * size
                    used += [ntok[t] for b in batches for t in b]
                    seconds: dict[str, float] = {}
                    each: dict[str, list[float]] = {}
                    vectors: dict[str, list[list[float]]] = {}
                    round_start = time.perf_counter()
                    order = ORDERS[rep % len(ORDERS)]
                    for path in order:
                        call = EMBED_PATHS[path]
                        began = time.perf_counter()
                        each[path] = []
                        for batch in batches:
                            t0 = time.perf_counter()
                            vectors[path] = await call(target[path], batch)
                            each[path].append(time.perf_counter() - t0)
                            if len(vectors[path]) != size:
                                raise RuntimeError(f"{path}: wrong number of vectors")
                        seconds[path] = (time.perf_counter() - began) / block
                    if rep == 1 and size == 16:
                        agreement = min(agreement, *(cosine(a, b) for other in (
                            "direct", "direct64") for a, b in zip(
                            vectors["llamad"], vectors[other], strict=True)))
                    if rep:
                        rounds.append(EmbedRound(size, rep, block, seconds["llamad"],
                                                 seconds["direct"], seconds["direct64"], each,
                                                 order, round_start, time.perf_counter()))
                tokens[size] = statistics.fmean(used)
                mine = [r for r in rounds if r.size == size]
                print(f"  batch {size}: {len(mine)} rounds of {block}, llamad "
                      f"{size / med([r.llamad for r in mine]):.1f} texts/s, direct "
                      f"{size / med([r.direct for r in mine]):.1f} texts/s", flush=True)
            concurrent: list[dict[str, float]] = []
            clients, each_calls = CONCURRENT
            for rep in range(args.embed_concurrent + 1):  # rep 0 is the warm-up
                spent: dict[str, float] = {}
                for path in ORDERS[rep % len(ORDERS)]:
                    base = offset
                    offset += clients * each_calls

                    async def client(c: int, path: str = path, base: int = base) -> None:
                        for j in range(each_calls):
                            text = texts[(base + c * each_calls + j) % len(texts)]
                            if len(await EMBED_PATHS[path](target[path], [text])) != 1:
                                raise RuntimeError(f"{path}: wrong number of vectors")

                    began = time.perf_counter()
                    await asyncio.gather(*(client(c) for c in range(clients)))
                    spent[path] = time.perf_counter() - began
                if rep:
                    concurrent.append(spent)
            isolated: dict[str, list[float]] = {path: [] for path in EMBED_PATHS}
            for rep in range(args.embed_isolated):
                for path in ORDERS[rep % len(ORDERS)]:
                    await asyncio.sleep(ISOLATED_IDLE)
                    began = time.perf_counter()
                    await EMBED_PATHS[path](target[path], [texts[(offset + rep) % len(texts)]])
                    isolated[path].append(time.perf_counter() - began)
    await asyncio.sleep(MONITOR.period * 1.5)  # let the monitor cover the last round
    for r in rounds:
        r.foreign = MONITOR.foreign(r.start, r.end)
    return EmbedResult(rounds, tokens, len(texts), agreement, args.embed_daemon, isolated,
                       concurrent)


def embed_section(r: EmbedResult, env: list[str], note: PartNote, command: str) -> list[str]:
    out = [EMBED_HEADING, "", *env, note.line(),
           "- Daemon: " + ("`python -m daemon serve` in its own process, as operators run "
                           "it; the clients below run in the benchmark's process"
                           if r.daemon == "process" else "inside the benchmark's process "
                           "(`--embed-daemon in-process`: the clients share its event loop)")
           + f"; embedding child only (`{EMBED_MODEL}`, llama-server, {THREADS} threads, "
           "2 slots, production defaults). llamad: gRPC `Embed` (grpc.aio, default request, "
           "so llamad L2-normalises), vectors read into lists. direct: `POST /v1/embeddings` "
           "(httpx) to the child's port from Status, the texts as llamad sends them, JSON "
           "numbers parsed into lists (a client's default). direct base64: the same with "
           "`encoding_format: base64`, decoded with numpy: what llamad itself asks the child "
           "for (with its lean keep-alive client, supervisor/_http.py).",
           f"- Texts: {r.sentences} distinct sentences of 20-60 tokens (the child's tokenizer) "
           "cut from the CISI corpus; each round sends the same batches the three ways, each "
           "way as a block of back-to-back calls ("
           + ", ".join(f"{n} at batch {b}" for b, n in EMBED_BLOCK.items())
           + "), the order rotating round by round; successive rounds take the next "
           "sentences; one warm-up round per size discarded. ms/call is a block's time over "
           "its calls (median over rounds): the rate a client embedding a corpus gets. "
           "Smallest cosine between llamad's vectors and the direct ones: "
           f"{r.agreement:.6f}.",
           ""]
    rows = []
    notes = []
    for size in sorted({p.size for p in r.rounds}):
        every = [p for p in r.rounds if p.size == size]
        mine = [p for p in every if not p.foreign > MONITOR.busy]
        if len(mine) < len(every) / 2:
            mine = every  # mostly disturbed: keep them all, and say so below
        lm, dm = med([p.llamad for p in mine]), med([p.direct for p in mine])
        d64 = med([p.direct64 for p in mine])
        ratio, ratio64 = dm / lm, d64 / lm
        paired = med([p.direct / p.llamad for p in mine])
        rows.append([str(size), f"{r.tokens[size]:.0f}", f"{len(mine)}/{len(every)}",
                     f"{size / lm:.1f}", f"{size / dm:.1f}", f"{size / d64:.1f}",
                     f"{lm * 1000:.2f}", f"{dm * 1000:.2f}", f"{(lm - dm) * 1000:+.2f}",
                     f"**{ratio:.3f}** {'ok' if ratio >= 0.97 else 'MISS'}", f"{paired:.3f}",
                     f"**{ratio64:.3f}** {'ok' if ratio64 >= 0.97 else 'MISS'}"])
        if EMBED_BLOCK[size] > 1:
            first = {k: med([p.calls_s[k][0] for p in mine]) for k in EMBED_PATHS}
            rest = {k: med([t for p in mine for t in p.calls_s[k][1:]]) for k in EMBED_PATHS}
            notes.append(f"- Batch {size}, each call's own time, median ms, the first call of "
                          "a block (after the other two ways' blocks) against the block's "
                          "other calls: " + "; ".join(
                              f"{k} {first[k] * 1000:.2f} vs {rest[k] * 1000:.2f} "
                              f"({(first[k] - rest[k]) * 1000:+.2f})" for k in EMBED_PATHS)
                          + ".")
    out += table(["batch", "tokens/text", f"rounds kept (others <= {MONITOR.busy} cores)",
                  "llamad texts/s", "direct texts/s", "direct base64 texts/s",
                  "llamad ms/call", "direct ms/call", "added ms/call",
                  "throughput llamad/direct (>= 0.97)", "median of per-round ratios",
                  "llamad/direct base64 (>= 0.97)"], rows)
    if r.concurrent:
        clients, each_calls = CONCURRENT
        rate = {k: clients * each_calls / med([c[k] for c in r.concurrent]) for k in EMBED_PATHS}
        ratio = rate["llamad"] / rate["direct"]
        ratio64 = rate["llamad"] / rate["direct64"]
        paired = med([c["direct"] / c["llamad"] for c in r.concurrent])
        out += ["", f"Concurrent clients: {clients} clients at once, each sending {each_calls} "
                "batch-1 calls back to back, per way per round (the ways in rotation, "
                f"{len(r.concurrent)} rounds after a warm-up); texts/s from the median round.",
                ""]
        out += table(["clients", "llamad texts/s", "direct texts/s", "direct base64 texts/s",
                      "throughput llamad/direct (>= 0.97)", "median of per-round ratios",
                      "llamad/direct base64"],
                     [[str(clients), f"{rate['llamad']:.1f}", f"{rate['direct']:.1f}",
                       f"{rate['direct64']:.1f}",
                       f"**{ratio:.3f}** {'ok' if ratio >= 0.97 else 'MISS'}", f"{paired:.3f}",
                       f"{ratio64:.3f}"]])
    if r.isolated and all(r.isolated.values()):
        iso = {k: med(v) for k, v in r.isolated.items()}
        notes.append(f"- Isolated calls (batch 1, {ISOLATED_IDLE * 1000:.0f} ms without any "
                      f"call before each, the ways in rotation, {len(r.isolated['llamad'])} "
                      "each), median ms: " + "; ".join(f"{k} {v * 1000:.2f}"
                                                       for k, v in iso.items())
                      + f"; direct/llamad {iso['direct'] / iso['llamad']:.3f}. Every way, the "
                      "direct ones too, is slower after an idle spell than back to back (the "
                      "child's threads and the machine waking): this is the latency of one "
                      "query now and then.")
    out += ["", *notes, "", f"Reproduce: `{command}`"]
    return out


# -- main -------------------------------------------------------------------------------


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = bench_parser("bench.bench_swap", __doc__)
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 4 swaps, short windows, 2 kills, fewer embed rounds")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--swaps", type=int, default=None, help="swaps under load (default 20)")
    p.add_argument("--steady", type=float, default=None,
                   help="seconds of each steady window (default 45)")
    p.add_argument("--kills", type=int, default=None, help="kill -9 under load (default 5)")
    p.add_argument("--kill-spacing", type=float, default=12.0,
                   help="seconds the child runs before each kill (default 12)")
    p.add_argument("--cold-starts", type=int, default=None,
                   help="fresh-daemon cold starts besides the crashed one (default 2)")
    p.add_argument("--parts", default="swap,crash,embed",
                   help="comma-separated subset of swap,crash,embed")
    p.add_argument("--extra-args", default="", metavar="ARGS",
                   help="generation.extra_args for the swap and crash parts (experiments, "
                   "e.g. '--poll 0'); default none")
    p.add_argument("--embed-daemon", choices=("process", "in-process"), default="process",
                   help="embed part: run the daemon as its own process (default, as in "
                   "production) or inside this one")
    p.add_argument("--corpus", type=Path, default=CORPUS)
    p.add_argument("--raw", type=Path, help="also write every measurement to this JSON file")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "RESULTS.md")
    add_quiet_options(p, "before each part")
    args = p.parse_args(argv)
    quick = args.quick
    args.swaps = args.swaps if args.swaps is not None else (4 if quick else 20)
    args.steady = args.steady if args.steady is not None else (12.0 if quick else 45.0)
    args.kills = args.kills if args.kills is not None else (2 if quick else 5)
    args.cold_starts = args.cold_starts if args.cold_starts is not None else (1 if quick else 2)
    args.warmup = 5.0 if quick else 10.0
    args.settle = 3.0
    args.gap = 2.0 if quick else 3.0
    args.swap_deadline = 60.0
    args.crash_deadline = 30.0
    args.embed_reps = (80, 8, 4) if quick else (600, 60, 30)
    args.embed_isolated = 20 if quick else 100
    args.embed_concurrent = 3 if quick else 12
    args.parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    if not set(args.parts) <= {"swap", "crash", "embed"} or not args.parts:
        p.error("--parts takes swap, crash and/or embed")
    if args.swaps < 1 or args.kills < 0 or args.clients < 1 or args.max_tokens < 2:
        p.error("--swaps and --clients must be >= 1, --kills >= 0, --max-tokens >= 2")
    return args


async def run(args: argparse.Namespace, command: str) -> None:
    """The parts in order. Only the first waits for other benchmarks to finish (they wait
    for this one in turn, so waiting between parts could deadlock); the later ones wait
    (briefly) for a quiet CPU and note any other benchmark seen. Each part's section and
    raw data are written as soon as it ends."""
    raw: dict[str, Any] = {"command": command}
    began = time.perf_counter()
    for name in (DEFAULT_MODEL, SMALL_MODEL, EMBED_MODEL):
        model_file(name)
    env = environment(command)
    first = True

    async def part(name: str) -> PartNote:
        nonlocal first
        note = await begin_part(name, args.wait_others if first else 120.0,
                                args.anyway or not first, args.max_foreign,
                                wait_others=first)
        first = False
        return note

    def done(key: str, section: list[str], data: dict[str, Any], note: PartNote) -> None:
        print("\n" + "\n".join(section), end="\n\n", flush=True)
        write_sections(args.out, [section])
        print(f"written to {args.out}", flush=True)
        raw[key] = {**data, "note": asdict(note)}
        if args.raw:
            args.raw.write_text(json.dumps(raw, indent=1, default=str) + "\n")

    MONITOR.start()
    with tempfile.TemporaryDirectory(prefix="llamad-bench-swap-") as tmp:
        state_dir = Path(tmp)
        if "swap" in args.parts:
            note = await part("swap under load")
            swap = await bench_swap(args, state_dir)
            end_part(note)
            done("swap", swap_section(swap, env, note, command), asdict(swap), note)
        if "crash" in args.parts:
            note = await part("crash under load")
            crash = await bench_crash(args, state_dir)
            end_part(note)
            done("crash", crash_section(crash, env, note, command), asdict(crash), note)
        if "embed" in args.parts:
            note = await part("embedding: llamad vs direct")
            emb = await bench_embed(args, state_dir)
            end_part(note)
            done("embed", embed_section(emb, env, note, command), asdict(emb), note)
    await MONITOR.stop()
    print(f"total {time.perf_counter() - began:.0f}s", flush=True)
    if args.raw:
        print(f"raw measurements in {args.raw}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    shown = sys.argv[1:] if argv is None else list(argv)
    command = " ".join([".venv/bin/python -m bench.bench_swap", *map(shlex.quote, shown)])
    with daemon_log():
        asyncio.run(run(args, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
