"""Review before indexing (issue 16), at the retrieval layer: a held version is stored
but never chunked, embedded or searchable; approval indexes exactly the held text,
rejection withdraws the document and sticks until its content changes; held versions
survive a restart."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from retrieval import (
    Hit,
    InvalidDocument,
    NotFound,
    Query,
    Retriever,
    WrongState,
    scan_source,
)
from retrieval.store._indexes import Indexes
from retrieval.store._metadata import Store
from tests.support.embedder import HashEmbedder, filled
from tests.support.held import hold_commits


def doc_ids(hits: Sequence[Hit]) -> set[str]:
    return {h.doc_id for h in hits}


async def found(r: Retriever, query: str) -> set[str]:
    """Documents whose indexed text matches ``query`` (BM25)."""
    return doc_ids((await r.search(query, k=20, options=Query(mode="text"))).hits)


async def anywhere(r: Retriever, query: str) -> set[str]:
    """Documents a search finds by text or by vectors (a vector search of this small
    corpus returns every document that has a vector)."""
    vector = await r.search(query, k=20, options=Query(mode="vector"))
    return await found(r, query) | doc_ids(vector.hits)


def store_of(r: Retriever) -> Store:
    return r._indexes.require()


async def test_a_held_document_is_stored_but_neither_chunked_embedded_nor_searchable(
        tmp_path: Path) -> None:
    """A push to a source requiring review is held in state review_required with its
    redacted text: no chunk, no embedding request, no hit in any mode, nothing for the
    backfill; listed by state and counted by Status."""
    embedder = HashEmbedder("m")
    r = await filled(tmp_path / "index", embedder)
    await r.add_source("inbox", review_required=True)
    before = (await r.status()).chunks
    calls = embedder.calls
    doc = await r.upsert("inbox", "printer", "printer jammed on floor two; "
                         "password=hunter2hunter2", doc_id="inbox/printer")
    assert doc.state == "review_required" and doc.indexed_at == 0
    assert (await r.status()).chunks == before
    assert embedder.calls == calls
    assert "inbox/printer" not in await anywhere(r, "printer jammed floor")
    assert not r.backfill()  # nothing lacks a vector: the held text is no chunk
    held = store_of(r).held_document("inbox/printer")
    assert held is not None and "hunter2" not in held[1] and "printer jammed" in held[1]
    assert [d.id for d in await r.documents(states=["review_required"])] == ["inbox/printer"]
    assert {d.id for d in await r.documents(states=["indexed"])} == {
        "docs/disk", "docs/db", "docs/vpn"}
    assert (await r.status()).documents_by_state == {"indexed": 3, "review_required": 1}
    await r.close()


async def test_approval_indexes_the_held_text_and_keeps_the_note(tmp_path: Path) -> None:
    """Approving indexes exactly the held version (chunked, embedded, searchable in both
    modes), records the note, and pushing the same content again changes nothing."""
    embedder = HashEmbedder("m")
    r = await filled(tmp_path / "index", embedder)
    await r.add_source("inbox")
    await r.upsert("inbox", "printer", "printer jammed on floor two", doc_id="inbox/p",
                   review=True)
    calls = embedder.calls
    doc = await r.approve("inbox/p", note="checked by ops")
    assert doc.state == "indexed" and doc.review_note == "checked by ops"
    assert embedder.calls > calls
    assert "inbox/p" in await found(r, "printer jammed floor")
    stored = await r.document("inbox/p")
    assert stored is not None and stored.state == "indexed"
    assert stored.review_note == "checked by ops"
    assert store_of(r).held_version("inbox/p") is None
    again = await r.upsert("inbox", "printer", "printer jammed on floor two",
                           doc_id="inbox/p", review=True)
    assert again.state == "indexed"  # the content approved needs no second review
    await r.close()


async def reviewed_wiki(tmp_path: Path) -> tuple[Retriever, Path]:
    """A retriever with the corpus and a directory source ``wiki`` requiring review,
    holding one page (not scanned yet); returns it and the page's file."""
    root = tmp_path / "wiki"
    root.mkdir()
    page = root / "page.txt"
    page.write_text("printer queue stuck on floor two\n")
    r = await filled(tmp_path / "index", HashEmbedder("m"))
    await r.add_source("wiki", root=root, review_required=True)
    return r, page


