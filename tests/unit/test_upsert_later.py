"""Upserts accepted now and indexed in the background (issue 16, UpsertDocument with
wait=false): every state reachable and shown — pending, processing, indexed, failed with
the reason — checked before acceptance, bounded, in order, and finished on close."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from retrieval import Busy, InvalidDocument, NotFound, Query, RetrievalLimits, Retriever
from retrieval.store._indexes import Indexes
from tests.support.embedder import HashEmbedder
from tests.support.held import hold_commits, hold_later_upserts


@pytest.fixture
async def r(tmp_path: Path) -> AsyncIterator[Retriever]:
    retriever = Retriever(tmp_path / "index", lambda: HashEmbedder("m"))
    await retriever.open()
    await retriever.add_source("inbox")
    yield retriever
    await retriever.close()


async def states_of(r: Retriever, doc_id: str, until: str) -> list[str]:
    """The states a document shows, polled until ``until``."""
    seen: list[str] = []
    for _ in range(500):
        doc = await r.document(doc_id)
        state = doc.state if doc is not None else "absent"
        if not seen or seen[-1] != state:
            seen.append(state)
        if state == until:
            return seen
        await asyncio.sleep(0.002)
    raise AssertionError(f"{doc_id} never reached {until}: {seen}")


async def test_a_document_goes_pending_processing_indexed(
        r: Retriever, monkeypatch: pytest.MonkeyPatch) -> None:
    """Accepted at once in state pending; then processing while its upsert runs; then
    indexed and searchable. Status counts it in each state."""
    gate = hold_commits(monkeypatch)
    hold = hold_later_upserts(r)
    doc = await r.upsert_later("inbox", "vpn", "vpn tunnel flapping: tune dpd",
                               doc_id="inbox/vpn")
    assert doc.state == "pending"
    assert (await r.document("inbox/vpn")).state == "pending"  # type: ignore[union-attr]
    assert (await r.status()).documents_by_state == {"pending": 1}
    assert [d.id for d in await r.documents("inbox")] == ["inbox/vpn"]
    hold.set()
    assert await states_of(r, "inbox/vpn", "processing") == ["pending", "processing"]
    assert (await r.status()).documents_by_state == {"processing": 1}
    gate.set()
    assert (await states_of(r, "inbox/vpn", "indexed"))[-1] == "indexed"
    assert (await r.search("vpn tunnel")).hits[0].doc_id == "inbox/vpn"


async def test_a_failed_background_upsert_shows_failed_with_the_reason(
        r: Retriever, monkeypatch: pytest.MonkeyPatch) -> None:
    """A background upsert that fails leaves the document failed, with the reason."""
    async def broken(self: Indexes, batch: list[object]) -> object:
        raise OSError("disk on fire")

    monkeypatch.setattr(Indexes, "commit", broken)
    await r.upsert_later("inbox", "t", "some text", doc_id="inbox/t")
    await states_of(r, "inbox/t", "failed")
    doc = await r.document("inbox/t")
    assert doc is not None and "disk on fire" in doc.error


async def test_what_would_be_refused_is_refused_before_acceptance(r: Retriever) -> None:
    """An unknown source, a bad id or kind, empty or oversized text: refused now, not
    accepted and failed later."""
    with pytest.raises(NotFound):
        await r.upsert_later("nope", "t", "x", doc_id="nope/x")
    with pytest.raises(InvalidDocument):
        await r.upsert_later("inbox", "t", "x", doc_id="inbox/../etc")
    with pytest.raises(InvalidDocument, match="kind"):
        await r.upsert_later("inbox", "t", "x", doc_id="inbox/k", kind="spreadsheet")
    with pytest.raises(InvalidDocument, match="empty"):
        await r.upsert_later("inbox", "t", "   ", doc_id="inbox/e")
    assert await r.documents("inbox") == []


async def test_the_queue_is_bounded_and_versions_land_in_order(r: Retriever) -> None:
    """Past max_pending, Busy says to retry; two versions of one document are indexed in
    the order they came (the last one wins); close finishes what was accepted."""
    r.limits = RetrievalLimits(max_pending=2)
    hold = hold_later_upserts(r)
    await r.upsert_later("inbox", "a", "first version about printers", doc_id="inbox/a")
    await r.upsert_later("inbox", "a", "second version about routers", doc_id="inbox/a")
    with pytest.raises(Busy, match=r"retrieval\.max_pending_upserts"):
        await r.upsert_later("inbox", "b", "another", doc_id="inbox/b")
    hold.set()
    await r._later.close()
    doc = await r.document("inbox/a")
    assert doc is not None and doc.state == "indexed"
    [hit] = (await r.search("version", options=Query(mode="text"))).hits
    assert hit.text == "second version about routers"


async def test_redaction_and_chunking_run_off_the_event_loop(
        r: Retriever, monkeypatch: pytest.MonkeyPatch) -> None:
    """Redacting and chunking a pushed text is CPU work linear in its size (seconds for
    tens of megabytes): both run in a worker thread, never on the loop serving calls."""
    import threading

    from retrieval import _ingest, _sizing

    threads: dict[str, str] = {}
    for module, name in ((_ingest, "redact"), (_sizing, "chunk_text")):
        real = getattr(module, name)

        def spy(*args: object, _real: object = real, _name: str = name,
                **kwargs: object) -> object:
            threads.setdefault(_name, threading.current_thread().name)
            return _real(*args, **kwargs)  # type: ignore[operator]

        monkeypatch.setattr(module, name, spy)
    loop_thread = threading.current_thread().name
    await r.upsert("inbox", "t", "password: hunter2\n\n" + "word " * 5000)
    assert threads.keys() == {"redact", "chunk_text"}
    assert loop_thread not in threads.values(), threads
