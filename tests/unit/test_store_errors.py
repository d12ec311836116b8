"""The PostgreSQL store's errors as call statuses: a lost server is UNAVAILABLE with a
retry hint; another embedding model than the corpus's, something the store backend cannot
do, and a schema from a newer llamad are FAILED_PRECONDITION with their messages."""

from __future__ import annotations

import grpc

from daemon.errors import DEFAULT_RETRY_AFTER, map_error
from retrieval import NotSupported, SchemaTooNew, StoreUnavailable
from retrieval.postgres._indexes import not_supported
from retrieval.postgres._schema import model_mismatch


def test_a_lost_store_is_unavailable_with_a_retry_hint() -> None:
    mapped = map_error(StoreUnavailable("PostgreSQL store llamad@db:5432/kb unavailable: "
                                        "server closed the connection"))
    assert mapped.code is grpc.StatusCode.UNAVAILABLE
    assert mapped.retry_after == DEFAULT_RETRY_AFTER
    assert "llamad@db:5432/kb" in mapped.message


def test_another_embedding_model_names_both_models() -> None:
    mapped = map_error(model_mismatch("llamad@db/kb", "bge-small (384 dimensions)",
                                      ("nomic-embed", 768)))
    assert mapped.code is grpc.StatusCode.FAILED_PRECONDITION
    assert "bge-small" in mapped.message and "nomic-embed" in mapped.message
    assert mapped.retry_after is None


def test_what_the_backend_cannot_do_is_a_failed_precondition_naming_it() -> None:
    refused = not_supported("a history source")
    assert isinstance(refused, NotSupported)
    mapped = map_error(refused)
    assert mapped.code is grpc.StatusCode.FAILED_PRECONDITION
    assert "retrieval.store = postgres" in mapped.message


def test_a_newer_schema_is_a_failed_precondition() -> None:
    mapped = map_error(SchemaTooNew("schema version 3 is newer than this llamad's 1"))
    assert mapped.code is grpc.StatusCode.FAILED_PRECONDITION
    assert mapped.retry_after is None
