"""Fusion chosen by leaving one collection out: RRF, DBSF, convex (and z-score) fusion.

    .venv/bin/python -m bench.bench_fusion_loco [--vectors FILE] [--data DIR]
        [--max-queries N] [--no-write] [--out bench/RESULTS.md] [--raw FILE]

1. **Real embeddings**, as ``bench.bench_fusion`` makes them (MiniLM child with production
   defaults, every chunk and query text once; ``--vectors FILE`` caches them on disk).
2. **Per collection** a fresh Retriever, each corpus document one ``upsert``. Per query
   the two candidate lists at depth 100 (``TextIndex.search``, ``VectorIndex.search``:
   BM25 scores, cosine similarities); each cell of the grid fuses their first ``depth``
   entries offline with ``retrieval.search._score_fusion.fuse_scored``, the function
   ``Retriever.search`` runs, knowing the text list's depth as Search does (a short BM25
   list normalised among the zeros below it, its weight raised toward the vectors'):
   method (rrf k=60, dbsf, convex = min-max, zscore; and ``dbsf-plain``, DBSF over each
   list alone, the default 5d913f0 chose and 041344b reverted) x text
   weight alpha (vector weight 1 - alpha; RRF with 0.5/0.5 is plain RRF) x depth x level
   (``chunk``: chunks fused, then each document at its best chunk, what a Search
   without ``group_by_document`` gives; ``doc``: each list reduced to one entry per
   document, its best chunk, then fused, what ``group_by_document`` does). nDCG@10 over
   corpus documents (linear graded gains).
3. **Leave one collection out** (:func:`decide`): for each collection, the chunk-level
   cell of a fusion Search offers (rrf, dbsf, convex) that keeps a word one document holds
   first or second (:func:`keeps_lone_match`) with the best mean nDCG@10 over the
   other three is chosen and scored on the held-out one, against a base (plain RRF,
   today's default: rrf, weights 1/1, 100 candidates per list, chunk level). Every knob
   at once is reported; then knob by knob, each changed only if its own choice beats its
   base on every held-out fold or on the mean of the folds by more than ``NOISE``: the
   depth (under plain RRF), then the fusion and its weights at that depth. The new
   default is the best of that last space on all four collections, provided none falls
   more than ``NOISE`` below today's nDCG@10.
4. **Cross-check**: the cells the folds chose, the new default and plain RRF, through
   ``Retriever.search(options=Query(fusion=..., ...))``: document rankings that differ
   from the offline fusion are counted.

Written into ``--out`` as the section ``## Fusion by leaving one collection out``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import _retrieval as rb
from bench import _support as support
from bench._daemon import daemon_log
from bench._retrieval_bench.common import TableEmbedder
from bench._retrieval_bench.metrics import doc_ranking, ndcg
from bench._retrieval_bench.quality import chunk_docs
from bench._vector_cache import vectors_for
from retrieval import Filters, RetrievalLimits, Retriever
from retrieval import Query as Options
from retrieval.search._score_fusion import FUSIONS, by_document, fuse_scored

HEADING = "## Fusion by leaving one collection out"
# DBSF over each list alone (Qdrant's; 5d913f0's default, reverted in 041344b): a short
# BM25 list normalised as if it were a full one. Every other method fuses as Search does,
# knowing the text list's depth (retrieval.search._score_fusion, "Short lexical lists").
PLAIN_DBSF = "dbsf-plain"
METHODS = ("rrf", "dbsf", "convex", "zscore", PLAIN_DBSF)
ALPHAS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
DEPTHS = (25, 50, 100)
LEVELS = ("chunk", "doc")
DEEP = 100
NOISE = 0.005
# Today's nDCG@10 of the default (RRF 1/1 at 100/100), "Fusion weights and depth" above.
TODAY = {"cisi": 0.437, "cranfield": 0.400, "medline": 0.804, "vaswani": 0.492}


@dataclasses.dataclass(frozen=True, order=True)
class Cell:
    method: str
    alpha: float
    depth: int
    level: str

    @property
    def name(self) -> str:
        return f"{self.method} {self.alpha:g}/{1 - self.alpha:g} @{self.depth} {self.level}"

    @property
    def weights(self) -> tuple[float, float]:
        return (self.alpha, round(1 - self.alpha, 6))

    @property
    def fusion(self) -> tuple[str, tuple[int | None, ...] | None]:
        """``fuse_scored``'s method and depths for this cell (Search's: the text list's
        depth known; ``dbsf-plain``: none)."""
        if self.method == PLAIN_DBSF:
            return "dbsf", None
        return self.method, (self.depth, None)


PLAIN = Cell("rrf", 0.5, 100, "chunk")
CELLS = tuple(Cell(m, a, d, lv) for m in METHODS for a in ALPHAS for d in DEPTHS
              for lv in LEVELS)


@dataclasses.dataclass
class Scores:
    name: str
    queries: int
    ndcg: dict[Cell, list[float]]
    mismatches: dict[Cell, int] = dataclasses.field(default_factory=dict)
    searched: dict[Cell, list[float]] = dataclasses.field(default_factory=dict)  # via Search
    short: dict[int, int] = dataclasses.field(default_factory=dict)  # text lists < depth

    def mean(self, cell: Cell) -> float:
        return statistics.fmean(self.ndcg[cell])


def fused_docs(cell: Cell, text: Sequence[tuple[int, float]], vec: Sequence[tuple[int, float]],
               doc_of: dict[int, str]) -> list[str]:
    lists = [list(text[:cell.depth]), list(vec[:cell.depth])]
    method, depths = cell.fusion
    hits = fuse_scored(lists, method, weights=cell.weights, depths=depths)
    if cell.level == "doc":  # keyed, so tie-broken, by each document's best chunk
        near = {h.key: doc_of[h.key] for h in hits if h.key in doc_of}  # as Search fetches
        hits, _ = by_document(lists, hits, near, method, weights=cell.weights,
                              depths=depths)
    return doc_ranking([h.key for h in hits], doc_of)


def keeps_lone_match(cell: Cell) -> bool:
    """Whether ``cell`` keeps a word only one document holds first or second when the
    vectors miss that document and their first stands clear of the rest (the worst case:
    tests/unit/test_score_fusion.py): BM25 finds document 0 alone."""
    vec = [(1, 0.9), *((2 + i, 0.5 - 0.001 * i) for i in range(cell.depth - 1))]
    lists = [[(0, 3.2)], vec]
    method, depths = cell.fusion
    hits = fuse_scored(lists, method, weights=cell.weights, depths=depths)
    return 0 in [h.key for h in hits[:2]]


# What a default can be: a fusion Search offers, at chunk level (a Search's own; the level
# is not a setting: group_by_document fuses per document, measured beside), that keeps a
# lone exact match first or second.
CHOICES = tuple(c for c in CELLS if c.level == "chunk" and c.method in FUSIONS
                and keeps_lone_match(c))
REVERTED = Cell(PLAIN_DBSF, 0.4, 100, "chunk")  # 5d913f0's default


def shuffled(col: rb.Collection, order: int) -> rb.Collection:
    """``col`` with its documents in ingest order ``order`` (0: the corpus's own; else a
    permutation seeded by ``order``)."""
    if order == 0:
        return col
    docs = list(col.docs)
    random.Random(order).shuffle(docs)
    return dataclasses.replace(col, docs=docs)


def averaged(runs: Sequence[Scores]) -> Scores:
    """One ``Scores`` whose per-query nDCG@10 is the mean over ``runs`` (the same
    collection ingested in several orders), its short-list counts the first run's."""
    first = runs[0]
    return Scores(first.name, first.queries,
                  {c: [statistics.fmean(vals) for vals in zip(*(r.ndcg[c] for r in runs),
                                                               strict=True)]
                   for c in first.ndcg}, short=dict(first.short))


