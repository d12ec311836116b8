"""The ``llamad`` verbs of review before indexing: ``documents`` (those awaiting review,
or in any state), ``approve`` and ``reject`` (admin). Dispatched by name from
:mod:`clients.cli._verbs`, like every verb: ``verb(client, args) -> exit status``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import get_args

from .._client import Client
from .._types import Document, DocumentState
from . import _format as fmt

STATES: tuple[str, ...] = get_args(DocumentState)
"""The document states ``--state`` takes."""


def add_review_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser],
                        common: list[argparse.ArgumentParser],
                        json_flag: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add ``documents``, ``approve`` and ``reject`` to the ``llamad`` parser."""
    p = sub.add_parser(
        "documents", parents=common, help="list documents (by state)",
        description="List the indexed documents with their state; --state review_required "
                    "shows those awaiting review (approve or reject them).")
    p.add_argument("--source", default="", metavar="ID", help="only this source")
    p.add_argument("--state", dest="states", action="append", default=[], choices=STATES,
                   metavar="STATE",
                   help=f"only documents in this state (repeatable): {', '.join(STATES)}")
    json_flag(p)
    for verb, what in (("approve", "index a document awaiting review (admin)"),
                       ("reject", "reject a document awaiting review (admin)")):
        p = sub.add_parser(
            verb, parents=common, help=what,
            description=(
                "Index exactly the version held for review (even if its file changed "
                "since); it becomes searchable." if verb == "approve" else
                "Withdraw the document from search (a version approved before too); it "
                "stays rejected until its content changes, which sends it back to review."))
        p.add_argument("id", metavar="ID", help="the document's id (llamad documents "
                                                "--state review_required lists them)")
        p.add_argument("--note", default="", required=verb == "reject", metavar="TEXT",
                       help="why (kept on the document" +
                            (")" if verb == "approve" else "; required)"))
        json_flag(p)


def _line(d: Document) -> list[str]:
    why = d.review_note or d.error
    return [d.id, d.state, d.source_id, fmt.clip(d.title, 40) or "-", fmt.when(d.indexed_at),
            fmt.when(d.document_date), fmt.clip(why, 60) or "-"]


def documents(client: Client, args: argparse.Namespace) -> int:
    found = client.list_documents(args.source, states=args.states)
    if args.json:
        print(fmt.to_json(found, indent=2))
        return 0
    if not found:
        print("llamad: documents: no documents" +
              (f" in state {' or '.join(args.states)}" if args.states else ""),
              file=sys.stderr)
        return 0
    print(fmt.table([_line(d) for d in found],
                    ("ID", "STATE", "SOURCE", "TITLE", "INDEXED", "DATED", "NOTE / ERROR")))
    return 0


def _decided(doc: Document, as_json: bool) -> int:
    return fmt.document_outcome(doc, as_json, f": {doc.error}" if doc.error else "")


def approve(client: Client, args: argparse.Namespace) -> int:
    return _decided(client.approve_document(args.id, args.note), args.json)


def reject(client: Client, args: argparse.Namespace) -> int:
    return _decided(client.reject_document(args.id, args.note), args.json)
