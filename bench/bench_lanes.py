"""Lanes benchmark: an interactive client's Search and chat latency while a directory
ingest and batch Embed clients load the same daemon, lanes on and lanes off.

    .venv/bin/python -m bench.bench_lanes [--docs 5000] [--seed-docs 300]
        [--batch-clients 8] [--batch-size 16] [--idle-calls 40] [--loaded-seconds 120]
        [--max-tokens 16] [--modes on,off] [--setting LLAMAD_X=V] [--wait-others S]
        [--max-foreign C] [--anyway]
        [--out bench/RESULTS.md] [--no-write]

One ``python -m daemon serve`` process per mode (``limits.lanes`` true, then false; mode
``shared``: lanes on without the embedding model's background instance; every other
option its default), the default models on llama-server (SmolLM2-135M generating,
all-MiniLM-L6-v2 embedding), retrieval on with a directory source of ``--seed-docs``
generated documents indexed first, so that a hybrid Search has an index to search. The
*interactive client* loops, one call at a time: a hybrid Search (top 10) of two words of
the documents' vocabulary, then a greedy Chat of ``--max-tokens`` tokens whose time to
the first streamed text is its TTFT. No call names a lane: all are interactive.

Phases, each mode:

1. **idle**: the interactive client alone for ``--idle-calls`` Search + chat pairs.
2. **ingest idle**: a directory source of ``--docs`` new documents (generated, about 90
   words each, one chunk) added and indexed to the last vector, nothing else running.
3. **ingest + interactive**: another ``--docs`` documents while the interactive client
   loops; ingest throughput here / phase 2's is the issue's ">= 0.7x" ratio.
4. **loaded**: a third ``--docs``-document source added, and ``--batch-clients`` clients
   each sending Embed batches of ``--batch-size`` texts with ``x-llamad-lane: batch`` as
   fast as they are answered, while the interactive client loops; for ``--loaded-seconds``
   or until that ingest is done.

Ingest throughput is documents indexed (to the last vector) per second from AddSource.
For each phase the section gives the 1-minute load at its start and the cores other
processes (outside this bench's process tree) used during it: the machine may be shared,
and latency ratios measured on busy cores say less than on quiet ones.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import tempfile
import time
from collections.abc import AsyncIterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from bench import _support as support
from bench._daemon import serving
from bench._relay import GREEDY_CHAT
from clients import AsyncClient
from llamad_protocol.v1 import (
    inference_pb2,
    inference_pb2_grpc,
    retrieval_pb2,
    retrieval_pb2_grpc,
)

SECTION = "## Lanes: interactive latency under ingest and batch load"
WORDS = ("river", "engine", "garden", "ledger", "harbour", "circuit", "lantern", "orchard",
         "quarry", "meadow", "signal", "timber", "furnace", "glacier", "market", "cipher",
         "beacon", "canyon", "pollen", "anchor", "turbine", "velvet", "saddle", "compass",
         "thistle", "mosaic", "granite", "falcon", "ribbon", "cobalt", "prairie", "tundra")
PROMPT = "Name one colour of the sky."


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = support.bench_parser("bench.bench_lanes", __doc__)
    p.add_argument("--docs", type=int, default=5000, help="documents per ingest")
    p.add_argument("--seed-docs", type=int, default=300,
                   help="documents indexed before any phase (Search's index)")
    p.add_argument("--batch-clients", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=16, help="texts per batch Embed")
    p.add_argument("--idle-calls", type=int, default=40, help="Search + chat pairs, idle")
    p.add_argument("--loaded-seconds", type=float, default=120.0,
                   help="longest loaded phase (it ends sooner when its ingest is done)")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--modes", default="on,off", help="lanes settings to run, in order: on "
                   "(the defaults: the embedding model's background instance too), shared "
                   "(lanes on, one child per model: background_instance false), off")
    p.add_argument("--instance-nice", type=int, default=0,
                   help="limits.background_instance_nice of mode on (0: its default)")
    p.add_argument("--setting", action="append", default=[], metavar="NAME=VALUE",
                   help="an extra LLAMAD_* environment setting of the daemon (repeatable), "
                   "e.g. LLAMAD_EMBEDDING_THREADS=1")
    p.add_argument("--llama-bin", default=str(support.ROOT / ".venv" / "bin" / "llama-server"))
    p.add_argument("--out", type=Path, default=support.ROOT / "bench" / "RESULTS.md")
    p.add_argument("--no-write", action="store_true", help="print only")
    support.add_quiet_options(p, "before each phase")
    args = p.parse_args(argv)
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not args.modes or any(m not in ("on", "shared", "off") for m in args.modes):
        p.error("--modes is a comma-separated list of on, shared and off")
    if min(args.docs, args.seed_docs, args.batch_size, args.idle_calls, args.max_tokens) < 1:
        p.error("--docs, --seed-docs, --batch-size, --idle-calls, --max-tokens must be >= 1")
    return args


def write_docs(folder: Path, name: str, count: int) -> None:
    """``count`` Markdown documents of about 90 words each, texts unique to ``name``."""
    folder.mkdir(parents=True)
    rng = random.Random(name)
    for i in range(count):
        words = " ".join(rng.choice(WORDS) for _ in range(88))
        (folder / f"{i:05}.md").write_text(f"# {name} note {i}\n\n{name}{i} {words}.\n")


def env(mode: str, root: Path, state: Path, llama_bin: str, *, nice: int = 0,
        settings: Sequence[str] = ()) -> dict[str, str]:
    extra = {"LLAMAD_LIMITS_BACKGROUND_INSTANCE_NICE": str(nice)} if nice else {}
    for setting in settings:
        name, sep, value = setting.partition("=")
        if not name.startswith("LLAMAD_") or not sep:
            raise SystemExit(f"--setting {setting!r}: expected LLAMAD_NAME=VALUE")
        extra[name] = value
    return {**GREEDY_CHAT, "LLAMAD_LISTEN": "127.0.0.1:0", "LLAMAD_STATE_DIR": str(state),
            "LLAMAD_LLAMA_BIN": llama_bin, "LLAMAD_LOG_FORMAT": "json",
            "LLAMAD_MODELS_DIR": str(support.MODELS_DIR),
            "LLAMAD_GENERATION_MODEL": str(support.model_file(support.SMALL_MODEL)),
            "LLAMAD_EMBEDDING_MODEL": str(support.model_file(support.EMBED_MODEL)),
            "LLAMAD_RETRIEVAL_ALLOWED_ROOTS": str(root),
            "LLAMAD_RETRIEVAL_RESCAN_INTERVAL": "0", "LLAMAD_RETRIEVAL_WATCH": "false",
            "LLAMAD_LIMITS_LANES": "false" if mode == "off" else "true",
            "LLAMAD_EMBEDDING_BACKGROUND_INSTANCE": "false" if mode == "shared" else "auto",
            **extra}


@dataclass
class Interactive:
    """The interactive client's samples, milliseconds."""

    search: list[float] = field(default_factory=list)
    embed: list[float] = field(default_factory=list)  # Search's own "embed" stage
    stages: dict[str, list[float]] = field(default_factory=dict)  # every stage, ms
    ttft: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    async def pair(self, channel: grpc.aio.Channel, rng: random.Random, max_tokens: int
                   ) -> None:
        retrieval = retrieval_pb2_grpc.RetrievalServiceStub(channel)
        inference = inference_pb2_grpc.InferenceServiceStub(channel)
        query = f"{rng.choice(WORDS)} {rng.choice(WORDS)}"
        try:
            began = time.perf_counter()
            found = await retrieval.Search(retrieval_pb2.SearchRequest(
                query=query, top_k=10, mode=retrieval_pb2.SEARCH_MODE_HYBRID), timeout=120)
            self.search.append((time.perf_counter() - began) * 1000)
            self.embed.append(found.stats.stages_ms.get("embed", float("nan")))
            for stage, took in found.stats.stages_ms.items():
                self.stages.setdefault(stage, []).append(took)
            request = inference_pb2.ChatRequest(
                messages=[inference_pb2.ChatMessage(role=inference_pb2.CHAT_ROLE_USER,
                                                    content=PROMPT)],
                sampling=inference_pb2.SamplingParams(max_tokens=max_tokens, temperature=0))
            began = time.perf_counter()
            first = None
            async for msg in inference.Chat(request, timeout=120):
                if first is None and msg.text:
                    first = time.perf_counter()
            if first is not None:
                self.ttft.append((first - began) * 1000)
        except grpc.aio.AioRpcError as exc:
            self.errors.append(exc.code().name)

    async def loop(self, channel: grpc.aio.Channel, max_tokens: int, stop: asyncio.Event,
                   calls: int = 0) -> None:
        """Pairs until ``stop`` is set (or ``calls`` pairs, when given)."""
        rng = random.Random(len(self.search))
        n = 0
        while not stop.is_set() and (not calls or n < calls):
            await self.pair(channel, rng, max_tokens)
            n += 1

    def row(self, q: float) -> tuple[float, float]:
        return support.pct(self.search, q), support.pct(self.ttft, q)