async def measure(col: rb.Collection, table: dict[str, rb.Vec], embedder: TableEmbedder,
                  root: Path, *, limits: RetrievalLimits, max_queries: int | None
                  ) -> tuple[Scores, Retriever, list[tuple[Any, ...]]]:
    r = await rb.open_retriever(root, lambda: embedder, limits, [col.name])
    ingest = await rb.upsert_all(r, col.docs)
    print(f"   {col.name}: {ingest.docs} documents, {ingest.chunks} chunks", flush=True)
    doc_of, _ = chunk_docs(r)
    text_index, vectors = r._indexes.text, r._indexes.vectors
    assert text_index is not None
    assert vectors is not None
    queries = col.queries[:max_queries]
    s = Scores(col.name, len(queries), {c: [] for c in CELLS})
    s.short = {d: 0 for d in DEPTHS}
    kept = []
    for q in queries:
        rels = col.qrels[q.id]
        text = text_index.search(q.text, filters=Filters(), limit=DEEP)
        vec = [(k, 1.0 - d) for k, d in vectors.search(table[q.text], DEEP)]
        for depth in DEPTHS:
            s.short[depth] += len(text) < depth
        kept.append((q, rels, text, vec, doc_of))
        for cell in CELLS:
            s.ndcg[cell].append(ndcg(fused_docs(cell, text, vec, doc_of), rels))
    return s, r, kept


