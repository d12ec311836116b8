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
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench._daemon import daemon_log
from bench._support import (
    DEFAULT_MODEL,
    EMBED_MODEL,
    MONITOR,
    ROOT,
    SMALL_MODEL,
    PartNote,
    add_quiet_options,
    begin_part,
    bench_parser,
    command_line,
    end_part,
    environment,
    model_file,
    write_sections,
)
from bench._swap.common import CORPUS
from bench._swap.part_crash import bench_crash, crash_section
from bench._swap.part_embed import bench_embed, embed_section
from bench._swap.part_swap import bench_swap, swap_section

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
    command = command_line("bench.bench_swap", argv)
    with daemon_log():
        asyncio.run(run(args, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
