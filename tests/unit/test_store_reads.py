"""The embedded store's reads of chunks (a search's fetch stage, the copies of a text) do
not wait for a write transaction (issue 28): they go through a reader connection (WAL),
which sees the last commit; inside the transaction the writer reads its own rows."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

from retrieval.store._metadata import ChunkRow, DocumentRow, SourceRow, Store
from tests.support.load import patience


def doc(doc_id: str) -> DocumentRow:
    return dataclasses.replace(DocumentRow(doc_id, "docs", title=doc_id, kind="text",
                                           content_hash=f"h-{doc_id}", indexed_at=1))


def chunk(doc_id: str, text: str) -> list[ChunkRow]:
    return [ChunkRow(f"{doc_id}#1", 1, "", text, f"hash-{text}")]


def test_a_read_of_chunks_does_not_wait_for_a_write_transaction(tmp_path: Path) -> None:
    store = Store(tmp_path / "meta.sqlite")
    try:
        store.upsert_source(SourceRow("docs", "push"))
        store.replace_document(doc("docs/a"), chunk("docs/a", "alpha"))
        (a,) = store.document_chunk_keys("docs/a")
        inside, release = threading.Event(), threading.Event()
        own: dict[str, str] = {}

        def writer() -> None:
            with store._transaction():
                store._replace(doc("docs/b"), chunk("docs/b", "beta"))
                (b,) = store.document_chunk_keys("docs/b")
                own.update({c.chunk_id: c.text for c in store.chunks_by_keys([b]).values()})
                own["copies"] = ",".join(
                    c.chunk_id for c in store.copies_of(["hash-beta"], 5)["hash-beta"])
                inside.set()
                release.wait(patience(3))

        thread = threading.Thread(target=writer)
        thread.start()
        try:
            assert inside.wait(patience(3))
            # The writer holds its transaction (and the writer's lock) until released:
            # these reads return meanwhile, with what was committed before it.
            got = store.chunks_by_keys([a])
            copies = store.copies_of(["hash-alpha", "hash-beta"], 5)
            assert thread.is_alive() and not release.is_set()
            assert got[a].text == "alpha"
            assert [c.chunk_id for c in copies["hash-alpha"]] == ["docs/a#1"]
            assert copies["hash-beta"] == []  # not committed yet
        finally:
            release.set()
            thread.join(patience(3))
        assert own == {"docs/b#1": "beta", "copies": "docs/b#1"}  # the writer's own rows
        assert [c.chunk_id for c in store.copies_of(["hash-beta"], 5)["hash-beta"]] == [
            "docs/b#1"]  # committed now
    finally:
        store.close()
