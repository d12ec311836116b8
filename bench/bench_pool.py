"""Model pool benchmark: llamad's pool against llama.cpp's own router mode, two generation
models, random model per request.

    .venv/bin/python -m bench.bench_pool [--seconds 300] [--clients 8] [--max-tokens 32]
        [--threads N] [--llamad-threads N] [--ctx 2048] [--parallel 4] [--cold 5] [--rooms 1,2]
        [--no-router] [--no-direct] [--llama-bin FILE]
        [--out bench/RESULTS.md]

In one run:

1. **Mixed load.** For room for one model and for both: llama-server in router mode
   (``--models-dir DIR --models-max 1`` or ``2``; DIR holds just the two GGUFs, gemma-3-270m
   and SmolLM2-135M-Instruct) and a llamad daemon (``python -m daemon serve``, HTTP API on,
   no embedding child, the same two models as ``[models.NAME]`` tables, SmolLM2 the
   generation default with ``pin = false``, ``[models] max_resident`` 1 or 2; with room for
   both, both models ``preload = true``, as an operator keeping both resident would). Both
   run every model with the same ``--ctx`` and ``--parallel`` (4 slots: both servers'
   own default; llama-server's -np auto is 4), and each with its own defaults otherwise,
   as a user would start them: the router with llama-server's threads
   (``--threads``, default every core) and OpenMP spins, llamad with its own (it sets
   ``GOMP_SPINCOUNT`` per child, and divides the cores among the generation models that
   stay resident together; ``--llamad-threads`` sets ``generation.threads`` instead).
   ``--clients`` clients each send, one after another,
   ``POST /v1/chat/completions`` streamed (``max_tokens`` ``--max-tokens``, greedy, the
   same body for both), each naming gemma or SmolLM2 at random (a seeded generator per
   client, the same sequence for every server), for ``--seconds``. A request fails if the
   answer is not 200 or the stream ends without a finish. Model starts are counted as the
   distinct llama-server children seen under the server's process (sampled every 50 ms).
   Time to first token is from sending to the first content delta; tokens/s is every
   completion token over the time from the first request to the last answer.
   With room for both, the reference (*direct*): each model on a llama-server of its
   own, started as llamad starts its children (the same settings, threads and
   GOMP_SPINCOUNT, and
   HTTP threads for every client: llama-server's default, slots + 2, closes the
   connections past them unanswered), each request sent to its model's server.
   The server's own CPU time (the router's or llamad's process, not the children) is
   read from /proc for each setup. Every request opens its own connection (keep-alive
   off for every server: a request sent on a connection llama-server is closing fails
   before the server sees it, which would count as the server's failure).
2. **Cold start.** With room for both and gemma unloaded (``UnloadModel``), the time from a
   request naming gemma to its first token through llamad, against gemma's cold start
   without llamad: llama-server started on the file with the settings llamad gives it, polled on
   ``/health`` every 10 ms, then the same request; ``--cold`` times each, alternated.

The section ``## Model pool: llamad vs llama-server's router`` of ``--out`` is created or
replaced. About 5 x ``--seconds`` plus two minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench import _support as support
from bench._pool_servers import (
    MODELS,
    Outcome,
    cold_direct,
    cold_llamad,
    direct_servers,
    llamad,
    llamad_threads,
    request,
    router,
)
from bench._relay import process_ticks

SECTION = "## Model pool: llamad vs llama-server's router"


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = support.bench_parser("bench.bench_pool", __doc__)
    p.add_argument("--seconds", type=float, default=300.0, help="mixed load per setup")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2,
                   help="the router's threads per model (default: every core, llama-server's)")
    p.add_argument("--llamad-threads", type=int, default=None,
                   help="llamad's generation.threads (default: the daemon's own)")
    p.add_argument("--ctx", type=int, default=2048, help="context tokens per slot")
    p.add_argument("--parallel", type=int, default=4,
                   help="slots per model (default: 4, llama-server's own default, and "
                   "llamad's generation.parallel)")
    p.add_argument("--cold", type=int, default=5, help="cold starts timed per path")
    p.add_argument("--no-router", action="store_true", help="leave out llama-server's router")
    p.add_argument("--no-direct", action="store_true",
                   help="leave out the two models served directly (room for both)")
    p.add_argument("--rooms", default="1,2", help="room for how many models, each setup")
    p.add_argument("--turn", type=float, default=None,
                   help="llamad's [models] turn (default: the daemon's own default)")
    p.add_argument("--spin-count", type=int, default=None,
                   help="llamad's generation.spin_count (default: the daemon's own)")
    p.add_argument("--llama-bin", default=str(support.ROOT / ".venv" / "bin" / "llama-server"))
    p.add_argument("--out", type=Path, default=support.ROOT / "bench" / "RESULTS.md")
    args = p.parse_args(argv)
    args.rooms = [int(r) for r in args.rooms.split(",")]
    if args.seconds <= 0 or args.clients < 1 or args.max_tokens < 1 or args.cold < 0:
        p.error("--seconds, --clients and --max-tokens must be positive, --cold >= 0")
    return args


# -- one request ---------------------------------------------------------------------------


def children_of(pid: int) -> set[int]:
    found = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{entry.name}/stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[1]) == pid and "llama-server" in stat[: stat.rindex(")")]:
                found.add(int(entry.name))
    return found


@dataclass
class Starts:
    """Distinct llama-server children seen under ``pid``, sampled every 50 ms."""

    pid: int
    seen: set[int] = field(default_factory=set)

    async def watch(self) -> None:
        while True:
            self.seen |= await asyncio.to_thread(children_of, self.pid)
            await asyncio.sleep(0.05)


# -- the mixed load --------------------------------------------------------------------------


@dataclass
class Mixed:
    setup: str
    room: int
    outcomes: list[Outcome]
    starts: int
    warm_starts: int  # of which during the first tenth of the run
    seconds: float
    cpu: float | None  # the server's own process, CPU s (None: direct, no server)


async def mixed(setup: str, room: int, http: httpx.AsyncClient | dict[str, httpx.AsyncClient],
                ids: dict[str, str], *, pid: int, args: argparse.Namespace) -> Mixed:
    """``--clients`` clients naming the models of ``ids`` at random; ``http`` is the
    server, or each model id's own (direct)."""
    routes = http if isinstance(http, dict) else {i: http for i in ids.values()}
    starts = Starts(pid)
    before = children_of(pid)
    ticks = process_ticks(pid)
    watcher = asyncio.create_task(starts.watch())
    began = time.perf_counter()
    stop = began + args.seconds
    warm_seen: set[int] = set()

    async def client(k: int) -> list[Outcome]:
        rng = random.Random(1000 + k)
        done: list[Outcome] = []
        i = k
        while time.perf_counter() < stop:
            model = ids[rng.choice(sorted(ids))]
            done.append(await request(routes[model], model,
                                      support.PROMPTS[i % len(support.PROMPTS)],
                                      args.max_tokens))
            i += 1
        return done

    async def warm() -> None:
        await asyncio.sleep(args.seconds / 10)
        warm_seen.update(starts.seen - before)

    warming = asyncio.create_task(warm())
    results = await asyncio.gather(*(client(k) for k in range(args.clients)))
    watcher.cancel()
    warming.cancel()
    outcomes = [o for r in results for o in r]
    end = max((o.done for o in outcomes), default=time.perf_counter())
    cpu = (process_ticks(pid) - ticks) / support.CLK_TCK
    started = starts.seen - before
    result = Mixed(setup, room, outcomes, len(started), len(warm_seen), end - began,
                   None if pid == os.getpid() else cpu)
    ok = [o for o in outcomes if not o.error]
    print(f"  {setup}, room for {room}: {len(ok)} completed, {len(outcomes) - len(ok)} "
          f"failed, {result.starts} model starts, {sum(o.tokens for o in ok)} tokens in "
          f"{result.seconds:.0f}s", flush=True)
    for o in outcomes:
        if o.error:
            print(f"    failed ({o.model}): {o.error}", flush=True)
            break
    return result


