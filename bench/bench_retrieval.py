"""Retrieval benchmark: quality, latency and ingest throughput of llamad's ``Retriever``.

    .venv/bin/python -m bench.bench_retrieval [--smoke]
        [--collections cisi,cranfield,medline,vaswani] [--data DIR]
        [--latency-chunks 100000] [--hnsw-vectors 1000000] [--hnsw-budget 450]
        [--embed-budget 1140] [--live-docs 600] [--bm25-docs 2000] [--upsert-docs 2000]
        [--rounds 2] [--slow-queries 40] [--out bench/RESULTS.md] [--raw FILE]
        [--workdir DIR] [--wait SECONDS]

One process, one embedding child, in this order:

1. **Embedding child.** An in-process :class:`daemon.Daemon` (127.0.0.1:0, generation
   child and RetrievalService disabled) runs the embedding child on llama-server with
   production defaults (2 threads, 2 slots, 512-token context); the bench embeds through
   the daemon's own ``ChildEmbedder`` (from ``make_provider``).
2. **Real embeddings.** Every distinct chunk text of every collection (the chunks the
   Retriever will make: ``redact`` then ``chunk_text`` with the Retriever's limits) and
   every query, in batches of ``embed_batch`` (32) through ChildEmbedder.
3. **Ingest with live embeddings** (``--live-docs`` documents sampled across the
   collections): the same chunk texts sent straight to the child (``POST
   /v1/embeddings``, httpx, the body llamad sends) in batches of 32; ``Retriever.upsert``
   with ``ingest_workers`` (4) documents in flight, as a directory scan runs them (their
   commits grouped), against the live child (fresh index, empty vector cache); the
   texts straight to the child again in the per-document batches the Retriever sends.
4. **Quality.** Per collection, a fresh Retriever (own directory: BM25 statistics are per
   collection); each corpus document is one ``upsert`` (kind ``text``, the corpus title),
   its vectors served from step 2 by text (a miss would go to the live child, and is
   counted); token counts from the live child. BM25 alone = ``TextIndex.search``,
   vectors alone = ``VectorIndex.search``, hybrid = ``Retriever.search`` (``candidates``
   25/25, RRF k=60; and 100/100 for recall@100). Chunk hits map to corpus ids,
   a document keeping its best rank. nDCG@10 (linear graded gains, log2 discount),
   recall@100. An RRF k x depth sweep is computed offline from the depth-100 candidate
   lists with ``retrieval.search._fusion.rrf`` (checked equal to ``Retriever.search`` at 25/25).
5. **Synthetic documents** to reach ``--latency-chunks``: see :func:`synthetic_docs`. The
   first of them are embedded for real for what is left of ``--embed-budget`` seconds
   (step 2 counts against it); the rest get ``normalise(e(a) + e(b))`` of their halves.
6. **BM25-only ingest** (no embedder) of the first ``--bm25-docs`` documents, fresh index.
7. **The latency index**: the first ``--upsert-docs`` documents through
   ``Retriever.upsert`` (vectors from the table, token counts from the live child), the
   rest written to SQLite as upsert writes them and indexed by ``Retriever.open()``'s
   reconciliation (see :func:`bulk_fill`; per-document upserts are too slow for 100k).
   Peak RSS (``VmHWM`` after resetting it through ``/proc/self/clear_refs``).
8. **Latency** (daemon stopped): ``TextIndex.search`` (25), ``VectorIndex.search`` (25)
   and ``Retriever.search`` (k=10, query vector looked up, so no embedding time), one
   warm-up pass then ``--rounds`` passes over all queries; HNSW recall@10 against exact
   search; bm25s, rank_bm25 and numpy brute force over the same chunks.
9. **HNSW at scale**: a ``VectorIndex`` filled in batches to ``--hnsw-vectors`` (the
   latency vectors, then mixtures of two real embeddings plus Gaussian noise) until
   ``--hnsw-budget`` seconds of building are spent; latency, recall@10, numpy brute force.

Before starting it waits (``--wait``) while ``pgrep -fa 'bench\\.'`` shows another
benchmark, and it notes the load and any other benchmark before every stage.

Results are printed and written into ``--out``: the sections ``## Retrieval quality``,
``## Retrieval latency`` and ``## Ingest throughput`` are created or replaced, others kept.
Needs ``rank_bm25`` and ``bm25s`` (``pip install rank_bm25 bm25s``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import json
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from bench._retrieval import (
    COLLECTIONS,
    DATA_DIR,
    Doc,
    Ingest,
    LiveIngest,
    live_ingest,
    load_collection,
    open_retriever,
    rechunk,
    start_child,
    upsert_all,
)
from bench._retrieval_bench.common import (
    NOTES,
    embed_batched,
    normalise,
    proc_kb,
    stage,
    synthetic_docs,
    wait_quiet,
)
from bench._retrieval_bench.index import build_latency_index, segments, timing_commits
from bench._retrieval_bench.latency import ScaleResult, hnsw_at_scale, measure_latency
from bench._retrieval_bench.metrics import pct
from bench._retrieval_bench.quality import chunk_docs, quality
from bench._retrieval_bench.report import (
    environment,
    ingest_section,
    latency_section,
    quality_section,
)
from bench._support import (
    ROOT,
    bench_parser,
    command_line,
    publish,
)
from bench._vector_cache import cached_part, write_cache
from daemon.telemetry import logs
from retrieval import RetrievalLimits
from retrieval._sizing import CHUNK_UNITS
from retrieval.search._score_fusion import FUSIONS

# -- main -------------------------------------------------------------------------------


SMOKE = {"collections": "medline,cisi", "latency_chunks": 6000, "hnsw_vectors": 30000,
         "hnsw_budget": 60.0, "embed_budget": 150.0, "live_docs": 60, "bm25_docs": 500,
         "upsert_docs": 500, "rounds": 1, "slow_queries": 10}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = bench_parser("bench.bench_retrieval", __doc__)
    p.add_argument("--smoke", action="store_true",
                   help="small sizes for a quick check: " + ", ".join(
                       f"--{k.replace('_', '-')} {v}" for k, v in SMOKE.items()))
    p.add_argument("--collections", default=",".join(COLLECTIONS))
    p.add_argument("--data", type=Path, default=DATA_DIR)
    p.add_argument("--latency-chunks", type=int, default=100_000)
    p.add_argument("--hnsw-vectors", type=int, default=1_000_000,
                   help="vectors for the HNSW-only scale test (0: skip)")
    p.add_argument("--hnsw-budget", type=float, default=450.0,
                   help="seconds of HNSW building at most for the scale test")
    p.add_argument("--embed-budget", type=float, default=1140.0,
                   help="seconds of real embedding (collections first, then synthetic texts)")
    p.add_argument("--live-docs", type=int, default=600,
                   help="documents ingested against the live embedding child")
    p.add_argument("--bm25-docs", type=int, default=2000,
                   help="documents ingested BM25-only")
    p.add_argument("--upsert-docs", type=int, default=2000,
                   help="documents of the latency index ingested by Retriever.upsert (the "
                   "rest: SQLite rows + Retriever.open() reconciliation)")
    p.add_argument("--rounds", type=int, default=2, help="timed passes over the queries")
    p.add_argument("--slow-queries", type=int, default=40,
                   help="queries for rank_bm25 (about 1 s each at 100k chunks)")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "RESULTS.md")
    p.add_argument("--raw", type=Path, default=None, help="also write raw results (JSON)")
    p.add_argument("--workdir", type=Path, default=None,
                   help="index directory (default: a temporary one, removed afterwards)")
    p.add_argument("--quality-only", action="store_true",
                   help="stop after the quality stage (write only its section; without "
                   "waiting for other benchmarks: it measures no time)")
    p.add_argument("--chunk-unit", choices=CHUNK_UNITS, default="characters",
                   help="retrieval.chunk_unit of every Retriever (tokens: sizes in tokens of "
                   "the embedding model, through its child)")
    p.add_argument("--chunk-size", type=int, default=RetrievalLimits.chunk_size,
                   help="retrieval.chunk_size, in --chunk-unit")
    p.add_argument("--chunk-overlap", type=int, default=RetrievalLimits.chunk_overlap,
                   help="retrieval.chunk_overlap, in --chunk-unit")
    p.add_argument("--fusion", choices=FUSIONS, default=RetrievalLimits.fusion,
                   help="retrieval.fusion of Retriever.search (the RRF sweep is computed "
                   "offline whatever it is)")
    p.add_argument("--text-weight", type=float, default=RetrievalLimits.text_weight)
    p.add_argument("--vector-weight", type=float, default=RetrievalLimits.vector_weight)
    p.add_argument("--vectors", type=Path, default=None,
                   help="a vector cache (.npz): texts it holds are not embedded again; it is "
                   "rewritten with every text embedded")
    p.add_argument("--wait", type=float, default=1800.0,
                   help="seconds to wait for other benchmarks to finish before starting")
    args = p.parse_args(argv)
    if args.smoke:
        for key, value in SMOKE.items():
            if getattr(args, key) == p.get_default(key):
                setattr(args, key, value)
    if args.upsert_docs < 1:
        p.error("--upsert-docs must be >= 1 (the first upsert creates the vector index)")
    unknown = set(args.collections.split(",")) - set(COLLECTIONS)
    if unknown:
        p.error(f"unknown collections: {sorted(unknown)}")
    return args


@contextlib.contextmanager
def workdir_for(args: argparse.Namespace) -> Iterator[Path]:
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
        if any(args.workdir.iterdir()):
            raise SystemExit(f"--workdir {args.workdir} is not empty")
        yield args.workdir
        return
    with tempfile.TemporaryDirectory(prefix="llamad-bench-retrieval-") as tmp:
        yield Path(tmp)


@contextlib.contextmanager
def daemon_log(path: Path) -> Iterator[TextIO]:
    with path.open("w") as fh:
        logs.configure("json", "info", stream=fh)
        yield fh


async def run(args: argparse.Namespace, command: str, work: Path) -> dict[str, Any]:
    began = time.perf_counter()
    limits = RetrievalLimits(max_query_chars=5000, chunk_unit=args.chunk_unit,
                             chunk_size=args.chunk_size, chunk_overlap=args.chunk_overlap,
                             fusion=args.fusion, text_weight=args.text_weight,
                             vector_weight=args.vector_weight)
    names = args.collections.split(",")
    cols = [load_collection(args.data / n, n, limits) for n in names]
    child = await start_child(work)
    print(f"embedding child pid {child.pid}: {' '.join(child.argv)}", flush=True)
    if limits.chunk_unit == "tokens":  # the chunks need the model's tokenizer
        cols = [await rechunk(c, limits, child.embedder) for c in cols]
    originals = [d for c in cols for d in c.docs]
    queries = [q for c in cols for q in c.queries]
    print(f"{len(originals)} documents, {sum(len(d.chunks) for d in originals)} chunks, "
          f"{len(queries)} queries", flush=True)
    raw: dict[str, Any] = {"command": command, "child_argv": child.argv}
    try:
        stage("real embeddings: every collection chunk and query, batches of 32, "
              "through ChildEmbedder")
        texts = [t for d in originals for t in d.chunks]
        known = cached_part(args.vectors, child.embedder.model_id, texts)
        table, failed, took = await embed_batched(
            child.embedder, [t for t in texts if t not in known], limits.embed_batch)
        table.update(known)
        if args.vectors is not None:
            write_cache(args.vectors, child.embedder.model_id, table)
        qtable, qfailed, qtook = await embed_batched(child.embedder, [q.text for q in queries],
                                                     limits.embed_batch)
        table.update(qtable)
        n_texts = len(set(texts))
        embed_rate = (f"Through ChildEmbedder (llamad's path), batches of "
                      f"{limits.embed_batch}: {n_texts} distinct collection chunks in "
                      f"{took:.0f} s ({n_texts / took:.1f} chunks/s).")
        print(f"   {embed_rate} Failed: {len(failed)} chunks, {len(qfailed)} queries",
              flush=True)
        raw["embed"] = {"chunks": n_texts, "seconds": took, "queries_seconds": qtook,
                        "failed_chunks": len(failed), "failed_queries": len(qfailed)}

        live: LiveIngest | None = None
        if args.live_docs:
            stage(f"ingest with the live embedding child ({args.live_docs} documents)")
            step = max(1, len(originals) // args.live_docs)
            sample = originals[::step][:args.live_docs]
            live = await live_ingest(sample, child, work, limits)
            raw["live_ingest"] = dataclasses.asdict(live)

        stage("quality: ingest and search, per collection")
        rows = []
        for col in cols:
            row = await quality(col, table, child, work, limits)
            rows.append(row)
            print(f"   {col.name}: ingest {row.ingest.rate:.0f} chunks/s; nDCG@10 "
                  + ", ".join(f"{k} {v:.3f}" for k, v in row.ndcg.items())
                  + "; R@100 " + ", ".join(f"{k} {v:.3f}" for k, v in row.recall.items()),
                  flush=True)
        raw["quality"] = [dataclasses.asdict(r) for r in rows]
        if args.quality_only:
            env = [*environment(command, child.argv),
                   f"- Chunks: {limits.chunk_size} / {limits.chunk_overlap} "
                   f"{limits.chunk_unit}; {len(known)} chunk vectors from `{args.vectors}`; "
                   f"Retriever.search fuses by {limits.fusion} ({limits.text_weight} / "
                   f"{limits.vector_weight})."]
            publish(args.out, [quality_section(rows, env, limits, embed_rate)])
            return raw

        # Documents of the latency index: the originals, then synthetic pairs.
        n_orig_chunks = sum(len(d.chunks) for d in originals)
        docs: list[Doc] = []
        chunks = 0
        for d in originals:
            if chunks >= args.latency_chunks:
                break
            docs.append(d)
            chunks += len(d.chunks)
        synth = synthetic_docs(originals, max(0, args.latency_chunks - chunks), limits)
        docs += synth
        real_synth_texts: list[str] = []
        embed_total = took + qtook   # seconds of embedding so far, against the budget
        if synth and embed_total < args.embed_budget:
            left = args.embed_budget - embed_total
            stage(f"real embeddings of synthetic documents, {left:.0f} s left of the "
                  "embedding budget")
            extra, _, extra_s = await embed_batched(
                child.embedder, [d.chunks[0] for d in synth], limits.embed_batch,
                time.perf_counter() + left)
            embed_total += extra_s
            table.update(extra)
            real_synth_texts = [d.chunks[0] for d in synth if d.chunks[0] in extra]
            real_synth = len(real_synth_texts)
            print(f"   {real_synth} synthetic chunks embedded in {extra_s:.0f} s", flush=True)
        agreement: list[float] = []
        for d in synth:
            assert d.parts is not None
            mix = normalise(table[d.parts[0]] + table[d.parts[1]])
            if d.chunks[0] in table:
                agreement.append(float(mix @ normalise(table[d.chunks[0]])))
            else:
                table[d.chunks[0]] = mix
        data_note = [
            f"- Latency index: {len(docs)} documents, {chunks + len(synth)} chunks: the "
            f"{len(originals)} documents of {', '.join(names)} ({n_orig_chunks} chunks; "
            f"{len(docs) - len(synth)} of them used), then {len(synth)} synthetic one-chunk "
            "documents, each two different short originals joined (`a.text + ' ' + b.text`, "
            "title of a, pairs drawn at random without repetition; see `synthetic_docs`).",
            f"- Vectors: real embeddings (the model via ChildEmbedder) for every original "
            f"chunk and for the first {len(real_synth_texts)} synthetic chunks "
            f"({embed_total / 60:.0f} minutes of the {args.embed_budget / 60:.0f}-minute "
            f"embedding budget, collections included); each other synthetic chunk gets "
            f"normalise(e(a) + e(b)) of its two halves' real embeddings. On the "
            f"{len(agreement)} synthetic chunks that have both, "
            f"cosine(real, normalise(e(a)+e(b))) is "
            + (f"mean {statistics.fmean(agreement):.3f}, 5th percentile "
               f"{pct(agreement, 0.05):.3f}." if agreement else "not measured."),
            f"- Queries: the {len(queries)} queries of the collections (real embeddings; "
            "a query that could not be embedded is skipped in vector timings).",
        ]
        raw["latency_data"] = data_note

        bm25_only: Ingest | None = None
        if args.bm25_docs:
            stage(f"BM25-only ingest ({min(args.bm25_docs, len(docs))} documents)")
            r0 = await open_retriever(work / "bm25only", lambda: None, limits,
                                      [d.source for d in docs[:args.bm25_docs]])
            commits = timing_commits(r0)
            bm25_only = await upsert_all(r0, docs[:args.bm25_docs])
            await r0.close()
            bm25_only.commit_s = sum(commits)
            bm25_only.segments = segments(work / "bm25only")
            print(f"   {bm25_only.rate:.0f} chunks/s; TextIndex.commit "
                  f"{1000 * bm25_only.commit_s / bm25_only.docs:.1f} ms/doc of "
                  f"{1000 * bm25_only.seconds / bm25_only.docs:.1f}", flush=True)
            raw["bm25_ingest"] = dataclasses.asdict(bm25_only)

        stage(f"build the latency index ({len(docs)} documents; the first "
              f"{min(args.upsert_docs, len(docs))} through Retriever.upsert)")
        r, embedder, build = await build_latency_index(
            docs, table, child, root=work / "latency", limits=limits,
            upsert_docs=args.upsert_docs)
        raw["build"] = dataclasses.asdict(build)
        child_peak = proc_kb("VmHWM", child.pid)
    finally:
        await child.daemon.shutdown()
    raw["child_peak_kb"] = child_peak

    vq = [q for q in queries if q.text in table]
    qvecs = normalise(np.stack([table[q.text] for q in vq]))
    lat = await measure_latency(r, embedder, vq, qvecs, rounds=args.rounds,
                                slow_queries=args.slow_queries)
    raw["latency"] = dataclasses.asdict(lat)
    store = r._indexes.store
    assert store is not None
    base_keys = sorted(store.chunk_keys())
    _, text_of = chunk_docs(r)
    base = normalise(np.stack([table[text_of[k]] for k in base_keys]))
    real_texts = [t for d in originals for t in d.chunks if t in table] + real_synth_texts
    pool = normalise(np.stack([table[t] for t in dict.fromkeys(real_texts)]))
    await r.close()
    del r, embedder, text_of
    gc.collect()

    scale: ScaleResult | None = None
    if args.hnsw_vectors:
        stage(f"HNSW alone at {args.hnsw_vectors} vectors (build budget "
              f"{args.hnsw_budget:.0f} s)")
        (work / "scale").mkdir()
        scale = hnsw_at_scale(base, pool, qvecs, target=args.hnsw_vectors,
                              budget=args.hnsw_budget, rounds=args.rounds,
                              root=work / "scale")
        raw["scale"] = dataclasses.asdict(scale)
        print(f"   {scale.built} vectors: p50 {scale.results['hnsw']['p50_ms']:.2f} ms, "
              f"p99 {scale.results['hnsw']['p99_ms']:.2f} ms, recall@10 {scale.recall10:.4f}",
              flush=True)

    total = time.perf_counter() - began
    raw["total_seconds"] = total
    raw["stages"] = [dataclasses.asdict(n) for n in NOTES]
    env = [*environment(command, child.argv), f"- Whole run: {total / 60:.1f} minutes."]
    sections = [
        quality_section(rows, env, limits,
                        f"Each corpus document is one `Retriever.upsert` (kind text, corpus "
                        f"title) into a per-collection index; vectors by the real model, "
                        f"batched 32 ({embed_rate}). BM25 = TextIndex.search, vectors = "
                        f"VectorIndex.search (ef 100), hybrid = Retriever.search "
                        f"(RRF k={limits.rrf_k}) with 25/25 candidates (k=20 hits) "
                        f"or 100/100 (k=200 hits). nDCG@10 with linear graded gains "
                        f"(cranfield 1-4), recall@100 at depth 100 per side; chunk hits "
                        f"become corpus documents at their best rank."),
        latency_section(lat, scale, env, data_note),
        ingest_section(live, bm25_only, build, embed_rate=embed_rate, env=env, limits=limits),
    ]
    publish(args.out, sections)
    return raw


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    command = command_line("bench.bench_retrieval", argv)
    if not args.quality_only:  # nDCG and recall do not depend on what else runs
        wait_quiet(args.wait)
    with workdir_for(args) as work, daemon_log(work.parent / f"{work.name}.daemon.log"):
        print(f"work directory {work}; daemon log {work.parent / (work.name + '.daemon.log')}",
              flush=True)
        raw = asyncio.run(run(args, command, work))
    if args.raw is not None:
        args.raw.write_text(json.dumps(raw, indent=1, default=str))


if __name__ == "__main__":
    main()