@dataclass
class Batches:
    texts: int = 0
    errors: dict[str, int] = field(default_factory=dict)


async def batch_client(channel: grpc.aio.Channel, k: int, size: int, stop: asyncio.Event,
                       out: Batches) -> None:
    """Embed batches of ``size`` texts in the batch lane, back to back, until ``stop``."""
    inference = inference_pb2_grpc.InferenceServiceStub(channel)
    rng = random.Random(f"batch{k}")
    n = 0
    while not stop.is_set():
        texts = [f"batch {k} {n} {i} " + " ".join(rng.choice(WORDS) for _ in range(40))
                 for i in range(size)]
        n += 1
        try:
            await inference.Embed(inference_pb2.EmbedRequest(texts=texts), timeout=120,
                                  metadata=(("x-llamad-lane", "batch"),))
            out.texts += size
        except grpc.aio.AioRpcError as exc:
            out.errors[exc.code().name] = out.errors.get(exc.code().name, 0) + 1
            await asyncio.sleep(0.1)  # a refusal: as a client honouring a retry hint would


async def indexed(client: AsyncClient) -> tuple[int, int]:
    """(chunks, chunks with a vector) in the index."""
    st = await client.retrieval_status()
    return st.chunks, st.embedded_chunks


async def ingest(client: AsyncClient, name: str, folder: Path, docs: int, stop: asyncio.Event,
                 *, limit: float = 0.0) -> tuple[float, int]:
    """Add ``folder`` as a source; wait until its ``docs`` documents have every vector
    (or ``limit`` seconds); set ``stop``. Returns (seconds, documents indexed)."""
    chunks0, _ = await indexed(client)
    began = time.perf_counter()
    await client.add_source(name, folder)
    scan = asyncio.create_task(drain(client.reindex(name)))  # AddSource does not scan
    done = 0
    try:
        while True:
            chunks, embedded = await indexed(client)
            done = min(embedded, chunks) - chunks0
            if done >= docs or (limit and time.perf_counter() - began >= limit):
                break
            await asyncio.sleep(0.5)
    finally:
        stop.set()
    seconds = time.perf_counter() - began
    if not scan.done():
        scan.cancel()
    with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
        await scan
    print(f"  ingest {name}: {done} documents in {seconds:.1f} s", flush=True)
    return seconds, max(0, min(done, docs))


