"""Relay cost: llamad's own CPU per 1,000 relayed tokens, and its relay ceiling (issue 27).

    .venv/bin/python -m bench.bench_relay_cost [--source fake|model|both] [--floor]
        [--concurrency 1,8,32] [--rounds N] [--ceiling 1,2,4,8,16,32,64] [--slots N]
        [--no-router] [--llama-bin FILE] [--out bench/RESULTS.md]

A daemon as operators run it (``python -m daemon serve``, ``http_listen`` on, no
embedding child) relays streamed generations from one generation child; every path is
measured in rounds, the paths in rotated order each round:

- *direct*: ``POST /v1/chat/completions`` (streamed) to the child's own socket with its
  key; the daemon's CPU meanwhile is its idle cost.
- *HTTP chat*: the same body to llamad's HTTP API (``model: generation``).
- *gRPC Chat*, *gRPC Generate*: grpc.aio streams.
- *router* (``--source model``, unless ``--no-router``): the same HTTP body to
  ``llama-server --models-dir models/gguf --models-max 1`` started with the child's
  command line (``bench.bench_http_relay``'s router), its process's CPU (not its child's).

Sources: *fake* is the fault-injecting fake child (``supervisor/testing/fake_child.py``)
at token delay 0 (``--token-delay``) as the generation child (a wrapper script given as
``llama_bin``; the model file is SmolLM2's, whose header and chat template the daemon
reads), one slot per stream: a token source that costs almost nothing and never waits.
*model* is llama-server on SmolLM2-135M with ``--slots`` slots (2 threads). With the
fake, the ceiling part also runs: 1 to 64 concurrent streams on direct, HTTP chat and
gRPC Chat, tokens/s, the daemon's cores and the median time to first token.

CPU: ``clock_gettime`` on each process's CPU clock before and after a round (utime +
stime of all its threads, ns: :func:`bench._relay_cost.cpu_ns`), per 1,000 tokens of the
round (the usage counts the stream reports). Medians over rounds. The bench's own
CPU per 1,000 tokens (its clients) is shown too. No quiet-machine guard: CPU time per
token moves less with load than wall time does; ``uptime`` is recorded before and after.
The section ``## Relay cost: llamad's CPU per token`` of ``--out`` is created or replaced.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path as FilePath

import grpc
import httpx

from bench import _support as support
from bench._daemon import DaemonProcess, serving
from bench._direct import child_key
from bench._generation.common import daemon_env
from bench._relay import GREEDY_CHAT, free_port
from bench._relay_cost import (
    CHAT,
    DIRECT,
    GENERATE,
    HTTP,
    ROUTER,
    Path,
    Round,
    grpc_path,
    http_path,
    measure,
    med,
)
from bench._relay_floor import floor_lines, floors
from bench.bench_http_relay import generation_child, router
from llamad_protocol.v1 import inference_pb2_grpc
from supervisor.http import LoopbackHTTP

HEADING = "## Relay cost: llamad's CPU per token"
FAKE_CHILD = support.ROOT / "supervisor" / "testing" / "fake_child.py"
DAEMON = "daemon"


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = support.bench_parser("bench.bench_relay_cost", __doc__)
    p.add_argument("--source", choices=("fake", "model", "both"), default="both")
    p.add_argument("--concurrency", default="1,8,32", help="concurrent streams per round")
    p.add_argument("--rounds", type=int, default=3, help="measured rounds (+1 warm-up)")
    p.add_argument("--ceiling", default="1,2,4,8,16,32,64",
                   help="the fake source's concurrency curve ('' to skip)")
    p.add_argument("--fake-tokens", type=int, default=1024, help="max_tokens, fake source")
    p.add_argument("--fake-round", type=int, default=16384,
                   help="tokens per round and path at least, fake source")
    p.add_argument("--token-delay", type=float, default=0.0, help="the fake's, s per token")
    p.add_argument("--model-tokens", type=int, default=64, help="max_tokens, model source")
    p.add_argument("--model-round", type=int, default=384,
                   help="tokens per round and path at least, model source")
    p.add_argument("--slots", type=int, default=4, help="the model child's slots")
    p.add_argument("--no-router", action="store_true", help="leave out llama-server's router")
    p.add_argument("--llama-bin", default=str(support.ROOT / ".venv" / "bin" / "llama-server"))
    p.add_argument("--out", type=FilePath, default=support.ROOT / "bench" / "RESULTS.md")
    p.add_argument("--no-write", action="store_true", help="print, do not write --out")
    p.add_argument("--stream-interval", type=int, default=None,
                   help="the daemon's [child] stream_interval, ms (default: its default)")
    p.add_argument("--floor", action="store_true",
                   help="also measure the floor: an asyncio process's CPU per wake-up")
    args = p.parse_args(argv)
    args.levels = [int(x) for x in args.concurrency.split(",") if x]
    args.curve = [int(x) for x in args.ceiling.split(",") if x]
    return args


def fake_binary(tmp: str, delay: float) -> str:
    """A script that runs the fake child with llama-server's arguments."""
    path = FilePath(tmp) / "fake-llama-server"
    path.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE_CHILD} --token-delay {delay} "
                    '"$@"\n')
    path.chmod(0o700)
    return str(path)


