"""Fusion benchmark: do RRF weights or a deeper candidate list beat plain RRF?

(RRF only, ``fusion="rrf"`` on every search; RRF against DBSF and convex fusion, chosen by
leaving one collection out, is ``bench.bench_fusion_loco``.)

    .venv/bin/python -m bench.bench_fusion [--collections cisi,cranfield,medline,vaswani]
        [--max-queries N] [--data DIR] [--vectors FILE] [--raw FILE] [--no-write]
        [--out bench/RESULTS.md] [--wait-others 3600] [--max-foreign 0.25] [--anyway]

One process, one embedding child:

1. **Quiet machine.** Waits (``--wait-others``, default an hour) until no other benchmark
   measures and other processes use at most ``--max-foreign`` cores
   (:func:`bench._support.begin_part`); the machine's load is sampled throughout.
2. **Real embeddings**, as ``bench.bench_retrieval`` makes them: an in-process daemon runs
   the MiniLM embedding child with production defaults (:func:`bench._retrieval.start_child`)
   and every distinct chunk text (the chunks the Retriever will make) and query is
   embedded once, in batches of 32, through the daemon's ``ChildEmbedder``. ``--vectors
   FILE`` keeps that table on disk (keyed by the texts' SHA-256) and reuses it.
3. **Per collection**, a fresh Retriever (its own BM25 statistics); each corpus document
   one ``upsert`` (kind text, corpus title), vectors served from the table. Then per
   query, all through ``Retriever.search(query, k=200, options=Query(...))``, the shipped
   path: BM25 alone (``mode="text"``, 100 candidates), vectors alone (``mode="vector"``,
   100), and weighted RRF (k=60) for every (text_weight, vector_weight) of ``WEIGHTS`` at
   every depth of ``DEPTHS`` (``candidates``, per index). Plain RRF is weights (1, 1) at
   depth 25, the shipped defaults. Chunk hits become corpus documents at their best rank;
   nDCG@10 (linear graded gains), recall@100. Each fused ranking is checked against
   ``retrieval.search._fusion.rrf`` over the same candidate lists (``TextIndex.search`` and
   ``VectorIndex.search`` at that depth): the disagreements are reported.
4. **Verdict** (:func:`verdict`): the best cell by mean nDCG@10 over the collections
   replaces plain RRF only if it gains more than ``NOISE`` on the mean and is better on at
   least three quarters of the collections; and each knob it moves (weights, depth) must
   clear that bar on its own, else the simpler cell is chosen. Otherwise plain RRF stays.

Results are printed and written into ``--out``: the section ``## Fusion weights and
depth`` is created or replaced (others kept), and the summary table's fusion row.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from bench import _support as support
from bench._daemon import daemon_log
from bench._retrieval import (
    COLLECTIONS,
    DATA_DIR,
    Child,
    Collection,
    Vec,
    load_collection,
    open_retriever,
    start_child,
    upsert_all,
)
from bench._retrieval_bench.common import DEEP, TableEmbedder
from bench._retrieval_bench.metrics import doc_ranking, ndcg, recall
from bench._retrieval_bench.quality import chunk_docs
from bench._vector_cache import vectors_for
from retrieval import Filters, RetrievalLimits, Retriever
from retrieval import Query as Options
from retrieval.search._fusion import rrf

HEADING = "## Fusion weights and depth"
SUMMARY_METRIC = "retrieval fusion: best weights/depth vs plain RRF, mean nDCG@10"
WEIGHTS: tuple[tuple[float, float], ...] = (
    (1, 1), (0.3, 0.7), (0.5, 1), (0.7, 0.3), (1, 0.5), (0.2, 0.8), (0.4, 0.6))
DEPTHS = (25, 50, 100)
PLAIN = ((1.0, 1.0), 25)  # the shipped defaults: RRF k=60, weights 1 and 1, 25/25
HITS = 2 * DEEP           # hits asked of Retriever.search: every fused chunk at depth 100
NOISE = 0.005             # mean nDCG@10 gain a new default must exceed

Cell = tuple[tuple[float, float], int]  # ((text_weight, vector_weight), depth)


def cell_name(cell: Cell) -> str:
    (wt, wv), depth = cell
    return f"({wt:g}, {wv:g}) @ {depth}"


CELLS: tuple[Cell, ...] = tuple((w, d) for w in WEIGHTS for d in DEPTHS)


# -- measuring ---------------------------------------------------------------------------


@dataclasses.dataclass
class Scores:
    """Per-query nDCG@10 and recall@100 of each method (a method: "bm25", "vectors", or
    a cell's name), in query order."""

    name: str
    docs: int
    chunks: int
    queries: list[str]
    ndcg: dict[str, list[float]]
    recall: dict[str, list[float]]
    mismatches: int = 0        # fused rankings that differ from offline rrf()
    bm25_only: int = 0         # hybrid searches the Retriever answered BM25-only
    no_query_vector: int = 0   # queries the child could not embed
    seconds: dict[int, list[float]] = dataclasses.field(default_factory=dict)  # depth ->
    # Retriever.search(k=10, candidates=depth) wall times

    def mean(self, method: str, metric: str = "ndcg") -> float:
        return statistics.fmean(getattr(self, metric)[method])


async def measure(col: Collection, table: dict[str, Vec], child: Child, *, root: Path,
                  limits: RetrievalLimits, max_queries: int | None) -> Scores:
    embedder = TableEmbedder(table, child.embedder, child.embedder.model_id,
                             child.embedder.context)
    r = await open_retriever(root / col.name, lambda: embedder, limits, [col.name])
    try:
        ingest = await upsert_all(r, col.docs)
        print(f"   {col.name}: {ingest.docs} documents, {ingest.chunks} chunks in "
              f"{ingest.seconds:.0f} s", flush=True)
        return await score_queries(r, col, table, max_queries)
    finally:
        await r.close()


async def score_queries(r: Retriever, col: Collection, table: dict[str, Vec],
                        max_queries: int | None) -> Scores:
    doc_of, _ = chunk_docs(r)
    text_index, vectors = r._indexes.text, r._indexes.vectors
    assert text_index is not None
    assert vectors is not None
    queries = col.queries[:max_queries]
    methods = ["bm25", "vectors", *map(cell_name, CELLS)]
    s = Scores(col.name, len(col.docs), len(doc_of), [q.id for q in queries],
               {m: [] for m in methods}, {m: [] for m in methods})

    def docs_of(hits: Sequence[Any]) -> list[str]:
        return list(dict.fromkeys(h.doc_id.split("/", 1)[1] for h in hits))

    def score(method: str, ranked: Sequence[str], rels: dict[str, int]) -> None:
        s.ndcg[method].append(ndcg(ranked, rels))
        s.recall[method].append(recall(ranked, rels))

    for q in queries:
        rels = col.qrels[q.id]
        qv = table.get(q.text)
        s.no_query_vector += qv is None
        alone = await r.search(q.text, k=HITS, options=Options(mode="text", candidates=DEEP))
        score("bm25", docs_of(alone.hits), rels)
        if qv is not None:
            alone = await r.search(q.text, k=HITS,
                                   options=Options(mode="vector", candidates=DEEP))
        score("vectors", docs_of(alone.hits) if qv is not None else [], rels)
        for depth in DEPTHS:
            began = time.perf_counter()
            await r.search(q.text, k=10, options=Options(candidates=depth, fusion="rrf"))
            s.seconds.setdefault(depth, []).append(time.perf_counter() - began)
            text_keys = [k for k, _ in text_index.search(q.text, filters=Filters(),
                                                         limit=depth)]
            vec_keys = [k for k, _ in vectors.search(qv, depth)] if qv is not None else []
            for w in WEIGHTS:
                res = await r.search(q.text, k=HITS, options=Options(
                    fusion="rrf", candidates=depth, text_weight=w[0], vector_weight=w[1]))
                s.bm25_only += res.mode != "hybrid"
                ranked = docs_of(res.hits)
                lists = [text_keys, vec_keys] if qv is not None else [text_keys]
                offline = rrf(lists, k=r.limits.rrf_k, weights=list(w[:len(lists)]))
                s.mismatches += doc_ranking([k for k, _ in offline][:HITS], doc_of) != ranked
                score(cell_name((w, depth)), ranked, rels)
    return s


# -- the verdict ---------------------------------------------------------------------------


@dataclasses.dataclass
class Comparison:
    """One cell against another: mean nDCG@10 gain over the collections, and where."""

    cell: Cell
    base: Cell
    gain: float
    wins: int                  # collections where the cell beats the base
    collections: int
    better: int                # queries (all collections) it scores higher / lower on
    worse: int

    @property
    def clears(self) -> bool:
        """The bar for a change: more than NOISE on the mean, better on at least three
        quarters of the collections."""
        return (self.cell != self.base and self.gain > NOISE
                and self.wins >= math.ceil(0.75 * self.collections))

    def says(self) -> str:
        return (f"{self.gain:+.3f} mean nDCG@10 against {cell_name(self.base)}, better on "
                f"{self.wins} of {self.collections} collections ({self.better} queries "
                f"better, {self.worse} worse, the rest equal)")


@dataclasses.dataclass
class Verdict:
    best: Comparison           # the best cell against plain RRF
    knobs: list[Comparison]    # the best cell against it with one knob back at its default
    chosen: Cell               # the recommended defaults
    chosen_vs_plain: Comparison

    @property
    def beats(self) -> bool:
        return self.chosen != PLAIN


def macro(rows: Sequence[Scores], method: str, metric: str = "ndcg") -> float:
    return statistics.fmean(r.mean(method, metric) for r in rows)


def compare(rows: Sequence[Scores], cell: Cell, base: Cell) -> Comparison:
    a, b = cell_name(cell), cell_name(base)
    pairs = [(x, y) for r in rows for x, y in zip(r.ndcg[a], r.ndcg[b], strict=True)]
    return Comparison(cell, base, macro(rows, a) - macro(rows, b),
                      sum(r.mean(a) > r.mean(b) for r in rows), len(rows),
                      sum(x > y for x, y in pairs), sum(x < y for x, y in pairs))


def verdict(rows: Sequence[Scores]) -> Verdict:
    """The best cell by mean nDCG@10 (plain RRF on a tie). It replaces plain RRF only if
    it clears the bar; and each knob it moves (the weights, the depth) must clear the bar
    on its own: when the best cell does not clear it against the cell with that knob back
    at its default, and that cell clears it against plain RRF, the simpler cell is chosen
    (the best of a 21-cell sweep on the test queries is an optimistic pick)."""
    best = max(CELLS, key=lambda c: (round(macro(rows, cell_name(c)), 12), c == PLAIN))
    vs_plain = compare(rows, best, PLAIN)
    chosen, knobs = PLAIN, []
    if vs_plain.clears:
        chosen = best
        simpler = [c for c in ((PLAIN[0], best[1]), (best[0], PLAIN[1])) if c != best]
        knobs = [compare(rows, best, c) for c in simpler]
        enough = [k.base for k in knobs
                  if not k.clears and compare(rows, k.base, PLAIN).clears]
        if enough:
            chosen = max(enough, key=lambda c: macro(rows, cell_name(c)))
    return Verdict(vs_plain, knobs, chosen, compare(rows, chosen, PLAIN))


def knob_names(cell: Cell) -> str:
    (wt, wv), depth = cell
    return f"text_weight {wt:g}, vector_weight {wv:g}, {depth}/{depth} candidates"


# -- the report ------------------------------------------------------------------------------


def section(rows: Sequence[Scores], v: Verdict, env: list[str], notes: list[str]
            ) -> list[str]:
    f3 = support.f3
    plain, best = cell_name(PLAIN), cell_name(v.best.cell)
    out = [HEADING, "", *env, *notes, ""]
    shown = list(dict.fromkeys([PLAIN, v.best.cell, v.chosen]))
    labels = {c: " = ".join(name for name, x in (("plain RRF", PLAIN), ("best cell", v.best.cell),
                                                  ("chosen", v.chosen)) if x == c)
              for c in shown}
    per = []
    for r in [*rows, None]:
        def m(method: str, metric: str = "ndcg", r: Scores | None = r) -> str:
            return f3(r.mean(method, metric) if r is not None else macro(rows, method, metric))
        per.append([r.name if r else "**mean**", f"{r.docs} / {r.chunks}" if r else "",
                    str(len(r.queries)) if r else "", m("bm25"), m("vectors"),
                    *(m(cell_name(c)) for c in shown), m("bm25", "recall"),
                    m("vectors", "recall"), *(m(cell_name(c), "recall") for c in shown)])
    out += ["Per collection: BM25 alone and vectors alone at 100 candidates, plain RRF "
            "(weights 1/1, 25/25 candidates), the best cell of the sweep ("
            f"{best}) and the chosen defaults ({cell_name(v.chosen)}):", ""]
    out += support.table(["collection", "docs / chunks", "queries", "BM25 nDCG@10",
                          "vectors nDCG@10", *(f"{labels[c]} nDCG@10" for c in shown),
                          "BM25 R@100", "vectors R@100",
                          *(f"{labels[c]} R@100" for c in shown)], per)
    grid = []
    for c in CELLS:
        name = cell_name(c)
        mean = macro(rows, name)
        grid.append([f"**{name}**" if c in (v.best.cell, v.chosen) else name,
                     *(f3(r.mean(name)) for r in rows), f3(mean),
                     f"{mean - macro(rows, plain):+.3f}",
                     f"{sum(r.mean(name) > r.mean(plain) for r in rows)}/{len(rows)}",
                     f3(macro(rows, name, "recall"))])
    out += ["", "Every cell, (text_weight, vector_weight) @ candidates per index, RRF k=60, "
            "nDCG@10 per collection, its mean over the collections, the gain over plain RRF "
            f"({plain}), the collections where the cell beats plain RRF, and mean R@100 "
            "(at depth 25 at most 50 chunks are fused, so R@100 is bounded by depth):", ""]
    out += support.table(["cell", *(f"{r.name} nDCG@10" for r in rows), "mean nDCG@10",
                          "vs plain", "better on", "mean R@100"], grid)
    compact = [[f"{w[0]:g} / {w[1]:g}", *(f3(macro(rows, cell_name((w, d)))) for d in DEPTHS)]
               for w in WEIGHTS]
    out += ["", "Mean nDCG@10 over the collections (rows: text / vector weight; columns: "
            "candidates per index):", ""]
    out += support.table(["weights", *(f"{d}/{d}" for d in DEPTHS)], compact)
    out += ["", "Retriever.search latency by depth (k=10, default weights, one search per "
            "query and depth, wall time in this process; indicative only, the machine was "
            "shared as said above), p50 / p99 ms:", ""]
    out += support.table(["collection", *(f"{d}/{d}" for d in DEPTHS)], [
        [r.name, *(f"{1000 * support.pct(r.seconds[d], 50):.2f} / "
                   f"{1000 * support.pct(r.seconds[d], 99):.2f}" for d in DEPTHS)]
        for r in rows])
    bar = (f"The bar for a new default: more than {NOISE} mean nDCG@10 and better on at "
           f"least {math.ceil(0.75 * len(rows))} of {len(rows)} collections.")
    if v.best.cell == PLAIN:
        says = f"The best cell is plain RRF itself: **plain RRF stays the default.** {bar}"
    elif not v.best.clears:
        says = (f"The best cell, {best}: {v.best.says()}. {bar} **It does not clear it: "
                "plain RRF stays the default.**")
    else:
        says = f"The best cell, {best}: {v.best.says()}. {bar} It clears it. "
        says += "Each knob it moves must clear the bar on its own: " + "; ".join(
            f"{k.says()}: {'clears' if k.clears else 'does not clear'}" for k in v.knobs
        ) + ". "
        says += (f"**Chosen defaults: {knob_names(v.chosen)}** ({cell_name(v.chosen)}: "
                 f"{v.chosen_vs_plain.says()}).")
    return [*out, "", says]


def summary_row(v: Verdict, rows: Sequence[Scores]) -> str:
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "retrieval", "daemon"],
                           cwd=support.ROOT, capture_output=True, text=True,
                           check=False).stdout.strip()
    commit = support.git_head() + (" + uncommitted" if dirty else "")
    now = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    f3 = support.f3
    plain = macro(rows, cell_name(PLAIN))
    measured = (f"best {cell_name(v.best.cell)} {f3(plain + v.best.gain)} vs plain "
                f"{f3(plain)} ({v.best.gain:+.3f}, better on {v.best.wins}/{len(rows)})")
    if v.beats:
        c = v.chosen_vs_plain
        measured += (f"; chosen {cell_name(v.chosen)} {f3(plain + c.gain)} ({c.gain:+.3f}, "
                     f"{c.wins}/{len(rows)}): new default {knob_names(v.chosen)}")
    else:
        measured += ": plain RRF stays the default"
    return (f"| {SUMMARY_METRIC} | > +{NOISE} and >= 3/4 collections to change the default | "
            f"{measured} | {commit} | {now} |")


