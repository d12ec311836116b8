"""Sources over time: a disabled source is kept but neither searched nor rescanned, and a
scan since a time reads only the files modified after it (issue 16)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from retrieval import Filters, Hit, NotFound, Retriever, SourceDisabled, scan_source
from tests.support.embedder import HashEmbedder, filled


def doc_ids(hits: Sequence[Hit]) -> set[str]:
    return {h.doc_id for h in hits}


async def test_a_disabled_source_is_kept_but_neither_searched_nor_rescanned(
        tmp_path: Path) -> None:
    """Disabling a source keeps its documents (listed, counted) but leaves them out of
    every search — asked for by name it says so — and refuses its scan; enabling it
    brings them back; the flag survives a reopen."""
    root = tmp_path / "wiki"
    root.mkdir()
    (root / "page.txt").write_text("printer queue stuck on floor two\n")
    r = await filled(tmp_path / "index", HashEmbedder("m"))
    wiki = await r.add_source("wiki", root=root)
    await scan_source(r, wiki.id)
    assert doc_ids((await r.search("printer queue")).hits) >= {"wiki/page.txt"}
    row = await r.set_source_disabled("wiki", True)
    assert row.disabled
    assert "wiki/page.txt" not in doc_ids((await r.search("printer queue", k=10)).hits)
    named = await r.search("printer queue", filters=Filters(sources=("wiki",)))
    assert named.hits == []
    assert named.warnings == ["source wiki is disabled: not searched"]
    assert await r.document("wiki/page.txt") is not None
    with pytest.raises(SourceDisabled, match="enable it to scan it"):
        await scan_source(r, "wiki")
    assert doc_ids((await r.search("nginx logs")).hits) >= {"docs/disk"}  # others still
    await r.close()
    again = Retriever(tmp_path / "index", lambda: HashEmbedder("m"))
    await again.open()
    assert [s.disabled for s in await again.sources() if s.id == "wiki"] == [True]
    await again.set_source_disabled("wiki", False)
    assert "wiki/page.txt" in doc_ids((await again.search("printer queue")).hits)
    with pytest.raises(NotFound):
        await again.set_source_disabled("nope", True)
    await again.close()


async def test_a_scan_since_a_time_reads_only_the_files_modified_after_it(
        tmp_path: Path) -> None:
    """since: a file modified after it is read again even when its size and mtime match
    the index (its content re-checked); an older one is left without a comparison, even
    if it changed; a new file is added and a deleted one removed as usual."""
    root = tmp_path / "kb"
    root.mkdir()
    old, recent = root / "old.txt", root / "recent.txt"
    old.write_text("disk full on web01\n")
    recent.write_text("replication lag on db02\n")
    os.utime(old, ns=(1_000_000_000_000_000_000,) * 2)        # 2001
    os.utime(recent, ns=(1_800_000_000_000_000_000,) * 2)     # 2027
    r = Retriever(tmp_path / "index", lambda: HashEmbedder("m"))
    await r.open()
    source = await r.add_source("kb", root=root)
    assert (await scan_source(r, source.id)).added == 2
    read: list[str] = []
    ingest_file = r.ingest_file

    async def counted(source: object, opened: object, rel: str, target: object = None) -> object:
        read.append(rel)
        return await ingest_file(source, opened, rel, target)  # type: ignore[arg-type]

    r.ingest_file = counted  # type: ignore[assignment,method-assign]
    assert (await scan_source(r, source.id)).unchanged == 2 and read == []
    old.write_text("disk full on web01, and on web02\n")      # changed, but mtime kept old
    os.utime(old, ns=(1_000_000_000_000_000_000,) * 2)
    (root / "new.txt").write_text("vpn flapping\n")
    report = await scan_source(r, source.id, since_ns=1_500_000_000_000_000_000)
    assert sorted(read) == ["new.txt", "recent.txt"]
    assert (report.added, report.unchanged) == (1, 2)  # recent re-read: same content
    assert "web02" not in (await r.search("web02 disk")).hits[0].text
    recent.unlink()
    assert (await scan_source(r, source.id, since_ns=1_500_000_000_000_000_000)).deleted == 1
    await r.close()
