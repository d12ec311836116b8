"""The knowledge base over HTTP alone, against a real daemon (real llama-server children:
the embedding model embeds the pushed documents and the queries, the generation model
answers Ask), driven by its own ``/openapi.json``: every call is found there by the gRPC
method it stands for, and every answer is checked against the schema documented for it.

No gRPC, no llamad import on the client side: plain httpx.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import pytest_asyncio

from daemon import Daemon
from tests.support.http_daemon import ADMIN, READ, auth, http_daemon

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

MAX_BODY = 64 * 1024
RUNBOOK = ("# Disk full on web01\n\n## Rotate the logs\n\nWhen the zanzibar partition of "
           "web01 is full, run logrotate -f /etc/logrotate.conf and remove the rotated "
           "archives older than seven days.\n")
NOTE = ("# Certificate renewal\n\nThe quokka certificates are renewed by certbot every "
        "sixty days; a failed renewal pages the on-call engineer.\n")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def running(llama_server: str, tmp_path_factory: pytest.TempPathFactory
                  ) -> AsyncIterator[tuple[Daemon, Path]]:
    """One daemon with tokens, a small body limit and a directory it may index; no
    1-token probes (on a loaded machine, Ask's prompt may take longer to read than a
    probe's allowance: this module tests the API, not the machine's speed)."""
    docs = tmp_path_factory.mktemp("docs")
    (docs / "backup.md").write_text("# Backups\n\nThe wombat backups run nightly at 02:00.\n")
    async with http_daemon(tmp_path_factory.mktemp("state"),
                           LLAMAD_HTTP_MAX_BODY_BYTES=str(MAX_BODY),
                           LLAMAD_RETRIEVAL_ALLOWED_ROOTS=str(docs)) as daemon:
        yield daemon, docs


class Api:
    """The daemon's HTTP API as its OpenAPI document describes it."""

    def __init__(self, http: httpx.AsyncClient, doc: dict[str, Any]) -> None:
        self.http = http
        self.doc = doc
        self.operations: dict[tuple[str, str], tuple[str, str, dict[str, Any]]] = {}
        for path, ops in doc["paths"].items():
            for method, op in ops.items():
                key = (op["x-llamad-grpc-method"].rsplit("/", 1)[1], path)
                self.operations[key] = (method.upper(), path, op)

    def find(self, rpc: str, path: str | None = None) -> tuple[str, str, dict[str, Any]]:
        """The operation standing for ``rpc`` (at ``path`` when several do)."""
        found = [v for (name, p), v in self.operations.items()
                 if name == rpc and (path is None or p == path)]
        assert len(found) == 1, (rpc, path, found)
        return found[0]

    def _check(self, schema: dict[str, Any], value: Any) -> None:
        jsonschema.validate(value, {**schema, "components": self.doc["components"]})

    async def call(self, rpc: str, *, path: str | None = None, token: str = ADMIN,
                   status: int = 200, **kwargs: Any) -> Any:
        """Call the operation; check its status and its body against the documented
        schema (the error object for a refusal); the body."""
        method, where, op = self.find(rpc, path)
        response = await self.http.request(method, where, headers=auth(token), **kwargs)
        assert response.status_code == status, response.text
        body = response.json()
        if status == 200:
            schema = op["responses"]["200"]["content"]["application/json"]["schema"]
        else:
            schema = op["responses"]["default"]["content"]["application/json"]["schema"]
        self._check(schema, body)
        return body


@pytest_asyncio.fixture(loop_scope="module")
async def api(running: tuple[Daemon, Path]) -> AsyncIterator[Api]:
    daemon, _ = running
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{daemon.http_port}",
                                 trust_env=False, timeout=120) as http:
        doc = (await http.get("/openapi.json", headers=auth(READ))).json()
        yield Api(http, doc)