# -- the servers -----------------------------------------------------------------------------


def row(m: Mixed) -> list[str]:
    ok = [o for o in m.outcomes if not o.error]
    ttft = [o.ttft for o in ok]
    tokens = sum(o.tokens for o in ok)
    return [m.setup, str(m.room), str(len(ok)), str(len(m.outcomes) - len(ok)),
            f"{support.pct(ttft, 50):.2f}", f"{support.pct(ttft, 90):.2f}",
            f"{support.pct(ttft, 99):.2f}", f"{tokens / m.seconds:.1f}",
            f"{m.starts} ({m.starts - m.warm_starts} after warm-up)",
            "—" if m.cpu is None else f"{m.cpu:.1f}"]


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "n/a (router: 0)"


def report(runs: list[Mixed], cold: tuple[list[float], list[float]],
           args: argparse.Namespace, env: list[str], *, minutes: float,
           threads: str) -> list[str]:
    lines = [SECTION, "", *env,
             f"- {args.clients} clients, each request naming gemma-3-270m or "
             f"SmolLM2-135M-Instruct at random, {args.max_tokens}-token streamed chat "
             f"completions, greedy, {args.seconds:.0f} s per setup; every model with "
             f"context {args.ctx}, {args.parallel} slot(s); the router's with {args.threads} "
             f"threads, llamad's with its own ({threads}). "
             "*direct*: each model on a llama-server of its own, no router, with llamad's "
             "threads and spins (the reference for room for both). *server CPU s*: the "
             "router's or llamad's own process "
             "(not its children) during the setup. Total "
             f"{minutes:.1f} min.", "",
             *support.table(["server", "room for", "completed", "failed",
                             "TTFT p50 s", "TTFT p90 s", "TTFT p99 s", "tokens/s",
                             "model starts", "server CPU s"], [row(m) for m in runs]), ""]
    by = {(m.setup, m.room): m for m in runs}

    def done(m: Mixed) -> int:
        return sum(1 for o in m.outcomes if not o.error)

    def p90(m: Mixed) -> float:
        return support.pct([o.ttft for o in m.outcomes if not o.error], 90)

    def rate(m: Mixed) -> float:
        return sum(o.tokens for o in m.outcomes if not o.error) / m.seconds

    if ("router", 1) in by and ("llamad", 1) in by:
        r, ll = by["router", 1], by["llamad", 1]
        lines.append(f"- Room for one: llamad completed {ratio(done(ll), done(r))} the "
                     f"router's calls, time to first token p90 {p90(ll):.2f} s vs "
                     f"{p90(r):.2f} s, {ll.starts} model starts vs {r.starts}.")
    if ("router", 2) in by and ("llamad", 2) in by:
        r, ll = by["router", 2], by["llamad", 2]
        lines.append(f"- Room for both: llamad's throughput is {ratio(rate(ll), rate(r))} "
                     f"the router's (goal 5x), {ll.starts - ll.warm_starts} starts after "
                     "warm-up.")
    if ("direct", 2) in by and ("llamad", 2) in by:
        d, ll = by["direct", 2], by["llamad", 2]
        lines.append(f"- Room for both: llamad's tokens/s is {rate(ll) / rate(d):.3f} of the "
                     "two models served directly (each on its own llama-server started as "
                     "llamad starts them; goal 0.98).")
    through, direct = cold
    if through and direct:
        lines.append(
            f"- Cold start of gemma: request to first token through llamad (model "
            f"unloaded) median {support.pct(through, 50):.3f} s "
            f"({', '.join(f'{x:.3f}' for x in through)}), gemma's own cold start "
            f"(llama-server started, /health polled every 10 ms, then the request) median "
            f"{support.pct(direct, 50):.3f} s ({', '.join(f'{x:.3f}' for x in direct)}): "
            f"llamad adds {1000 * (support.pct(through, 50) - support.pct(direct, 50)):.0f}"
            " ms (goal: within 100 ms).")
    return lines


