"""The harness of ``bench.soak``'s clients: the clock, counted calls, and the sampler."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc

from bench._daemon import DaemonProcess
from bench._soak.common import (
    CLIENT_CANCEL,
    DEADLINES,
    HANG_GRACE,
    MIB,
    DocRecord,
    Hung,
    Sample,
    SwapRecord,
    T,
    descendants,
    proc_stat,
)
from bench._support import RETRY_KEY, RETRYABLE


class Harness:
    """What every client shares: the clock, the stop event, counted calls, samples."""

    def __init__(self, args: argparse.Namespace, address: str, daemon: DaemonProcess,
                 corpus: Path, models: tuple[Path, Path]) -> None:
        self.args = args
        self.address = address
        self.daemon = daemon
        self.corpus = corpus
        self.models = models
        self.t0 = time.monotonic()
        self.stop = asyncio.Event()
        self.counts: Counter[tuple[str, str]] = Counter()
        self.latency: dict[tuple[str, str], list[float]] = defaultdict(list)
        self.details: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
        self.hung: list[Hung] = []
        self.client_errors: Counter[str] = Counter()
        self.docs: dict[str, DocRecord] = {}
        self.anomalies: Counter[str] = Counter()
        self.probes: Counter[str] = Counter()  # token searches during the load
        self.dir_files: dict[str, str] = {}  # file name -> token, on disk
        self.dir_acked: dict[str, str] = {}  # as of the last acknowledged Reindex
        self.dir_removed: list[str] = []  # tokens replaced or deleted on disk
        self.reindex_failures: Counter[str] = Counter()
        self.swaps: list[SwapRecord] = []
        self.samples: list[Sample] = []
        self.died: str = ""

    # -- bookkeeping -------------------------------------------------------------------

    def now(self) -> float:
        return time.monotonic() - self.t0

    async def pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), seconds)

    async def every(self, seconds: float) -> AsyncIterator[None]:
        """Yield each ``seconds`` until the run stops (never once it has stopped)."""
        while not self.stop.is_set():
            await self.pause(seconds)
            if self.stop.is_set():
                return
            yield

    async def call(self, rpc: str, fn: Callable[[float], Awaitable[tuple[str, T]]]
                   ) -> tuple[str, T | None, grpc.aio.AioRpcError | None]:
        """Run ``fn(deadline)``: count its outcome; a hang is abandoned after deadline + 2 s."""
        deadline = DEADLINES[rpc.split(" ", maxsplit=1)[0]]
        began = time.monotonic()
        value: T | None = None
        err: grpc.aio.AioRpcError | None = None
        try:
            code, value = await asyncio.wait_for(fn(deadline), deadline + HANG_GRACE)
        except TimeoutError:
            code = "HUNG"
            self.hung.append(Hung(rpc, began - self.t0, deadline))
            print(f"  HUNG: {rpc} sent at {began - self.t0:.1f}s, deadline {deadline:.0f}s",
                  flush=True)
        except grpc.aio.AioRpcError as exc:
            code, err = exc.code().name, exc
            text = " ".join((exc.details() or "").split())
            self.details[(rpc, code)][text[:100]] += 1
        except Exception as exc:  # a bug of the soak itself: counted and shown
            code = f"client error {type(exc).__name__}"
            self.client_errors[f"{rpc}: {exc!r}"[:160]] += 1
        self.counts[(rpc, code)] += 1
        self.latency[(rpc, code)].append(time.monotonic() - began)
        return code, value, err

    @staticmethod
    def after(code: str, err: grpc.aio.AioRpcError | None, normal: float) -> float:
        """How long a client waits before its next call."""
        if err is not None and code in RETRYABLE:
            for key, value in err.trailing_metadata() or ():
                if key == RETRY_KEY:
                    return max(0.05, int(value) / 1000)
            return 1.0
        return normal if code in ("OK", CLIENT_CANCEL) else 1.0

    def channel(self) -> grpc.aio.Channel:
        return grpc.aio.insecure_channel(self.address)

    # -- the sampler -------------------------------------------------------------------

    def sample(self, phase: str) -> Sample | None:
        own = proc_stat(self.daemon.pid)
        if own is None or self.daemon.proc.poll() is not None:
            return None
        kids = [s for s in (proc_stat(p) for p in descendants(self.daemon.pid)) if s]
        acked = sum(1 for d in self.docs.values() if d.token)
        s = Sample(round(self.now(), 2), own.rss, own.fds, own.threads, len(kids),
                   sum(k.rss for k in kids), sum(k.fds for k in kids),
                   sum(k.threads for k in kids), sum(self.counts.values()), acked, phase,
                   own.rss_anon, own.rss_file)
        self.samples.append(s)
        return s

    async def sampler(self, duration: float) -> None:
        shown = -1
        while not self.stop.is_set():
            s = self.sample("load")
            if s is None:
                self.died = f"the daemon exited ({self.daemon.proc.poll()}) at {self.now():.0f}s"
                print(f"  {self.died}", flush=True)
                self.stop.set()
                return
            if int(s.t // 30) > shown:
                shown = int(s.t // 30)
                print(f"  {s.t:5.0f}s/{duration:.0f}: daemon {s.rss / MIB:.1f} MiB (anon "
                      f"{s.rss_anon / MIB:.1f}), {s.fds} fds, "
                      f"{s.threads} threads; {s.children} children {s.children_rss / MIB:.0f} "
                      f"MiB; {s.calls} calls, {s.acked} docs acked, {len(self.hung)} hung",
                      flush=True)
            await self.pause(self.args.sample_every)