async def test_approving_a_file_indexes_what_was_reviewed_even_after_it_changed(
        tmp_path: Path) -> None:
    """A directory source requiring review: a new file waits; approval indexes the text
    held at the scan, not the file's newer content; the next scan holds the newer
    content for review while the approved version stays searchable."""
    r, page = await reviewed_wiki(tmp_path)
    assert (await scan_source(r, "wiki")).added == 1
    assert (await r.document("wiki/page.txt")).state == "review_required"  # type: ignore[union-attr]
    assert (await scan_source(r, "wiki")).unchanged == 1  # held, unchanged: not read again
    page.write_text("kerberos tickets expire after midnight\n")
    os.utime(page, ns=(1_900_000_000_000_000_000,) * 2)
    await r.approve("wiki/page.txt")
    assert "wiki/page.txt" in await found(r, "printer queue stuck")
    assert "wiki/page.txt" not in await found(r, "kerberos tickets midnight")
    report = await scan_source(r, "wiki")
    assert report.changed == 1
    doc = await r.document("wiki/page.txt")
    assert doc is not None and doc.state == "review_required"
    assert doc.mtime_ns == 1_900_000_000_000_000_000 and doc.indexed_at > 0
    # The old version is searchable until the new one is approved.
    assert "wiki/page.txt" in await found(r, "printer queue stuck")
    assert "wiki/page.txt" not in await found(r, "kerberos tickets midnight")
    await r.approve("wiki/page.txt")
    assert "wiki/page.txt" in await found(r, "kerberos tickets midnight")
    assert "wiki/page.txt" not in await found(r, "printer queue stuck")
    await r.close()


async def test_rejection_withdraws_the_document_and_sticks_until_it_changes(
        tmp_path: Path) -> None:
    """Rejecting a new version withdraws the document (its approved version too), drops
    the held text and keeps the note; a rescan of the unchanged file (even touched) leaves
    it rejected; changed content goes back to review; a changed-back file releases."""
    r, page = await reviewed_wiki(tmp_path)
    await scan_source(r, "wiki")
    await r.approve("wiki/page.txt")
    page.write_text("customer list: alice bob carol\n")
    os.utime(page, ns=(1_900_000_000_000_000_000,) * 2)
    await scan_source(r, "wiki")
    chunks = (await r.status()).chunks
    doc = await r.reject("wiki/page.txt", note="names customers")
    assert doc.state == "rejected" and doc.review_note == "names customers"
    assert (await r.status()).chunks < chunks
    assert "wiki/page.txt" not in await anywhere(r, "printer queue stuck")
    assert "wiki/page.txt" not in await anywhere(r, "customer list alice")
    assert store_of(r).held_version("wiki/page.txt") is None
    assert (await scan_source(r, "wiki")).unchanged == 1
    os.utime(page, ns=(1_950_000_000_000_000_000,) * 2)  # touched, same content
    await scan_source(r, "wiki")
    assert (await r.document("wiki/page.txt")).state == "rejected"  # type: ignore[union-attr]
    assert (await r.status()).documents_by_state["rejected"] == 1
    page.write_text("customer count: three\n")
    await scan_source(r, "wiki")
    assert (await r.document("wiki/page.txt")).state == "review_required"  # type: ignore[union-attr]
    with pytest.raises(WrongState, match="is indexed, not review_required"):
        await r.approve("docs/disk")
    await r.close()


