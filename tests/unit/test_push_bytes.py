"""A document pushed as a file's bytes with a content type (issue 16): extracted as that
file would be (HTML without its markup, PDF through the worker), refused clearly when the
type is unknown or text comes too."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from daemon.grpcapi.retrieval import RetrievalServicer
from llamad_protocol.v1 import retrieval_pb2 as rpb
from llamad_protocol.v1 import retrieval_pb2_grpc
from retrieval import Retriever
from tests.support.embedder import HashEmbedder
from tests.support.inprocess import serving
from tests.support.pdf import text_pdf


@pytest.fixture
async def stub(tmp_path: Path) -> AsyncIterator[retrieval_pb2_grpc.RetrievalServiceStub]:
    r = Retriever(tmp_path / "index", lambda: HashEmbedder("m"))
    await r.open()
    await r.add_source("inbox")
    servicer = RetrievalServicer(r)
    async with serving(lambda s: retrieval_pb2_grpc.add_RetrievalServiceServicer_to_server(
            servicer, s)) as channel:
        yield retrieval_pb2_grpc.RetrievalServiceStub(channel)
    await r.close()


async def test_html_bytes_are_extracted_as_a_page(
        stub: retrieval_pb2_grpc.RetrievalServiceStub) -> None:
    """text/html bytes: the page's text is indexed (no tags, no script), titled from its
    <title> unless the request names one."""
    page = (b"<html><head><title>Disk runbook</title><script>var secret = 1;</script>"
            b"</head><body><h1>web01</h1><p>Rotate the <b>nginx</b> logs.</p></body></html>")
    done = await stub.UpsertDocument(rpb.UpsertDocumentRequest(
        source_id="inbox", id="inbox/disk", content=page, content_type="text/html; charset=utf-8"))
    assert (done.document.title, done.document.kind) == ("Disk runbook", "html")
    hit = (await stub.Search(rpb.SearchRequest(query="rotate nginx logs"))).hits[0]
    assert hit.document_id == "inbox/disk"
    assert "<b>" not in hit.text and "secret" not in hit.text
    assert "Rotate the nginx logs." in hit.text


@pytest.mark.parametrize(("content_type", "content", "kind", "heading"), [
    ("application/yaml", b"services:\n  web:\n    image: nginx\n    restart: always\n",
     "yaml", "services"),
    ("text/yaml", b"services:\n  web:\n    image: nginx\n", "yaml", "services"),
    ("application/json", b'{\n  "web": {"image": "nginx", "restart": "always"}\n}\n',
     "json", "web"),
    ("application/toml", b'[web]\nimage = "nginx"\nrestart = "always"\n', "toml", "[web]"),
    ("text/x-shellscript", b"restart_nginx() {\n  systemctl restart nginx\n}\n", "shell",
     "restart_nginx()"),
    ("application/x-sh", b"restart_nginx() {\n  systemctl restart nginx\n}\n", "shell",
     "restart_nginx()"),
    ("text/x-python", b"def restart_nginx():\n    run('systemctl restart nginx')\n",
     "python", "def restart_nginx():"),
])
async def test_structured_bytes_are_indexed_as_their_kind(
        stub: retrieval_pb2_grpc.RetrievalServiceStub, content_type: str, content: bytes,
        kind: str, heading: str) -> None:
    """YAML, JSON, TOML, shell and Python bytes are read as UTF-8 text of their kind and
    chunked by its structure (the hit's heading is the key path or signature)."""
    done = await stub.UpsertDocument(rpb.UpsertDocumentRequest(
        source_id="inbox", id="inbox/web", title="web", content=content,
        content_type=content_type))
    assert done.document.kind == kind
    hit = (await stub.Search(rpb.SearchRequest(query="nginx"))).hits[0]
    assert (hit.document_id, hit.kind) == ("inbox/web", kind)
    assert hit.heading == heading


@pytest.mark.parametrize(("request_fields", "needle"), [
    ({"content": b"%PDF", "content_type": "image/png"},
     "content_type 'image/png' is not one of application/json, application/pdf, "
     "application/toml"),
    ({"content": b"hello", "text": "hello"}, "give text or content, not both"),
    ({"content": b"\x00\x01\x02binary", "content_type": "text/plain"}, "binary"),
])
async def test_bad_pushed_bytes_are_refused_saying_why(
        stub: retrieval_pb2_grpc.RetrievalServiceStub, request_fields: dict[str, object],
        needle: str) -> None:
    """An unknown type, text and bytes together, or bytes that are no text: refused."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.UpsertDocument(rpb.UpsertDocumentRequest(
            source_id="inbox", id="inbox/x", **request_fields))  # type: ignore[arg-type]
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert needle in (info.value.details() or "")
    listed = await stub.ListDocuments(rpb.ListDocumentsRequest())
    assert not listed.documents


@pytest.mark.process  # the PDF worker is a process
async def test_pdf_bytes_are_extracted_by_the_worker(
        stub: retrieval_pb2_grpc.RetrievalServiceStub) -> None:
    """application/pdf bytes go through the PDF worker like a .pdf file."""
    pdf = text_pdf(b"Core router BGP flap runbook", b"Clear the session and watch it.")
    done = await stub.UpsertDocument(rpb.UpsertDocumentRequest(
        source_id="inbox", id="inbox/bgp", content=pdf, content_type="application/pdf"))
    assert done.document.kind == "pdf"
    hits = (await stub.Search(rpb.SearchRequest(query="BGP flap"))).hits
    assert hits[0].document_id == "inbox/bgp"


async def test_wait_false_returns_pending_then_the_document_is_indexed(
        stub: retrieval_pb2_grpc.RetrievalServiceStub) -> None:
    """UpsertDocument with wait=false answers at once with state PENDING; GetDocument
    then shows it indexed once the background upsert is done."""
    done = await stub.UpsertDocument(rpb.UpsertDocumentRequest(
        source_id="inbox", id="inbox/later", text="printer queue stuck", wait=False))
    assert done.document.state == rpb.DOCUMENT_STATE_PENDING
    for _ in range(200):
        doc = await stub.GetDocument(rpb.GetDocumentRequest(id="inbox/later"))
        if doc.state == rpb.DOCUMENT_STATE_INDEXED:
            break
        await asyncio.sleep(0.01)
    assert doc.state == rpb.DOCUMENT_STATE_INDEXED
