"""Live change detection benchmark: how long from a file saved into a directory source
until a Search finds it (retrieval.watch), beside a Reindex called the moment the file is
saved (what an operator's own hook would do at best: the scan and embedding alone).

    .venv/bin/python -m bench.bench_watch [--saves 30] [--burst 1000] [--no-write]
        [--out bench/RESULTS.md]

One ``python -m daemon serve`` process, the generation role off, all-MiniLM-L6-v2 on
llama-server as the embedding child, the default watch options (debounce 0.5 s). Each
save writes one small Markdown file with a word found nowhere else, alternately in place
and as editors do (a temporary file renamed over the name), then polls a text Search for
the word every 20 ms (text mode: the poll must not queue query embeddings in front of the
ingest's). The Reindex way writes the same kind of file with the watcher off, calls
Reindex at once and polls the same way. The burst writes ``--burst`` files from a thread,
as a checkout would, and reports the time until the last is found and how many scans the
watcher started for it (its log lines).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench import _support as support
from bench._daemon import serving
from clients import AsyncClient


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--saves", type=int, default=30, help="single saves measured per way")
    p.add_argument("--burst", type=int, default=1000, help="files in the burst (0: skip)")
    p.add_argument("--llama-bin", default=str(support.ROOT / ".venv" / "bin" / "llama-server"))
    p.add_argument("--out", type=Path, default=support.ROOT / "bench" / "RESULTS.md")
    p.add_argument("--no-write", action="store_true", help="print only")
    return p.parse_args(argv)


def env(root: Path, state: Path, llama_bin: str, watch: bool) -> dict[str, str]:
    return {"LLAMAD_LISTEN": "127.0.0.1:0", "LLAMAD_STATE_DIR": str(state),
            "LLAMAD_LLAMA_BIN": llama_bin, "LLAMAD_LOG_FORMAT": "json",
            "LLAMAD_GENERATION_ENABLED": "false",
            "LLAMAD_EMBEDDING_MODEL": str(support.model_file("all-MiniLM-L6-v2-f16.gguf")),
            "LLAMAD_RETRIEVAL_ALLOWED_ROOTS": str(root),
            "LLAMAD_RETRIEVAL_RESCAN_INTERVAL": "0",
            "LLAMAD_RETRIEVAL_REFRESH_MIN_INTERVAL": "0",
            "LLAMAD_RETRIEVAL_WATCH": "true" if watch else "false"}


def save(folder: Path, i: int, word: str) -> None:
    text = f"# Note {i}\n\nThe keyword of this note is {word}.\n"
    if i % 2:  # as editors save: a temporary file renamed over the name
        tmp = folder / f".note{i}.md.swp"
        tmp.write_text(text)
        os.replace(tmp, folder / f"note{i}.md")
    else:
        (folder / f"note{i}.md").write_text(text)


async def until_found(client: AsyncClient, word: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not (await client.search(word, top_k=1, mode="text")).hits:
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: {word} not found within {timeout:.0f} s")
        await asyncio.sleep(0.02)


def scans_started(log: Path) -> int:
    count = 0
    for line in log.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("event") == "source changed: scanning":
            count += 1
    return count


async def one_way(args: argparse.Namespace, watch: bool, work: Path) -> dict[str, float]:
    root = work / ("watched" if watch else "reindexed")
    docs = root / "docs"
    docs.mkdir(parents=True)
    log = work / f"daemon-{'watch' if watch else 'reindex'}.log"
    state = work / f"state-{'watch' if watch else 'reindex'}"
    out: dict[str, float] = {}
    async with serving(env(root, state, args.llama_bin, watch), log) as (proc, _channel), \
            AsyncClient(await proc.address(), timeout=120) as client:
        await client.add_source("docs", docs)
        await asyncio.sleep(6.0)  # past one watch_retry: the new source is watched
        latencies = []
        for i in range(args.saves):
            word = f"{'w' if watch else 'r'}quillon{i:03}"
            started = time.monotonic()
            save(docs, i, word)
            if not watch:
                _ = [p async for p in client.reindex("docs")]
            await until_found(client, word)
            latencies.append(time.monotonic() - started)
            await asyncio.sleep(0.2)
        out["median"] = statistics.median(latencies)
        out["p95"] = statistics.quantiles(latencies, n=20)[-1]
        if watch and args.burst:
            before = scans_started(log)
            burst = docs / "checkout"

            def checkout() -> None:
                burst.mkdir()
                for i in range(args.burst):
                    (burst / f"f{i:04}.md").write_text(
                        f"# File {i}\n\nBurst keyword brambleton{i}.\n")
            started = time.monotonic()
            await asyncio.to_thread(checkout)
            written = time.monotonic() - started
            await until_found(client, f"brambleton{args.burst - 1}", timeout=600)
            out["burst_s"] = time.monotonic() - started
            out["burst_write_s"] = written
            out["burst_scans"] = scans_started(log) - before
    return out


async def run(args: argparse.Namespace) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="bench-watch-") as tmp:
        watched = await one_way(args, True, Path(tmp))
        reindexed = await one_way(args, False, Path(tmp))
    def ms(seconds: float) -> str:
        return f"{seconds * 1000:.0f}"
    rows = [["watch (retrieval.watch, debounce 0.5 s)", ms(watched["median"]),
             ms(watched["p95"])],
            ["Reindex called at once after the save", ms(reindexed["median"]),
             ms(reindexed["p95"])]]
    lines = ["## Live change detection (save -> searchable)", "",
             f"`{support.command_line('bench.bench_watch', None)}`; "
             f"{time.strftime('%Y-%m-%d')}, {support.cpu_model()}, 1-minute load "
             f"{os.getloadavg()[0]:.2f}. One daemon process per way, all-MiniLM-L6-v2 on "
             "llama-server embedding each saved file; "
             f"{args.saves} saves per way (every other one written as editors do, a "
             "temporary file renamed over the name), each polled with a text Search every "
             "20 ms until found.", "",
             *support.table(["way", "median ms", "p95 ms"], rows), "",
             f"Ratio of medians, watch / Reindex at once: "
             f"{watched['median'] / reindexed['median']:.2f} (the watch waits "
             "watch_debounce for the changes to settle, then runs the same scan). "
             "Without either, a save is found by the next scheduled rescan "
             "(retrieval.rescan_interval, 3600 s) or a Search's lazy refresh "
             "(retrieval.refresh_min_interval, 600 s)."]
    if "burst_s" in watched:
        lines += ["", f"Burst: {args.burst} files written from another thread in "
                  f"{watched['burst_write_s']:.2f} s (a checkout) were all searchable "
                  f"{watched['burst_s']:.1f} s after the first write, by "
                  f"{watched['burst_scans']:.0f} scan(s) of the watcher."]
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    support.print_or_publish(asyncio.run(run(args)), args.out, not args.no_write)


if __name__ == "__main__":
    main()
