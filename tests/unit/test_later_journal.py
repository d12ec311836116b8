"""Durable asynchronous pushes (issue 30): a document accepted with wait=false is in the
journal before the acceptance returns, leaves it once indexed, survives a retriever that
never closed (its tasks gone as a killed process's are) and is indexed at the next open,
in the order accepted; an unreadable journal file is set aside, not fatal. The real
kill -9 of a daemon is tests/integration/test_durable_push.py."""

from __future__ import annotations

import asyncio
import errno
import json
import stat
from pathlib import Path

import pytest

from retrieval import Query, RetrievalLimits, Retriever, _later
from retrieval.redaction._redactor import redact
from tests.support.embedder import HashEmbedder
from tests.support.eventually import eventually
from tests.support.held import hold_later_upserts


def journal(root: Path) -> list[Path]:
    folder = root / "pending"
    return sorted(folder.glob("*.json")) if folder.is_dir() else []


async def opened(root: Path) -> Retriever:
    r = Retriever(root, lambda: HashEmbedder("m"))
    await r.open()
    return r


async def crash(r: Retriever) -> None:
    """What a kill -9 leaves: the background upserts gone before they ended, nothing
    closed or flushed by the retriever itself (its SQLite commits are already durable)."""
    tasks = list(r._later._running)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_accepted_is_journaled_first_and_removed_once_indexed(tmp_path: Path) -> None:
    root = tmp_path / "index"
    r = await opened(root)
    try:
        await r.add_source("inbox")
        gate = hold_later_upserts(r)
        doc = await r.upsert_later("inbox", "Disk", "Rotate the nginx logs.", doc_id="inbox/a")
        assert doc.state == "pending"
        (saved,) = journal(root)
        entry = json.loads(saved.read_text())
        assert (entry["doc_id"], entry["text"]) == ("inbox/a", "Rotate the nginx logs.")
        assert stat.S_IMODE(saved.stat().st_mode) == 0o600
        assert stat.S_IMODE(saved.parent.stat().st_mode) == 0o700
        gate.set()

        async def indexed() -> bool:
            d = await r.document("inbox/a")
            return d is not None and d.state == "indexed" and not journal(root)
        await eventually(indexed)
    finally:
        await r.close()


async def test_pending_documents_survive_a_crash_in_order(tmp_path: Path) -> None:
    root = tmp_path / "index"
    r = await opened(root)
    await r.add_source("inbox")
    hold_later_upserts(r)  # never released: the "process" dies with them pending
    for i in range(5):
        await r.upsert_later("inbox", "Note", f"version {i} keyword quillon", doc_id="inbox/n")
    await r.upsert_later("inbox", "Other", "the other document basaltmoth",
                         doc_id="inbox/o")
    await crash(r)
    assert len(journal(root)) == 6
    await asyncio.to_thread(r._backend.close_sync)

    again = await opened(root)
    try:
        async def all_indexed() -> bool:
            docs = {d.id: d.state for d in await again.documents("inbox")}
            return docs == {"inbox/n": "indexed", "inbox/o": "indexed"} \
                and not journal(root)
        await eventually(all_indexed)
        hits = (await again.search("quillon")).hits
        assert hits[0].text.startswith("version 4")  # the last accepted won
        assert (await again.search("basaltmoth")).hits
    finally:
        await again.close()


async def test_an_unreadable_journal_file_is_set_aside(tmp_path: Path) -> None:
    root = tmp_path / "index"
    (root / "pending").mkdir(parents=True, mode=0o700)
    (root / "pending" / "000000000007.json").write_text("{not json")
    r = await opened(root)
    try:
        assert (root / "pending" / "000000000007.bad").exists()
        await r.add_source("inbox")
        await r.upsert_later("inbox", "New", "after the bad one", doc_id="inbox/new")
        assert journal(root)[-1].name == "000000000008.json"  # numbering goes on
    finally:
        await r.close()


async def test_concurrent_pushes_each_get_their_file_in_acceptance_order(
        tmp_path: Path) -> None:
    """Fifty acceptances at once (their writes run in worker threads side by side): fifty
    files, numbered in the order the upserts were queued, so a restart replays what ran."""
    root = tmp_path / "index"
    r = await opened(root)
    try:
        await r.add_source("inbox")
        gate = hold_later_upserts(r)
        await asyncio.gather(*(
            r.upsert_later("inbox", "N", f"version {i} of one note", doc_id="inbox/n")
            for i in range(50)))
        files = journal(root)
        assert len(files) == 50
        texts = [json.loads(f.read_text())["text"] for f in files]
        assert sorted(texts) == sorted(f"version {i} of one note" for i in range(50))
        gate.set()

        async def done() -> bool:
            return not journal(root)
        await eventually(done)
        hits = (await r.search("note", k=1)).hits
        assert hits[0].text == texts[-1]  # the last in the journal is the one indexed
    finally:
        await r.close()


