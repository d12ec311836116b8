"""``llamad retrieval migrate --to postgres`` (issue 17), against a real PostgreSQL 18 +
pgvector (tests/support/postgres.py): an embedded store built with the Retriever API is
copied into Postgres, where a retriever on the postgres store finds the same documents
with their vectors; a rerun writes nothing; a run stopped after a few batches resumes to
the same end state; history sources, versions held for review and rejected documents are
copied with their state; what is not copied is named, and a running daemon, a state
directory without a store and a corpus of another model are refused."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from daemon.cli import main
from daemon.ops.statelock import StateLock
from retrieval import PgOptions, Query, Retriever
from retrieval.postgres._store import PostgresStore
from tests.conftest import ROOT
from tests.support.embedder import HashEmbedder
from tests.support.terminal import in_tmux

MODEL = "hash-a"
TEXTS = {
    f"docs/{name}": text for name, text in {
        "disk": "web01 disk full: rotate nginx logs and check df",
        "db": "db02 replication lag: check replay timestamp on the replica",
        "vpn": "vpn tunnel flapping: tune dead peer detection",
        "cert": "tls certificate expired on the load balancer: renew with certbot",
        "dns": "dns resolution slow: unbound cache misses after restart",
        "oom": "java heap out of memory: raise xmx and look for leaking caches",
        "ntp": "clock drift on kafka brokers: chrony was stopped",
        "raid": "raid array degraded: replace the failed sata drive",
    }.items()
}
QUERIES = ("nginx logs", "replication replica", "certificate", "chrony clock", "sata drive",
           "cache")


async def build_embedded(state: Path) -> dict[str, set[str]]:
    """An embedded store in ``state`` (push documents with vectors, a disabled source, a
    history source, a source requiring review with a version held and one rejected);
    returns each query's text-mode hits."""
    r = Retriever(state / "retrieval", lambda: HashEmbedder(MODEL))
    await r.open()
    try:
        await r.add_source("docs")
        for doc_id, text in TEXTS.items():
            await r.upsert("docs", doc_id.split("/")[1], text, doc_id=doc_id)
        await r.add_source("old")
        await r.upsert("old", "legacy", "legacy nginx notes", doc_id="old/legacy")
        await r.set_source_disabled("old", True)
        await r.add_source("events", history=True)
        await r.upsert("events", "deploy", "deployed nginx 1.27", doc_id="events/1")
        await r.add_source("held")
        await r.upsert("held", "proxy", "haproxy backend weights v1", doc_id="held/3")
        await r.add_source("held", review_required=True)
        await r.upsert("held", "proxy", "haproxy backend weights v2 tuned", doc_id="held/3")
        await r.upsert("held", "secret", "nginx reverse proxy notes", doc_id="held/1",
                       review=True)
        await r.upsert("held", "names", "customer list: alice bob", doc_id="held/2")
        await r.reject("held/2", note="names customers")
        return {q: hits(await r.search(q, k=20, options=Query(mode="text")))
                for q in QUERIES}
    finally:
        await r.close()


def hits(result: object) -> set[str]:
    return {h.doc_id for h in getattr(result, "hits", [])}


def run(state: Path, dsn: str, *extra: str) -> int:
    return main(["retrieval", "migrate", "--to", "postgres", "--state-dir", str(state),
                 "--retrieval-postgres-dsn", dsn, *extra])


def snapshot(dsn: str) -> tuple[dict[str, tuple[str, str]], int, int]:
    """Documents (state, content hash), chunks, vectors of the Postgres store."""
    pg = PostgresStore.open(PgOptions(dsn))
    try:
        docs = {d.id: (d.state, d.content_hash) for d in pg.documents()}
        return docs, pg.chunk_count(), pg.embedded_chunks(MODEL)
    finally:
        pg.close()


