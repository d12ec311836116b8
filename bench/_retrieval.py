"""What the retrieval benches share: the BEIR collections on disk and the chunks the
Retriever makes of them, the embedding child run by an in-process daemon, and the
live-ingest measurement (``Retriever.upsert`` against the live child vs the same texts
straight to it) that ``bench.bench_retrieval`` and ``bench.bench_ingest`` both report.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from bench._direct import child_http
from bench._support import EMBED_MODEL, MODELS_DIR
from daemon import Daemon, load
from daemon.services.retrieval_bridge import ChildEmbedder, make_provider
from retrieval import Embedder, RetrievalLimits, Retriever, Vector, redact
from retrieval._sizing import sized_chunks
from retrieval.chunking._chunker import chunk_text
from tests.support.embedder import FixedEmbedder

Vec = npt.NDArray[np.float32]

DATA_DIR = Path("/work/shared/data")
COLLECTIONS = ("cisi", "cranfield", "medline", "vaswani")


# -- data -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Doc:
    source: str
    id: str
    title: str
    text: str
    chunks: tuple[str, ...]        # the chunk texts the Retriever makes of ``text``
    parts: tuple[str, str] | None = None   # synthetic: the chunk texts of its two halves

    @property
    def doc_id(self) -> str:
        return f"{self.source}/{self.id}"


@dataclass(frozen=True)
class Query:
    id: str
    text: str


@dataclass
class Collection:
    name: str
    docs: list[Doc]
    skipped: list[str]               # empty documents (the Retriever refuses them)
    queries: list[Query]
    qrels: dict[str, dict[str, int]]


def predict_chunks(text: str, limits: RetrievalLimits) -> tuple[str, ...]:
    """The chunk texts ``Retriever.upsert`` makes of ``text`` (kind ``text``) before the
    embedding-context check (which only splits chunks over 512 tokens)."""
    cleaned = redact(text, hostnames=limits.redact_hostnames, ips=limits.redact_ips).text
    return tuple(c.text for c in chunk_text(cleaned, "text", size=limits.chunk_size,
                                            overlap=limits.chunk_overlap,
                                            max_chars=limits.max_chunk_chars))


async def rechunk(col: Collection, limits: RetrievalLimits, embedder: Embedder) -> Collection:
    """``col`` with each document's chunks as ``Retriever.upsert`` makes them with
    ``limits`` and the embedding model's tokenizer (``chunk_unit = tokens``)."""
    docs = []
    for d in col.docs:
        cleaned = redact(d.text, hostnames=limits.redact_hostnames, ips=limits.redact_ips).text
        pieces = await sized_chunks(cleaned, "text", limits, embedder)
        docs.append(dataclasses.replace(d, chunks=tuple(p.text for p in pieces)))
    return dataclasses.replace(col, docs=docs)


