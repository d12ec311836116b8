"""Review holds on the PostgreSQL store, against a real PostgreSQL 18 + pgvector
(tests/support/postgres.py): the embedded store's review tests (tests/unit/test_review.py)
run unchanged on Postgres, and across two nodes: a version held through one is approved
or rejected through the other, and a version pushed through one while the other approves
waits for its own review instead of being dropped by the approval."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from retrieval import Query, Retriever
from retrieval.postgres._indexes import PgDocumentStore, PgIndexes
from tests.support.held import hold_commits
from tests.support.postgres import on_postgres, two_nodes
from tests.unit import test_review as embedded

EMBEDDED_TESTS = [
    embedded.test_a_held_document_is_stored_but_neither_chunked_embedded_nor_searchable,
    embedded.test_approval_indexes_the_held_text_and_keeps_the_note,
    embedded.test_approving_a_file_indexes_what_was_reviewed_even_after_it_changed,
    embedded.test_rejection_withdraws_the_document_and_sticks_until_it_changes,
    embedded.test_a_file_changed_back_to_the_approved_content_needs_no_review,
    embedded.test_held_and_rejected_documents_survive_a_restart,
    embedded.test_review_refusals,
    embedded.test_a_held_document_can_be_deleted,
    embedded.test_turning_review_on_and_off_for_a_source,
    embedded.test_a_background_push_goes_pending_processing_review_required,
    embedded.test_a_version_pushed_during_an_approval_waits_for_its_own_review,
    embedded.test_a_credential_in_a_note_is_redacted,
]


@pytest.fixture
def review_on_postgres(monkeypatch: pytest.MonkeyPatch, pg_dsn: str) -> None:
    """The embedded review tests' retrievers made on the PostgreSQL store: the same
    calls, the store and backend classes they gate being Postgres's."""
    on_postgres(monkeypatch, embedded, pg_dsn)
    monkeypatch.setattr(embedded, "store_of", lambda r: r._backend.require())
    monkeypatch.setattr(embedded, "Store", PgDocumentStore)
    monkeypatch.setattr(embedded, "Indexes", PgIndexes)


@pytest.mark.parametrize("test", EMBEDDED_TESTS, ids=lambda t: t.__name__)
async def test_the_embedded_review_behaviour_on_postgres(
        test: Callable[..., Awaitable[None]], review_on_postgres: None, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each embedded review test, its retrievers on the PostgreSQL store."""
    if "monkeypatch" in test.__code__.co_varnames[:test.__code__.co_argcount]:
        await test(tmp_path, monkeypatch)
    else:
        await test(tmp_path)


Nodes = tuple[Retriever, Retriever]


@pytest.fixture
async def nodes(tmp_path: Path, pg_dsn: str) -> AsyncIterator[Nodes]:
    async with two_nodes(tmp_path, pg_dsn) as both:
        yield both


async def found(r: Retriever, query: str) -> set[str]:
    return {h.doc_id for h in (await r.search(query, options=Query(mode="text"))).hits}


async def test_a_version_held_through_one_node_is_decided_through_the_other(
        nodes: Nodes) -> None:
    """Held through A: B lists it awaiting review and approves it (searchable on both);
    a new version held through B is rejected through A (gone from both, rejected)."""
    a, b = nodes
    await a.add_source("inbox", review_required=True)
    await a.upsert("inbox", "p", "printer jammed on floor two", doc_id="inbox/p")
    assert [d.id for d in await b.documents(states=["review_required"])] == ["inbox/p"]
    assert (await b.approve("inbox/p", note="ok")).state == "indexed"
    assert await found(a, "printer jammed") == {"inbox/p"}
    await b.upsert("inbox", "p", "customer list: alice bob", doc_id="inbox/p")
    held = await a.document("inbox/p")
    assert held is not None and held.state == "review_required"
    rejected = await a.reject("inbox/p", note="names customers")
    assert (rejected.state, rejected.review_note) == ("rejected", "names customers")
    assert await found(b, "printer jammed") == set()
    assert (await b.document("inbox/p")).state == "rejected"  # type: ignore[union-attr]


async def test_a_version_pushed_through_another_node_during_an_approval_waits(
        nodes: Nodes, monkeypatch: pytest.MonkeyPatch) -> None:
    """While A's approval commits, a new version pushed through B waits for A's review
    turn: it is held after the approval, never dropped by it."""
    a, b = nodes
    await a.add_source("inbox", review_required=True)
    await a.upsert("inbox", "a", "printer jammed on floor two", doc_id="inbox/a")
    entered = asyncio.Event()
    gate = hold_commits(monkeypatch, PgIndexes, entered=entered)
    approving = asyncio.create_task(a.approve("inbox/a", note="ok"))
    await entered.wait()  # A's approval is committing
    pushing = asyncio.create_task(b.upsert("inbox", "a", "kerberos tickets expire",
                                           doc_id="inbox/a"))
    await asyncio.sleep(0.3)
    assert not pushing.done()  # B waits for A's review turn
    gate.set()
    assert (await approving).state == "indexed"
    assert (await pushing).state == "review_required"
    held_version = b._backend.require().held_document("inbox/a")
    assert held_version is not None and "kerberos" in held_version[1]
    assert await found(b, "printer jammed floor") == {"inbox/a"}
    assert await found(a, "kerberos tickets") == set()