@contextlib.asynccontextmanager
async def daemon(binary: str, slots: int, threads: int, tmp: str, tag: str, *,
                 connections: int = 0, interval: int | None = None
                 ) -> AsyncIterator[tuple[DaemonProcess, grpc.aio.Channel, int]]:
    """The daemon; ``connections``: the child's HTTP threads, if set (``--threads-http``);
    ``interval``: its ``[child] stream_interval`` (ms), if set."""
    port = free_port()
    env = {**daemon_env("llama-server", support.model_file(support.SMALL_MODEL), threads),
           **GREEDY_CHAT, "LLAMAD_STATE_DIR": tempfile.mkdtemp(dir=tmp),
           "LLAMAD_LLAMA_BIN": binary, "LLAMAD_HTTP_LISTEN": f"127.0.0.1:{port}",
           "LLAMAD_GENERATION_PARALLEL": str(slots), "LLAMAD_LIMITS_QUEUE_SIZE": "128",
           "LLAMAD_GENERATION_CTX_SIZE": "2048"}
    if connections:
        env["LLAMAD_GENERATION_EXTRA_ARGS"] = f"--threads-http {connections}"
    if interval is not None:
        env["LLAMAD_CHILD_STREAM_INTERVAL"] = str(interval)
    async with serving(env, FilePath(tmp) / f"daemon-{tag}.log") as (proc, channel):
        yield proc, channel, port


async def rounds(paths: Sequence[Path], levels: Sequence[int], n: int, max_tokens: int, *,
                 per_round: int, every: dict[str, int], tag: str) -> list[Round]:
    """``n`` measured rounds (after one warm-up) of every path at every level."""
    kept: list[Round] = []
    for rnd in range(n + 1):
        began = time.perf_counter()
        for level in levels:
            per_worker = max(1, math.ceil(per_round / (level * max_tokens)))
            for k in range(len(paths)):
                path = paths[(k + rnd) % len(paths)]
                got = await measure(path, level, per_worker, max_tokens,
                                    tag=f"{tag} r{rnd} x{level}", every=every)
                if rnd:
                    kept.append(got)
        what = "warm-up" if rnd == 0 else f"round {rnd}/{n}"
        print(f"  {tag}, {what}: {time.perf_counter() - began:.1f}s", flush=True)
    return kept


def cost_rows(kept: Sequence[Round], paths: Sequence[Path], levels: Sequence[int]
              ) -> list[list[str]]:
    rows: list[list[str]] = []
    for level in levels:
        for path in paths:
            these = [r for r in kept if r.path == path.name and r.concurrency == level]
            if not these:
                continue
            relay = ROUTER if path.name == ROUTER else DAEMON
            per_1k = med([r.per_1k(relay) for r in these])
            idle = "" if path.name != DIRECT else " (idle)"
            rows.append([str(level), path.name, f"{med([r.rate for r in these]):.0f}",
                         f"**{per_1k:.1f}**{idle}" if relay == DAEMON else f"{per_1k:.1f}",
                         f"{med([r.cores(relay) for r in these]):.2f}",
                         f"{med([r.per_1k('child') for r in these]):.1f}",
                         f"{med([r.client_cpu * 1e6 / r.tokens for r in these]):.1f}",
                         f"{med([med(r.ttfts) for r in these]) * 1000:.1f}",
                         _gap(these), f"{sum(r.tokens for r in these)}"])
    return rows


def _gap(these: Sequence[Round]) -> str:
    """The median of the streams' mean gaps between two text events (HTTP paths), ms."""
    gaps = [g for r in these for g in r.gaps]
    return f"{med(gaps) * 1000:.1f}" if gaps else "-"


COST_HEADER = ["streams", "path", "tokens/s", "relay CPU ms / 1k tokens", "relay cores",
               "child CPU ms / 1k", "bench clients ms / 1k", "median TTFT ms",
               "median event gap ms", "tokens"]


