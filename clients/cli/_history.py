"""The ``llamad`` verbs of pushed documents and history sources: ``push`` (a document or a
history record, from a file or stdin, with its own date) and the ``sources --add`` flags
(a push or history source, with retention). Dispatched by name from
:mod:`clients.cli._verbs`, like every verb: ``verb(client, args) -> exit status``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from .._client import Client
from .._types import Source
from . import _format as fmt

Moment = Callable[[str], datetime]
"""Parses an ISO 8601 time from the command line (``clients.cli._commands._moment``)."""


def add_push_command(sub: argparse._SubParsersAction[argparse.ArgumentParser],
                     common: list[argparse.ArgumentParser],
                     json_flag: Callable[[argparse.ArgumentParser], None],
                     moment: Moment) -> None:
    """Add ``push`` to the ``llamad`` parser."""
    p = sub.add_parser(
        "push", parents=common, help="push a document or a history record (admin)",
        description="Index a document of a push or history source from FILE (or stdin): "
                    "e.g. a shell session's transcript as a history record, "
                    "'script -q -c CMD out.txt; llamad push shell out.txt --kind session'. "
                    "A history record is dated --date, else when the daemon receives it.")
    p.add_argument("source", metavar="SOURCE", help="the push or history source's id")
    p.add_argument("file", nargs="?", default="-", metavar="FILE",
                   help="the text to index (default: - , stdin)")
    p.add_argument("--id", default="", metavar="ID",
                   help="the document's id (default: derived from its content)")
    p.add_argument("--title", default="", metavar="TEXT")
    p.add_argument("--kind", default="text", metavar="KIND",
                   help="markdown, text, html, config, session (a shell transcript), ... "
                        "(default text)")
    p.add_argument("--date", type=moment, default=None, metavar="TIME",
                   help="the document's own date (ISO 8601, e.g. 2026-11-30T08:00)")
    p.add_argument("--category", default="", metavar="NAME")
    p.add_argument("--tag", dest="tags", action="append", default=[], metavar="TAG",
                   help="a tag (repeatable)")
    p.add_argument("--no-wait", action="store_true",
                   help="return at once (state pending); llamad documents shows it later")
    p.add_argument("--review", action="store_true",
                   help="hold it for review (state review_required, not searchable) until "
                        "llamad approve, even if its source does not require review")
    json_flag(p)


def add_source_flags(p: argparse.ArgumentParser,
                     toggle: argparse._MutuallyExclusiveGroup) -> None:
    """``sources --add ID [--review] [--history [--max-age-days N] [--max-items N]]``."""
    toggle.add_argument("--add", metavar="ID", default="",
                        help="add (or update) a source of pushed documents (llamad push); "
                             "directories are added by llamad ingest")
    g = p.add_argument_group("adding a source")
    g.add_argument("--review", action="store_true",
                   help="with --add: every new or changed document waits for review "
                        "(llamad approve) before it is searchable; adding the source again "
                        "without it turns review off")
    g.add_argument("--history", action="store_true",
                   help="with --add: a history source of time-ordered records (shell "
                        "sessions, incidents), pruned by the retention below")
    g.add_argument("--max-age-days", type=int, default=0, metavar="N",
                   help="with --history: delete records older than N days (0: never)")
    g.add_argument("--max-items", type=int, default=0, metavar="N",
                   help="with --history: keep the newest N records (0: all)")


def _read(name: str) -> str:
    return sys.stdin.read() if name == "-" else Path(name).read_text(encoding="utf-8")


def push(client: Client, args: argparse.Namespace) -> int:
    text = _read(args.file)
    doc = client.upsert_document(args.source, text, document_id=args.id, title=args.title,
                                 kind=args.kind, category=args.category, tags=args.tags,
                                 document_date=args.date, wait=not args.no_wait,
                                 review=args.review)
    dated = f", dated {fmt.when(doc.document_date)}" if doc.document_date else ""
    return fmt.document_outcome(doc, args.json, dated)


def add_source(client: Client, args: argparse.Namespace) -> Source:
    """``sources --add``: the source added (or updated)."""
    return client.add_source(args.add, history=args.history, review_required=args.review,
                             max_age_days=args.max_age_days, max_items=args.max_items)


def retention(s: Source) -> str:
    """A history source's retention, for the sources table ("-" for other kinds)."""
    if s.kind != "history":
        return "-"
    limits = [f"{s.max_age_days}d" if s.max_age_days else "",
              f"{s.max_items} items" if s.max_items else ""]
    kept = ", ".join(x for x in limits if x) or "unlimited"
    return f"{kept}; {s.pruned} pruned"