async def test_push_review_approve_search_and_ask(api: Api) -> None:
    """A runbook pushed for review is held (listed by review, not found by search);
    approved, search finds it by a word only it has, and Ask cites it; a file's raw
    bytes pushed with their media type are indexed as Markdown."""
    for source in ("runbooks", "notes"):
        added = await api.call("AddSource", json={"id": source})
        assert added["kind"] == "push"
    pushed = await api.call("UpsertDocument", path="/v1/llamad/documents", json={
        "source_id": "runbooks", "id": "runbooks/disk.md", "title": "Disk full",
        "text": RUNBOOK, "kind": "markdown", "review": True, "tags": ["disk"]})
    assert pushed["document"]["state"] == "DOCUMENT_STATE_REVIEW_REQUIRED"
    held = await api.call("ListDocuments", path="/v1/llamad/review", token=READ)
    assert [d["id"] for d in held["documents"]] == ["runbooks/disk.md"]
    before = await api.call("Search", token=READ, json={"query": "zanzibar",
                                                        "mode": "SEARCH_MODE_TEXT"})
    assert before.get("hits", []) == []

    approved = await api.call("ApproveDocument", json={"id": "runbooks/disk.md",
                                                       "note": "checked"})
    assert (approved["state"], approved["review_note"]) == ("DOCUMENT_STATE_INDEXED",
                                                            "checked")
    raw = await _push_raw(api, NOTE)
    assert raw["document"]["kind"] == "markdown"
    assert raw["document"]["state"] == "DOCUMENT_STATE_INDEXED"

    found = await api.call("Search", token=READ, json={
        "query": "zanzibar partition full", "topK": 3,
        "filters": {"tags": ["disk"], "indexed_since": "2020-01-01T00:00:00Z"}})
    assert found["hits"][0]["document_id"] == "runbooks/disk.md"
    assert found["hits"][0]["heading"]  # the section it came from
    # Hybrid (the default), or BM25-only saying why while the backfill embeds.
    hybrid = await api.call("Search", token=READ, json={"query": "quokka certificates"})
    assert hybrid["mode"] == "SEARCH_MODE_HYBRID" or hybrid["warnings"], hybrid
    assert hybrid["hits"][0]["document_id"] == "notes/certs.md"
    got = await api.call("GetDocument", token=READ, params={"id": "runbooks/disk.md"})
    assert got["state"] == "DOCUMENT_STATE_INDEXED"

    answer = await api.call("Ask", token=READ, json={
        "question": "What do I do when the zanzibar partition of web01 is full?",
        "top_k": 2, "no_cache": True, "sampling": {"max_tokens": 8, "temperature": 0}})
    cited = [c["document_id"] for c in answer["sources"]["citations"]]
    assert "runbooks/disk.md" in cited
    assert answer["done"]["usage"]["completion_tokens"] <= 8


async def _push_raw(api: Api, text: str) -> Any:
    method, path, op = api.find("UpsertDocument", "/v1/llamad/documents/content")
    assert "text/markdown" in op["requestBody"]["content"]
    response = await api.http.request(
        method, path, params={"source_id": "notes", "id": "notes/certs.md",
                              "tags": ["tls", "certs"]},
        content=text.encode(), headers={**auth(ADMIN), "Content-Type": "text/markdown"})
    assert response.status_code == 200, response.text
    body = response.json()
    api._check(op["responses"]["200"]["content"]["application/json"]["schema"], body)
    return body