def load_collection(root: Path, name: str, limits: RetrievalLimits) -> Collection:
    docs: list[Doc] = []
    skipped: list[str] = []
    with (root / "corpus.jsonl").open(encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            text = str(d.get("text") or "")
            if not text.strip():
                skipped.append(str(d["_id"]))
                continue
            docs.append(Doc(name, str(d["_id"]), str(d.get("title") or ""), text,
                            predict_chunks(text, limits)))
    qrels: dict[str, dict[str, int]] = {}
    with (root / "qrels" / "test.tsv").open(encoding="utf-8") as f:
        next(f)
        for line in f:
            if line.strip():
                qid, did, score = line.rstrip("\n").split("\t")
                qrels.setdefault(qid, {})[did] = int(score)
    queries = []
    with (root / "queries.jsonl").open(encoding="utf-8") as f:
        for line in f:
            q = json.loads(line)
            if str(q["_id"]) in qrels:
                queries.append(Query(str(q["_id"]), str(q["text"])))
    return Collection(name, docs, skipped, queries, qrels)



# -- the embedding child ----------------------------------------------------------------


@dataclass
class Child:
    """The in-process daemon running only its embedding child."""

    daemon: Daemon
    embedder: ChildEmbedder
    socket: str
    pid: int
    argv: list[str]


async def start_child(workdir: Path) -> Child:
    env = {
        "LLAMAD_LISTEN": "127.0.0.1:0",
        "LLAMAD_GENERATION_ENABLED": "false",
        "LLAMAD_EMBEDDING_MODEL": str(MODELS_DIR / EMBED_MODEL),
        "LLAMAD_EMBEDDING_RUNTIME": "llama-server",
        "LLAMAD_EMBEDDING_THREADS": "2",
        "LLAMAD_RETRIEVAL_ENABLED": "false",
        "LLAMAD_STATE_DIR": str(workdir / "state"),
        "LLAMAD_LOG_FORMAT": "json",
        "LLAMAD_CHILD_STOP_GRACE": "3",
        "LLAMAD_DRAIN_GRACE": "5",
    }
    daemon = Daemon(load(None, env=env))
    await daemon.start()
    provider = make_provider(daemon.router, daemon.children)
    deadline = time.monotonic() + 180
    embedder = provider()
    while embedder is None:
        if time.monotonic() > deadline:
            await daemon.shutdown()
            raise RuntimeError("the embedding child never became ready")
        await asyncio.sleep(0.2)
        embedder = provider()
    supervisor = daemon.children["embedding"].supervisor
    pid = supervisor.pid
    with open(f"/proc/{pid}/cmdline", "rb") as f:  # noqa: ASYNC230 (procfs, instant)
        argv = f.read().decode().split("\0")[:-1]
    return Child(daemon, embedder, supervisor.socket, pid, argv)



async def direct_embed(child: Child, batches: Sequence[Sequence[str]]) -> tuple[float, int]:
    """POST the batches to the child's /v1/embeddings, one after another, as llamad's
    client does (same body); returns (seconds, prompt tokens)."""
    tokens = 0
    async with child_http(child.socket, child.pid) as http:
        began = time.perf_counter()
        for part in batches:
            resp = await http.post("/v1/embeddings", json={"input": list(part)})
            resp.raise_for_status()
            data = resp.json()
            if len(data["data"]) != len(part):
                raise RuntimeError("the child returned the wrong number of vectors")
            tokens += int((data.get("usage") or {}).get("prompt_tokens") or 0)
        return time.perf_counter() - began, tokens


class CountingEmbedder(FixedEmbedder):
    """ChildEmbedder as it is (its model id and context are fixed too), counting the
    /tokenize calls the Retriever makes."""

    def __init__(self, inner: ChildEmbedder) -> None:
        super().__init__(inner.model_id, inner.context)
        self.inner = inner
        self.token_calls = 0

    async def embed(self, texts: Sequence[str]) -> Sequence[Vector]:
        return await self.inner.embed(texts)

    async def count_tokens(self, text: str) -> int:
        self.token_calls += 1
        return await self.inner.count_tokens(text)



# -- ingest -----------------------------------------------------------------------------


@dataclass
class Ingest:
    docs: int
    chunks: int
    seconds: float
    commit_s: float = 0.0        # in TextIndex.commit
    segments: int = 0            # tantivy segments afterwards

    @property
    def rate(self) -> float:
        return self.chunks / self.seconds if self.seconds else 0.0


async def upsert_all(r: Retriever, docs: Sequence[Doc],
                     progress: Callable[[int, int, float], None] | None = None) -> Ingest:
    """Upsert every document through ``Retriever.upsert`` the way a directory scan does:
    ``limits.ingest_workers`` documents in flight (their commits are grouped)."""
    chunks = 0
    done = 0
    began = time.perf_counter()
    workers = asyncio.Semaphore(max(1, r.limits.ingest_workers))

    async def one(d: Doc) -> None:
        nonlocal chunks, done
        async with workers:
            await r.upsert(d.source, d.title, d.text, doc_id=d.doc_id, kind="text")
        chunks += len(d.chunks)
        done += 1
        if progress is not None:
            progress(done, chunks, time.perf_counter() - began)

    await asyncio.gather(*(one(d) for d in docs))
    return Ingest(len(docs), chunks, time.perf_counter() - began)


async def open_retriever(root: Path, provider: Callable[[], Embedder | None],
                         limits: RetrievalLimits, sources: Iterable[str]) -> Retriever:
    r = Retriever(root, provider, limits)
    await r.open()
    for source in dict.fromkeys(sources):
        await r.add_source(source)
    return r


@dataclass
class LiveIngest:
    docs: int
    chunks: int
    retriever_s: float
    direct32_s: float
    direct32_tokens: int
    direct_perdoc_s: float
    token_calls: int


async def live_ingest(docs: Sequence[Doc], child: Child, workdir: Path,
                      limits: RetrievalLimits) -> LiveIngest:
    """Retriever.upsert against the live child vs the same texts straight to the child."""
    texts = [t for d in docs for t in d.chunks]
    batch = limits.embed_batch
    direct32, tokens = await direct_embed(
        child, [texts[i:i + batch] for i in range(0, len(texts), batch)])
    print(f"   direct, batches of {batch}: {len(texts) / direct32:.1f} chunks/s", flush=True)

    live = CountingEmbedder(child.embedder)
    r = await open_retriever(workdir / "live", lambda: live, limits, {d.source for d in docs})
    result = await upsert_all(r, docs)
    await r.close()
    print(f"   Retriever.upsert, live child: {result.rate:.1f} chunks/s", flush=True)
    perdoc, _ = await direct_embed(child, [list(d.chunks) for d in docs])
    print(f"   direct, one request per document: {len(texts) / perdoc:.1f} chunks/s",
          flush=True)
    return LiveIngest(len(docs), len(texts), result.seconds, direct32, tokens, perdoc,
                      live.token_calls)
