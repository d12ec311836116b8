"""The report of ``bench.bench_retrieval``: its three sections of RESULTS.md."""

from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import statistics
import subprocess
from collections.abc import Sequence

from bench._retrieval import (
    Ingest,
    LiveIngest,
)
from bench._retrieval_bench.common import (
    DIM,
    HYBRID_K,
    INGEST_HEADING,
    LATENCY_HEADING,
    NOTES,
    QUALITY_HEADING,
    README_BM25,
    SEARCH_N,
    SWEEP_DEPTH,
    SWEEP_K,
)
from bench._retrieval_bench.index import BuildResult
from bench._retrieval_bench.latency import Latency, ScaleResult
from bench._retrieval_bench.quality import QualityRow
from bench._support import (
    ROOT,
    cpu_model,
    f3,
    table,
    version_of,
)
from retrieval import RetrievalLimits

# -- report -----------------------------------------------------------------------------


def source() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "retrieval", "daemon",
                                "supervisor"], cwd=ROOT, check=True, capture_output=True,
                               text=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return "(no git)"
    if not dirty:
        return rev
    mine = [line[3:] for line in dirty if line[3:].startswith("retrieval/")]
    return (f"{rev} + uncommitted changes ({', '.join(mine) or 'none'} in retrieval/; "
            f"{len(dirty) - len(mine)} files in daemon/ and supervisor/)")


def ms(x: float) -> str:
    return f"{x:.2f}" if x < 10 else f"{x:.1f}"


def mb(kb: int) -> str:
    return f"{kb / 1024:.0f} MB"


def environment(command: str, child: list[str]) -> list[str]:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    loads = "; ".join(f"{n.stage.split(':')[0]} {n.load[0]:.2f}" for n in NOTES[:1] + NOTES[-1:])
    foreign = sorted({line for n in NOTES for line in n.foreign})
    return [
        f"- Date: {now}; llamad {source()}",
        f"- Machine: {os.cpu_count()} CPUs ({cpu_model()}), Linux {platform.release()}, "
        f"Python {platform.python_version()}; tantivy {version_of('tantivy')}, hnswlib "
        f"{version_of('hnswlib')}, numpy {version_of('numpy')}, bm25s {version_of('bm25s')}, "
        f"rank_bm25 {version_of('rank_bm25')}",
        f"- 1-minute load at the first and last stage: {loads}; other benchmarks seen "
        f"during the run: {', '.join(foreign) if foreign else 'none'}",
        f"- Embedding child (llamad's production defaults): `{' '.join(child)}`",
        f"- Command: `{command}`",
    ]