async def test_sources_reindex_disable_reprocess_and_delete(
        api: Api, running: tuple[Daemon, Path]) -> None:
    """A directory source is added and reindexed (the whole answer, then streamed
    events), disabled (its documents leave search), reprocessed; a document deleted is
    gone."""
    _, docs = running
    added = await api.call("AddSource", json={"id": "ops", "path": str(docs),
                                              "category": "ops"})
    assert added["kind"] == "directory"
    whole = await api.call("Reindex", json={"source_id": "ops"})
    assert [(r["source_id"], r["added"], r["done"]) for r in whole["reports"]] == \
        [("ops", 1, True)]
    method, path, _ = api.find("Reindex")
    async with api.http.stream(method, path, headers=auth(ADMIN),
                               json={"source_id": "ops", "stream": True}) as streamed:
        lines = [line async for line in streamed.aiter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and '"done":true' in lines[-2]
    status = await api.call("Status", path="/v1/llamad/status", token=READ)
    assert status["documents_by_state"]["indexed"] and int(status["chunks"]) >= 1
    assert "ops" in [s["id"] for s in status["source_list"]]
    listed = await api.call("ListSources", token=READ)
    assert {s["id"]: s.get("documents", 0) for s in listed["sources"]}["ops"] == 1
    found = await api.call("Search", token=READ, json={"query": "wombat backups",
                                                        "mode": "SEARCH_MODE_TEXT"})
    assert [h["source_id"] for h in found["hits"]] == ["ops"]
    disabled = await api.call("SetSourceDisabled", json={"id": "ops", "disabled": True})
    assert disabled["disabled"] is True
    gone = await api.call("Search", token=READ, json={"query": "wombat backups",
                                                       "mode": "SEARCH_MODE_TEXT"})
    assert gone.get("hits", []) == []
    redone = await api.call("Reprocess", json={"source_id": "ops"})
    assert int(redone.get("chunks", 0)) >= 0
    await api.call("AddSource", json={"id": "scratch"})
    pushed = await api.call("UpsertDocument", path="/v1/llamad/documents", json={
        "source_id": "scratch", "id": "scratch/tmp", "content": base64.b64encode(
            b"<html><body><h1>Temp</h1><p>ephemeral marmot</p></body></html>").decode(),
        "content_type": "text/html"})
    assert pushed["document"]["kind"] == "html"
    deleted = await api.call("DeleteDocument", params={"id": "scratch/tmp"})
    assert deleted["deleted"] is True
    await api.call("GetDocument", token=READ, params={"id": "scratch/tmp"}, status=404)


@pytest.mark.parametrize(("rpc", "path", "kwargs", "param"), [
    ("Search", None, {"json": {"query": "q", "top_k": -1}}, "top_k"),
    ("Search", None, {"json": {"query": "q", "filters": {"indexed_since": "May"}}},
     "filters.indexed_since"),
    ("Search", None, {"json": {"query": "q", "mode": "SEARCH_MODE_FAST"}}, "mode"),
    ("Search", None, {"json": {"query": ""}}, "query"),
    ("UpsertDocument", "/v1/llamad/documents",
     {"json": {"source_id": "s", "text": "t", "content": "aGk="}}, "content"),
    ("UpsertDocument", "/v1/llamad/documents",
     {"json": {"source_id": "s", "content": "aGk=", "content_type": "image/png"}},
     "content_type"),
    ("UpsertDocument", "/v1/llamad/documents", {"json": {"text": "t"}}, "source_id"),
    ("GetDocument", None, {"params": {"id": "/etc/passwd"}}, "id"),
    ("GetDocument", None, {"params": {"nope": "x"}}, "nope"),
    ("Reprocess", None, {"json": {"document_id": "a", "source_id": "b"}}, "source_id"),
    ("AddSource", None, {"json": {"id": "rel", "path": "relative/dir"}}, "path"),
    ("AddSource", None, {"json": {"id": "h", "max_items": 3}}, "max_items"),
    ("Reindex", None, {"json": {"source_id": "no-such-source"}}, "source_id"),
])
async def test_refusals_name_their_field(api: Api, rpc: str, path: str | None,
                                         kwargs: dict[str, Any], param: str) -> None:
    """A bad request is a 400 whose error names the field at fault."""
    refused = await api.call(rpc, path=path, status=400, **kwargs)
    assert refused["error"]["param"] == param, refused


async def test_roles_and_tokens(api: Api) -> None:
    """Every documented admin operation refuses a read token (403) and every operation
    refuses no token (401), before its body is read; GET /openapi.json itself needs a
    token too."""
    admin = [(m, p) for (_, p), (m, _, op) in api.operations.items()
             if op["x-llamad-role"] == "admin"]
    assert len(admin) >= 11
    for method, path in admin:
        response = await api.http.request(method, path, headers=auth(READ), json={})
        assert response.status_code == 403, (method, path, response.text)
        assert response.json()["error"]["type"] == "permission_error"
    for method, path, _ in api.operations.values():
        response = await api.http.request(method, path.replace("{id}", "x"), json={})
        assert response.status_code == 401, (method, path, response.text)


async def test_an_oversized_body_is_refused(api: Api) -> None:
    """A body past http.max_body_bytes is 413 naming the option, JSON or raw."""
    big = "x" * (MAX_BODY + 1)
    refused = await api.call("Search", token=READ, status=413, json={"query": big})
    assert "http.max_body_bytes" in refused["error"]["message"]
    method, path, _ = api.find("UpsertDocument", "/v1/llamad/documents/content")
    response = await api.http.request(method, path, params={"source_id": "s"},
                                      content=big.encode(),
                                      headers={**auth(ADMIN), "Content-Type": "text/plain"})
    assert response.status_code == 413


async def test_tokenize_and_model_residency(api: Api) -> None:
    """/tokenize answers the generation model's token ids (more with its BOS); the
    embedding model's own with model named; loading a resident model answers it ready;
    an unknown one is 404 naming model."""
    plain = await api.call("Tokenize", path="/tokenize", token=READ,
                           json={"content": "Hello world"})
    special = await api.call("Tokenize", path="/tokenize", token=READ,
                             json={"content": "Hello world", "add_special": True})
    assert plain["tokens"] and len(special["tokens"]) >= len(plain["tokens"])
    models = (await api.http.get("/v1/models", headers=auth(READ))).json()["data"]
    embedder = next(m["id"] for m in models if m.get("role") == "embedding" or
                    "MiniLM" in m["id"])
    own = await api.call("Tokenize", path="/tokenize", token=READ,
                         json={"content": "Hello world", "model": embedder})
    assert own["model"] == embedder and own["tokens"] != plain["tokens"]
    await _detokenize_round_trip(api, embedder)
    loaded = await api.call("LoadModel", json={"name": embedder})
    assert loaded["model"]["state"] == "MODEL_STATE_READY"
    missing = await api.call("LoadModel", json={"name": "no-such-model"}, status=404)
    assert "no-such-model" in missing["error"]["message"]


async def _detokenize_round_trip(api: Api, embedder: str) -> None:
    """/detokenize gives the generation model's text back from its /tokenize ids (accents,
    an emoji, symbols); the embedding model's ids give its own (lowercased) text; ids
    that are no token of the model, negative, or not integers are a 400 naming tokens,
    and never reach the child (it answers such ids with a 500): it still serves."""
    text = "Héllo wörld 🎉, 42 ≠ 43 — «quoted»"
    ids = (await api.call("Tokenize", path="/tokenize", token=READ,
                          json={"content": text}))["tokens"]
    back = await api.call("Detokenize", path="/detokenize", token=READ, json={"tokens": ids})
    assert back["content"] == text and back["model"]
    own = await api.call("Tokenize", path="/tokenize", token=READ,
                         json={"content": "Hello world", "model": embedder})
    words = await api.call("Detokenize", path="/detokenize", token=READ,
                           json={"tokens": own["tokens"], "model": embedder})
    # WordPiece's pieces: lowercased, each word with its leading space.
    assert (words["content"].strip(), words["model"]) == ("hello world", embedder)
    for bad, says in (([5, 10**9], "1000000000 is not a token id"), ([-1], "tokens[0]"),
                      (["7"], "tokens[0]"), ([True], "tokens[0]"), ("1 2", "an array")):
        refused = await api.call("Detokenize", path="/detokenize", token=READ,
                                 json={"tokens": bad}, status=400)
        assert refused["error"]["param"] == "tokens", refused
        assert says in refused["error"]["message"], refused
    unknown = await api.call("Detokenize", path="/detokenize", token=READ,
                             json={"tokens": [1], "text": "x"}, status=400)
    assert unknown["error"]["param"] == "text"
    assert (await api.call("Detokenize", path="/detokenize", token=READ,
                           json={"tokens": ids}))["content"] == text
