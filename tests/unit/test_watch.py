"""Live change detection (issue 30): real inotify on real directories, a real retriever
(embedded store, BM25 only), the watcher's own scans. A saved file becomes searchable, a
burst is one scan, new subdirectories are watched, a renamed or re-created root is watched
again, and the walk's confinement holds (no symlinked or hidden directory is watched)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from retrieval import Retriever, scan_source
from retrieval._watch import IN_CLOSE_WRITE, Inotify, SourceWatcher
from tests.support.eventually import eventually


def found(r: Retriever, word: str, present: bool = True) -> Callable[[], Awaitable[bool]]:
    """A check: is ``word`` found (or, ``present`` False, not found) by a search?"""
    async def check() -> bool:
        return bool((await r.search(word, k=1)).hits) is present
    return check


@pytest.fixture
async def kb(tmp_path: Path) -> AsyncIterator[tuple[Retriever, Path]]:
    root = tmp_path / "roots" / "kb"
    root.mkdir(parents=True)
    (root / "first.md").write_text("# First\n\nKeyword amberquill.\n")
    r = Retriever(tmp_path / "index", lambda: None)
    await r.open()
    await r.add_source("kb", root=root)
    await scan_source(r, "kb")
    yield r, root
    await r.close()


@contextlib.asynccontextmanager
async def watching(r: Retriever, roots: Path, **options: float
                   ) -> AsyncIterator[SourceWatcher]:
    """A running watcher of ``r`` (short debounce and retry unless given), armed."""
    options = {"debounce": 0.1, "retry": 0.2, **options}
    watcher = SourceWatcher(r, lambda: (str(roots),), **options)  # type: ignore[arg-type]
    task = asyncio.create_task(watcher.run())

    async def armed() -> bool:
        return watcher.watched_dirs > 0
    try:
        await eventually(armed)
        yield watcher
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def test_inotify_reports_a_closed_file(tmp_path: Path) -> None:
    ino = Inotify()
    try:
        ino.add(str(tmp_path))
        (tmp_path / "a.md").write_text("x")
        events = ino.read()
        assert any(mask & IN_CLOSE_WRITE and name == "a.md" for _wd, mask, name in events)
        assert ino.read() == []  # drained; never blocks
    finally:
        ino.close()


async def test_a_saved_file_is_searchable_without_a_rescan(
        kb: tuple[Retriever, Path]) -> None:
    r, root = kb
    async with watching(r, root.parent) as watcher:
        (root / "new.md").write_text("# New\n\nKeyword basaltmoth.\n")
        await eventually(found(r, "basaltmoth"))
        (root / "new.md").write_text("# New\n\nKeyword cobaltfern.\n")  # edited in place
        await eventually(found(r, "cobaltfern"))
        assert await found(r, "basaltmoth", present=False)()
        (root / "new.md").unlink()
        await eventually(found(r, "cobaltfern", present=False))
        assert watcher.scans == 3


async def test_a_burst_of_a_thousand_files_is_one_scan(kb: tuple[Retriever, Path]) -> None:
    """Written from another thread while the watcher runs, as a checkout would: the
    watcher sees the events as they come, and still scans once (the writes never pause
    for the debounce; 3 s is far above a pause between two small writes)."""
    r, root = kb

    def checkout() -> None:
        for i in range(1000):
            (root / f"f{i:04}.md").write_text(f"# File {i}\n\nKeyword kestrel{i}.\n")

    async with watching(r, root.parent, debounce=3.0, max_delay=60.0) as watcher:
        await asyncio.to_thread(checkout)
        await eventually(found(r, "kestrel999"), timeout=120.0)
        assert len(await r.documents("kb")) == 1001
        assert watcher.scans == 1


async def test_a_new_subdirectory_is_watched(kb: tuple[Retriever, Path]) -> None:
    r, root = kb
    async with watching(r, root.parent) as watcher:
        before = watcher.watched_dirs
        (root / "notes" / "deeper").mkdir(parents=True)

        async def rearmed() -> bool:
            return watcher.watched_dirs == before + 2 and watcher.scans >= 1
        await eventually(rearmed)
        (root / "notes" / "deeper" / "late.md").write_text("# Late\n\nKeyword duskwillow.\n")
        await eventually(found(r, "duskwillow"))


async def test_a_renamed_then_recreated_root_is_watched_again(
        kb: tuple[Retriever, Path]) -> None:
    r, root = kb
    async with watching(r, root.parent) as watcher:
        root.rename(root.with_name("kb.old"))

        async def lost() -> bool:
            return watcher.watched_dirs == 0
        await eventually(lost)
        (root.with_name("kb.old") / "moved.md").write_text("# Moved\n\nKeyword emberlynx.\n")
        root.mkdir()
        (root / "again.md").write_text("# Again\n\nKeyword foxglade.\n")
        await eventually(found(r, "foxglade"))
        assert await found(r, "emberlynx", present=False)()  # the old tree is not watched
        await eventually(found(r, "amberquill", present=False))  # left with the old root


async def test_links_hidden_directories_and_other_roots_are_not_watched(
        tmp_path: Path, kb: tuple[Retriever, Path]) -> None:
    r, root = kb
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, root / "link")
    (root / ".hidden").mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    await r.add_source("other", root=elsewhere)  # not under the allowed roots
    async with watching(r, root.parent) as watcher:
        assert watcher.watched_dirs == 1  # the root alone
        (outside / "o.md").write_text("# Out\n\nKeyword gloamrook.\n")
        (root / ".hidden" / "h.md").write_text("# Hidden\n\nKeyword hollowpine.\n")
        (elsewhere / "e.md").write_text("# Else\n\nKeyword ironmarsh.\n")
        await asyncio.sleep(1.0)  # ten debounces: a scan would have started
        assert watcher.scans == 0


async def test_a_disabled_source_is_no_longer_watched(kb: tuple[Retriever, Path]) -> None:
    r, root = kb
    async with watching(r, root.parent) as watcher:
        await r.set_source_disabled("kb", True)

        async def dropped() -> bool:
            return watcher.watched_dirs == 0
        await eventually(dropped)
        (root / "late.md").write_text("# Late\n\nKeyword juniperash.\n")
        await asyncio.sleep(1.0)
        assert watcher.scans == 0