def quality_section(rows: Sequence[QualityRow], env: list[str], limits: RetrievalLimits,
                    embed_note: str) -> list[str]:
    out = [QUALITY_HEADING, "", *env, f"- {embed_note}", ""]
    body = []
    for r in rows:
        body.append([r.name, f"{r.docs} / {r.chunks}", str(r.queries),
                     f3(README_BM25.get(r.name, float("nan"))), f3(r.ndcg["bm25"]),
                     f3(r.ndcg["vectors"]), f3(r.ndcg["hybrid25"]), f3(r.ndcg["hybrid100"]),
                     f3(r.recall["bm25"]), f3(r.recall["vectors"]), f3(r.recall["hybrid100"])])
    if rows:
        mean = {m: statistics.fmean(r.ndcg[m] for r in rows) for m in rows[0].ndcg}
        rmean = {m: statistics.fmean(r.recall[m] for r in rows) for m in rows[0].recall}
        body.append(["**mean**", "", "", "", f3(mean["bm25"]), f3(mean["vectors"]),
                     f"**{f3(mean['hybrid25'])}**", f3(mean["hybrid100"]),
                     f3(rmean["bm25"]), f3(rmean["vectors"]), f3(rmean["hybrid100"])])
    out += table(["collection", "docs / chunks", "queries", "README BM25 nDCG@10",
                  "BM25 nDCG@10", "vectors nDCG@10", "hybrid 25/25 nDCG@10",
                  "hybrid 100/100 nDCG@10", "BM25 R@100", "vectors R@100",
                  "hybrid 100/100 R@100"], body)
    if not rows:
        return out
    best_single = max(mean["bm25"], mean["vectors"])
    verdict = ("beats" if mean["hybrid25"] > best_single else "does **not** beat")
    out += ["", f"Hybrid (25/25, RRF k={limits.rrf_k}) {verdict} the better single "
            f"method on the mean over collections: {f3(mean['hybrid25'])} against "
            f"{f3(best_single)} ({'BM25' if mean['bm25'] >= mean['vectors'] else 'vectors'}); "
            "per collection: " + ", ".join(
                f"{r.name} {r.ndcg['hybrid25'] - max(r.ndcg['bm25'], r.ndcg['vectors']):+.3f}"
                for r in rows) + "."]
    out += ["", "nDCG@10 of RRF over the same depth-100 candidate lists, mean over the "
            "collections (rows: RRF k, columns: candidates per side; offline with "
            "`retrieval.search._fusion.rrf`):", ""]
    sweep_rows = []
    for rk in SWEEP_K:
        sweep_rows.append([str(rk)] + [
            f3(statistics.fmean(r.sweep[f"k={rk},d={d}"] for r in rows)) for d in SWEEP_DEPTH])
    out += table(["RRF k", *(f"{d}/{d}" for d in SWEEP_DEPTH)], sweep_rows)
    best = []
    for r in rows:
        cell = max(r.sweep, key=r.sweep.__getitem__)
        best.append(f"{r.name} {cell} {f3(r.sweep[cell])} (k=60,d=25: "
                    f"{f3(r.sweep['k=60,d=25'])})")
    out += ["", "Per collection, best cell of the sweep: " + "; ".join(best) + "."]
    notes = []
    skipped = {r.name: r.skipped_docs for r in rows if r.skipped_docs}
    if skipped:
        notes.append(f"empty corpus documents not indexed (the Retriever refuses empty "
                     f"text; no qrel points at them): {skipped}")
    long_q = {r.name: r.long_queries for r in rows if r.long_queries}
    if long_q:
        notes.append(f"queries longer than the default max_query_chars "
                     f"({limits.max_query_chars}), which the bench raises to 5000 so they "
                     f"are scored unchanged: {long_q}")
    noq = {r.name: r.no_query_vector for r in rows if r.no_query_vector}
    if noq:
        notes.append(f"queries the embedding child could not embed (over its 512-token "
                     f"context; vectors alone score 0 and hybrid is BM25-only): {noq}")
    misses = sum(r.misses for r in rows)
    mism = sum(r.crosscheck_mismatch for r in rows)
    notes.append(f"vectors embedded live during ingest because the bench's chunk "
                 f"prediction missed them: {misses}; queries where Retriever.search and "
                 f"offline RRF over the same candidates disagree: {mism}")
    out += ["", *(f"- {n}" for n in notes)]
    return out