async def cross_check(r: Retriever, s: Scores, kept: list[tuple[Any, ...]],
                      cells: Sequence[Cell]) -> None:
    """Through Retriever.search, the shipped path: rankings that differ from offline."""
    for cell in cells:
        if cell.method not in FUSIONS:
            continue  # not a fusion Search offers
        s.mismatches[cell], s.searched[cell] = 0, []
        for q, rels, text, vec, doc_of in kept:
            res = await r.search(q.text, k=2 * cell.depth, options=Options(
                fusion=cell.method, text_weight=cell.weights[0],
                vector_weight=cell.weights[1], candidates=cell.depth,
                group_by_document=cell.level == "doc"))
            got = list(dict.fromkeys(h.doc_id.split("/", 1)[1] for h in res.hits))
            s.mismatches[cell] += got != fused_docs(cell, text, vec, doc_of)
            s.searched[cell].append(ndcg(got, rels))


def best(rows: Sequence[Scores], cells: Sequence[Cell], base: Cell) -> Cell:
    """The best cell by mean nDCG@10 over ``rows``; ``base`` on a tie."""
    return max(cells, key=lambda c: (round(statistics.fmean(r.mean(c) for r in rows), 9),
                                     c == base))


@dataclasses.dataclass
class Fold:
    held_out: str
    chosen: Cell
    train_chosen: float
    train_base: float
    held_chosen: float
    held_base: float

    @property
    def gain(self) -> float:
        return self.held_chosen - self.held_base


@dataclasses.dataclass
class Stage:
    """One leave-one-collection-out choice: the best of ``space`` on three collections,
    scored on the fourth against ``base``."""

    name: str
    space: tuple[Cell, ...]
    base: Cell
    folds: list[Fold]

    @property
    def mean_gain(self) -> float:
        return statistics.fmean(f.gain for f in self.folds)

    @property
    def clears(self) -> bool:
        """The bar for a change: better on every held-out fold, or on their mean by more
        than NOISE."""
        return all(f.gain > 0 for f in self.folds) or self.mean_gain > NOISE


def stage(rows: Sequence[Scores], name: str, space: Sequence[Cell], base: Cell) -> Stage:
    out = []
    for held in rows:
        train = [r for r in rows if r is not held]
        c = best(train, space, base)
        out.append(Fold(held.name, c, statistics.fmean(r.mean(c) for r in train),
                        statistics.fmean(r.mean(base) for r in train), held.mean(c),
                        held.mean(base)))
    return Stage(name, tuple(space), base, out)