def write_summary_row(path: Path, row: str) -> None:
    """Replace the summary table's fusion row, or add it after the table's last row."""
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        if line.startswith(f"| {SUMMARY_METRIC} |"):
            lines[i] = row
            break
    else:
        start = lines.index("## Summary")
        end = next(i for i in range(start + 1, len(lines))
                   if lines[i].startswith("|") and not lines[i + 1].startswith("|"))
        lines.insert(end + 1, row)
    path.write_text("\n".join(lines) + "\n")


# -- main ----------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = support.bench_parser("bench.bench_fusion", __doc__)
    p.add_argument("--collections", default=",".join(COLLECTIONS),
                   help="comma-separated, of " + ", ".join(COLLECTIONS))
    p.add_argument("--max-queries", type=int, default=None, metavar="N",
                   help="the first N queries of each collection only (smoke tests)")
    p.add_argument("--data", type=Path, default=DATA_DIR)
    p.add_argument("--vectors", type=Path, default=None, metavar="FILE",
                   help="keep the embeddings in this .npz file, and reuse it if it exists")
    p.add_argument("--out", type=Path, default=support.ROOT / "bench" / "RESULTS.md")
    p.add_argument("--no-write", action="store_true", help="print only; leave --out alone")
    p.add_argument("--raw", type=Path, default=None, help="also write per-query scores (JSON)")
    support.add_quiet_options(p, "before measuring")
    p.set_defaults(wait_others=3600.0)
    args = p.parse_args(argv)
    args.collections = [c for c in args.collections.split(",") if c]
    unknown = set(args.collections) - set(COLLECTIONS)
    if unknown or not args.collections:
        p.error(f"unknown collections: {sorted(unknown)}" if unknown else "no collection")
    if args.max_queries is not None and args.max_queries < 1:
        p.error("--max-queries must be >= 1")
    return args