def latency_section(lat: Latency | None, scale: ScaleResult | None, env: list[str],
                    data_note: list[str]) -> list[str]:
    out = [LATENCY_HEADING, "", *env, *data_note, ""]
    if lat is not None:
        res = lat.results
        rows = []
        names = {
            "bm25": "BM25: TextIndex.search (tantivy), 25",
            "hnsw": "HNSW: VectorIndex.search (hnswlib, ef 100), 25",
            "hybrid": f"hybrid: Retriever.search k={HYBRID_K} (25+25, RRF, SQLite, snippets)",
            "numpy": "numpy brute-force cosine, 25",
            "bm25s": "bm25s 0.3 (numpy backend, stopwords en), 25",
            "rank_bm25": "rank_bm25 BM25Okapi, 25",
            "bm25_same_queries": "tantivy on the rank_bm25 query subset, 25",
        }
        for key, label in names.items():
            if key not in res:
                continue
            s = res[key]
            target = ""
            if key in ("bm25", "hnsw", "hybrid"):
                ok = s["p50_ms"] <= 10 and s["p99_ms"] <= 30
                target = "meets" if ok else "**misses**"
            rows.append([label, str(int(s["n"])), ms(s["p50_ms"]), ms(s["p99_ms"]),
                         ms(s["mean_ms"]), target])
        out += [f"At {lat.chunks} chunks, {lat.queries} queries x {lat.rounds} rounds after "
                "a warm-up pass (target p50 <= 10 ms, p99 <= 30 ms):", ""]
        out += table(["search", "samples", "p50 ms", "p99 ms", "mean ms", "target"], rows)
        ratio = []
        pairs = [("bm25s", "bm25"), ("rank_bm25", "bm25_same_queries"), ("numpy", "hnsw")]
        for base, ours in pairs:
            if base in res and ours in res:
                ratio.append(f"{base} p50 / {ours.replace('_same_queries', '')} p50 = "
                             f"{res[base]['p50_ms'] / res[ours]['p50_ms']:.1f}x")
        out += ["", "Baselines over the same chunks (title + text, as tantivy's body "
                f"field): {'; '.join(ratio)}. Index build: "
                + ", ".join(f"{k} {v:.1f} s" for k, v in lat.builds.items()) + ".", "",
                f"HNSW recall against exact search at the default ef (100): "
                f"recall@10 {lat.recall10:.4f} (target >= 0.97), recall@25 "
                f"{lat.recall25:.4f}."]
    if scale is not None:
        r = scale.results
        out += ["", f"HNSW alone at {scale.built} vectors"
                + (f" (asked {scale.target}; building stopped at the time budget)"
                   if scale.built < scale.target else "") + ":", ""]
        out += table(["search", "samples", "p50 ms", "p99 ms", "mean ms"], [
            [f"VectorIndex.search, k {SEARCH_N}", str(int(r['hnsw']['n'])),
             ms(r["hnsw"]["p50_ms"]), ms(r["hnsw"]["p99_ms"]), ms(r["hnsw"]["mean_ms"])],
            [f"numpy brute force ({scale.numpy_queries} queries, 1 round)",
             str(int(r['numpy']['n'])), ms(r["numpy"]["p50_ms"]), ms(r["numpy"]["p99_ms"]),
             ms(r["numpy"]["mean_ms"])]])
        last = scale.batch_rates[-1][1] if scale.batch_rates else 0.0
        out += ["", f"Recall@10 {scale.recall10:.4f}, recall@25 {scale.recall25:.4f} "
                f"against exact search. Build: {scale.built} vectors in {scale.build_s:.0f} s "
                f"(VectorIndex.add in batches of 25k, hnswlib's 2 threads; last batch "
                f"{last:.0f} vectors/s); peak RSS {mb(scale.peak_kb - scale.rss_before_kb)} "
                f"over the {mb(scale.rss_before_kb)} before (includes the bench's own "
                f"{scale.built * DIM * 4 / 2**20:.0f} MB copy of the vectors). numpy brute "
                f"force p50 / HNSW p50 = {r['numpy']['p50_ms'] / r['hnsw']['p50_ms']:.0f}x."]
    return out