async def test_a_file_changed_back_to_the_approved_content_needs_no_review(
        tmp_path: Path) -> None:
    """A held version is released, the document indexed again, when its file comes back
    to the content already approved and indexed."""
    r, page = await reviewed_wiki(tmp_path)
    await scan_source(r, "wiki")
    await r.approve("wiki/page.txt")
    page.write_text("something else entirely\n")
    await scan_source(r, "wiki")
    assert (await r.document("wiki/page.txt")).state == "review_required"  # type: ignore[union-attr]
    page.write_text("printer queue stuck on floor two\n")
    os.utime(page, ns=(1_900_000_000_000_000_000,) * 2)
    await scan_source(r, "wiki")
    assert (await r.document("wiki/page.txt")).state == "indexed"  # type: ignore[union-attr]
    assert store_of(r).held_version("wiki/page.txt") is None
    await r.close()


async def test_held_and_rejected_documents_survive_a_restart(tmp_path: Path) -> None:
    """Held versions live in SQLite: after reopening, one is still review_required (and
    unsearchable) and its approval indexes it; a rejected one stays rejected."""
    r = await filled(tmp_path / "index", HashEmbedder("m"))
    await r.add_source("inbox", review_required=True)
    await r.upsert("inbox", "a", "printer jammed on floor two", doc_id="inbox/a")
    await r.upsert("inbox", "b", "kerberos tickets expire", doc_id="inbox/b")
    await r.reject("inbox/b", note="wrong")
    await r.close()
    again = Retriever(tmp_path / "index", lambda: HashEmbedder("m"))
    await again.open()
    assert (await again.document("inbox/a")).state == "review_required"  # type: ignore[union-attr]
    assert "inbox/a" not in await anywhere(again, "printer jammed floor")
    b = await again.document("inbox/b")
    assert b is not None and (b.state, b.review_note) == ("rejected", "wrong")
    await again.approve("inbox/a", note="ok")
    assert "inbox/a" in await found(again, "printer jammed floor")
    await again.close()


async def test_review_refusals(tmp_path: Path) -> None:
    """An unknown document is NotFound; one not awaiting review is WrongState naming
    its state (rejected too); an oversized note is refused and changes nothing."""
    r = await filled(tmp_path / "index", HashEmbedder("m"))
    await r.add_source("inbox", review_required=True)
    with pytest.raises(NotFound):
        await r.approve("inbox/nope")
    with pytest.raises(NotFound):
        await r.reject("inbox/nope", note="x")
    await r.upsert("inbox", "a", "printer jammed", doc_id="inbox/a")
    with pytest.raises(InvalidDocument, match="note"):
        await r.reject("inbox/a", note="x" * 5000)
    assert (await r.document("inbox/a")).state == "review_required"  # type: ignore[union-attr]
    await r.reject("inbox/a", note="no")
    with pytest.raises(WrongState, match="is rejected"):
        await r.approve("inbox/a")
    with pytest.raises(WrongState, match="is rejected"):
        await r.reject("inbox/a")
    await r.close()


async def test_a_held_document_can_be_deleted(tmp_path: Path) -> None:
    """Deleting a held document removes it and its held text."""
    r = await filled(tmp_path / "index", HashEmbedder("m"))
    await r.add_source("inbox", review_required=True)
    await r.upsert("inbox", "a", "printer jammed", doc_id="inbox/a")
    assert await r.delete("inbox/a")
    assert await r.document("inbox/a") is None
    assert store_of(r).held_version("inbox/a") is None
    with pytest.raises(NotFound):
        await r.approve("inbox/a")
    await r.close()


