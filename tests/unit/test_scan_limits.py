"""A directory source's caps count the documents it holds, never the files a scan skips
(issue 25): junk files (empty, unsupported, hidden, not regular, blank) take no room, a
document indexed before is never dropped for a cap, and new files past a cap are not
added, which the report, the source's status and a log line say."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import structlog

from retrieval import RetrievalLimits, Retriever, scan_source
from retrieval._scan_report import LISTED_BYTES, LISTED_ISSUES, REASON_CHARS, ScanReport

# Each of the source's first documents carries a word found nowhere else: its search key.
WORDS = ("amberquill", "basaltmoth", "cobaltfern", "duskwillow", "emberlynx")


def seed(root: Path) -> None:
    """Five documents, named to sort after every junk file the tests add."""
    root.mkdir()
    for i, word in enumerate(WORDS):
        (root / f"zz-{i}.md").write_text(f"# Runbook {i}\n\nKeyword {word}.\n")


async def opened(tmp_path: Path, **limits: Any) -> Retriever:
    r = Retriever(tmp_path / "index", lambda: None, RetrievalLimits(**limits))
    await r.open()
    return r


@pytest.fixture
def kb(tmp_path: Path) -> Path:
    root = tmp_path / "kb"
    seed(root)
    return root


async def assert_seeded_searchable(r: Retriever) -> None:
    for i, word in enumerate(WORDS):
        hits = (await r.search(word, k=1)).hits
        assert [h.doc_id for h in hits] == [f"kb/zz-{i}.md"], word


async def test_twenty_thousand_empty_files_delete_nothing(tmp_path: Path, kb: Path) -> None:
    """The tester's case at the default limit (20,000 files): 20,000 empty files added to
    a source of 5 documents leave all 5 indexed and searchable; the empty files are
    skipped as empty, take no room, and no limit is reported."""
    r = await opened(tmp_path)
    assert r.limits.max_files_per_source == 20_000
    await r.add_source("kb", root=kb)
    assert (await scan_source(r, "kb")).added == 5
    for i in range(20_000):
        os.close(os.open(kb / f"a{i:05}.md", os.O_CREAT | os.O_WRONLY, 0o644))
    report = await scan_source(r, "kb")
    assert (report.seen, report.added, report.unchanged, report.deleted) == (5, 0, 5, 0)
    assert report.skipped_total == 20_000 and report.failed_total == 0
    assert {why for _, why in report.skipped} == {"empty file: nothing to index"}
    assert report.limit_reached == ""
    assert len(await r.documents("kb")) == 5
    await assert_seeded_searchable(r)
    await r.close()


async def test_junk_files_take_no_room_below_a_lowered_limit(tmp_path: Path, kb: Path) -> None:
    """With max_files_per_source 6 and 5 documents held: hundreds of empty, unsupported,
    hidden and non-regular files and a blank one (it fails, giving its room back) leave
    room for exactly one new document, which is added; nothing is deleted."""
    r = await opened(tmp_path, max_files_per_source=6, ingest_workers=4)
    await r.add_source("kb", root=kb)
    await scan_source(r, "kb")
    for i in range(300):
        (kb / f"a{i:03}.md").touch()                      # empty
        (kb / f"b{i:03}.bin").write_bytes(b"\x00" * 8)    # unsupported suffix
        (kb / f".hidden{i:03}.md").write_text("hidden words")
    os.mkfifo(kb / "c-pipe.md")                            # not a regular file
    (kb / "d-blank.md").write_text("   \n\t\n")            # no text: fails
    (kb / "e-new.md").write_text("Keyword fernglade.\n")   # the one that fits
    report = await scan_source(r, "kb")
    assert (report.added, report.deleted, report.failed_total) == (1, 0, 1)
    assert report.failed[0][0] == "d-blank.md"
    assert report.limit_reached == ""
    assert [h.doc_id for h in (await r.search("fernglade", k=1)).hits] == ["kb/e-new.md"]
    assert len(await r.documents("kb")) == 6
    await assert_seeded_searchable(r)
    await r.close()


async def test_past_the_file_limit_new_files_wait_and_nothing_is_deleted(
        tmp_path: Path, kb: Path) -> None:
    """max_files_per_source 8 and 5 documents held: of 300 new files (sorted first), 3 are
    added and 297 are not, which the report, the source's status and a warning say; all
    5 stay searchable. Files deleted later free their room for the scan after."""
    r = await opened(tmp_path, max_files_per_source=8)
    await r.add_source("kb", root=kb)
    await scan_source(r, "kb")
    for i in range(300):
        (kb / f"a{i:03}.md").write_text(f"new note {i}\n")
    with structlog.testing.capture_logs() as logs:
        report = await scan_source(r, "kb")
    assert (report.added, report.deleted, report.unchanged) == (3, 0, 5)
    assert report.skipped_total == 297 and len(report.skipped) == LISTED_ISSUES
    assert all("retrieval.max_files_per_source" in why for _, why in report.skipped)
    assert report.limit_reached.startswith("297 new files not added: the source holds 8 "
                                           "documents (retrieval.max_files_per_source)")
    assert "every document indexed before is kept" in report.limit_reached
    [source] = await r.sources()
    assert report.limit_reached in source.last_error
    assert [e["not_added"] for e in logs if e["event"] == "source limit reached"] == [297]
    assert sorted(d.id for d in await r.documents("kb")) == \
        ["kb/a000.md", "kb/a001.md", "kb/a002.md", *(f"kb/zz-{i}.md" for i in range(5))]
    await assert_seeded_searchable(r)

    for name in ("a000.md", "a001.md", "zz-4.md"):
        (kb / name).unlink()
    again = await scan_source(r, "kb")
    assert (again.added, again.deleted) == (0, 3)  # the room is freed at the scan's end
    third = await scan_source(r, "kb")
    assert third.added == 3 and third.limit_reached.startswith("294 new files not added")
    assert len(await r.documents("kb")) == 8
    await r.close()


async def test_a_lowered_limit_keeps_every_document_and_refreshes_changed_ones(
        tmp_path: Path, kb: Path) -> None:
    """A source holding more documents than a lowered max_files_per_source keeps them all
    and still re-reads a changed one; only new files are refused."""
    r = await opened(tmp_path)
    await r.add_source("kb", root=kb)
    await scan_source(r, "kb")
    await r.close()
    r = await opened(tmp_path, max_files_per_source=2)
    (kb / "zz-0.md").write_text("# Runbook 0\n\nKeyword amberquill, now with mossbridge.\n")
    (kb / "a-new.md").write_text("Keyword lanternfig.\n")
    report = await scan_source(r, "kb")
    assert (report.changed, report.unchanged, report.added, report.deleted) == (1, 4, 0, 0)
    assert report.limit_reached.startswith("1 new files not added")
    assert [h.doc_id for h in (await r.search("mossbridge", k=1)).hits] == ["kb/zz-0.md"]
    assert (await r.search("lanternfig")).hits == []
    await assert_seeded_searchable(r)
    await r.close()


async def test_past_the_byte_limit_new_files_are_not_added(tmp_path: Path, kb: Path) -> None:
    """max_bytes_per_source counts the bytes held: a new file that would pass it is not
    added (saying so, naming the option), a smaller one that fits is, and the documents
    held stay."""
    held = sum(p.stat().st_size for p in kb.iterdir())
    r = await opened(tmp_path, max_bytes_per_source=held + 100)
    await r.add_source("kb", root=kb)
    await scan_source(r, "kb")
    (kb / "a-big.md").write_text("Keyword quartzbarrow. " + "filler " * 40)
    (kb / "b-small.md").write_text("Keyword tinsellark.\n")
    report = await scan_source(r, "kb")
    assert (report.added, report.deleted) == (1, 0)
    assert report.skipped == [("a-big.md", "not added: the source would hold more than "
                               f"{held + 100} bytes (retrieval.max_source_mb)")]
    assert "retrieval.max_source_mb" in report.limit_reached
    assert (await r.search("quartzbarrow")).hits == []
    assert [h.doc_id for h in (await r.search("tinsellark", k=1)).hits] == ["kb/b-small.md"]
    await assert_seeded_searchable(r)
    await r.close()


def test_a_report_lists_a_bounded_number_of_issues_and_counts_them_all() -> None:
    """At most LISTED_ISSUES of each kind and LISTED_BYTES of text in all are listed,
    reasons clipped to REASON_CHARS; the totals count every one."""
    report = ScanReport("kb")
    for i in range(1000):
        report.fail(f"f{i}.md", "binary")
    for i in range(1000):
        report.skip(f"{'d' * 200}/{i}.md", "x" * 5000)
    assert report.failed_total == report.skipped_total == 1000
    assert len(report.failed) == LISTED_ISSUES
    assert all(len(why) == REASON_CHARS for _, why in report.skipped)
    listed = sum(len(p) + len(why) for p, why in report.failed + report.skipped)
    assert listed <= LISTED_BYTES
    assert 0 < len(report.skipped) < LISTED_ISSUES