# -- main ------------------------------------------------------------------------------------


async def run(args: argparse.Namespace, command: str, logdir: Path) -> None:
    folder = logdir / "models"
    folder.mkdir()
    for file in MODELS.values():
        (folder / file).symlink_to(support.model_file(file))
    began = time.perf_counter()
    runs: list[Mixed] = []
    through: list[float] = []
    direct: list[float] = []
    used: list[str] = []
    for room in args.rooms:
        if not args.no_router:
            async with router(args, folder, room, logdir / f"router-{room}.log") as (
                    pid, http, ids):
                runs.append(await mixed("router", room, http, ids, pid=pid, args=args))
        threads = llamad_threads(args, folder, room, logdir)
        print(f"  llamad's threads, room for {room}: {threads}", flush=True)
        used.append(f"room for {room}: " + ", ".join(f"{n} {t}" for n, t in threads.items()))
        if room == 2 and not args.no_direct:
            async with direct_servers(args, folder, logdir, threads) as routes:
                runs.append(await mixed("direct", room, routes, {n: n for n in MODELS},
                                        pid=os.getpid(), args=args))
        async with llamad(args, folder, room, logdir) as (pid, http, channel):
            runs.append(await mixed("llamad", room, http, {n: n for n in MODELS},
                                    pid=pid, args=args))
            if room == 2:
                for _ in range(args.cold):
                    through.append(await cold_llamad(http, channel, args))
                    direct.append(await cold_direct(args, folder, logdir, threads["gemma"]))
                    print(f"  cold start: through llamad {through[-1]:.3f}s, direct "
                          f"{direct[-1]:.3f}s", flush=True)
    env = support.environment(command, args.llama_bin)
    section = report(runs, (through, direct), args, env,
                     minutes=(time.perf_counter() - began) / 60, threads="; ".join(used))
    support.publish(args.out, [section])


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    command = support.command_line("bench.bench_pool", argv)
    logdir = Path(tempfile.mkdtemp(prefix="llamad-bench-pool-"))
    print(f"logs in {logdir}", flush=True)
    asyncio.run(run(args, command, logdir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
