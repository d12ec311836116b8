"""Two ``llamad serve`` processes configured with ``retrieval.store = postgres`` on one real
PostgreSQL 18 + pgvector (tests/support/postgres.py), no model running (BM25-only): a
document pushed to one daemon is found by the other's Search at once, a delete on the other
is gone on the first, both Status calls name the store, and the password (from an
environment variable) appears in neither daemon's log."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import psycopg

from llamad_protocol.v1 import retrieval_pb2 as rpb
from llamad_protocol.v1 import retrieval_pb2_grpc
from tests.support.daemon import config_env
from tests.support.daemon_process import DaemonProcess
from tests.support.postgres import PgServer

SECRET = "n0des-Share-the-kb"


def test_two_daemons_share_one_postgres_store(
        tmp_path: Path, pg_server: PgServer, pg_dsn: str,
        processes: Callable[..., DaemonProcess]) -> None:
    pg_server.create_role("llamad_nodes", SECRET, superuser=True)
    dbname = str(psycopg.conninfo.conninfo_to_dict(pg_dsn)["dbname"])
    env = config_env("llama-server", LLAMAD_GENERATION_ENABLED="false",
                     LLAMAD_EMBEDDING_ENABLED="false", LLAMAD_RETRIEVAL_STORE="postgres",
                     LLAMAD_RETRIEVAL_POSTGRES_DSN=pg_server.dsn(dbname, user="llamad_nodes"),
                     LLAMAD_RETRIEVAL_POSTGRES_PASSWORD_ENV="LLAMAD_TEST_KB_PASSWORD",
                     LLAMAD_TEST_KB_PASSWORD=SECRET, LLAMAD_LOG_LEVEL="debug")
    a = processes(tmp_path, {**env, "LLAMAD_STATE_DIR": str(tmp_path / "a")})
    b = processes(tmp_path, {**env, "LLAMAD_STATE_DIR": str(tmp_path / "b")})
    with a.stub(retrieval_pb2_grpc.RetrievalServiceStub) as on_a, \
            b.stub(retrieval_pb2_grpc.RetrievalServiceStub) as on_b:
        on_a.AddSource(rpb.AddSourceRequest(id="runbooks"), timeout=30)
        on_a.UpsertDocument(rpb.UpsertDocumentRequest(
            source_id="runbooks", id="runbooks/disk", title="disk full",
            text="web01 disk full: rotate the nginx logs, then check df"), timeout=30)
        found = on_b.Search(rpb.SearchRequest(query="nginx logs rotate"), timeout=30)
        assert [h.document_id for h in found.hits] == ["runbooks/disk"]
        assert found.mode == rpb.SEARCH_MODE_TEXT  # no embedding model: BM25-only
        for stub in (on_a, on_b):
            status = stub.Status(rpb.RetrievalStatusRequest(), timeout=30)
            assert (status.store, status.lexical_ranking) == ("postgres", "bm25-sql")
            assert status.store_target.startswith("llamad_nodes@")
            assert status.chunks == 1
        assert on_b.DeleteDocument(rpb.DeleteDocumentRequest(id="runbooks/disk"),
                                   timeout=30).deleted
        gone = on_a.Search(rpb.SearchRequest(query="nginx logs rotate"), timeout=30)
        assert list(gone.hits) == []
    for d in (a, b):
        log = d.log.read_text(errors="replace")
        assert "postgres store open" in log
        assert SECRET not in log