async def drain(stream: AsyncIterable[object]) -> None:
    async for _ in stream:
        pass


@dataclass
class Phase:
    name: str
    note: support.PartNote
    interactive: Interactive | None = None
    ingest: tuple[float, int] | None = None  # (seconds, documents)
    batches: Batches | None = None


async def part(args: argparse.Namespace, name: str) -> support.PartNote:
    return await support.begin_part(name, args.wait_others, args.anyway, args.max_foreign)


async def one_mode(args: argparse.Namespace, mode: str, work: Path) -> list[Phase]:
    root = work / "docs"
    phases: list[Phase] = []
    async with serving(env(mode, root, work / f"state-{mode}", args.llama_bin,
                           nice=args.instance_nice, settings=args.setting),
                       work / f"daemon-{mode}.log") as (proc, channel), \
            AsyncClient(await proc.address(), timeout=120) as client:
        never = asyncio.Event()
        await ingest(client, "seed", root / "seed", args.seed_docs, never)
        await Interactive().loop(channel, args.max_tokens, asyncio.Event(), calls=3)  # warm-up

        note = await part(args, f"lanes {mode}: idle")
        idle = Interactive()
        await idle.loop(channel, args.max_tokens, asyncio.Event(), calls=args.idle_calls)
        support.end_part(note)
        phases.append(Phase("idle", note, interactive=idle))

        note = await part(args, f"lanes {mode}: ingest idle")
        took = await ingest(client, "alone", root / "alone", args.docs, asyncio.Event())
        support.end_part(note)
        phases.append(Phase("ingest alone", note, ingest=took))

        note = await part(args, f"lanes {mode}: ingest + interactive")
        stop, with_ingest = asyncio.Event(), Interactive()
        looping = asyncio.create_task(with_ingest.loop(channel, args.max_tokens, stop))
        took = await ingest(client, "busy", root / "busy", args.docs, stop)
        await looping
        support.end_part(note)
        phases.append(Phase("ingest + interactive", note, interactive=with_ingest,
                            ingest=took))

        note = await part(args, f"lanes {mode}: loaded")
        stop, loaded, batches = asyncio.Event(), Interactive(), Batches()
        tasks = [asyncio.create_task(batch_client(channel, k, args.batch_size, stop, batches))
                 for k in range(args.batch_clients)]
        await asyncio.sleep(1.0)  # the batch clients have filled their lane
        tasks.append(asyncio.create_task(loaded.loop(channel, args.max_tokens, stop)))
        took = await ingest(client, "loaded", root / "loaded", args.docs, stop,
                            limit=args.loaded_seconds)
        await asyncio.gather(*tasks)
        support.end_part(note)
        phases.append(Phase("loaded", note, interactive=loaded, ingest=took, batches=batches))
        with contextlib.suppress(grpc.aio.AioRpcError):
            await client.remove_source("loaded")  # stops its ingest before shutdown
    return phases