async def test_a_migrated_store_is_found_on_postgres_with_its_vectors(
        tmp_path: Path, pg_dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The copy answers text searches with the same documents, has every chunk's vector
    (a vector search finds a document by its own text), keeps the disabled source out,
    keeps the history source's record, the version held for review (approved there, it is
    indexed) and the rejected document with its note."""
    state = tmp_path / "state"
    expected = await build_embedded(state)
    assert run(state, pg_dsn) == 0
    out = capsys.readouterr()
    assert "documents written: 11 (11 chunks, 11 with a vector of hash-a, 0 without)" \
        in out.out
    assert "states of documents not indexed written: 3" in out.out
    assert "skipped: nothing" in out.out
    assert "11/11 documents, 11/11 chunks" in out.err

    node = Retriever(tmp_path / "node", lambda: HashEmbedder(MODEL),
                     postgres=PgOptions(pg_dsn))
    await node.open()
    try:
        for query, want in expected.items():
            assert hits(await node.search(query, k=20, options=Query(mode="text"))) == want, \
                query
        found = await node.search(TEXTS["docs/raid"], k=1, options=Query(mode="vector"))
        assert hits(found) == {"docs/raid"}
        status = await node.status()
        assert status.vectors == 11
        sources = {s.id: (s.kind, s.disabled, s.review_required)
                   for s in await node.sources()}
        assert sources == {"docs": ("push", False, False), "old": ("push", True, False),
                           "events": ("history", False, False),
                           "held": ("push", False, True)}
        rejected = await node.document("held/2")
        assert rejected is not None
        assert (rejected.state, rejected.review_note) == ("rejected", "names customers")
        assert (await node.document("held/1")).state == "review_required"  # type: ignore[union-attr]
        assert "held/1" not in hits(await node.search("reverse proxy",
                                                      options=Query(mode="text")))
        assert (await node.approve("held/1")).state == "indexed"
        assert "held/1" in hits(await node.search("reverse proxy",
                                                  options=Query(mode="text")))
        # A new version held while the one indexed before stays searchable.
        assert (await node.document("held/3")).state == "review_required"  # type: ignore[union-attr]
        assert "held/3" in hits(await node.search("haproxy weights v1",
                                                  options=Query(mode="text")))
        assert "held/3" not in hits(await node.search("tuned", options=Query(mode="text")))
        await node.approve("held/3")
        assert "held/3" in hits(await node.search("tuned", options=Query(mode="text")))
    finally:
        await node.close()


async def test_a_rerun_writes_nothing(tmp_path: Path, pg_dsn: str,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "state"
    await build_embedded(state)
    assert run(state, pg_dsn) == 0
    before = snapshot(pg_dsn)
    capsys.readouterr()
    assert run(state, pg_dsn) == 0
    out = capsys.readouterr().out
    assert "documents written: 0 (0 chunks" in out
    assert "already present (same content): 11" in out
    assert "states of documents not indexed written: 0" in out
    assert snapshot(pg_dsn) == before


async def test_a_run_stopped_after_two_batches_resumes_to_the_same_end(
        tmp_path: Path, pg_dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Stopped after 2 batches of 2 documents (exit 3), four documents are in; the rerun
    copies the other five, and the end state is a complete run's."""
    state = tmp_path / "state"
    await build_embedded(state)
    assert run(state, pg_dsn, "--batch-documents", "2", "--max-batches", "2") == 3
    docs, chunks, vectors = snapshot(pg_dsn)
    assert (len(docs), chunks, vectors) == (4, 4, 4)
    assert "stopped early" in capsys.readouterr().out
    assert run(state, pg_dsn, "--batch-documents", "2") == 0
    assert "already present (same content): 4" in capsys.readouterr().out
    docs, chunks, vectors = snapshot(pg_dsn)
    assert set(docs) == {*TEXTS, "old/legacy", "events/1", "held/1", "held/2", "held/3"}
    assert {d: state for d, (state, _) in docs.items() if state != "indexed"} == {
        "held/1": "review_required", "held/2": "rejected", "held/3": "review_required"}
    assert (chunks, vectors) == (11, 11)