async def run(args: argparse.Namespace, command: str, work: Path) -> dict[str, Any]:
    began = time.perf_counter()
    # Some queries are longer than the production limit (2000 characters): as in
    # bench.bench_retrieval, allowed. max_k: every fused chunk at depth 100.
    limits = RetrievalLimits(max_query_chars=5000, max_k=HITS)
    cols = [load_collection(args.data / n, n, limits) for n in args.collections]
    support.MONITOR.start()
    note = await support.begin_part("fusion weights and depth", args.wait_others,
                                    args.anyway, args.max_foreign)
    child = await start_child(work)
    print(f"embedding child pid {child.pid}", flush=True)
    try:
        texts = [t for c in cols for d in c.docs for t in d.chunks]
        texts += [q.text for c in cols for q in c.queries[:args.max_queries]]
        table, embedded = await vectors_for(texts, child, args.vectors, limits.embed_batch)
        print(f"   {embedded}", flush=True)
        rows = []
        for col in cols:
            rows.append(await measure(col, table, child, root=work / "index", limits=limits,
                                      max_queries=args.max_queries))
            r = rows[-1]
            print(f"   {col.name}: nDCG@10 bm25 {r.mean('bm25'):.3f}, vectors "
                  f"{r.mean('vectors'):.3f}, plain {r.mean(cell_name(PLAIN)):.3f}; "
                  f"mismatches {r.mismatches}", flush=True)
    finally:
        await child.daemon.shutdown()
    support.end_part(note)
    await support.MONITOR.stop()
    v = verdict(rows)
    total = time.perf_counter() - began
    argv_child = " ".join(child.argv)
    shipped = RetrievalLimits()
    notes = [
        f"- Embedding child (llamad's production defaults): `{argv_child}`",
        f"- Defaults when measured (`RetrievalLimits()`): text_weight {shipped.text_weight:g}, "
        f"vector_weight {shipped.vector_weight:g}, {shipped.text_candidates}/"
        f"{shipped.vector_candidates} candidates, RRF k={shipped.rrf_k}.",
        note.line(),
        f"- Whole run {total / 60:.1f} minutes; {embedded}.",
        "- Each corpus document is one `Retriever.upsert` (kind text, corpus title) into a "
        "per-collection index. Every number comes from `Retriever.search(query, k=200, "
        "options=Query(...))`: BM25 alone `mode=\"text\"` and vectors alone "
        "`mode=\"vector\"` with 100 candidates; the cells with `candidates=depth, "
        "text_weight=..., vector_weight=...` (RRF k=60). Chunk hits become corpus "
        "documents at their best rank; nDCG@10 with linear graded gains, recall@100. "
        "Queries up to 5000 characters allowed (production: 2000)"
        + (f"; only the first {args.max_queries} queries of each collection."
           if args.max_queries else "."),
        f"- Cross-check: fused rankings that differ from `retrieval.search._fusion.rrf` over "
        f"`TextIndex.search` and `VectorIndex.search` at the same depth: "
        f"{sum(r.mismatches for r in rows)} of {sum(len(r.queries) for r in rows) * len(CELLS)}"
        f"; hybrid searches answered BM25-only: {sum(r.bm25_only for r in rows)}; queries "
        f"the model could not embed: {sum(r.no_query_vector for r in rows)}.",
    ]
    out = section(rows, v, support.environment(command), notes)
    print("\n" + "\n".join(out) + "\n", flush=True)
    if not args.no_write:
        support.write_sections(args.out, [out])
        write_summary_row(args.out, summary_row(v, rows))
        print(f"written to {args.out}", flush=True)
    return {"command": command, "verdict": dataclasses.asdict(v), "beats": v.beats,
            "collections": [dataclasses.asdict(r) for r in rows], "note": note.line()}


@contextlib.contextmanager
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="llamad-bench-fusion-") as tmp:
        yield Path(tmp)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    command = support.command_line("bench.bench_fusion", argv)
    with workdir() as work, daemon_log():
        raw = asyncio.run(run(args, command, work))
    if args.raw is not None:
        args.raw.write_text(json.dumps(raw, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