def safe(rows: Sequence[Scores], cell: Cell) -> bool:
    """No collection more than NOISE below today's nDCG@10 (the measured plain RRF and
    the published number, the lower of them)."""
    return all(r.mean(cell) >= min(r.mean(PLAIN), TODAY.get(r.name, 1.0)) - NOISE
               for r in rows)


def decide(rows: Sequence[Scores]) -> tuple[list[Stage], Cell]:
    """Every knob at once (reported), then knob by knob, each changed only if its own
    leave-one-out clears the bar: the depth (under plain RRF), then the fusion and its
    weights at that depth. The default: the best of the last space on all four, if its
    stage clears the bar and no collection falls more than NOISE below today."""
    joint = stage(rows, "fusion, weights and depth at once", CHOICES, PLAIN)
    depths = stage(rows, "depth alone (rrf, weights 1/1)",
                   [dataclasses.replace(PLAIN, depth=d) for d in DEPTHS], PLAIN)
    base = best(rows, depths.space, PLAIN) if depths.clears else PLAIN
    fusion = stage(rows, f"fusion and weights at {base.depth} candidates",
                   [c for c in CHOICES if c.depth == base.depth], base)
    default = base
    if fusion.clears:
        fits = [c for c in fusion.space if safe(rows, c)]
        default = best(rows, fits, base) if fits else base
    return [joint, depths, fusion], default