async def test_turning_review_on_and_off_for_a_source(tmp_path: Path) -> None:
    """Adding a source again with review_required keeps its indexed documents indexed
    and holds what comes next; turning it off indexes the next push directly, which
    supersedes a held version."""
    r = await filled(tmp_path / "index", HashEmbedder("m"))
    await r.add_source("inbox")
    await r.upsert("inbox", "a", "printer jammed", doc_id="inbox/a")
    source = await r.add_source("inbox", review_required=True)
    assert source.review_required
    assert [s.review_required for s in await r.sources() if s.id == "inbox"] == [True]
    assert (await r.document("inbox/a")).state == "indexed"  # type: ignore[union-attr]
    assert (await r.upsert("inbox", "a", "printer fixed", doc_id="inbox/a")).state == \
        "review_required"
    await r.add_source("inbox", review_required=False)
    doc = await r.upsert("inbox", "a", "printer replaced", doc_id="inbox/a")
    assert doc.state == "indexed"
    assert store_of(r).held_version("inbox/a") is None
    assert "inbox/a" in await found(r, "printer replaced")
    await r.close()


async def test_a_background_push_goes_pending_processing_review_required(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """upsert_later with review: pending at once, processing while it is held, then
    review_required; approval then indexes it."""
    r = await filled(tmp_path / "index", HashEmbedder("m"))
    await r.add_source("inbox")
    gate = threading.Event()
    hold = Store.hold_document

    def gated(self: Store, doc: object, text: str) -> None:
        gate.wait(10)
        hold(self, doc, text)  # type: ignore[arg-type]

    monkeypatch.setattr(Store, "hold_document", gated)
    doc = await r.upsert_later("inbox", "vpn", "vpn tunnel flapping", doc_id="inbox/vpn",
                               review=True)
    assert doc.state == "pending"
    seen = [doc.state]
    for _ in range(2000):
        current = await r.document("inbox/vpn")
        state = current.state if current is not None else "absent"
        if state != seen[-1]:
            seen.append(state)
        if state == "processing":
            gate.set()
        if state == "review_required":
            break
        await asyncio.sleep(0.002)
    assert seen == ["pending", "processing", "review_required"]
    assert "inbox/vpn" not in await anywhere(r, "vpn tunnel flapping")
    await r.approve("inbox/vpn")
    assert "inbox/vpn" in await found(r, "vpn tunnel flapping")
    await r.close()


async def test_a_version_pushed_during_an_approval_waits_for_its_own_review(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new version pushed while an approval commits is held after it, never dropped by
    it: the approved version is indexed and searchable, the newer one awaits review."""
    r = await filled(tmp_path / "index", HashEmbedder("m"))
    await r.add_source("inbox", review_required=True)
    await r.upsert("inbox", "a", "printer jammed on floor two", doc_id="inbox/a")
    entered = asyncio.Event()
    gate = hold_commits(monkeypatch, Indexes, entered=entered)  # PgIndexes on PostgreSQL
    approving = asyncio.create_task(r.approve("inbox/a", note="ok"))
    await entered.wait()  # the approval is committing
    pushing = asyncio.create_task(r.upsert("inbox", "a", "kerberos tickets expire",
                                           doc_id="inbox/a"))
    for _ in range(50):
        await asyncio.sleep(0.001)
    gate.set()
    assert (await approving).state == "indexed"
    assert (await pushing).state == "review_required"
    doc = await r.document("inbox/a")
    assert doc is not None and doc.state == "review_required"
    held_version = store_of(r).held_document("inbox/a")
    assert held_version is not None and "kerberos" in held_version[1]
    assert "inbox/a" in await found(r, "printer jammed floor")
    assert "inbox/a" not in await found(r, "kerberos tickets")
    await r.close()


async def test_a_credential_in_a_note_is_redacted(tmp_path: Path) -> None:
    """A reviewer's note is stored redacted, like a title."""
    r = await filled(tmp_path / "index", HashEmbedder("m"))
    await r.add_source("inbox", review_required=True)
    await r.upsert("inbox", "a", "printer jammed", doc_id="inbox/a")
    doc = await r.reject("inbox/a", note="leaks password=hunter2hunter2 in step 3")
    assert "hunter2" not in doc.review_note and doc.review_note.startswith("leaks ")
    await r.close()