async def source_run(args: argparse.Namespace, tmp: str, kind: str) -> list[str]:
    fake = kind == "fake"
    binary = fake_binary(tmp, args.token_delay) if fake else args.llama_bin
    slots = max([*args.levels, *args.curve]) if fake else args.slots
    lines: list[str] = []
    async with contextlib.AsyncExitStack() as stack:
        # llama-server serves slots + 2 connections at once by default (its HTTP threads)
        # and closes the ones past them unanswered: the direct and router paths open one
        # per stream (llamad queues past its slots itself), and the daemon's liveness probe
        # and kept connections need threads too. The router runs the child's command line.
        proc, channel, port = await stack.enter_async_context(
            daemon(binary, slots, 1 if fake else 2, tmp, kind,
                   connections=0 if fake else max(args.levels) + slots + 8,
                   interval=args.stream_interval))
        child = await generation_child(channel)
        every = {DAEMON: proc.pid, "child": child.pid}
        print(f"{kind}: daemon pid {proc.pid}, child pid {child.pid}", flush=True)
        direct = LoopbackHTTP("localhost", 0, unix_path=child.socket,
                              api_key=child_key(child.pid), max_connections=128)
        llamad = LoopbackHTTP("127.0.0.1", port, max_connections=128)
        stack.push_async_callback(direct.aclose)
        stack.push_async_callback(llamad.aclose)
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        paths = [http_path(DIRECT, direct, "", every), http_path(HTTP, llamad, "generation",
                                                                 every),
                 grpc_path(CHAT, stub, chat=True, processes=every),
                 grpc_path(GENERATE, stub, chat=False, processes=every)]
        if not fake and not args.no_router:
            args.model, args.threads = support.SMALL_MODEL, 2
            rproc, rport = await stack.enter_async_context(
                router(args, child.pid, FilePath(tmp) / "router.log"))
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{rport}",
                                         trust_env=False) as http:
                ids = [str(m.get("id", "")) for m in
                       (await http.get("/v1/models", timeout=10)).json()["data"]]
            name = min((i for i in ids if "smollm2" in i.lower()), key=len)
            routed = LoopbackHTTP("127.0.0.1", rport, max_connections=128)
            stack.push_async_callback(routed.aclose)
            every[ROUTER] = rproc.pid
            paths.append(http_path(ROUTER, routed, name, every))
        max_tokens = args.fake_tokens if fake else args.model_tokens
        per_round = args.fake_round if fake else args.model_round
        kept = await rounds(paths, args.levels, args.rounds, max_tokens,
                            per_round=per_round, every=every, tag=kind)
        what = (f"the fake child at token delay {args.token_delay:g} s, one slot per "
                f"stream, max_tokens {max_tokens}" if fake else
                f"llama-server on SmolLM2-135M, {args.slots} slots, 2 threads, greedy, "
                f"max_tokens {max_tokens}")
        retried = sum(r.retried for r in kept)
        lines += ["", f"Source: {what}; at least {per_round} tokens per path and round, "
                  f"{args.rounds} rounds (medians); {retried} requests dropped before any "
                  "answer and sent again:", "",
                  *support.table(COST_HEADER, cost_rows(kept, paths, args.levels))]
        if fake and args.curve:
            curve = await rounds(paths[:3], args.curve, 1, max_tokens,
                                 per_round=per_round, every=every, tag="ceiling")
            lines += ["", "Relay ceiling (the same fake source; one round per level):", "",
                      *support.table(["streams", *(f"{p.name} tokens/s" for p in paths[:3]),
                                      "daemon cores HTTP / gRPC",
                                      "added median TTFT ms HTTP / gRPC"],
                                     curve_rows(curve, paths[:3], args.curve))]
    return lines


def curve_rows(kept: Sequence[Round], paths: Sequence[Path], levels: Sequence[int]
               ) -> list[list[str]]:
    rows = []
    for level in levels:
        by = {r.path: r for r in kept if r.concurrency == level}
        if len(by) < len(paths):
            continue
        base = med(by[DIRECT].ttfts)
        rows.append([str(level), *(f"{by[p.name].rate:.0f}" for p in paths),
                     f"{by[HTTP].cores(DAEMON):.2f} / {by[CHAT].cores(DAEMON):.2f}",
                     f"{(med(by[HTTP].ttfts) - base) * 1000:.1f} / "
                     f"{(med(by[CHAT].ttfts) - base) * 1000:.1f}"])
    return rows


async def run(args: argparse.Namespace, command: str) -> list[str]:
    began = time.perf_counter()
    load = support.uptime()
    body: list[str] = []
    if args.floor:
        body += floor_lines(await floors(interval=0.014), 0.014)
    with tempfile.TemporaryDirectory(prefix="llamad-relay-cost-") as tmp:
        for kind in (("fake", "model") if args.source == "both" else (args.source,)):
            body += await source_run(args, tmp, kind)
    return [HEADING, "", *support.environment(command, args.llama_bin),
            f"- Machine load: before `{load}`; after `{support.uptime()}`; whole run "
            f"{(time.perf_counter() - began) / 60:.1f} min.",
            "- Paths, CPU and sources: see the docstring of `bench/bench_relay_cost.py`. "
            "*relay CPU*: the daemon's (the router's process for *router*); on *direct* it "
            "is the daemon's idle cost per 1,000 direct tokens. *relay cores*: its CPU "
            "seconds per wall second.", *body]


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    command = ".venv/bin/python -m bench.bench_relay_cost " + " ".join(
        sys.argv[1:] if argv is None else argv)
    lines = asyncio.run(run(args, command.strip()))
    print("\n".join(lines))
    if not args.no_write:
        support.write_sections(args.out, [lines])
        print(f"wrote {args.out}", flush=True)


if __name__ == "__main__":
    main()
