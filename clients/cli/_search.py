"""``llamad ask`` and ``llamad search``: a grounded answer with its sources, and hits.

Both print one score scale, ``score`` in [0, 1]: the fused RRF score divided by the best a
chunk could get from the indexes that answered (1: ranked first by each of them), or the
cosine similarity in vector mode; ``--min-score`` compares the same number. Each hit and
source shows the section it came from (its chunk's heading) beside the document's title.
``llamad ask --dry-run`` prints what the answer's prompt would be instead of an answer:
each hit and what became of it, the prompt's sections (redacted) and their tokens.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

from .._client import Client
from .._types import AskDone, AskPlan, AskSources, AskText, SearchStats
from . import _format as fmt
from ._progress import Elapsed


def _filter_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("filters")
    g.add_argument("--source", dest="sources", action="append", default=[], metavar="ID",
                   help="only this source (repeatable)")
    g.add_argument("--kind", dest="kinds", action="append", default=[], metavar="KIND",
                   help="only this kind: markdown, text, html, pdf, config, yaml, json, "
                        "toml, shell, python, session (repeatable)")
    g.add_argument("--category", dest="categories", action="append", default=[], metavar="NAME",
                   help="only this category (repeatable)")
    g.add_argument("--tag", dest="tags", action="append", default=[], metavar="TAG",
                   help="only documents with any of these tags (repeatable)")


def _dated_flags(p: argparse.ArgumentParser, moment: Callable[[str], datetime]) -> None:
    g = p.add_argument_group("by the document's own date (undated ones left out)")
    g.add_argument("--dated-since", type=moment, default=None, metavar="TIME",
                   help="only documents dated TIME or later (ISO 8601, e.g. 2026-11-30)")
    g.add_argument("--dated-until", type=moment, default=None, metavar="TIME",
                   help="only documents dated TIME or earlier")


def add_search_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser],
                        common: list[argparse.ArgumentParser],
                        json_flag: Callable[..., None], moment: Callable[[str], datetime],
                        model_flag: Callable[[argparse.ArgumentParser, str], None]) -> None:
    """Add ``ask`` and ``search`` to the ``llamad`` parser (every option of Search)."""
    p = sub.add_parser("ask", parents=common, help="a grounded answer with sources",
                       description="Stream an answer grounded in the indexed documents, "
                                   "then its numbered sources.")
    p.add_argument("question", metavar="QUESTION", help="the question; - reads it from stdin")
    p.add_argument("--top-k", type=int, default=0, metavar="K", help="sources to retrieve")
    p.add_argument("--task", choices=("answer", "explain_output", "diagnose", "summarize"),
                   default="answer")
    p.add_argument("--attach", metavar="FILE",
                   help="text the question is about (e.g. a command's output); - is stdin")
    p.add_argument("--max-tokens", type=int, metavar="N")
    p.add_argument("--temperature", type=float, metavar="T")
    p.add_argument("--no-cache", action="store_true", help="skip the response cache")
    p.add_argument("--dry-run", action="store_true",
                   help="generate nothing: print the hits and which were kept (under the "
                        "relevance floor and the token budget), the prompt's sections as "
                        "the model would get them (redacted) and their tokens")
    p.add_argument("--mode", choices=("hybrid", "text", "vector"), default="hybrid",
                   help="how the sources are searched (default hybrid)")
    model_flag(p, "generation")
    _filter_flags(p)
    _dated_flags(p, moment)
    json_flag(p, "JSON lines (text or plan, sources and done events)")

    p = sub.add_parser("search", parents=common, help="hybrid search of the documents",
                       description="Search the indexed documents (BM25 and vectors).")
    p.add_argument("query", metavar="QUERY")
    p.add_argument("--top-k", type=int, default=0, metavar="K", help="hits (default 5)")
    p.add_argument("--mode", choices=("hybrid", "text", "vector"), default="hybrid",
                   help="which indexes answer (default hybrid)")
    p.add_argument("--min-score", type=float, default=None, metavar="S",
                   help="drop hits scoring below S (0..1; cosine in vector mode)")
    p.add_argument("--by-document", action="store_true",
                   help="one hit per document (its best chunk)")
    p.add_argument("--candidates", type=int, default=0, metavar="N",
                   help="candidates each index contributes before fusion (default: the "
                        "daemon's retrieval.text_candidates and vector_candidates)")
    p.add_argument("--fusion", choices=("rrf", "dbsf", "convex"), default="",
                   help="how the two lists are fused: reciprocal ranks, distribution-based "
                        "score fusion or a convex combination of min-max normalised scores "
                        "(default: the daemon's retrieval.fusion)")
    p.add_argument("--text-weight", type=float, default=None, metavar="W",
                   help="the BM25 list's weight in the fusion (default: the daemon's)")
    p.add_argument("--vector-weight", type=float, default=None, metavar="W",
                   help="the vector list's weight in the fusion (default: the daemon's)")
    _filter_flags(p)
    _dated_flags(p, moment)
    g = p.add_argument_group("by when the document was indexed")
    g.add_argument("--indexed-since", type=moment, default=None, metavar="TIME",
                   help="only documents indexed at TIME or later (ISO 8601)")
    g.add_argument("--indexed-until", type=moment, default=None, metavar="TIME",
                   help="only documents indexed at TIME or earlier")
    json_flag(p)


def _filters(args: argparse.Namespace) -> dict[str, Any]:
    return {"sources": args.sources, "kinds": args.kinds, "categories": args.categories,
            "tags": args.tags, "dated_since": args.dated_since,
            "dated_until": args.dated_until}


def titled(title: str, heading: str, width: int = 0) -> str:
    """``Title: Section``: the document's title and the section of it (either may be
    empty), clipped to ``width`` when one is given."""
    title, heading = title.strip(), " ".join(heading.split())
    # A chunk's heading is its path of headings ("Runbook > Disk full"), and a document's
    # first heading is often its title too: the title is said once.
    if heading == title:
        heading = ""
    elif title and heading.startswith(title + " > "):
        heading = heading[len(title) + 3:]
    text = ": ".join(part for part in (title, heading) if part)
    return fmt.clip(text, width) if width else text


def ask(client: Client, args: argparse.Namespace) -> int:
    from ._verbs import UsageError, _text_arg  # noqa: PLC0415 - _verbs imports this module

    attachment = ""
    if args.attach:
        try:
            attachment = (sys.stdin.read() if args.attach == "-"
                          else Path(args.attach).read_text(errors="replace"))
        except OSError as exc:
            raise UsageError(f"cannot read {args.attach}: {exc.strerror or exc}") from None
    stream = client.ask(_text_arg(args.question), top_k=args.top_k, task=args.task,
                        attachment=attachment, max_tokens=args.max_tokens,
                        temperature=args.temperature, no_cache=args.no_cache,
                        mode=args.mode, model=args.model, dry_run=args.dry_run,
                        **_filters(args))
    out = sys.stdout
    sources: AskSources | None = None
    done: AskDone | None = None
    plan: AskPlan | None = None
    text = ""
    what = ("searching the documents, then waiting for "
            + (f"the model {args.model}" if args.model else "the model"))
    kinds = {AskText: "text", AskPlan: "plan", AskSources: "sources", AskDone: "done"}
    shown = sys.stderr.isatty() and not args.json
    with stream, Elapsed(sys.stderr, what, shown=shown) as waiting:
        for event in stream:
            waiting.done()
            if args.json:
                fmt.json_line(out, {"event": kinds[type(event)], **dataclasses.asdict(event)})
                continue
            if isinstance(event, AskText):
                out.write(event.text)
                out.flush()
                text += event.text
            elif isinstance(event, AskPlan):
                plan = event
            elif isinstance(event, AskSources):
                sources = event
            else:
                done = event
    if args.json:
        return 0
    if plan is not None:
        print_plan(plan, done, out)
    if text and not text.endswith("\n"):
        out.write("\n")
    if sources is not None and sources.citations:
        out.write("\nSources:\n")
        for c in sources.citations:
            where = f" — {c.path}" if c.path else ""
            dated = f", dated {fmt.when(c.document_date)}" if c.document_date else ""
            out.write(f"[{c.label}] {titled(c.title or c.document_id, c.heading)}{where} "
                      f"({c.score:.3f}{dated})\n")
    out.flush()
    for warning in sources.warnings if sources is not None else ():
        print(f"llamad: ask: warning: {warning}", file=sys.stderr)
    if done is not None and sys.stderr.isatty():
        notes = [done.model_name, f"{done.usage.completion_tokens} tokens",
                 f"retrieval {sources.retrieval_mode}" if sources is not None else "",
                 "cached" if done.cached else "",
                 f"{done.chunks_dropped} sources left out" if done.chunks_dropped else ""]
        print("[" + ", ".join(n for n in notes if n) + "]", file=sys.stderr)
    return 0


_VERDICTS = {"kept": "kept", "below_floor": "below floor", "over_budget": "over budget"}


def print_plan(plan: AskPlan, done: AskDone | None, out: TextIO) -> None:
    """A dry run: each hit with its verdict, then the prompt's sections with their text."""
    out.write("Hits (rank order):\n")
    for h in plan.hits:
        out.write(f"  {h.label or '-':<4} {_VERDICTS.get(h.verdict, h.verdict):<12} "
                  f"{h.score:.3f}  {h.chunk_id}  {fmt.clip(h.title or h.document_id, 40)}\n")
    if not plan.hits:
        out.write("  (none)\n")
    if not plan.sections:
        out.write("\nNo prompt: nothing relevant was retrieved (Ask answers that the "
                  "knowledge base has nothing on it).\n")
        return
    template = f", templates {done.template_version}" if done is not None else ""
    out.write(f"\nPrompt: {plan.prompt_tokens} tokens of a {plan.budget}-token budget"
              f"{template}\n")
    for s in plan.sections:
        out.write(f"\n--- {s.role} ({s.tokens} tokens) ---\n{s.content}\n")
    out.flush()