async def test_a_push_the_journal_cannot_hold_is_refused_and_never_indexed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "index"
    r = await opened(root)
    try:
        await r.add_source("inbox")

        def full(*_: object) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")
        monkeypatch.setattr(_later, "_write", full)
        with pytest.raises(OSError, match="No space"):
            await r.upsert_later("inbox", "Disk", "never indexed", doc_id="inbox/x")
        await asyncio.sleep(0.2)
        assert await r.document("inbox/x") is None
        assert not r._later.pending and not r._later._running
    finally:
        await r.close()


# -- redacted before it is journaled -----------------------------------------------------

SECRETS = ("Hunter2Secret9", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
           "ghp_16C7e42F292c6912E7710c838347Ae178B4a")
PUSHED = ("---\ndate: 2024-03-05\n---\n# Vault\n\nThe db password: Hunter2Secret9\n\n"
          "export AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n"
          "rotate quarterly with the vaultword runbook\n")
TITLE = "Deploy token=ghp_16C7e42F292c6912E7710c838347Ae178B4a"


async def indexed_at_once(root: Path) -> tuple[int, int | None, str]:
    """The document as an upsert that waits indexes it: its redactions, date and hash."""
    r = await opened(root)
    try:
        await r.add_source("inbox")
        doc = await r.upsert("inbox", TITLE, PUSHED, doc_id="inbox/v", kind="markdown")
        return doc.redactions, doc.document_date, doc.content_hash
    finally:
        await r.close()


async def replayed(root: Path) -> Retriever:
    again = await opened(root)

    async def indexed() -> bool:
        d = await again.document("inbox/v")
        return d is not None and d.state == "indexed" and not journal(root)
    await eventually(indexed)
    return again


async def test_the_journal_never_holds_a_secret_and_the_count_survives_a_replay(
        tmp_path: Path) -> None:
    """A pushed text with three secrets (password, AWS secret key in the text, a GitHub
    token in the title): the journal file holds none of them, only placeholders and the
    count; replayed after a crash, the document has the redactions, date and content
    hash an upsert that waits gives it."""
    want = await indexed_at_once(tmp_path / "direct")
    assert want[0] == 2 and want[1] is not None
    root = tmp_path / "index"
    r = await opened(root)
    await r.add_source("inbox")
    hold_later_upserts(r)
    pending = await r.upsert_later("inbox", TITLE, PUSHED, doc_id="inbox/v", kind="markdown")
    assert not any(s in pending.title for s in SECRETS)
    (saved,) = journal(root)
    raw = saved.read_bytes()
    assert not [s for s in SECRETS if s.encode() in raw]
    entry = json.loads(raw)
    assert entry["redactions"] == 2 and "[REDACTED:password]" in entry["text"]
    assert entry["title"] == "Deploy token=[REDACTED:github_token]"
    await crash(r)
    await asyncio.to_thread(r._backend.close_sync)

    again = await replayed(root)
    try:
        doc = await again.document("inbox/v")
        assert doc is not None
        assert (doc.redactions, doc.document_date, doc.content_hash) == want
        assert (await again.search("vaultword")).hits
        assert not (await again.search("Hunter2Secret9", options=Query(mode="text"))).hits
    finally:
        await again.close()


async def test_a_journal_file_written_before_redaction_still_replays(tmp_path: Path) -> None:
    """A file of the earlier format (the text as pushed, no ``redactions``) is indexed at
    the next start as an upsert that waits indexes it: redacted then, counted then."""
    want = await indexed_at_once(tmp_path / "direct")
    root = tmp_path / "index"
    r = await opened(root)
    await r.add_source("inbox")
    await r.close()
    (root / "pending").mkdir(mode=0o700)
    (root / "pending" / "000000000003.json").write_text(json.dumps({
        "source_id": "inbox", "title": TITLE, "text": PUSHED, "doc_id": "inbox/v",
        "kind": "markdown", "category": "", "tags": [], "document_date": None,
        "received_at": 1_700_000_000, "review": False}))
    again = await replayed(root)
    try:
        doc = await again.document("inbox/v")
        assert doc is not None
        assert (doc.redactions, doc.document_date, doc.content_hash) == want
        assert not any(s in doc.title for s in SECRETS)
        assert not (await again.search("Hunter2Secret9", options=Query(mode="text"))).hits
    finally:
        await again.close()


async def test_a_push_at_the_size_limit_is_indexed_though_redaction_lengthens_it(
        tmp_path: Path) -> None:
    """The size limit is checked on the text as pushed: a text at the limit whose
    placeholder is longer than its secret is indexed, not failed for its new length."""
    r = Retriever(tmp_path / "index", lambda: HashEmbedder("m"),
                  limits=RetrievalLimits(max_document_chars=200))
    await r.open()
    try:
        await r.add_source("inbox")
        text = "password: abc123\n" + "word " * 36 + "end"
        assert len(text) == 200 and len(redact(text).text) > 200
        await r.upsert_later("inbox", "Edge", text, doc_id="inbox/e")

        async def indexed() -> bool:
            d = await r.document("inbox/e")
            return d is not None and d.state == "indexed" and d.redactions == 1
        await eventually(indexed)
    finally:
        await r.close()
