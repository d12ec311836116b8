"""A directory source's exclude patterns and the built-in credential defaults (issue 30),
through real scans of a real retriever (embedded store, BM25 only): nothing excluded is
indexed, looked at or entered; the counts reach the report and the source; changing the
patterns removes what they now exclude; bad patterns are refused naming the limit."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from retrieval import InvalidDocument, RetrievalLimits, Retriever, scan_source
from tests.support.exclusions import write_tree


@pytest.fixture
async def retriever(tmp_path: Path) -> AsyncIterator[Retriever]:
    r = Retriever(tmp_path / "index", lambda: None,
                  RetrievalLimits(max_exclude_patterns=4, max_exclude_chars=64))
    await r.open()
    yield r
    await r.close()


async def ids(r: Retriever) -> list[str]:
    return sorted(d.id for d in await r.documents("kb"))


async def test_defaults_and_patterns_leave_files_unindexed_and_unlooked_at(
        tmp_path: Path, retriever: Retriever) -> None:
    root = tmp_path / "kb"
    write_tree(root)
    # Were these looked at, the scan would list them as skipped: a link out of the root,
    # and a directory whose file name is not UTF-8.
    os.symlink("/etc/hostname", root / "drafts" / "escape.md")
    (root / "runbooks" / "private" / os.fsdecode(b"bad\xff.md")).write_text("x")
    await retriever.add_source("kb", root=root, exclude=["private/", "/drafts"])
    report = await scan_source(retriever, "kb")
    assert await ids(retriever) == ["kb/runbooks/disk.md"]
    # tls/server.pem, ssh/id_ed25519, gcp/credentials.json, runbooks/private, drafts
    assert report.excluded == 5
    assert report.skipped == []
    (source,) = await retriever.sources()
    assert (source.exclude, source.excluded) == (("private/", "/drafts"), 5)
    for word in ("basaltmoth", "cobaltfern", "duskwillow", "emberlynx", "foxglade"):
        assert (await retriever.search(word)).hits == [], word


async def test_changed_patterns_remove_what_they_now_exclude_and_restore_the_rest(
        tmp_path: Path, retriever: Retriever) -> None:
    root = tmp_path / "kb"
    write_tree(root)
    await retriever.add_source("kb", root=root)
    await scan_source(retriever, "kb")
    assert await ids(retriever) == ["kb/drafts/todo.md", "kb/runbooks/disk.md",
                                    "kb/runbooks/private/notes.md"]
    await retriever.add_source("kb", root=root,
                               exclude=["notes.md", "!gcp/credentials.json"])
    report = await scan_source(retriever, "kb")
    assert report.deleted == 1
    assert await ids(retriever) == ["kb/drafts/todo.md", "kb/gcp/credentials.json",
                                    "kb/runbooks/disk.md"]
    assert (await retriever.search("emberlynx")).hits  # a default included again with !
    await retriever.add_source("kb", root=root)  # patterns cleared: all back
    await scan_source(retriever, "kb")
    assert "kb/runbooks/private/notes.md" in await ids(retriever)


async def test_defaults_off(tmp_path: Path) -> None:
    root = tmp_path / "kb"
    write_tree(root)
    r = Retriever(tmp_path / "index", lambda: None, RetrievalLimits(exclude_defaults=False))
    await r.open()
    try:
        await r.add_source("kb", root=root)
        report = await scan_source(r, "kb")
        assert report.excluded == 0
        assert "kb/gcp/credentials.json" in await ids(r)
    finally:
        await r.close()


@pytest.mark.parametrize(("exclude", "message"), [
    (["a", "b", "c", "d", "e"], r"at most 4 \(retrieval.max_exclude_patterns\)"),
    (["x" * 65], r"retrieval.max_exclude_chars"),
    (["a\nb"], r"control character"),
])
async def test_bad_patterns_are_refused_and_change_nothing(
        tmp_path: Path, retriever: Retriever, exclude: list[str], message: str) -> None:
    root = tmp_path / "kb"
    root.mkdir()
    await retriever.add_source("kb", root=root, exclude=["keep/"])
    with pytest.raises(InvalidDocument, match=message):
        await retriever.add_source("kb", root=root, exclude=exclude)
    (source,) = await retriever.sources()
    assert source.exclude == ("keep/",)


async def test_patterns_belong_to_directory_sources(retriever: Retriever) -> None:
    with pytest.raises(InvalidDocument, match="directory sources only"):
        await retriever.add_source("pushed", exclude=["*.md"])