def _rank(rank: int | None, score: float | None) -> str:
    return "-" if rank is None else f"#{rank} {score or 0.0:.3f}"


def search(client: Client, args: argparse.Namespace) -> int:
    result = client.search(args.query, top_k=args.top_k, mode=args.mode,
                           min_score=args.min_score, group_by_document=args.by_document,
                           candidates=args.candidates, text_weight=args.text_weight,
                           vector_weight=args.vector_weight, fusion=args.fusion,
                           indexed_since=args.indexed_since,
                           indexed_until=args.indexed_until, **_filters(args))
    if args.json:
        print(fmt.to_json({"mode": result.mode, "vector_model": result.vector_model,
                           "warnings": result.warnings, "hits": result.hits,
                           "stats": result.stats}, indent=2))
        return 0
    for warning in result.warnings:
        print(f"llamad: search: warning: {warning}", file=sys.stderr)
    if not result.hits:
        print("llamad: search: no hits", file=sys.stderr)
        return 0
    rows = [[h.chunk_id, titled(h.title, h.heading, 60), h.path or "-",
             fmt.when(h.document_date), h.search_source, f"{h.score:.3f}",
             _rank(h.text_rank, h.text_score), _rank(h.vector_rank, h.vector_score)]
            for h in result.hits]
    print(fmt.table(rows, ("CITATION", "TITLE: SECTION", "PATH", "DATED", "FOUND BY",
                           "SCORE", "BM25", "VECTOR")))
    for h in result.hits:  # the same text under other document ids (one hit)
        if h.also_in:
            print(f"{h.chunk_id}: also in {', '.join(h.also_in)}")
    if sys.stderr.isatty():
        print(searched(result.stats), file=sys.stderr)
    return 0


def searched(st: SearchStats) -> str:
    """One line of what a search did, for a terminal."""
    lists = [f"{st.text_candidates} of {st.text_chunks:,} chunks by BM25"
             if st.text_depth else "",
             f"{st.vector_candidates} of {st.vector_chunks:,} vectors"
             if st.vector_depth else ""]
    return (f"candidates: {' and '.join(x for x in lists if x) or 'none'}, {st.fused} "
            f"fused; {st.stages_ms.get('total', 0.0):.1f} ms")
