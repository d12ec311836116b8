"""Review before indexing from the client side (issue 16): the ``llamad documents``,
``approve`` and ``reject`` verbs and ``ingest --review`` against the fake daemon, and the
client library's calls (both clients) with their states filter."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from clients import AsyncClient, Client, errors
from clients.testing import FakeLlamad
from tests.support.cli_run import Run


def test_ingest_review_then_list_approve_and_reject(llamad: Run, tmp_path: Path) -> None:
    """ingest --review holds every file (sources marks the source, search finds none);
    documents --state review_required lists them; approve makes one searchable; reject
    needs --note and shows it; approving again is refused (exit 1) naming the state."""
    (tmp_path / "a.txt").write_text("nginx logs rotate daily\n")
    (tmp_path / "b.txt").write_text("customer names alice bob\n")
    assert llamad("ingest", str(tmp_path), "--source", "kb", "--review")[0] == 0
    assert "kb (review)" in llamad("sources")[1]
    status, out, err = llamad("search", "nginx logs")
    assert status == 0 and "kb:a.txt" not in out
    status, out, _ = llamad("documents", "--state", "review_required")
    header, *rows = out.splitlines()
    assert header.split()[:3] == ["ID", "STATE", "SOURCE"]
    assert [r.split()[:2] for r in rows] == [["kb:a.txt", "review_required"],
                                             ["kb:b.txt", "review_required"]]
    status, out, _ = llamad("approve", "kb:a.txt", "--note", "fine")
    assert (status, out) == (0, "kb:a.txt: indexed\n")
    assert "kb:a.txt" in llamad("search", "nginx logs")[1]
    with pytest.raises(SystemExit) as usage:
        llamad("reject", "kb:b.txt")
    assert usage.value.code == 2
    status, out, err = llamad("reject", "kb:b.txt", "--note", "names customers", "--json")
    assert "the following arguments are required: --note" in err
    doc = json.loads(out)
    assert (status, doc["state"], doc["review_note"]) == (0, "rejected", "names customers")
    status, out, _ = llamad("documents", "--state", "rejected", "--state", "indexed",
                            "--json")
    assert [(d["id"], d["state"]) for d in json.loads(out)] == [
        ("kb:a.txt", "indexed"), ("kb:b.txt", "rejected")]
    assert "names customers" in llamad("documents")[1]
    status, out, err = llamad("approve", "kb:b.txt")
    assert (status, out) == (1, "")
    assert err.startswith("llamad: approve: refused: document 'kb:b.txt' is rejected")
    assert llamad("approve", "kb:nope")[0] == 4
    with pytest.raises(SystemExit) as usage:
        llamad("documents", "--state", "sideways")
    assert usage.value.code == 2
    assert "invalid choice: 'sideways'" in llamad("documents")[2]
    status, _, err = llamad("documents", "--state", "pending")
    assert err == "llamad: documents: no documents in state pending\n"


def test_sources_add_review_and_push_review(llamad: Run, tmp_path: Path) -> None:
    """sources --add ID --review makes a source requiring review (said, and marked in the
    listing); push --review holds one document of an ordinary source; --review without
    --add is a usage error; adding the source again without it turns review off."""
    status, out, _ = llamad("sources", "--add", "inbox", "--review")
    assert (status, out) == (0, "inbox: push source (review required)\n")
    assert "inbox (review)" in llamad("sources")[1]
    note = tmp_path / "note.txt"
    note.write_text("printer jammed on floor two\n")
    assert llamad("push", "inbox", str(note), "--id", "a")[1] == "a: review_required\n"
    assert llamad("sources", "--add", "inbox")[1] == "inbox: push source\n"
    assert llamad("push", "inbox", str(note), "--id", "b")[1] == "b: indexed\n"
    assert llamad("push", "inbox", str(note), "--id", "c", "--review")[1] == \
        "c: review_required\n"
    status, out, err = llamad("sources", "--review")
    assert (status, out) == (2, "") and "--review go with --add ID" in err


def test_the_clients_review_calls(fake: FakeLlamad) -> None:
    """Client and AsyncClient: upsert with review, the states filter, approve and reject;
    an unknown state name is refused before any call."""
    with Client(fake.address) as llamad:
        source = llamad.add_source("inbox", review_required=False)
        assert not source.review_required
        held = llamad.upsert_document("inbox", "disk full", document_id="a", review=True)
        assert held.state == "review_required"
        llamad.upsert_document("inbox", "vpn flapping", document_id="b")
        assert [d.id for d in llamad.list_documents(states=["review_required"])] == ["a"]
        assert llamad.search("disk full").hits == ()
        approved = llamad.approve_document("a", "ok")
        assert (approved.state, approved.review_note) == ("indexed", "ok")
        with pytest.raises(errors.FailedPrecondition, match="is indexed"):
            llamad.reject_document("a", "too late")
        with pytest.raises(ValueError, match="state must be one of"):
            llamad.list_documents(states=["sideways"])  # type: ignore[list-item]

    async def asynchronous() -> None:
        async with AsyncClient(fake.address) as llamad:
            await llamad.add_source("held", review_required=True)
            doc = await llamad.upsert_document("held", "kerberos expiry", document_id="c")
            assert doc.state == "review_required"
            rejected = await llamad.reject_document("c", "stale")
            assert (rejected.state, rejected.review_note) == ("rejected", "stale")
            listed = await llamad.list_documents("held", states=["rejected"])
            assert [d.id for d in listed] == ["c"]
            with pytest.raises(errors.NotFound):
                await llamad.approve_document("zz")

    asyncio.run(asynchronous())
