"""Soak: a real daemon under a mixed workload for minutes; its resources must stay bounded.

    .venv/bin/python -m bench.soak [--minutes 10] [--out bench/RESULTS.md]
        [--svg bench/results/soak.svg] [--raw FILE] [--swap-every 60] [--sample-every 2]
        [--wait-others SECONDS] [--anyway]

The daemon runs as operators run it: ``python -m daemon serve`` as a subprocess, listening
on 127.0.0.1:0 (the address is read from its ``listening`` log line), with its own
temporary state directory; the generation child on llama-server (SmolLM2-135M first, then
swapped with gemma-3-270m back and forth), the embedding child on llama-server
(all-MiniLM-L6-v2); every other setting is the production default.

For ``--minutes``, concurrent asyncio clients, each on its own gRPC channel, send:

- streaming ``Generate`` (``--generate-clients``; a share of them cancelled by the client
  after a few tokens, to exercise the daemon's cleanup);
- ``Search`` (``--search-clients``), half of them for the unique token of a document
  acknowledged earlier;
- ``UpsertDocument`` of new documents, each with a unique token (every acknowledged id is
  recorded), updates of acknowledged documents with a new token, and occasional
  ``DeleteDocument``;
- a directory source whose files are changed, added and removed, then ``Reindex``;
- ``ControlService/Swap`` between the two generation models every ``--swap-every`` s;
- ``ControlService/Status``, ``RetrievalService/Status`` and ``ListDocuments`` now and then.

Every call has a deadline; outcomes are counted per RPC and status code. A call *hangs*
when it runs past its deadline + 2 s (it is then abandoned and counted). Every
``--sample-every`` s the daemon process (and, separately, its children) is sampled from
/proc: resident memory, open file descriptors, threads.

At the end, load stops and the writes are checked: every acknowledged, not deleted
document must be listed INDEXED and found by a search for its unique token; every file of
the directory source (after a last Reindex) likewise; an acknowledged delete must stay
deleted. Then the daemon gets SIGTERM and must exit 0 leaving no child.

Growth rule (after a warm-up of the first ``--warmup`` share of the run, 20 %): the median
of the last quarter of the run is compared with the median of the second quarter. RSS
fails if it grew by more than 30 MiB *and* more than 10 %; open fds fail if they grew by
more than 8; threads if they grew by more than 4. A least-squares line over the samples
after the warm-up is reported beside it (per hour). The run fails (exit status 1, MISS in
the table) on any growth failure, any lost or resurrected write, any hung call, or a
daemon that died or did not exit cleanly.

Results are printed; the ``## Soak`` section of ``--out`` is created or replaced (other
sections kept), and the plot (three line charts, hand-written SVG) goes to ``--svg``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import html
import json
import math
import os
import random
import shlex
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc

from bench._daemon import DaemonProcess, wait_ready
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
    model_file,
    pct,
    short,
    table,
    under,
    write_sections,
)
from llamad_protocol.v1 import (
    common_pb2,
    control_pb2,
    control_pb2_grpc,
    inference_pb2,
    inference_pb2_grpc,
    retrieval_pb2,
    retrieval_pb2_grpc,
)
from tests.support.procs import proc_stats

T = TypeVar("T")

HEADING = "## Soak"
MIB = 1024 * 1024
HANG_GRACE = 2.0  # a call running this long past its deadline hangs
THREADS = 2
GEN = common_pb2.CHILD_ROLE_GENERATION
PUSH_SOURCE = "soak-push"
DIR_SOURCE = "soak-dir"
CLIENT_CANCEL = "CANCELLED by the client"

DEADLINES: dict[str, float] = {
    "Generate": 30.0,
    "Search": 10.0,
    "UpsertDocument": 30.0,
    "DeleteDocument": 10.0,
    "Reindex": 120.0,
    "Swap": 150.0,
    "Status": 5.0,
    "RetrievalService/Status": 10.0,
    "ListDocuments": 30.0,
    "AddSource": 10.0,
}

# The growth rule: (absolute limit, relative limit or None), in the metric's unit.
RSS_LIMIT_MIB = 30.0
RSS_LIMIT_SHARE = 0.10
FD_LIMIT = 8
THREAD_LIMIT = 4

WORDS = (
    "disk", "nginx", "replication", "certificate", "latency", "backup", "rotation", "vpn",
    "tunnel", "kernel", "memory", "swap", "queue", "consumer", "partition", "leader",
    "failover", "dns", "resolver", "firewall", "rule", "route", "gateway", "switch",
    "uplink", "vlan", "database", "vacuum", "index", "snapshot", "restore", "cron",
    "timer", "service", "restart", "journal", "alert", "threshold", "pager", "runbook",
)
QUERIES = (
    "disk full on the web server", "how to restore a database snapshot",
    "vpn tunnel flapping", "certificate renewal", "replication lag on the replica",
    "firewall rule for the gateway", "restart the consumer service", "dns resolver timeout",
)


# -- the daemon process ------------------------------------------------------------------


@dataclass(frozen=True)
class ProcStat:
    rss: int  # bytes
    fds: int
    threads: int
    rss_anon: int = 0  # bytes: heap and other private memory (RssAnon)
    rss_file: int = 0  # bytes: mapped files (RssFile)


def proc_stat(pid: int) -> ProcStat | None:
    """Resident memory, open file descriptors and threads of ``pid``; None if it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    fields: dict[str, int] = {}
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "Threads"):
            number = int(value.split()[0])
            fields[key] = number if key == "Threads" else number * 1024
    return ProcStat(fields.get("VmRSS", 0), fds, fields.get("Threads", 0),
                    fields.get("RssAnon", 0), fields.get("RssFile", 0))


def descendants(root: int) -> list[int]:
    """Every live process under ``root`` (children, grandchildren, ...)."""
    parent = {pid: int(fields[1]) for pid, fields in proc_stats().items()}
    return sorted(pid for pid, ppid in parent.items() if under(ppid, root, parent))