def section(rows: Sequence[Scores], stages: Sequence[Stage], default: Cell,
            notes: list[str]) -> list[str]:
    f3 = support.f3
    out = [HEADING, "", *notes, ""]
    out += ["Every fold of each choice: the cell with the best mean nDCG@10 on the other "
            "three collections, scored on the held-out one against the choice's base "
            "(plain RRF: rrf 0.5/0.5 = weights 1/1, 100 candidates per list, chunk level, "
            "today's default):", ""]
    table = []
    for st in stages:
        table += [[st.name, f.held_out, f.chosen.name, f3(f.train_chosen), f3(f.train_base),
                   f3(f.held_chosen), f3(f.held_base), f"{f.gain:+.3f}"] for f in st.folds]
        table.append([st.name, "**mean**", "", "", "",
                      f3(statistics.fmean(f.held_chosen for f in st.folds)),
                      f3(statistics.fmean(f.held_base for f in st.folds)),
                      f"**{st.mean_gain:+.3f}**"
                      + (" clears" if st.clears else " does not clear")])
    out += support.table(["choice", "held out", "chosen on the other three",
                          "its mean there", "base there", "held-out chosen",
                          "held-out base", "gain"], table)
    shown = list(dict.fromkeys([PLAIN, default, REVERTED,
                                dataclasses.replace(REVERTED, method="dbsf"),
                                *(f.chosen for st in stages for f in st.folds),
                                dataclasses.replace(PLAIN, level="doc"),
                                dataclasses.replace(default, level="doc")]))
    out += ["", "nDCG@10 per collection of plain RRF, the new default, each fold's choice, "
            "and the first two fused per document (`doc`: what `group_by_document` does); "
            "the mean through `Retriever.search` (which since dba83ab returns a text held "
            "by several documents once) and its rankings that differ from the offline "
            "fusion (today's published default: "
            f"{', '.join(f'{k} {v:.3f}' for k, v in TODAY.items())}):", ""]
    out += support.table(
        ["cell", *(r.name for r in rows), "mean", "mean via Search", "differing rankings"], [
            [("**" + c.name + "**") if c == default else c.name,
             *(f3(r.mean(c)) for r in rows), f3(statistics.fmean(r.mean(c) for r in rows)),
             f3(statistics.fmean(statistics.fmean(r.searched[c]) for r in rows))
             if all(c in r.searched for r in rows) else "",
             str(sum(r.mismatches.get(c, 0) for r in rows))] for c in shown])
    out += ["", "Best cell of each method and level on the mean of the four (weights and "
            "depth free), and at the default's weights and depth:", ""]
    rows_m = []
    for m in METHODS:
        for lv in LEVELS:
            c = best(rows, [x for x in CELLS if x.method == m and x.level == lv], PLAIN)
            at = Cell(m, default.alpha, default.depth, lv)
            rows_m.append([f"{m} {lv}", c.name, *(f3(r.mean(c)) for r in rows),
                           f3(statistics.fmean(r.mean(c) for r in rows)),
                           f3(statistics.fmean(r.mean(at) for r in rows))])
    out += support.table(["method, level", "best cell", *(r.name for r in rows), "mean",
                          "mean at the default's weights/depth"], rows_m)
    for depth in DEPTHS:
        out += ["", "Mean nDCG@10 over the four, chunk level, by method (rows) and text "
                f"weight alpha (columns), at {depth} candidates per list:", ""]
        out += support.table(["method", *(f"{a:g}" for a in ALPHAS)], [
            [m, *(f3(statistics.fmean(r.mean(Cell(m, a, depth, "chunk")) for r in rows))
                  for a in ALPHAS)] for m in METHODS])
    says = (f"The bar for each choice: better on every held-out fold, or more than {NOISE} "
            "on their mean; and no collection more than "
            f"{NOISE} below today's nDCG@10. " + " ".join(
                f"{st.name.capitalize()}: {st.mean_gain:+.3f} on the mean of the folds, "
                f"better on {sum(f.gain > 0 for f in st.folds)} of {len(st.folds)}: "
                f"{'clears' if st.clears else 'does not clear'}." for st in stages))
    says += (f" **New default: {default.name}** (on all four: "
             f"{statistics.fmean(r.mean(default) for r in rows):.3f} against plain RRF "
             f"{statistics.fmean(r.mean(PLAIN) for r in rows):.3f})." if default != PLAIN
             else " **Plain RRF stays the default.**")
    return [*out, "", says]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = support.bench_parser("bench.bench_fusion_loco", __doc__)
    p.add_argument("--data", type=Path, default=rb.DATA_DIR)
    p.add_argument("--vectors", type=Path, default=None, metavar="FILE")
    p.add_argument("--max-queries", type=int, default=None, metavar="N")
    p.add_argument("--out", type=Path, default=support.ROOT / "bench" / "RESULTS.md")
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--raw", type=Path, default=None)
    p.add_argument("--orders", type=int, default=1, metavar="N",
                   help="ingest each collection in N document orders (the corpus's, then "
                        "seeded permutations) and average each query's nDCG@10 over them "
                        "before choosing: the order moves BM25 ties and the HNSW graph, "
                        "and a choice must not rest on one order's coin toss")
    args = p.parse_args(argv)
    if args.orders < 1:
        p.error("--orders must be at least 1")
    return args