async def test_a_corpus_of_another_model_is_refused_and_nothing_written(
        tmp_path: Path, pg_dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "state"
    await build_embedded(state)
    other = Retriever(tmp_path / "node", lambda: HashEmbedder("hash-b"),
                      postgres=PgOptions(pg_dsn))
    await other.open()
    try:
        await other.add_source("notes")
        await other.upsert("notes", "n", "a note embedded with hash-b", doc_id="notes/n")
    finally:
        await other.close()
    assert run(state, pg_dsn) == 2
    err = capsys.readouterr().err
    assert "refused" in err and "hash-a" in err and "hash-b" in err
    docs, _, _ = snapshot(pg_dsn)
    assert set(docs) == {"notes/n"}


async def test_a_state_dir_in_use_or_without_a_store_is_refused(
        tmp_path: Path, pg_dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(tmp_path / "empty", pg_dsn) == 2
    assert "no embedded retrieval store" in capsys.readouterr().err
    state = tmp_path / "state"
    await build_embedded(state)
    lock = StateLock(state)
    lock.acquire()  # a daemon on this state directory
    try:
        assert run(state, pg_dsn) == 2
        assert "in use" in capsys.readouterr().err
    finally:
        lock.release()
    docs, _, _ = snapshot(pg_dsn)
    assert docs == {}


def test_the_dsn_and_password_come_from_the_environment_as_for_serve(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A DSN holding a password is refused as ``serve`` refuses it, and the password is
    never echoed."""
    monkeypatch.setenv("LLAMAD_RETRIEVAL_POSTGRES_DSN",
                       "postgresql://llamad:hunter2@db.example.net/kb")
    assert main(["retrieval", "migrate", "--to", "postgres",
                 "--state-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "retrieval.postgres_dsn" in err and "hunter2" not in err


async def build_many(state: Path, count: int) -> None:
    r = Retriever(state / "retrieval", lambda: HashEmbedder(MODEL))
    await r.open()
    try:
        await r.add_source("many")
        for i in range(count):
            await r.upsert("many", f"n{i}", f"note {i}: disk {i} on web{i:02d} is full",
                           doc_id=f"many/{i}")
    finally:
        await r.close()


def test_a_run_killed_after_a_batch_resumes_to_the_same_end(
        tmp_path: Path, pg_dsn: str) -> None:
    """``kill -9`` of the command once it reports a committed batch: the rerun finds
    that batch present, copies the rest, and the end state is a complete run's."""
    state = tmp_path / "state"
    asyncio.run(build_many(state, 60))
    with subprocess.Popen(
            [sys.executable, "-m", "daemon", "retrieval", "migrate", "--to", "postgres",
             "--state-dir", str(state), "--retrieval-postgres-dsn", pg_dsn,
             "--batch-documents", "2"], cwd=ROOT, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True) as proc:
        assert proc.stderr is not None
        line = proc.stderr.readline()     # printed after the first batch committed
        proc.kill()
        proc.wait()
    assert "documents" in line, line
    out = subprocess.run(
        [sys.executable, "-m", "daemon", "retrieval", "migrate", "--to", "postgres",
         "--state-dir", str(state), "--retrieval-postgres-dsn", pg_dsn],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=True).stdout
    present = int(out.split("already present (same content): ")[1].split()[0])
    assert present >= 2
    docs, chunks, vectors = snapshot(pg_dsn)
    assert set(docs) == {f"many/{i}" for i in range(60)}
    assert (chunks, vectors) == (60, 60)


def test_progress_is_a_bar_in_a_real_terminal_and_lines_elsewhere(
        tmp_path: Path, pg_dsn: str) -> None:
    """Not on a terminal (stderr a pipe): a plain line per report, no bar. In a real
    terminal (tmux): a tqdm bar of the chunks with the documents, total, rate and ETA,
    redrawn as the batches commit and erased at the end, the summary left on screen."""
    state = tmp_path / "state"
    asyncio.run(build_many(state, 60))
    command = [sys.executable, "-m", "daemon", "retrieval", "migrate", "--to", "postgres",
               "--state-dir", str(state), "--retrieval-postgres-dsn", pg_dsn,
               "--batch-documents", "2"]
    piped = subprocess.run([*command, "--max-batches", "3"], cwd=ROOT, capture_output=True,
                           text=True, timeout=300, check=False)
    assert piped.returncode == 3, piped.stderr
    lines = piped.stderr.splitlines()
    assert lines and all(line.startswith("llamad: migrate: ") for line in lines), lines
    assert "\r" not in piped.stderr and "chunks/s]" not in piped.stderr
    assert "6/60 documents, 6/60 chunks" in lines[-1]

    shown = in_tmux(command, cwd=ROOT, env=os.environ)
    assert shown.status == 0, shown.screen
    frames = [f for f in shown.drawn.replace("\n", "\r").split("\r") if "migrate:" in f]
    bar = re.compile(r"migrate: +\d+%\|.*\| *(\d+)/54 \[\d\d:\d\d<(\d\d:\d\d|\?), "
                     r" *[\d.?]+ ?chunks/s, (\d+)/54 documents\]")
    seen = [m for m in map(bar.search, frames) if m]
    assert len(seen) >= 5, frames  # redrawn batch by batch (27 batches of 2)
    assert [int(m.group(1)) for m in seen] == sorted(int(m.group(1)) for m in seen)
    assert any(m.group(2) != "?" for m in seen)  # an ETA once the rate is known
    assert "migrated into" in shown.screen and ": complete" in shown.screen
    assert "%|" not in shown.screen, shown.screen  # the bar is erased; the summary stays