def ingest_section(live: LiveIngest | None, bm25: Ingest | None, build: BuildResult | None,
                   *, embed_rate: str, env: list[str], limits: RetrievalLimits) -> list[str]:
    out = [INGEST_HEADING, "", *env, ""]
    rows = []

    def row(label: str, i: Ingest) -> list[str]:
        return [label, str(i.docs), str(i.chunks), f"{i.seconds:.1f}", f"{i.rate:.1f}",
                f"{1000 * i.seconds / i.docs:.1f}",
                f"{1000 * i.commit_s / i.docs:.1f}" if i.commit_s else ""]

    if bm25 is not None:
        rows.append(row("BM25 only (no embedder), fresh index", bm25))
    if build is not None:
        i = dataclasses.replace(build.ingest, commit_s=build.commit_s)
        rows.append(row("BM25 + vectors, vectors precomputed (first documents of the "
                        "latency index)", i))
    if live is not None:
        rows.append(row("BM25 + vectors, live embedding child, fresh index",
                        Ingest(live.docs, live.chunks, live.retriever_s)))
        rows.append([f"child alone: POST /v1/embeddings, batches of {limits.embed_batch}", "",
                     str(live.chunks), f"{live.direct32_s:.1f}",
                     f"{live.chunks / live.direct32_s:.1f}", "", ""])
        rows.append(["child alone: one request per document (the Retriever's batches)", "",
                     str(live.chunks), f"{live.direct_perdoc_s:.1f}",
                     f"{live.chunks / live.direct_perdoc_s:.1f}", "", ""])
    out += [f"All through `Retriever.upsert` (kind text) with {limits.ingest_workers} "
            "documents in flight, as a directory scan runs them (concurrent upserts share "
            "one SQLite transaction and one tantivy commit), unless marked \"child alone\":",
            ""]
    out += table(["path", "docs", "chunks", "seconds", "chunks/s", "ms/doc",
                  "of which TextIndex.commit, ms/doc"], rows)
    if live is not None:
        frac = live.direct32_s / live.retriever_s
        frac_doc = live.direct_perdoc_s / live.retriever_s
        out += ["", f"With live embeddings the Retriever reaches **{frac:.2f}** of the child's "
                f"own throughput at batches of {limits.embed_batch} (target >= 0.9), and "
                f"{frac_doc:.2f} of the child's throughput with the batches the Retriever "
                f"actually sends (one document's chunks: {live.chunks / live.docs:.2f} "
                f"chunks per document here). The Retriever also made {live.token_calls} "
                f"/tokenize calls (one per chunk over 510 characters: the embedding-context "
                f"check). The child alone: {live.direct32_tokens} tokens, "
                f"{live.direct32_tokens / live.direct32_s:.0f} tokens/s at batches of "
                f"{limits.embed_batch}. {embed_rate}"]
    if bm25 is not None:
        out += ["", f"BM25-only index after {bm25.docs} upserts: {bm25.segments} tantivy "
                "segments."]
    if build is not None:
        total = build.ingest.chunks + build.bulk_chunks
        grow = build.peak_kb - build.rss_before_kb
        held = build.rss_after_kb - build.rss_before_kb
        cps = build.checkpoints
        trend = ""
        if len(cps) >= 2:
            (c0, s0), (c1, s1) = cps[0], cps[-1]
            prev_c, prev_s = cps[-2]
            trend = (f" Upsert rate over the first {c0} chunks {c0 / s0:.0f} chunks/s, over "
                     f"the last {c1 - prev_c} {(c1 - prev_c) / (s1 - prev_s):.0f} chunks/s.")
        out += ["", f"Latency index, {total} chunks: {build.ingest.docs} documents by upsert, "
                f"then {build.bulk_docs} documents ({build.bulk_chunks} chunks) written to "
                f"SQLite as upsert writes them ({build.fill_s:.0f} s) and indexed by "
                f"`Retriever.open()` reconciling tantivy and hnswlib from SQLite in bulk "
                f"(**{build.reconcile_s:.0f} s, {build.bulk_chunks / build.reconcile_s:.0f} "
                f"chunks/s**; repaired {build.repaired}). Memory: peak RSS grew by "
                f"{mb(grow)} over the {mb(build.rss_before_kb)} the process held before "
                f"(the reconcile pass holds every missing chunk at once), "
                f"**{mb(int(grow * 100_000 / max(1, total)))} per 100k chunks**; the open "
                f"index holds {mb(held)} ({mb(int(held * 100_000 / max(1, total)))} per 100k "
                f"chunks). On disk {build.disk_bytes / 2**20:.0f} MB, {build.segments} "
                f"tantivy segments. /tokenize calls during the upserts {build.token_calls}; "
                f"vectors not in the table {build.misses}.{trend}"]
    return out
