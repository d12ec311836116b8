"""Directory sources never read outside their root: files are opened beneath the root's
descriptor without following links, whatever is swapped meanwhile; a file the scan cannot
read (or whose name is not UTF-8) is reported for that file and the scan goes on."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from daemon.services.retrieval_bridge import rescan_loop
from retrieval import RetrievalLimits, Retriever, scan_source
from retrieval.errors import ExtractionError, SourceNotAllowed
from retrieval.extraction._confine import SourceRoot, display_name
from tests.support.races import OUTSIDE_DIR_WORD, swap_forever

OUTSIDE_FILE_WORD = "zanzibarquokka"
@pytest.fixture
async def retriever(tmp_path: Path) -> AsyncIterator[Retriever]:
    """A BM25-only retriever (no embedder): the scan and the text index are what count."""
    r = Retriever(tmp_path / "state", lambda: None)
    await r.open()
    yield r
    await r.close()


async def hits_for(r: Retriever, word: str) -> list[str]:
    return [h.doc_id for h in (await r.search(word)).hits]


# --- SourceRoot ------------------------------------------------------------------------


def test_open_file_refuses_a_symlink_even_to_a_file_inside(tmp_path: Path) -> None:
    """open_file follows no symlink: the link itself, and a link to a directory on the
    way, are refused as unreadable, while the plain path reads."""
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "a.md").write_text("inside")
    (tmp_path / "link.md").symlink_to(tmp_path / "real" / "a.md")
    (tmp_path / "dirlink").symlink_to(tmp_path / "real")
    with SourceRoot(tmp_path) as root:
        fd = root.open_file("real/a.md")
        try:
            assert os.read(fd, 100) == b"inside"
        finally:
            os.close(fd)
        for rel in ("link.md", "dirlink/a.md"):
            with pytest.raises(ExtractionError, match="symlink") as caught:
                root.open_file(rel)
            assert caught.value.kind == "unreadable"


@pytest.mark.parametrize("rel", ["../x.md", "a/../../x.md", "/etc/passwd", "./a.md", ""])
def test_open_file_refuses_paths_that_are_not_plain(tmp_path: Path, rel: str) -> None:
    """Dots, absolute paths and the empty path are refused before any open."""
    with SourceRoot(tmp_path) as root, pytest.raises(ExtractionError, match="plain relative"):
        root.open_file(rel)


def test_open_file_refuses_a_fifo_without_blocking(tmp_path: Path) -> None:
    """A FIFO (swapped in after a scan looked) is opened non-blocking and refused."""
    os.mkfifo(tmp_path / "pipe.md")
    with SourceRoot(tmp_path) as root, pytest.raises(ExtractionError) as caught:
        root.open_file("pipe.md")
    assert caught.value.kind == "not_regular"


def test_hard_links_are_read_unless_refused(tmp_path: Path) -> None:
    """A hard link is the file itself and is read; with refuse_hard_links a file with more
    than one link is refused, naming the option."""
    src, outside = tmp_path / "src", tmp_path / "outside.md"
    src.mkdir()
    outside.write_text("linked in")
    os.link(outside, src / "linked.md")
    with SourceRoot(src) as root:
        os.close(root.open_file("linked.md"))
    with SourceRoot(src, refuse_hard_links=True) as root, \
            pytest.raises(ExtractionError, match=r"retrieval\.refuse_hard_links") as caught:
        root.open_file("linked.md")
    assert caught.value.kind == "hard_link"


def test_a_root_that_is_a_symlink_is_not_opened(tmp_path: Path) -> None:
    """The root path must be the resolved one: if it or a directory above it now leads
    elsewhere (swapped after the check), the open is refused rather than scanning what it
    leads to."""
    (tmp_path / "elsewhere" / "sub").mkdir(parents=True)
    (tmp_path / "root").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError, match="Not a directory"):
        SourceRoot(tmp_path / "root")          # the last component: O_NOFOLLOW refuses it
    with pytest.raises(SourceNotAllowed, match="changed while being opened"):
        SourceRoot(tmp_path / "root" / "sub")  # one above it: the real path gives it away


def test_walk_lists_files_skips_hidden_and_never_enters_links(tmp_path: Path) -> None:
    """The walk is depth first in name order, leaves out hidden entries, lists a symlink
    to a directory as a file name (never entering it) and reports non-UTF-8 names."""
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "c.md").write_text("c")
    (tmp_path / "a.md").write_text("a")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "h.md").write_text("h")
    (tmp_path / "out").symlink_to("/etc")
    os.mkdir(os.fsencode(tmp_path) + b"/bad\xff")
    with SourceRoot(tmp_path) as root:
        seen = [(rel, names, problems) for rel, _, names, problems in root.walk()]
    assert seen == [
        ("", ["a.md", "out"], [("bad\\xff", "directory name is not valid UTF-8; "
                                            "rename it to index it")]),
        ("b", ["c.md"], []),
    ]


def test_close_while_an_open_is_under_way_waits_for_it(tmp_path: Path) -> None:
    """close() during an open (a cancelled task's thread still running) defers closing
    the root descriptor until that open returns, and later opens are refused."""
    (tmp_path / "a.md").write_text("a")
    root = SourceRoot(tmp_path)
    with root._using() as fd:
        root.close()
        os.fstat(fd)                      # still open: the user holds it
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(fd)                      # closed by the last user
    with pytest.raises(ExtractionError, match="scan ended"):
        root.open_file("a.md")


def test_display_name_escapes_bytes_that_are_not_utf8() -> None:
    """Names os hands over with lone surrogates are shown with \\x escapes."""
    assert display_name(os.fsdecode(b"bad\xff\xfe.txt")) == "bad\\xff\\xfe.txt"
    assert display_name("ü.md") == "ü.md"


# --- scans -------------------------------------------------------------------------------


async def test_a_file_swapped_for_a_symlink_during_scans_never_leaks_outside_bytes(
    retriever: Retriever, tmp_path: Path
) -> None:
    """A thread swapping a file and a directory inside a source for symlinks to outside,
    during repeated scans (for a bounded time), never gets a byte from outside indexed,
    while the inside files keep being indexed."""
    src, outside = tmp_path / "roots" / "src", tmp_path / "outside"
    (src / "sub").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret.txt").write_text(f"{OUTSIDE_FILE_WORD} outside only\n")
    (outside / "note.md").write_text(f"# Outside\n\n{OUTSIDE_DIR_WORD} outside only\n")
    (src / "sub" / "note.md").write_text("# Inside\n\ninside note\n")
    (src / "stable.md").write_text("# Stable\n\nalways here\n")
    await retriever.add_source("src", root=src)
    stop = threading.Event()
    racer = threading.Thread(target=swap_forever,
                             args=(src, outside / "secret.txt", outside, stop), daemon=True)
    racer.start()
    rounds = 0
    try:
        deadline = time.monotonic() + 4.0
        # 4 s of races, and never fewer than 20 rounds: a busy machine fit only 14 scans in
        # the 4 s (load 11, two xdist workers).
        while time.monotonic() < deadline or rounds < 20:
            await scan_source(retriever, "src", allowed_roots=[str(tmp_path / "roots")])
            rounds += 1
            assert await hits_for(retriever, OUTSIDE_FILE_WORD) == [], f"round {rounds}"
            assert await hits_for(retriever, OUTSIDE_DIR_WORD) == [], f"round {rounds}"
    finally:
        stop.set()
        racer.join(10)
    assert rounds >= 20
    assert await hits_for(retriever, "always") == ["src/stable.md"]


async def test_a_file_name_that_is_not_utf8_is_reported_and_the_scan_goes_on(
    retriever: Retriever, tmp_path: Path
) -> None:
    """A file (and a directory) whose name is not valid UTF-8 is skipped with its name
    escaped; every other file is indexed and the source records its scan."""
    src = tmp_path / "src"
    src.mkdir()
    raw = os.fsencode(src)
    with open(raw + b"/bad\xff\xfe.txt", "wb") as f:
        f.write(b"bad name\n")
    os.mkdir(raw + b"/dir\xff")
    (src / "good.md").write_text("# Good\n\nperfectly fine\n")
    await retriever.add_source("src", root=src)
    report = await scan_source(retriever, "src", allowed_roots=[str(tmp_path)])
    assert (report.seen, report.added, report.failed) == (1, 1, [])
    assert sorted(path for path, _ in report.skipped) == ["bad\\xff\\xfe.txt", "dir\\xff"]
    assert all("not valid UTF-8" in why for _, why in report.skipped)
    source = next(s for s in await retriever.sources() if s.id == "src")
    assert source.last_scan and source.last_error == ""
    assert await hits_for(retriever, "perfectly") == ["src/good.md"]


async def test_the_scheduled_rescan_survives_a_file_name_that_is_not_utf8(
    retriever: Retriever, tmp_path: Path
) -> None:
    """The background rescan indexes the other files despite a bad name, round after
    round."""
    src = tmp_path / "src"
    src.mkdir()
    with open(os.fsencode(src) + b"/bad\xff.md", "wb") as f:
        f.write(b"x\n")
    (src / "first.md").write_text("# First\n\nfirst file\n")
    await retriever.add_source("src", root=src)
    loop = asyncio.create_task(rescan_loop(retriever, 0.05, lambda: (str(tmp_path),)))

    async def found(word: str, doc_id: str) -> bool:
        for _ in range(500):
            if await hits_for(retriever, word) == [doc_id]:
                return True
            await asyncio.sleep(0.02)
        return False

    try:
        assert await found("first", "src/first.md")
        (src / "second.md").write_text("# Second\n\nsecond file\n")
        assert await found("second", "src/second.md")
    finally:
        loop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop


async def test_refuse_hard_links_fails_only_that_file(tmp_path: Path) -> None:
    """With refuse_hard_links, a hard-linked file is a per-file failure naming the option;
    the other files are indexed."""
    r = Retriever(tmp_path / "state", lambda: None, RetrievalLimits(refuse_hard_links=True))
    await r.open()
    try:
        src = tmp_path / "src"
        src.mkdir()
        (tmp_path / "outside.md").write_text("# Out\n\nlinked words\n")
        os.link(tmp_path / "outside.md", src / "linked.md")
        (src / "plain.md").write_text("# Plain\n\nplain words\n")
        await r.add_source("src", root=src)
        report = await scan_source(r, "src", allowed_roots=[str(tmp_path)])
        assert report.added == 1
        assert [p for p, _ in report.failed] == ["linked.md"]
        assert "retrieval.refuse_hard_links" in report.failed[0][1]
        assert await hits_for(r, "linked") == []
    finally:
        await r.close()


@pytest.mark.parametrize(("protected", "refuse", "roots", "warned"), [
    (False, False, "/srv/docs", True),
    (True, False, "/srv/docs", False),
    (None, False, "/srv/docs", False),   # unknown (no /proc/sys): nothing to say
    (False, True, "/srv/docs", False),   # refuse_hard_links closes it anyway
    (False, False, "", False),           # no directory sources at all
])
def test_start_warns_when_hard_links_are_unprotected(
    monkeypatch: pytest.MonkeyPatch, protected: bool | None, refuse: bool, roots: str,
    warned: bool
) -> None:
    """With directory sources allowed, fs.protected_hardlinks = 0 and hard links not
    refused, the daemon logs a warning naming both fixes; otherwise it says nothing."""
    from structlog.testing import capture_logs

    from daemon.config import load
    from daemon.ops import startup

    config = load(None, env={"LLAMAD_GENERATION_ENABLED": "false",
                             "LLAMAD_EMBEDDING_ENABLED": "false",
                             "LLAMAD_RETRIEVAL_ALLOWED_ROOTS": roots,
                             "LLAMAD_RETRIEVAL_REFUSE_HARD_LINKS": str(refuse).lower()})
    monkeypatch.setattr(startup, "protected_hardlinks", lambda: protected)
    with capture_logs() as logs:
        startup.warn_unprotected_hard_links(config)
    events = [e for e in logs if e["event"] == "hard links unprotected"]
    assert len(events) == (1 if warned else 0)
    if warned:
        assert "retrieval.refuse_hard_links" in events[0]["reason"]
        assert "fs.protected_hardlinks" in events[0]["reason"]


async def test_concurrent_scans_of_one_source_read_each_file_once(
    retriever: Retriever, tmp_path: Path
) -> None:
    """A Reindex and a scheduled rescan of the same new source at once: the second scan
    waits for the first and finds its files unchanged, so each file is read and indexed
    once and each report counts what it did."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(6):
        (src / f"doc{i}.md").write_text(f"# Doc {i}\n\nbody {i}\n")
    await retriever.add_source("src", root=src)
    reads: list[str] = []
    ingest_file = retriever.ingest_file

    async def counted(source: object, root: SourceRoot, rel: str,
                      target: str | None = None) -> object:
        reads.append(rel)
        await asyncio.sleep(0.01)
        return await ingest_file(source, root, rel, target)  # type: ignore[arg-type]

    retriever.ingest_file = counted  # type: ignore[assignment,method-assign]
    first, second = await asyncio.gather(scan_source(retriever, "src"),
                                         scan_source(retriever, "src"))
    assert sorted(reads) == [f"doc{i}.md" for i in range(6)]
    assert sorted([(first.added, first.unchanged), (second.added, second.unchanged)]) == [
        (0, 6), (6, 0)]