def ms(x: float) -> str:
    return f"{x:.0f}"


def load1(note: support.PartNote) -> str:
    """The 1-minute load average of a part's ``uptime`` line."""
    return note.uptime.split("average:")[-1].split(",")[0].strip()


def report(args: argparse.Namespace, runs: dict[str, list[Phase]], command: str) -> list[str]:
    lines = [SECTION, "", *support.environment(command, args.llama_bin), "",
             f"Interactive client: hybrid Search (top 10) then greedy Chat of {args.max_tokens} "
             f"tokens, one call at a time; loaded = a {args.docs}-document directory ingest "
             f"and {args.batch_clients} clients sending Embed batches of {args.batch_size} "
             "texts (x-llamad-lane: batch) back to back. Latencies in ms; x = / the same "
             "mode's idle value.", ""]
    rows = []
    for mode, phases in runs.items():
        idle = phases[0].interactive
        assert idle is not None
        s95, t95 = idle.row(95)
        for ph in phases:
            it = ph.interactive
            if it is None:
                continue
            a50, b50 = it.row(50)
            a95, b95 = it.row(95)
            rows.append([mode, ph.name, str(len(it.search)), ms(a50), ms(a95),
                         f"{a95 / s95:.2f}x", ms(support.pct(it.embed, 95)), ms(b50),
                         ms(b95), f"{b95 / t95:.2f}x",
                         str(len(it.errors)), load1(ph.note), f"{ph.note.foreign:.2f}"])
    lines += support.table(["lanes", "phase", "pairs", "Search p50", "Search p95", "p95 x",
                            "of it embed p95", "TTFT p50", "TTFT p95", "p95 x", "errors",
                            "load (1 min)", "foreign cores"], rows)
    lines += ["", "Search's stages, p95 in ms (its stats' stages_ms):", ""]
    for mode, phases in runs.items():
        for ph in phases:
            if ph.interactive is not None and ph.interactive.stages:
                each = ", ".join(f"{stage} {support.pct(v, 95):.0f}"
                                 for stage, v in sorted(ph.interactive.stages.items()))
                lines.append(f"- {mode}, {ph.name}: {each}")
    lines += ["", "Ingest throughput (documents indexed to the last vector per second, from "
              "AddSource):", ""]
    rows = []
    for mode, phases in runs.items():
        alone = next(ph.ingest for ph in phases if ph.name == "ingest alone")
        assert alone is not None
        base = alone[1] / alone[0]
        for ph in phases:
            if ph.ingest is None:
                continue
            secs, docs = ph.ingest
            rate = docs / secs
            extra = ""
            if ph.batches is not None:
                extra = (f"batch Embed {ph.batches.texts / secs:.1f} texts/s"
                         + (f", refused {ph.batches.errors}" if ph.batches.errors else ""))
            rows.append([mode, ph.name, f"{docs}", f"{secs:.1f}", f"{rate:.2f}",
                         f"{rate / base:.2f}x", extra,
                         load1(ph.note), f"{ph.note.foreign:.2f}"])
    lines += support.table(["lanes", "phase", "documents", "seconds", "docs/s", "/ alone",
                            "beside", "load (1 min)", "foreign cores"], rows)
    lines += ["", *[ph.note.line().replace("- Machine during this part",
                                           f"- lanes {mode}, {ph.name}")
                    for mode, phases in runs.items() for ph in phases]]
    return lines


async def run(args: argparse.Namespace, command: str) -> list[str]:
    support.MONITOR.start()
    runs: dict[str, list[Phase]] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="bench-lanes-") as tmp:
            work = Path(tmp)
            for name, count in (("seed", args.seed_docs), ("alone", args.docs),
                                ("busy", args.docs), ("loaded", args.docs)):
                write_docs(work / "docs" / name, name, count)
            for mode in args.modes:
                runs[mode] = await one_mode(args, mode, work)
    finally:
        await support.MONITOR.stop()
    return report(args, runs, command)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    section = asyncio.run(run(args, support.command_line("bench.bench_lanes", argv)))
    if args.no_write:
        print("\n".join(section))
    else:
        support.publish(args.out, [section])


if __name__ == "__main__":
    main()