async def run(args: argparse.Namespace, command: str, work: Path) -> dict[str, Any]:
    began = time.perf_counter()
    limits = RetrievalLimits(max_query_chars=5000, max_k=2 * DEEP)
    cols = [rb.load_collection(args.data / n, n, limits) for n in rb.COLLECTIONS]
    child = await rb.start_child(work)
    rows, retrievers = [], []
    try:
        texts = [t for c in cols for d in c.docs for t in d.chunks]
        texts += [q.text for c in cols for q in c.queries[:args.max_queries]]
        table, embedded = await vectors_for(texts, child, args.vectors, limits.embed_batch)
        print(f"   {embedded}", flush=True)
        embedder = TableEmbedder(table, child.embedder, child.embedder.model_id,
                                 child.embedder.context)
        for col in cols:
            runs = []
            for order in range(args.orders):
                s, r, kept = await measure(shuffled(col, order), table, embedder,
                                           work / "index" / f"{col.name}-{order}",
                                           limits=limits, max_queries=args.max_queries)
                runs.append(s)
                print(f"   {col.name} order {order}: plain {s.mean(PLAIN):.3f}", flush=True)
                if order == 0:  # the corpus's own order is the one cross-checked
                    retrievers.append((r, kept))
                else:
                    await r.close()
            rows.append(averaged(runs))
        stages, default = decide(rows)
        checked = list(dict.fromkeys([PLAIN, default,
                                      dataclasses.replace(REVERTED, method="dbsf"),
                                      *(f.chosen for st in stages for f in st.folds),
                                      dataclasses.replace(PLAIN, level="doc"),
                                      dataclasses.replace(default, level="doc")]))
        for s, (r, kept) in zip(rows, retrievers, strict=True):
            await cross_check(r, s, kept, checked)
    finally:
        for r, _ in retrievers:
            await r.close()
        await child.daemon.shutdown()
    buried = sorted({f"{c.method} {c.alpha:g}/{1 - c.alpha:g}" for c in CELLS
                     if c.level == "chunk" and not keeps_lone_match(c)})
    short = ", ".join(f"{r.name} {'/'.join(str(r.short[d]) for d in DEPTHS)}" for r in rows)
    notes = [*support.environment(command),
             f"- Whole run {(time.perf_counter() - began) / 60:.1f} minutes; {embedded}.",
             "- Each corpus document is one `Retriever.upsert` (kind text, corpus title). Per "
             "query the BM25 and vector candidate lists at depth 100 (`TextIndex.search`, "
             "`VectorIndex.search`), each cell fusing their first `depth` entries with "
             "`retrieval.search._score_fusion.fuse_scored` (what `Retriever.search` runs); "
             f"{len(CELLS)} cells: method (rrf k=60; dbsf; convex = min-max; zscore; each "
             "knowing the text list's depth as Search does: a shorter list normalised among "
             "the zeros below it, its weight raised toward the vectors'; dbsf-plain: DBSF "
             "over each list alone, 5d913f0's) x text "
             f"weight alpha {', '.join(map(str, ALPHAS))} (vector weight 1 - alpha) x depth "
             f"{', '.join(map(str, DEPTHS))} x level (chunk: chunks fused, documents at "
             "their best chunk; doc: each list one entry per document, then fused, as "
             "`group_by_document` does). nDCG@10 over corpus documents, linear graded "
             "gains" + (f"; the first {args.max_queries} queries only." if args.max_queries
                        else ".")
             + (f" Each collection ingested in {args.orders} document orders (its own, "
                f"then permutations seeded 1..{args.orders - 1}); each query's nDCG@10 is "
                "the mean over the orders, so no choice rests on one order's ties."
                if args.orders > 1 else ""),
             "- Cross-check (the corpus's own order), the table's cells through "
             "`Retriever.search(options=Query(fusion=..., text_weight, vector_weight, "
             "candidates, group_by_document))`: document "
             "rankings differing from the offline fusion in the column `mismatches` (of "
             f"{sum(r.queries for r in rows)} queries).",
             "- A default must keep a word one document holds first or second when the "
             "vectors miss that document (`keeps_lone_match`: BM25 finds it alone, the "
             "vectors' first stands clear of the rest; the unit test "
             "tests/unit/test_score_fusion.py pins the same through Search). Cells that bury "
             f"it: {', '.join(buried) or 'none'} (at one depth or more). Queries whose BM25 list "
             f"is shorter than the depth ({'/'.join(map(str, DEPTHS))}): {short}; only "
             "those fuse differently from dbsf-plain."]
    out = section(rows, stages, default, notes)
    if not args.no_write:
        support.publish(args.out, [out])
    else:
        print("\n".join(out))
    return {"stages": [dataclasses.asdict(st) for st in stages], "default": default.name,
            "means": {r.name: {c.name: r.mean(c) for c in CELLS} for r in rows}}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    command = support.command_line("bench.bench_fusion_loco", argv)
    with tempfile.TemporaryDirectory(prefix="llamad-bench-loco-") as tmp, daemon_log():
        raw = asyncio.run(run(args, command, Path(tmp)))
    if args.raw is not None:
        args.raw.write_text(json.dumps(raw, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