def daemon_env(state_dir: Path, corpus: Path, model: Path, embed: Path) -> dict[str, str]:
    return {
        "LLAMAD_RETRIEVAL_ALLOWED_ROOTS": str(corpus),
        "LLAMAD_LISTEN": "127.0.0.1:0",
        "LLAMAD_STATE_DIR": str(state_dir),
        "LLAMAD_GENERATION_MODEL": str(model),
        "LLAMAD_GENERATION_RUNTIME": "llama-server",
        "LLAMAD_GENERATION_THREADS": str(THREADS),
        "LLAMAD_GENERATION_PARALLEL": "2",
        "LLAMAD_GENERATION_CTX_SIZE": "2048",
        "LLAMAD_EMBEDDING_MODEL": str(embed),
        "LLAMAD_EMBEDDING_RUNTIME": "llama-server",
        "LLAMAD_EMBEDDING_THREADS": str(THREADS),
        "LLAMAD_LOG_FORMAT": "json",
    }


# -- what the clients did ------------------------------------------------------------------


@dataclass
class Sample:
    t: float  # seconds since the load started
    rss: int
    fds: int
    threads: int
    children: int
    children_rss: int
    children_fds: int
    children_threads: int
    calls: int  # calls finished so far
    acked: int  # documents acknowledged so far (push source)
    phase: str = "load"  # "idle" before the load, "load", "after" once it stopped
    rss_anon: int = 0  # the daemon's RssAnon (heap, private memory)
    rss_file: int = 0  # the daemon's RssFile (mapped files)


