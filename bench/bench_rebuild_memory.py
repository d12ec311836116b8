"""Rebuild memory benchmark: peak RSS of the start-up repair and of a vector rebuild as
the corpus grows, before and after the memory-bounded change (20bf0e0, ``_indexes.PAGE``).

    .venv/bin/python -m bench.bench_rebuild_memory [--sizes 10000,30000,100000]
        [--before 20bf0e0^] [--dim 384] [--work /tmp/llamad-rebuild-mem] [--no-write]
        [--out bench/RESULTS.md]

No model is needed: the vectors are synthetic. For each tree (``before``: a detached
``git worktree`` of the commit before the change, removed afterwards; ``after``: this
checkout) and each corpus size, three child processes, each running that tree's
``retrieval`` (``PYTHONPATH``):

1. **build**: a fresh SQLite store written through ``Store.replace_documents``, documents
   of 20 chunks of about 1 kB of words each, with cached vectors of two models (``old``,
   the index's, and ``new``), unit-norm random float32 of ``--dim`` dimensions;
2. **start-up repair**: tantivy's directory and the HNSW files are deleted, then
   ``Indexes.open_sync`` reconciles both from SQLite (every chunk re-added);
3. **rebuild**: ``Indexes.open_sync`` (nothing to repair: it loads ``old``'s HNSW index),
   then ``Indexes.use_vector_model_sync("new")``: the index rebuilt from the cached
   vectors of every chunk, as the backfill ends a model change.

Each child reports its RSS before the step (``VmRSS``), its peak (``VmHWM``, the kernel's
high-water mark of the process) and its RSS after. What a rebuild cannot avoid holding is
the index it builds (vectors and graph: grows with the corpus, and stays after); what the
change bounds is the rest: the peak over the RSS of a process that merely opened the
same indexes (the rebuild step's RSS before it rebuilds).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
SECTION = "## Rebuild and repair memory"
CHUNKS_PER_DOC = 20
DOCS_PER_TRANSACTION = 50
MEMORY_COMMIT = "20bf0e0"


# -- in the child: one step, one process ----------------------------------------------------


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


class AnonPeak:
    """The peak of the process's anonymous memory (``RssAnon``: heap and the like, not
    the file pages tantivy maps, which the kernel may drop at will) while the block runs,
    sampled every 20 ms."""

    def __init__(self) -> None:
        self.peak_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while True:
            self.peak_kb = max(self.peak_kb, _status_kb("RssAnon"))
            if self._stop.wait(0.02):
                return

    def __enter__(self) -> AnonPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_kb = max(self.peak_kb, _status_kb("RssAnon"))


def _mb(kb: int) -> float:
    return round(kb / 1024, 1)


def _words(rng: np.random.Generator, vocabulary: list[str], n: int) -> str:
    return " ".join(vocabulary[i] for i in rng.integers(0, len(vocabulary), n))


def build(root: Path, chunks: int, dim: int) -> dict[str, Any]:
    """Write the corpus: ``chunks`` chunks with cached vectors of models old and new."""
    from retrieval.store._metadata import ChunkRow, DocumentRow, SourceRow, Store

    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    rng = np.random.default_rng(chunks)
    vocabulary = ["".join(chr(97 + c) for c in rng.integers(0, 26, int(n)))
                  for n in rng.integers(3, 10, 20000)]
    store = Store(root / "meta.sqlite3")
    store.upsert_source(SourceRow("bench", "push"))
    began = time.perf_counter()
    now = int(time.time())
    docs = chunks // CHUNKS_PER_DOC
    for first in range(0, docs, DOCS_PER_TRANSACTION):
        items: list[tuple[DocumentRow, list[ChunkRow]]] = []
        old: dict[str, np.ndarray] = {}
        new: dict[str, np.ndarray] = {}
        for d in range(first, min(docs, first + DOCS_PER_TRANSACTION)):
            rows = []
            for i in range(CHUNKS_PER_DOC):
                text = f"doc {d} chunk {i}: " + _words(rng, vocabulary, 150)
                h = hashlib.sha256(text.encode()).hexdigest()
                rows.append(ChunkRow(f"bench/{d}#{i}", i + 1, f"section {i}", text, h))
                for table in (old, new):
                    v = rng.standard_normal(dim).astype(np.float32)
                    table[h] = v / np.linalg.norm(v)
            doc_hash = hashlib.sha256("".join(r.content_hash for r in rows).encode())
            items.append((DocumentRow(f"bench/{d}", "bench", title=f"doc {d}",
                                      content_hash=doc_hash.hexdigest(), state="indexed",
                                      indexed_at=now), rows))
        store.replace_documents(items, [("old", old), ("new", new)])
    store.set_meta("vector_model", "old")
    store.set_meta("vector_dim", str(dim))
    count = store.counts()["chunks"]
    store.close()
    return {"chunks": count, "seconds": round(time.perf_counter() - began, 1),
            "sqlite_mb": _mb((root / "meta.sqlite3").stat().st_size // 1024)}


def startup(root: Path) -> dict[str, Any]:
    """The start-up repair with both derived indexes gone."""
    from retrieval.store._indexes import Indexes

    shutil.rmtree(root / "bm25", ignore_errors=True)
    for name in ("vectors.hnsw", "vectors.hnsw.json"):
        (root / name).unlink(missing_ok=True)
    indexes = Indexes(root)
    before = _status_kb("VmRSS")
    began = time.perf_counter()
    with AnonPeak() as anon:
        indexes.open_sync()
    seconds = time.perf_counter() - began
    result = {"rss_before_mb": _mb(before), "peak_mb": _mb(_status_kb("VmHWM")),
              "anon_peak_mb": _mb(anon.peak_kb),
              "rss_after_mb": _mb(_status_kb("VmRSS")), "seconds": round(seconds, 1),
              "repaired": indexes.repaired}
    indexes.close_sync()
    return result


def rebuild(root: Path, dim: int) -> dict[str, Any]:
    """Open (loading old's index), then rebuild the index for model new."""
    from retrieval.store._indexes import Indexes

    indexes = Indexes(root)
    indexes.open_sync()
    if indexes.repaired or indexes.vector_model != "old":
        raise RuntimeError(f"unexpected state before the rebuild: {indexes.repaired}, "
                           f"{indexes.vector_model!r}")
    before, hwm_before = _status_kb("VmRSS"), _status_kb("VmHWM")
    anon_before = _status_kb("RssAnon")
    began = time.perf_counter()
    with AnonPeak() as anon:
        indexes.use_vector_model_sync("new", dim)
    seconds = time.perf_counter() - began
    vectors = indexes.vectors.count() if indexes.vectors is not None else 0
    result = {"rss_before_mb": _mb(before), "open_peak_mb": _mb(hwm_before),
              "anon_before_mb": _mb(anon_before), "anon_peak_mb": _mb(anon.peak_kb),
              "peak_mb": _mb(_status_kb("VmHWM")), "rss_after_mb": _mb(_status_kb("VmRSS")),
              "seconds": round(seconds, 1), "vectors": vectors}
    indexes.close_sync()  # the corpus is the new model's now: build it again to rerun
    return result


def child(args: argparse.Namespace) -> None:
    root = Path(args.root)
    if args.child == "build":
        out = build(root, args.chunks, args.dim)
    elif args.child == "startup":
        out = startup(root)
    else:
        out = rebuild(root, args.dim)
    print("RESULT " + json.dumps(out), flush=True)


# -- the parent ---------------------------------------------------------------------------


def run_step(tree: Path, step: str, root: Path, chunks: int, dim: int) -> dict[str, Any]:
    """One step in a fresh process running ``tree``'s code."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run(
        [sys.executable, str(HERE), "--child", step, "--root", str(root),
         "--chunks", str(chunks), "--dim", str(dim)],
        cwd=tree, env=env, capture_output=True, text=True, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
            return result
    raise RuntimeError(f"{step} in {tree} failed ({proc.returncode}): {proc.stderr[-2000:]}")


def worktree(commit: str, path: Path) -> None:
    if path.exists():
        subprocess.run(["git", "worktree", "remove", "--force", str(path)],
                       cwd=ROOT, check=False)
    subprocess.run(["git", "worktree", "add", "--detach", str(path), commit],
                   cwd=ROOT, check=True, capture_output=True)


def section(results: dict[str, dict[int, dict[str, dict[str, Any]]]], sizes: list[int],
            args: argparse.Namespace, before: str, note: str) -> list[str]:
    from bench import _support as support

    anon = all("anon_peak_mb" in results[t][n][step] for t in ("before", "after")
               for n in sizes for step in ("startup", "rebuild"))
    lines = [SECTION, "",
             f"- Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
             f"llamad {support.source()}; before = {before} (the commit before "
             f"{MEMORY_COMMIT}, the memory-bounded repair and rebuild), in a detached "
             "git worktree",
             f"- Machine: {os.cpu_count()} CPUs ({support.cpu_model()}); {note}",
             f"- Corpus: documents of {CHUNKS_PER_DOC} chunks of about 1 kB of words "
             f"(150 words of a 20000-word vocabulary), each chunk with cached vectors of two "
             f"models ({args.dim} dimensions, as all-MiniLM-L6-v2), written through "
             "Store.replace_documents; one process per step, peak = the process's VmHWM.",
             "- Start-up repair: tantivy and HNSW deleted, `Indexes.open_sync()` re-adds "
             "every chunk to both. Rebuild: `Indexes.open_sync()` (loads the old model's "
             "index), then `use_vector_model_sync(new)` builds the new model's index from "
             "the cached vectors of every chunk (the end of a model change's backfill). "
             "over open = peak - the RSS of a process that opened the same corpus's "
             "indexes with nothing to repair (what the step holds beyond an opened index: "
             "the index itself grows with the corpus, this should not)."
             + (" anon: the same for RssAnon sampled every 20 ms (heap, without the file "
                "pages tantivy maps, which VmHWM counts and the kernel may drop)."
                if anon else ""),
             ""]
    header = ["step", "chunks", "before: peak MB", "before: over open MB",
              "after: peak MB", "after: over open MB",
              *(["before: anon over open MB", "after: anon over open MB"] if anon else []),
              "open RSS MB", "before s", "after s"]
    rows = []
    for step in ("startup", "rebuild"):
        for n in sizes:
            b, a = results["before"][n], results["after"][n]
            rows.append([
                "start-up repair" if step == "startup" else "rebuild", str(n),
                f"{b[step]['peak_mb']:.0f}", f"{_over_open(b, step):.0f}",
                f"{a[step]['peak_mb']:.0f}", f"{_over_open(a, step):.0f}",
                *([f"{_anon_over_open(b, step):.0f}", f"{_anon_over_open(a, step):.0f}"]
                  if anon else []),
                f"{a['rebuild']['rss_before_mb']:.0f}",
                f"{b[step]['seconds']:.1f}", f"{a[step]['seconds']:.1f}"])
    lines += support.table(header, rows)
    lines.append("")
    small, big = sizes[0], sizes[-1]
    per = (big - small) / 10000
    for step, name in (("startup", "start-up repair"), ("rebuild", "rebuild")):
        parts = []
        for tree in ("before", "after"):
            lo, hi = results[tree][small], results[tree][big]
            peak = (hi[step]["peak_mb"] - lo[step]["peak_mb"]) / per
            over = (_over_open(hi, step) - _over_open(lo, step)) / per
            anon_part = ""
            if anon:
                anon_over = (_anon_over_open(hi, step) - _anon_over_open(lo, step)) / per
                anon_part = f", {anon_over:.1f} MB anonymous over open"
            parts.append(f"{tree} **{over:.1f} MB** over open ({peak:.1f} MB peak"
                         f"{anon_part})")
        lines.append(f"- {name}, MB per 10k chunks more ({small} -> {big} chunks): "
                     + "; ".join(parts) + ".")
    lines += ["", "Reproduce: `.venv/bin/python -m bench.bench_rebuild_memory`"]
    return lines


def _over_open(steps: dict[str, dict[str, Any]], step: str) -> float:
    """The step's peak over the RSS of a process that merely opened the same indexes
    (nothing to repair: the rebuild step's RSS before it rebuilds)."""
    return float(steps[step]["peak_mb"]) - float(steps["rebuild"]["rss_before_mb"])


def _anon_over_open(steps: dict[str, dict[str, Any]], step: str) -> float:
    """The step's peak anonymous memory (RssAnon: not the file pages tantivy maps) over
    that of a process that merely opened the same indexes."""
    return float(steps[step]["anon_peak_mb"]) - float(steps["rebuild"]["anon_before_mb"])


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.bench_rebuild_memory",
                                description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--sizes", default="10000,30000,100000")
    p.add_argument("--before", default=f"{MEMORY_COMMIT}^")
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--work", type=Path, default=Path("/tmp/llamad-rebuild-mem"))  # noqa: S108
    p.add_argument("--raw", type=Path, help="also write every measurement as JSON here")
    p.add_argument("--report", type=Path, metavar="RAW",
                   help="measure nothing: write the section from a --raw file")
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "RESULTS.md")
    p.add_argument("--child", choices=("build", "startup", "rebuild"), help=argparse.SUPPRESS)
    p.add_argument("--root", help=argparse.SUPPRESS)
    p.add_argument("--chunks", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return
    before = subprocess.run(["git", "rev-parse", "--short", args.before],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    if args.report:
        raw = json.loads(args.report.read_text())
        measured = {tree: {int(n): steps for n, steps in by_size.items()}
                    for tree, by_size in raw["results"].items()}
        write(args, measured, sorted(measured["after"]), before, str(raw["note"]))
        return
    sizes = sorted(int(s) for s in args.sizes.split(","))
    before_tree = Path("/tmp/llamad-before")  # noqa: S108
    worktree(before, before_tree)
    load = [os.getloadavg()[0]]
    results: dict[str, dict[int, dict[str, dict[str, Any]]]] = {"before": {}, "after": {}}
    try:
        for n in sizes:
            for tree_name, tree in (("before", before_tree), ("after", ROOT)):
                root = args.work / f"{tree_name}-{n}"
                built = run_step(tree, "build", root, n, args.dim)
                steps = {"build": built}
                for step in ("startup", "rebuild"):
                    steps[step] = run_step(tree, step, root, n, args.dim)
                    load.append(os.getloadavg()[0])
                results[tree_name][n] = steps
                print(tree_name, n, json.dumps(steps), flush=True)
                shutil.rmtree(root, ignore_errors=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(before_tree)],
                       cwd=ROOT, check=False)
    note = (f"1-minute load between steps {min(load):.2f}-{max(load):.2f} (other helpers' "
            "tests ran; memory, unlike time, does not depend on it)")
    if args.raw:
        args.raw.write_text(json.dumps({"results": results, "note": note}, indent=1))
    write(args, results, sizes, before, note)


def write(args: argparse.Namespace, results: dict[str, dict[int, dict[str, dict[str, Any]]]],
          sizes: list[int], before: str, note: str) -> None:
    lines = section(results, sizes, args, before, note)
    print("\n".join(lines))
    if not args.no_write:
        from bench import _support as support
        support.write_sections(args.out, [lines])


if __name__ == "__main__":
    main()
