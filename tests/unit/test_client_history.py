"""History sources and the document's own date in the client library and the ``llamad``
verbs (issue 16): AsyncClient against the real RetrievalService in-process, and
``sources --add --history``, ``push --date`` and ``search --dated-since`` against the fake
daemon."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest

from clients import AsyncClient
from daemon.grpcapi.retrieval import RetrievalServicer
from llamad_protocol.v1 import retrieval_pb2_grpc
from retrieval import Retriever
from supervisor import ManualClock
from tests.support.cli_run import Run
from tests.support.embedder import history_retriever

# --- the client library against the real service ---------------------------------------


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[str, Retriever, ManualClock]]:
    """The real RetrievalService on a loopback port: (address, retriever, clock)."""
    r, clock = await history_retriever(tmp_path)
    server = grpc.aio.server()
    retrieval_pb2_grpc.add_RetrievalServiceServicer_to_server(RetrievalServicer(r), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}", r, clock
    finally:
        await server.stop(0)
        await r.close()


async def test_the_async_client_adds_history_pushes_dated_records_and_filters(
        served: tuple[str, Retriever, ManualClock]) -> None:
    """add_source(history, limits) gives a history Source; upsert_document(document_date)
    round-trips the date to Document and SearchHit; dated_since/dated_until filter;
    list_sources and retrieval status show what retention pruned."""
    address, r, clock = served
    now = datetime.fromtimestamp(int(clock.wall()), UTC)
    async with AsyncClient(address) as client:
        source = await client.add_source("shell", history=True, max_age_days=30,
                                         max_items=2)
        assert (source.kind, source.max_age_days, source.max_items) == ("history", 30, 2)
        for i in range(3):
            doc = await client.upsert_document(
                "shell", f"$ journalctl -u nginx\nrecord {i}: nginx worker crashed",
                document_id=f"shell/{i}", kind="session",
                document_date=now - timedelta(days=3 - i))
            assert doc.document_date == now - timedelta(days=3 - i)
        recent = await client.search("nginx worker crashed",
                                     dated_since=now - timedelta(days=2, hours=1))
        assert {h.document_id: h.document_date for h in recent.hits} == {
            "shell/1": now - timedelta(days=2), "shell/2": now - timedelta(days=1)}
        older = await client.search("nginx worker crashed",
                                    dated_until=now - timedelta(days=2, hours=1))
        assert [h.document_id for h in older.hits] == ["shell/0"]
        assert await r.prune() == 1
        [listed] = await client.list_sources()
        assert (listed.pruned, listed.documents) == (1, 2)
        assert (await client.retrieval_status()).pruned == 1
        assert (await client.get_document("shell/2")).document_date == now - timedelta(days=1)


# --- the llamad verbs against the fake ------------------------------------------------------


def local(text: str) -> str:
    """How ``llamad`` prints an ISO time given on its command line (local time)."""
    return datetime.fromisoformat(text).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def test_sources_add_history_then_push_records_with_dates(llamad: Run, tmp_path: Path) -> None:
    """sources --add --history shows the retention; push reads stdin or a file, dated by
    --date, and prints the date; the source table shows the retention and what it pruned
    (the fake prunes at each push) and search shows each hit's date."""
    status, out, err = llamad("sources", "--add", "shell", "--history", "--max-items", "2")
    assert (status, err) == (0, "")
    assert out == "shell: history source (2 items; 0 pruned)\n"
    for i, day in enumerate(("2026-11-28T08:00", "2026-11-29T08:00", "2026-11-30T08:00")):
        status, out, err = llamad("push", "shell", "--id", f"shell/{i}", "--kind", "session",
                                  "--date", day, stdin=f"$ df -h\n/ 9{i}% full\n")
        assert (status, err) == (0, "")
        assert out == f"shell/{i}: indexed, dated {local(day)}\n"
    transcript = tmp_path / "session.txt"
    transcript.write_text("$ uptime\nload average 9.1\n")
    status, out, _ = llamad("push", "shell", str(transcript), "--id", "shell/3",
                            "--date", "2026-12-01T08:00", "--json")
    assert status == 0 and '"document_date": "2026-12-01T' in out
    status, out, _ = llamad("sources")
    header, row = out.splitlines()
    assert "RETENTION" in header
    assert "2 items; 2 pruned" in row
    status, out, _ = llamad("status")
    assert out.splitlines()[-1].endswith("; 2 history records pruned since start")
    status, out, _ = llamad("search", "df full load")
    assert status == 0
    lines = out.splitlines()
    assert "DATED" in lines[0]
    assert any(local("2026-11-30T08:00") in line for line in lines[1:])


def test_search_dated_since_and_until(llamad: Run) -> None:
    """--dated-since and --dated-until keep the documents dated inside them; an undated
    document is left out once either is given."""
    llamad("sources", "--add", "notes")
    llamad("push", "notes", "--id", "old", "--date", "2025-01-01", stdin="disk alert old")
    llamad("push", "notes", "--id", "new", "--date", "2026-06-01", stdin="disk alert new")
    llamad("push", "notes", "--id", "undated", stdin="disk alert undated")

    def found(*flags: str) -> set[str]:
        status, out, _ = llamad("search", "disk alert", "--json", *flags)
        assert status == 0
        return {line.split('"')[3] for line in out.splitlines()
                if line.strip().startswith('"document_id"')}

    assert found() == {"old", "new", "undated"}
    assert found("--dated-since", "2026-01-01") == {"new"}
    assert found("--dated-until", "2026-01-01") == {"old"}


def test_ask_dated_since_cites_only_dated_sources_with_their_date(llamad: Run) -> None:
    """ask --dated-since: the answer's sources are only those dated since then, each
    printed with its date."""
    llamad("sources", "--add", "notes")
    llamad("push", "notes", "--id", "old", "--title", "Old", "--date", "2025-01-01",
           stdin="nginx logs rotated")
    llamad("push", "notes", "--id", "new", "--title", "New", "--date", "2026-06-01T10:00",
           stdin="nginx logs rotated again")
    status, out, _ = llamad("ask", "nginx logs", "--dated-since", "2026-01-01")
    assert status == 0
    sources = out.split("Sources:\n", 1)[1].splitlines()
    assert sources == [f"[S1] New (1.000, dated {local('2026-06-01T10:00')})"]


def test_history_flags_need_add_and_retention_needs_history(llamad: Run) -> None:
    """--history without --add is a usage error (2); retention without --history is
    refused by the daemon as an invalid argument (5); nothing is added."""
    status, out, err = llamad("sources", "--history")
    assert status == 2 and "go with --add ID" in err and out == ""
    status, out, err = llamad("sources", "--add", "x", "--max-items", "3")
    assert status == 5 and "apply to history sources only" in err
    assert llamad("sources")[2] == "llamad: sources: no sources\n"