@dataclass
class DocRecord:
    """One pushed document, as the clients know it."""

    id: str
    token: str | None = None  # the last acknowledged write's token
    superseded: list[str] = field(default_factory=list)  # earlier acknowledged tokens
    pending: list[str] = field(default_factory=list)  # unacknowledged writes since then
    deleted: bool = False  # an acknowledged delete (deleted=true)
    delete_pending: bool = False  # a delete that got no answer
    busy: bool = False  # a write to it is running

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Busy (so not clean, and left alone by other clients) while a write runs."""
        self.busy = True
        try:
            yield
        finally:
            self.busy = False

    @property
    def clean(self) -> bool:
        return (self.token is not None and not self.pending and not self.deleted
                and not self.delete_pending and not self.busy)


@dataclass
class SwapRecord:
    at: float  # seconds since the load started
    from_model: str
    to_model: str
    seconds: float
    code: str
    message: str


@dataclass
class Hung:
    rpc: str
    at: float
    deadline: float


@dataclass
class Check:
    """The end-of-run check of the writes."""

    push_checked: int = 0  # acknowledged, no unanswered write after, not deleted
    push_not_indexed: list[str] = field(default_factory=list)
    push_not_found: list[str] = field(default_factory=list)
    ambiguous_checked: int = 0  # acknowledged, then a write or delete with no answer
    ambiguous_lost: list[str] = field(default_factory=list)
    deleted_checked: int = 0
    resurrected: list[str] = field(default_factory=list)
    superseded_checked: int = 0
    stale: list[str] = field(default_factory=list)  # a superseded token still finds its doc
    never_acked: int = 0
    dir_reindex: str = ""
    dir_checked: int = 0
    dir_lost: list[str] = field(default_factory=list)
    dir_removed_checked: int = 0
    dir_stale: list[str] = field(default_factory=list)
    in_flight: int = -1  # generation calls running once the load stopped (after settling)
    queued: int = -1
    settle_seconds: float = 0.0

    @property
    def lost(self) -> int:
        return (len(self.push_not_indexed) + len(self.push_not_found) + len(self.ambiguous_lost)
                + len(self.dir_lost))


def token(rng: random.Random) -> str:
    return "sk" + "".join(rng.choice("abcdefghjkmnpqrstuvwxyz23456789") for _ in range(10))


def body(rng: random.Random, tok: str, paragraphs: int) -> str:
    out = []
    for _ in range(paragraphs):
        words = [rng.choice(WORDS) for _ in range(rng.randint(25, 70))]
        out.append(" ".join(words).capitalize() + ".")
    out.insert(rng.randrange(len(out) + 1), f"Reference {tok} for this note.")
    return "\n\n".join(out)


class Soak:
    """The clients, the sampler, and what they saw."""

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

    # -- clients -----------------------------------------------------------------------

    async def generate_client(self, cid: int) -> None:
        rng = random.Random(1000 + cid)
        async with self.channel() as ch:
            stub = inference_pb2_grpc.InferenceServiceStub(ch)
            n = 0
            while not self.stop.is_set():
                cancel_after = rng.randint(1, 4) if rng.random() < self.args.cancel_share \
                    else None
                request = inference_pb2.GenerateRequest(
                    prompt=PROMPTS[(cid + n) % len(PROMPTS)],
                    sampling=inference_pb2.SamplingParams(
                        max_tokens=rng.randint(8, self.args.max_tokens), temperature=0.7,
                        seed=rng.randrange(1 << 30)))

                async def fn(deadline: float, request: Any = request,
                             cancel_after: int | None = cancel_after) -> tuple[str, int]:
                    call = stub.Generate(request, timeout=deadline)
                    texts = 0
                    try:
                        async for msg in call:
                            texts += bool(msg.text)
                            if cancel_after is not None and texts >= cancel_after:
                                call.cancel()
                                return CLIENT_CANCEL, texts
                    finally:
                        call.cancel()  # no-op once it ended
                    return "OK", texts

                code, _, err = await self.call("Generate", fn)
                n += 1
                await self.pause(self.after(code, err, 0.2))

    async def search_client(self, cid: int) -> None:
        rng = random.Random(2000 + cid)
        async with self.channel() as ch:
            stub = retrieval_pb2_grpc.RetrievalServiceStub(ch)
            while not self.stop.is_set():
                clean = [d for d in self.docs.values() if d.clean]
                probe = rng.choice(clean) if clean and rng.random() < 0.5 else None
                query = probe.token if probe is not None and probe.token else rng.choice(
                    QUERIES)
                request = retrieval_pb2.SearchRequest(query=query, top_k=5)

                async def fn(deadline: float, request: Any = request
                             ) -> tuple[str, list[str]]:
                    resp = await stub.Search(request, timeout=deadline)
                    return "OK", [h.document_id for h in resp.hits
                                  if h.HasField("text_rank")]

                code, ids, err = await self.call("Search", fn)
                if probe is not None and code == "OK" and ids is not None and probe.clean:
                    self.probes["found" if probe.id in ids else "missed"] += 1
                await self.pause(self.after(code, err, 0.3))

    async def ingest_client(self) -> None:
        rng = random.Random(3000)
        async with self.channel() as ch:
            stub = retrieval_pb2_grpc.RetrievalServiceStub(ch)
            n = 0
            while not self.stop.is_set():
                clean = [d for d in self.docs.values() if d.clean]
                live = [d for d in self.docs.values() if d.token and not d.deleted]
                r = rng.random()
                if clean and (r < self.args.delete_share or len(live) > self.args.max_docs):
                    doc = clean[0] if len(live) > self.args.max_docs else rng.choice(clean)
                    code, err = await self.delete(stub, doc)
                elif clean and r < self.args.delete_share + self.args.update_share:
                    code, err = await self.upsert(stub, rng.choice(clean), rng)
                else:
                    n += 1
                    doc = self.docs.setdefault(f"soak/{n:06d}", DocRecord(f"soak/{n:06d}"))
                    code, err = await self.upsert(stub, doc, rng)
                await self.pause(self.after(code, err, self.args.ingest_pause))

    async def upsert(self, stub: Any, doc: DocRecord, rng: random.Random
                     ) -> tuple[str, grpc.aio.AioRpcError | None]:
        tok = token(rng)
        request = retrieval_pb2.UpsertDocumentRequest(
            source_id=PUSH_SOURCE, id=doc.id, title=f"Soak note {doc.id}",
            text=body(rng, tok, rng.randint(1, 4)), kind="text")

        async def fn(deadline: float) -> tuple[str, int]:
            resp = await stub.UpsertDocument(request, timeout=deadline)
            return "OK", int(resp.document.state)

        with doc.writing():
            code, state, err = await self.call("UpsertDocument", fn)
        if code == "OK":
            if state != retrieval_pb2.DOCUMENT_STATE_INDEXED:
                self.anomalies[f"UpsertDocument OK with state {state}"] += 1
            if doc.token:
                doc.superseded.append(doc.token)
            doc.token = tok
            doc.pending.clear()
        else:
            doc.pending.append(tok)
        return code, err

    async def delete(self, stub: Any, doc: DocRecord) -> tuple[str, grpc.aio.AioRpcError | None]:
        async def fn(deadline: float) -> tuple[str, bool]:
            resp = await stub.DeleteDocument(retrieval_pb2.DeleteDocumentRequest(id=doc.id),
                                             timeout=deadline)
            return "OK", bool(resp.deleted)

        with doc.writing():
            code, deleted, err = await self.call("DeleteDocument", fn)
        if code == "OK":
            doc.deleted = True
            if not deleted:
                self.anomalies["DeleteDocument of an acknowledged document: deleted=false"] += 1
        else:
            doc.delete_pending = True
        return code, err

    def write_file(self, name: str, rng: random.Random) -> None:
        tok = token(rng)
        old = self.dir_files.get(name)
        if old:
            self.dir_removed.append(old)
        text = body(rng, tok, rng.randint(1, 3))
        (self.corpus / name).write_text(f"# Runbook {name}\n\n{text}\n")
        self.dir_files[name] = tok

    async def reindex(self, stub: Any, rpc: str = "Reindex"
                      ) -> tuple[str, grpc.aio.AioRpcError | None]:
        async def fn(deadline: float) -> tuple[str, Any]:
            call = stub.Reindex(retrieval_pb2.ReindexRequest(source_id=DIR_SOURCE),
                                timeout=deadline)
            last = None
            try:
                async for msg in call:
                    last = msg
            finally:
                call.cancel()
            if last is None or not last.done:
                return "ended without done", last
            return "OK", last

        files = dict(self.dir_files)
        code, last, err = await self.call(rpc, fn)
        if code == "OK" and last is not None:
            for issue in [*last.failed]:
                self.reindex_failures[f"{Path(issue.path).name}: {issue.reason}"[:120]] += 1
            self.dir_acked = files
        return code, err

    async def directory_client(self) -> None:
        rng = random.Random(4000)
        n = len(self.dir_files)
        async with self.channel() as ch:
            stub = retrieval_pb2_grpc.RetrievalServiceStub(ch)
            async for _ in self.every(self.args.reindex_every):
                names = sorted(self.dir_files)
                for name in rng.sample(names, min(2, len(names))):
                    self.write_file(name, rng)
                n += 1
                self.write_file(f"note-{n:04d}.md", rng)
                if len(self.dir_files) > 10:
                    gone = rng.choice(sorted(self.dir_files))
                    (self.corpus / gone).unlink()
                    self.dir_removed.append(self.dir_files.pop(gone))
                await self.reindex(stub)

    async def swap_client(self) -> None:
        async with self.channel() as ch:
            control = control_pb2_grpc.ControlServiceStub(ch)
            async for _ in self.every(self.args.swap_every):
                async def status(deadline: float) -> tuple[str, str]:
                    resp = await control.Status(control_pb2.StatusRequest(), timeout=deadline)
                    return "OK", next((c.model_path for c in resp.children if c.role == GEN),
                                      "")

                _, current, _ = await self.call("Status", status)
                now = Path(current or "").name
                target = self.models[1] if now == self.models[0].name else self.models[0]
                messages: list[str] = []

                async def swap(deadline: float, target: Path = target,
                               messages: list[str] = messages) -> tuple[str, str]:
                    call = control.Swap(control_pb2.SwapRequest(
                        role=GEN, model_path=str(target), reason="soak"), timeout=deadline)
                    stage = ""
                    try:
                        async for msg in call:
                            stage = control_pb2.SwapStage.Name(msg.stage)
                            messages.append(msg.message)
                    finally:
                        call.cancel()
                    return ("OK" if stage == "SWAP_STAGE_DONE" else f"ended at {stage}"), stage

                at = self.now()
                code, _, err = await self.call("Swap", swap)
                message = (err.details() or "") if err is not None else next(
                    (m for m in reversed(messages) if m.strip()), "")
                self.swaps.append(SwapRecord(at, now, target.name, self.now() - at, code,
                                             " ".join(message.split())[:120]))
                print(f"  swap {len(self.swaps)} at {at:.0f}s: {short(now)} -> "
                      f"{short(target.name)}: {code} in {self.now() - at:.1f}s", flush=True)

    async def status_client(self) -> None:
        async with self.channel() as ch:
            control = control_pb2_grpc.ControlServiceStub(ch)
            retrieval = retrieval_pb2_grpc.RetrievalServiceStub(ch)
            tick = 0
            while not self.stop.is_set():
                async def status(deadline: float) -> tuple[str, None]:
                    await control.Status(control_pb2.StatusRequest(), timeout=deadline)
                    return "OK", None

                async def rstatus(deadline: float) -> tuple[str, None]:
                    await retrieval.Status(retrieval_pb2.RetrievalStatusRequest(),
                                           timeout=deadline)
                    return "OK", None

                async def listing(deadline: float) -> tuple[str, None]:
                    await retrieval.ListDocuments(
                        retrieval_pb2.ListDocumentsRequest(source_id=PUSH_SOURCE),
                        timeout=deadline)
                    return "OK", None

                await self.call("Status", status)
                if tick % 3 == 0:
                    await self.call("RetrievalService/Status", rstatus)
                if tick % 6 == 0:
                    await self.call("ListDocuments", listing)
                tick += 1
                await self.pause(5.0)

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

    # -- the run -------------------------------------------------------------------------

    async def setup(self) -> None:
        rng = random.Random(5000)
        for i in range(8):
            self.write_file(f"note-{i:04d}.md", rng)
        async with self.channel() as ch:
            stub = retrieval_pb2_grpc.RetrievalServiceStub(ch)
            for request in (retrieval_pb2.AddSourceRequest(id=PUSH_SOURCE, category="soak"),
                            retrieval_pb2.AddSourceRequest(id=DIR_SOURCE, path=str(self.corpus),
                                                           category="soak")):
                async def fn(deadline: float, request: Any = request) -> tuple[str, None]:
                    await stub.AddSource(request, timeout=deadline)
                    return "OK", None

                code, _, err = await self.call("AddSource", fn)
                if code != "OK":
                    raise SystemExit(f"soak: AddSource {request.id} failed: {code} "
                                     f"{err.details() if err is not None else ''}")
            code, _ = await self.reindex(stub)
            if code != "OK":
                raise SystemExit(f"soak: the first Reindex failed: {code}")

    async def run(self, duration: float) -> None:
        self.t0 = time.monotonic()
        tasks = [asyncio.create_task(self.sampler(duration), name="sampler")]
        tasks += [asyncio.create_task(self.generate_client(i), name=f"generate-{i}")
                  for i in range(self.args.generate_clients)]
        tasks += [asyncio.create_task(self.search_client(i), name=f"search-{i}")
                  for i in range(self.args.search_clients)]
        tasks += [asyncio.create_task(c(), name=c.__name__) for c in (
            self.ingest_client, self.directory_client, self.swap_client, self.status_client)]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), duration)
        self.stop.set()
        await asyncio.gather(*tasks)

    async def settle(self, timeout: float = 15.0) -> tuple[int, int, float]:
        """Once the load stopped: until the generation child has no call running or queued
        (cancelled and abandoned calls must be cleaned up), up to ``timeout`` s."""
        began = time.monotonic()
        in_flight = queued = -1
        async with self.channel() as ch:
            control = control_pb2_grpc.ControlServiceStub(ch)
            while time.monotonic() - began < timeout:
                resp = await control.Status(control_pb2.StatusRequest(), timeout=5)
                gen = next(c for c in resp.children if c.role == GEN)
                in_flight, queued = int(gen.in_flight), int(gen.queued)
                if in_flight == 0 and queued == 0:
                    break
                await asyncio.sleep(0.25)
        return in_flight, queued, time.monotonic() - began

    async def verify(self) -> Check:
        check = Check()
        check.in_flight, check.queued, check.settle_seconds = await self.settle()
        async with self.channel() as ch:
            stub = retrieval_pb2_grpc.RetrievalServiceStub(ch)
            code, _ = await self.reindex(stub, "Reindex (final)")
            check.dir_reindex = code

            async def listing(deadline: float) -> tuple[str, list[Any]]:
                resp = await stub.ListDocuments(retrieval_pb2.ListDocumentsRequest(),
                                                timeout=deadline)
                return "OK", list(resp.documents)

            code, docs, _ = await self.call("ListDocuments", listing)
            if code != "OK" or docs is None:
                raise SystemExit(f"soak: ListDocuments failed at the end: {code}")
            listed = {d.id: d for d in docs}
            files = {Path(d.path).name: d for d in docs if d.source_id == DIR_SOURCE}
            gate = asyncio.Semaphore(4)

            async def finds(query: str, source: str) -> set[str]:
                """Document ids (push) or file names (directory) whose text a search for
                ``query`` matched (BM25: a hybrid search always returns nearest vectors,
                whatever the query); retried on failure, so that a flaky search is not a
                lost write."""
                async with gate:
                    request = retrieval_pb2.SearchRequest(
                        query=query, top_k=5,
                        filters=retrieval_pb2.SearchFilters(sources=[source]))
                    for _ in range(3):
                        async def fn(deadline: float) -> tuple[str, set[str]]:
                            resp = await stub.Search(request, timeout=deadline)
                            return "OK", {h.document_id if source == PUSH_SOURCE
                                          else Path(h.path).name for h in resp.hits
                                          if h.HasField("text_rank")}

                        code, found, _ = await self.call("Search (check)", fn)
                        if code == "OK" and found is not None:
                            return found
                        await asyncio.sleep(1)
                    raise SystemExit(f"soak: the checking searches fail ({code})")

            indexed = retrieval_pb2.DOCUMENT_STATE_INDEXED

            async def check_doc(d: DocRecord) -> None:
                if d.token is None:
                    check.never_acked += 1
                    return
                if d.deleted:
                    check.deleted_checked += 1
                    if d.id in listed or d.id in await finds(d.token, PUSH_SOURCE):
                        check.resurrected.append(d.id)
                    return
                if d.pending or d.delete_pending:
                    check.ambiguous_checked += 1
                    hits = [d.id in await finds(t, PUSH_SOURCE) for t in [d.token, *d.pending]]
                    if not any(hits) and not (d.delete_pending and d.id not in listed):
                        check.ambiguous_lost.append(d.id)
                    return
                check.push_checked += 1
                doc = listed.get(d.id)
                if doc is None or doc.state != indexed:
                    state = "missing" if doc is None else retrieval_pb2.DocumentState.Name(
                        doc.state)
                    check.push_not_indexed.append(f"{d.id} ({state})")
                if d.id not in await finds(d.token, PUSH_SOURCE):
                    check.push_not_found.append(d.id)
                for old in d.superseded:
                    check.superseded_checked += 1
                    if d.id in await finds(old, PUSH_SOURCE):
                        check.stale.append(f"{d.id} ({old})")

            async def check_file(name: str, tok: str) -> None:
                check.dir_checked += 1
                doc = files.get(name)
                if doc is None or doc.state != indexed or name not in await finds(
                        tok, DIR_SOURCE):
                    check.dir_lost.append(name)

            async def check_removed(tok: str) -> None:
                check.dir_removed_checked += 1
                if await finds(tok, DIR_SOURCE):
                    check.dir_stale.append(tok)

            jobs: list[Awaitable[None]] = [check_doc(d) for d in self.docs.values()]
            if check.dir_reindex == "OK":
                jobs += [check_file(n, t) for n, t in self.dir_files.items()]
                jobs += [check_removed(t) for t in self.dir_removed]
            await asyncio.gather(*jobs)
        return check


# -- analysis --------------------------------------------------------------------------------


@dataclass
class Growth:
    metric: str
    unit: str
    q2: float
    q4: float
    slope_per_hour: float  # least squares over the samples after the warm-up
    rule: str
    ok: bool
    judged: bool = True  # False: shown for information only (the children)

    @property
    def delta(self) -> float:
        return self.q4 - self.q2


def fit_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    if len(xs) < 2:
        return math.nan
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = math.fsum((x - mx) ** 2 for x in xs)
    return math.fsum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if (
        den) else math.nan


def growth(samples: Sequence[Sample], duration: float, warmup: float) -> list[Growth]:
    load = [s for s in samples if s.phase == "load"]
    q2 = [s for s in load if duration * 0.25 <= s.t < duration * 0.5]
    q4 = [s for s in load if s.t >= duration * 0.75]
    steady = [s for s in load if s.t >= duration * warmup]
    out = []
    metrics: list[tuple[str, str, Callable[[Sample], float]]] = [
        ("daemon RSS", "MiB", lambda s: s.rss / MIB),
        ("daemon open fds", "", lambda s: float(s.fds)),
        ("daemon threads", "", lambda s: float(s.threads)),
        ("children RSS", "MiB", lambda s: s.children_rss / MIB),
        ("children open fds", "", lambda s: float(s.children_fds)),
        ("children threads", "", lambda s: float(s.children_threads)),
    ]
    for name, unit, get in metrics:
        a = statistics.median([get(s) for s in q2]) if q2 else math.nan
        b = statistics.median([get(s) for s in q4]) if q4 else math.nan
        slope = fit_slope([s.t for s in steady], [get(s) for s in steady]) * 3600
        delta = b - a
        if name.startswith("children"):
            out.append(Growth(name, unit, a, b, slope, "not judged: depends on the model "
                              "swapped in (and on a swap running at the time)", True, False))
            continue
        if unit == "MiB":
            rule = (f"fails if it grows by > {RSS_LIMIT_MIB:.0f} MiB and > "
                    f"{RSS_LIMIT_SHARE:.0%}")
            ok = not (delta > RSS_LIMIT_MIB and delta > RSS_LIMIT_SHARE * a)
        else:
            limit = FD_LIMIT if "fds" in name else THREAD_LIMIT
            rule = f"fails if it grows by > {limit}"
            ok = not delta > limit
        out.append(Growth(name, unit, a, b, slope, rule, ok and not math.isnan(delta)))
    return out


def lat(values: Sequence[float], q: float) -> str:
    x = pct(values, q)
    return "n/a" if math.isnan(x) else f"{x:.2f}"


# -- the plot --------------------------------------------------------------------------------


def nice_ticks(lo: float, hi: float, n: int = 4) -> list[float]:
    if not hi > lo:
        hi = lo + 1
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step) * step
    ticks = [round(first, 6)]
    while ticks[-1] < hi - 1e-9:
        ticks.append(round(ticks[-1] + step, 6))
    return ticks


def svg_plot(samples: Sequence[Sample], swaps: Sequence[SwapRecord], *, duration: float,
             warmup: float, verdicts: Sequence[Growth], title: str) -> str:
    load = [s for s in samples if s.phase == "load"]
    width, chart_h, left, right, top, bottom = 760, 170, 64, 20, 26, 30
    head = 34
    height = head + 3 * chart_h + 22
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left}" y="20" font-size="14" font-weight="bold">'
           f'{html.escape(title)}</text>']
    series: list[tuple[str, Callable[[Sample], float]]] = [
        ("daemon RSS, MiB", lambda s: s.rss / MIB),
        ("daemon open file descriptors", lambda s: float(s.fds)),
        ("daemon threads", lambda s: float(s.threads)),
    ]
    xmax = max(duration, max((s.t for s in load), default=1.0))
    pw = width - left - right
    for i, ((label, get), g) in enumerate(zip(series, verdicts[:3], strict=True)):
        y0 = head + i * chart_h
        ph = chart_h - top - bottom
        values = [get(s) for s in load] or [0.0]
        lo, hi = min(values), max(values)
        pad = max((hi - lo) * 0.15, 1.0 if i else 2.0)
        ticks = nice_ticks(max(0.0, lo - pad), hi + pad)
        ylo, yhi = ticks[0], ticks[-1]

        def px(t: float) -> float:
            return left + pw * t / xmax

        def py(v: float, y0: float = y0, ph: int = ph, ylo: float = ylo,
               yhi: float = yhi) -> float:
            return y0 + top + ph * (1 - (v - ylo) / (yhi - ylo))

        verdict = "ok" if g.ok else "MISS"
        out.append(f'<text x="{left}" y="{y0 + top - 8}" font-weight="bold">'
                   f'{html.escape(label)}</text>'
                   f'<text x="{width - right}" y="{y0 + top - 8}" text-anchor="end" '
                   f'fill="{"#2a7d2a" if g.ok else "#c62828"}">second vs last quarter median: '
                   f'{g.q2:.1f} -&gt; {g.q4:.1f} ({g.delta:+.1f}) {verdict}</text>')
        out.append(f'<rect x="{left}" y="{y0 + top}" width="{px(duration * warmup) - left:.1f}" '
                   f'height="{ph}" fill="#f0f0f0"/>')
        for t in ticks:
            y = py(t)
            out.append(f'<line x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" '
                       'stroke="#ddd"/>'
                       f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{t:g}</text>')
        minutes = nice_ticks(0, xmax / 60, 6)
        for m in minutes:
            if m * 60 > xmax + 1e-6:
                continue
            x = px(m * 60)
            out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y0 + top + ph}" '
                       f'y2="{y0 + top + ph + 4}" stroke="#444"/>'
                       f'<text x="{x:.1f}" y="{y0 + top + ph + 15}" '
                       f'text-anchor="middle">{m:g}</text>')
        out.append(f'<text x="{width - right}" y="{y0 + top + ph + 26}" text-anchor="end" '
                   'fill="#666">minutes</text>')
        for sw in swaps:
            x = px(sw.at)
            out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y0 + top}" y2="{y0 + top + ph}" '
                       f'stroke="{"#bbb" if sw.code == "OK" else "#c62828"}" '
                       'stroke-dasharray="3,3"/>')
        for a, b, v in ((0.25, 0.5, g.q2), (0.75, 1.0, g.q4)):
            if not math.isnan(v):
                out.append(f'<line x1="{px(duration * a):.1f}" x2="{px(duration * b):.1f}" '
                           f'y1="{py(v):.1f}" y2="{py(v):.1f}" stroke="#e07b00" '
                           'stroke-width="2" stroke-dasharray="6,3"/>')
        points = " ".join(f"{px(s.t):.1f},{py(get(s)):.1f}" for s in load)
        out.append(f'<polyline points="{points}" fill="none" stroke="#1f5fa8" '
                   'stroke-width="1.5"/>')
        out.append(f'<rect x="{left}" y="{y0 + top}" width="{pw}" height="{ph}" fill="none" '
                   'stroke="#444"/>')
    out.append(f'<text x="{left}" y="{height - 6}" fill="#666">grey band: warm-up (not '
               'judged); dashed grey lines: swaps (red: failed); orange: medians of the '
               'second and last quarters</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


# -- the report ------------------------------------------------------------------------------


@dataclass
class Outcome:
    soak: Soak
    check: Check | None
    verdicts: list[Growth]
    exit_code: int | None
    exit_seconds: float
    leftover: list[int]
    idle: Sample | None
    duration: float

    @property
    def failures(self) -> list[str]:
        out = []
        s, c = self.soak, self.check
        if s.died:
            out.append(s.died)
        if s.hung:
            out.append(f"{len(s.hung)} hung calls")
        if c is None:
            out.append("the writes were not checked")
        else:
            if c.lost:
                out.append(f"{c.lost} lost acknowledged writes")
            if c.resurrected:
                out.append(f"{len(c.resurrected)} deleted documents back")
            if c.dir_reindex != "OK":
                out.append(f"the final Reindex failed ({c.dir_reindex})")
        out += [f"{g.metric} grows" if not math.isnan(g.delta) else
                f"{g.metric}: too few samples to judge" for g in self.verdicts if not g.ok]
        if self.exit_code != 0:
            out.append(f"exit status after SIGTERM: {self.exit_code}")
        if self.leftover:
            out.append(f"children left after exit: {self.leftover}")
        if s.client_errors:
            out.append(f"{sum(s.client_errors.values())} client errors (a bug of the soak)")
        return out


def samples_table(samples: Sequence[Sample], every: float) -> list[str]:
    rows: list[Sample] = [s for s in samples if s.phase == "idle"]
    load = [s for s in samples if s.phase == "load"]
    mark = 0.0
    for s in load:
        if s.t >= mark:
            rows.append(s)
            mark = (s.t // every + 1) * every
    if load and rows[-1] is not load[-1]:
        rows.append(load[-1])
    rows += [s for s in samples if s.phase == "after"]
    return table(
        ["t s", "phase", "daemon RSS MiB", "of which anon / file MiB", "daemon fds",
         "daemon threads", "children",
         "children RSS MiB", "children fds", "children threads", "calls so far",
         "docs acked so far"],
        [["-" if s.phase == "idle" else f"{s.t:.0f}", s.phase, f"{s.rss / MIB:.1f}",
          f"{s.rss_anon / MIB:.1f} / {s.rss_file / MIB:.1f}",
          str(s.fds), str(s.threads),
          str(s.children), f"{s.children_rss / MIB:.0f}", str(s.children_fds),
          str(s.children_threads), str(s.calls), str(s.acked)] for s in rows])


def section(o: Outcome, env: list[str], note: PartNote, args: argparse.Namespace, *,
            command: str, svg_link: str) -> list[str]:
    s, c = o.soak, o.check
    fails = o.failures
    verdict = "**PASS**" if not fails else "**FAIL**: " + "; ".join(fails)
    out = [HEADING, "", *env, note.line(),
           f"- Daemon: `python -m daemon serve` as a subprocess (its own process, pid "
           f"{s.daemon.pid}), listening on 127.0.0.1:0, its own temporary state directory "
           "(retrieval.allowed_roots: the directory source's temporary directory); "
           f"generation child on llama-server ({THREADS} threads, 2 slots, ctx 2048 per slot), "
           f"`{s.models[0].name}` first, swapped with `{s.models[1].name}` every "
           f"{args.swap_every:g} s (make-before-break); embedding child `{EMBED_MODEL}` on "
           f"llama-server ({THREADS} threads); every other setting the production default.",
           f"- Load for {o.duration / 60:g} min, each client on its own channel: "
           f"{args.generate_clients} streaming `Generate` clients (max_tokens 8-"
           f"{args.max_tokens}, {args.cancel_share:.0%} cancelled by the client after 1-4 "
           f"tokens), {args.search_clients} `Search` clients (top_k 5, half of the queries a "
           "known document's unique token), one ingest client (`UpsertDocument` of new "
           f"documents with a unique token, {args.update_share:.0%} updates with a new token, "
           f"{args.delete_share:.0%} `DeleteDocument`, at most {args.max_docs} documents "
           "kept), a directory source changed (2 files rewritten, 1 added, 1 removed) then "
           f"`Reindex`ed every {args.reindex_every:g} s, `Swap` every {args.swap_every:g} s, "
           "`Status` every 5 s, `RetrievalService/Status` every 15 s, `ListDocuments` every "
           "30 s. Deadlines: " + ", ".join(f"{k} {v:g} s" for k, v in DEADLINES.items())
           + f"; a call still running {HANG_GRACE:g} s past its deadline is *hung*. "
           "UNAVAILABLE and RESOURCE_EXHAUSTED are retried after `retry-after-ms`.",
           f"- Sampled every {args.sample_every:g} s from /proc: the daemon process "
           "(VmRSS, entries of /proc/pid/fd, Threads) and, separately, all its descendants "
           "(summed).",
           f"- Growth rule: after a warm-up (first {args.warmup:.0%} of the run), the median "
           "of the last quarter against the median of the second quarter: RSS fails if it "
           f"grew by more than {RSS_LIMIT_MIB:g} MiB *and* more than {RSS_LIMIT_SHARE:.0%}; "
           f"open fds fail if they grew by more than {FD_LIMIT}; threads if by more than "
           f"{THREAD_LIMIT}. The slope of a least-squares line over the samples after the "
           "warm-up is shown beside it. The children's sums are shown too, not judged "
           "(they change with the model swapped in).",
           "", f"Verdict: {verdict}.", ""]
    rows = []
    for g in o.verdicts:
        unit = f" {g.unit}" if g.unit else ""
        mark = ("ok" if g.ok else "MISS") if g.judged else "info"
        rows.append([g.metric, f"{g.q2:.1f}{unit}", f"{g.q4:.1f}{unit}",
                     f"**{g.delta:+.1f}{unit}** {mark}",
                     f"{g.slope_per_hour:+.1f}{unit}/h", g.rule])
    out += table(["metric", "median, second quarter", "median, last quarter", "growth",
                  "line fit after warm-up", "rule"], rows)
    out += ["", f"![daemon RSS, fds and threads over time]({svg_link})", ""]
    hung = len(s.hung)
    lost = c.lost if c is not None else -1
    out += [f"Calls per RPC and outcome (hung: **{hung}** {'ok' if not hung else 'MISS'}; "
            "latency in seconds, client side):", ""]
    rows = []
    for (rpc, code), n in sorted(s.counts.items(), key=lambda kv: (kv[0][0], -kv[1])):
        ls = s.latency[(rpc, code)]
        rows.append([rpc, code, str(n), lat(ls, 50), lat(ls, 99), lat(ls, 100),
                     f"{DEADLINES.get(rpc.split(' ')[0], math.nan):g}"])
    out += table(["RPC", "outcome", "calls", "p50 s", "p99 s", "max s", "deadline s"], rows)
    details = [(k, t, n) for k, cnt in s.details.items() for t, n in cnt.items()]
    if details:
        out += ["", "Messages of the failed calls (first 100 characters):", ""]
        out += [f"- {rpc} {code} x {n}: `{t or '(none)'}`" for (rpc, code), t, n in
                sorted(details, key=lambda x: -x[2])[:12]]
    if s.hung:
        out += ["", "Hung calls: " + "; ".join(f"{h.rpc} sent at {h.at:.1f} s" for h in s.hung)]
    if s.client_errors:
        out += ["", "Client errors (the soak's own bugs): " + "; ".join(
            f"{k} x {n}" for k, n in s.client_errors.items())]
    out += [""]
    if c is not None:
        out += [f"Writes checked after the load (lost: **{lost}** {'ok' if not lost else 'MISS'}"
                f"; resurrected: **{len(c.resurrected)}** "
                f"{'ok' if not c.resurrected else 'MISS'}):", ""]
        rows = [
            ["pushed, acknowledged, nothing unanswered after", str(c.push_checked),
             "listed INDEXED and found by its token",
             f"{len(c.push_not_indexed)} not INDEXED, {len(c.push_not_found)} not found"],
            ["pushed, acknowledged, then a write or delete with no answer",
             str(c.ambiguous_checked),
             "found by one of its tokens (or gone, after an unanswered delete)",
             f"{len(c.ambiguous_lost)} lost"],
            ["acknowledged deletes", str(c.deleted_checked), "not listed, not found",
             f"{len(c.resurrected)} back"],
            ["superseded tokens of updated documents", str(c.superseded_checked),
             "no longer find the document", f"{len(c.stale)} stale"],
            ["directory files (after a last Reindex: "
             f"{c.dir_reindex})", str(c.dir_checked), "listed INDEXED and found by its token",
             f"{len(c.dir_lost)} lost"],
            ["tokens removed from the directory's files", str(c.dir_removed_checked),
             "no longer found", f"{len(c.dir_stale)} stale"],
            ["writes never acknowledged (not checked)", str(c.never_acked), "", ""],
        ]
        out += table(["documents", "count", "must be", "failed"], rows)
        out.append("")
        lists = [("not INDEXED", c.push_not_indexed), ("not found", c.push_not_found),
                 ("lost after an unanswered write", c.ambiguous_lost),
                 ("resurrected", c.resurrected), ("stale", c.stale),
                 ("directory lost", c.dir_lost), ("directory stale", c.dir_stale)]
        for label, items in lists:
            if items:
                out.append(f"- {label}: {', '.join(items[:10])}"
                           f"{' ...' if len(items) > 10 else ''}")
        probes = s.probes
        anomalies = "; ".join(f"{k} x {n}" for k, n in s.anomalies.items()) or "none"
        failed = "; ".join(f"{k} x {n}" for k, n in s.reindex_failures.items()) or "none"
        if out[-1]:
            out.append("")
        out += [f"- During the load, token searches for clean acknowledged documents found "
                f"them {probes['found']} times, missed {probes['missed']} times (a delete or "
                f"update may race the search). Files Reindex reported failed: {failed}. "
                f"Other anomalies: {anomalies}.",
                f"- Clean-up once the load stopped: generation calls running {c.in_flight}, "
                f"queued {c.queued} after {c.settle_seconds:.1f} s "
                f"({'ok' if c.in_flight == 0 and c.queued == 0 else 'MISS'})."]
    out += [f"- Shutdown: SIGTERM -> exit status {o.exit_code} in {o.exit_seconds:.1f} s; "
            f"children left: {len(o.leftover)} "
            f"({'ok' if o.exit_code == 0 and not o.leftover else 'MISS'})."]
    if o.idle is not None:
        out += [f"- Before the load (both children ready, sources added): daemon "
                f"{o.idle.rss / MIB:.1f} MiB, {o.idle.fds} fds, {o.idle.threads} threads."]
    out += ["", "Swaps:", ""]
    out += table(["#", "at s", "from", "to", "seconds", "outcome", "last message"],
                 [[str(i), f"{w.at:.0f}", short(w.from_model), short(w.to_model),
                   f"{w.seconds:.1f}", w.code, f"`{w.message}`" if w.message else ""]
                  for i, w in enumerate(s.swaps, 1)])
    out += ["", f"Samples (every ~{args.table_every:g} s; children: all descendants of the "
            "daemon, summed; the count is 3 while a swap runs both generation children):", ""]
    out += samples_table(s.samples, args.table_every)
    out += ["", f"Reproduce: `{command}`"]
    return out


def relative_link(target: Path, page: Path) -> str:
    """``target`` as a link from the markdown file ``page``."""
    return Path(os.path.relpath(target.resolve(), page.resolve().parent)).as_posix()


# -- main ------------------------------------------------------------------------------------


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = bench_parser("bench.soak", __doc__)
    p.add_argument("--minutes", type=float, default=10.0, help="load duration (default 10)")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "RESULTS.md",
                   help="markdown file whose '## Soak' section is created or replaced")
    p.add_argument("--svg", type=Path, default=ROOT / "bench" / "results" / "soak.svg")
    p.add_argument("--raw", type=Path, help="also write every sample and count to this JSON")
    p.add_argument("--generate-clients", type=int, default=2)
    p.add_argument("--search-clients", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--cancel-share", type=float, default=0.25,
                   help="share of Generate calls cancelled by the client midway")
    p.add_argument("--ingest-pause", type=float, default=0.5,
                   help="seconds between the ingest client's calls")
    p.add_argument("--update-share", type=float, default=0.12)
    p.add_argument("--delete-share", type=float, default=0.08)
    p.add_argument("--max-docs", type=int, default=400,
                   help="pushed documents kept; beyond, the oldest are deleted")
    p.add_argument("--reindex-every", type=float, default=20.0)
    p.add_argument("--swap-every", type=float, default=60.0)
    p.add_argument("--sample-every", type=float, default=2.0)
    p.add_argument("--table-every", type=float, default=30.0)
    p.add_argument("--warmup", type=float, default=0.2,
                   help="share of the run not judged (default 0.2)")
    add_quiet_options(p, "before starting")
    args = p.parse_args(argv)
    if args.minutes <= 0 or args.generate_clients < 0 or args.search_clients < 0:
        p.error("--minutes must be > 0, client counts >= 0")
    if not 0 <= args.warmup < 0.25:
        p.error("--warmup must be in [0, 0.25)")
    return args


async def run(args: argparse.Namespace, command: str, log_path: Path) -> int:
    models = (model_file(SMALL_MODEL), model_file(DEFAULT_MODEL))
    embed = model_file(EMBED_MODEL)
    env_lines = environment(command)
    duration = args.minutes * 60
    MONITOR.start()
    with tempfile.TemporaryDirectory(prefix="llamad-soak-") as tmp:
        state, corpus = Path(tmp) / "state", Path(tmp) / "corpus"
        state.mkdir()
        corpus.mkdir()
        note = await begin_part("soak", args.wait_others, args.anyway, args.max_foreign)
        daemon = DaemonProcess(daemon_env(state, corpus, models[0], embed), log_path)
        outcome: Outcome | None = None
        try:
            address = await daemon.address()
            print(f"  daemon pid {daemon.pid} on {address}; waiting for both children",
                  flush=True)
            async with grpc.aio.insecure_channel(address) as ch:
                await wait_ready(ch)
            soak = Soak(args, address, daemon, corpus, models)
            await soak.setup()
            idle = soak.sample("idle")
            print(f"  ready; load for {duration:.0f}s", flush=True)
            await soak.run(duration)
            end_part(note)
            check: Check | None = None
            if not soak.died:
                print("  load stopped; checking the writes", flush=True)
                check = await soak.verify()
                last = soak.sample("after")
                if last is not None:
                    last.t = round(soak.now(), 2)
            kids = descendants(daemon.pid)
            code, seconds = await daemon.stop()
            await asyncio.sleep(0.5)
            leftover = [p for p in kids if proc_stat(p) is not None]
            outcome = Outcome(soak, check, growth(soak.samples, duration, args.warmup), code,
                              seconds, leftover, idle, duration)
        finally:
            if outcome is None:
                daemon.kill()
    await MONITOR.stop()
    o = outcome
    args.svg.parent.mkdir(parents=True, exist_ok=True)
    fails = o.failures
    title = (f"llamad soak, {duration / 60:g} min: "
             + ("PASS" if not fails else "FAIL (" + "; ".join(fails)[:80] + ")"))
    args.svg.write_text(svg_plot(o.soak.samples, o.soak.swaps, duration=duration,
                                 warmup=args.warmup, verdicts=o.verdicts, title=title))
    lines = section(o, env_lines, note, args, command=command,
                    svg_link=relative_link(args.svg, args.out))
    print("\n" + "\n".join(lines) + "\n", flush=True)
    write_sections(args.out, [lines])
    print(f"written to {args.out} and {args.svg}; daemon log {log_path}", flush=True)
    if args.raw:
        raw = {"command": command, "duration": duration,
               "samples": [asdict(s) for s in o.soak.samples],
               "counts": [[r, c, n] for (r, c), n in o.soak.counts.items()],
               "swaps": [asdict(w) for w in o.soak.swaps],
               "hung": [asdict(h) for h in o.soak.hung],
               "check": asdict(o.check) if o.check else None,
               "growth": [asdict(g) for g in o.verdicts], "failures": fails,
               "note": asdict(note)}
        args.raw.write_text(json.dumps(raw, indent=1, default=str) + "\n")
    print("PASS" if not fails else "FAIL: " + "; ".join(fails), flush=True)
    return 0 if not fails else 1


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    shown = sys.argv[1:] if argv is None else list(argv)
    command = " ".join([".venv/bin/python -m bench.soak", *map(shlex.quote, shown)])
    fd, name = tempfile.mkstemp(prefix="llamad-soak-", suffix=".log")
    os.close(fd)
    print(f"daemon log: {name}", flush=True)
    return asyncio.run(run(args, command, Path(name)))


if __name__ == "__main__":
    sys.exit(main())
