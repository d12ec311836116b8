"""Hostile input against a real daemon (real llama-server children on SmolLM2 and MiniLM,
real gRPC clients on port 0): every case gets a clear status code and a message that says
what is wrong, and afterwards nothing already stored is lost or changed.

One daemon serves the whole module. Before the first case it indexes a few documents (three
pushed, two from a directory source); ``intact`` then checks, after each case, that
RetrievalService Status reports the same counts, every document is still listed and found
by its own unique word (hybrid search), and Generate still answers.

Files go through a directory source of their own (``hostile``), emptied after each case.
Extraction details are unit-tested in tests/unit/test_extract.py; here they are checked end
to end: what a Reindex reports, and that nothing is indexed.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import time
import zlib
from collections.abc import AsyncIterable, AsyncIterator, Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
from grpc_reflection.v1alpha import reflection_pb2

from daemon import Daemon
from llamad_protocol.v1 import answer_pb2 as apb
from llamad_protocol.v1 import answer_pb2_grpc, common_pb2, control_pb2, retrieval_pb2_grpc
from llamad_protocol.v1 import inference_pb2 as pb
from llamad_protocol.v1 import retrieval_pb2 as rpb
from tests.conftest import SMALL_MODEL
from tests.support.daemon import Clients, config_env, make_daemon, serving
from tests.support.pdf import encrypted_pdf, image_only_pdf, pdf_with_pages, text_pdf

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

GEN = common_pb2.CHILD_ROLE_GENERATION
EMB = common_pb2.CHILD_ROLE_EMBEDDING
INVALID = grpc.StatusCode.INVALID_ARGUMENT
MAX_MESSAGE = 16 * 1024 * 1024  # limits.max_message_bytes, default
UTF8 = "proto3 string fields must be UTF-8"

# Each stored document carries a word found nowhere else: its search key.
PUSHED = {
    "seed/web01-disk": ("web01 disk full", "When web01 reports No space left on device, the "
                        "nginx access logs have grown: rotate them. Keyword zephyrquartz."),
    "seed/db02-lag": ("db02 replication lag", "If db02 falls behind the primary, look for "
                      "long-running queries on the replica. Keyword mauvelantern."),
    "seed/vpn-flap": ("VPN tunnel flapping", "The IPsec tunnel flaps when dead peer detection "
                      "is too aggressive; set dpd 30. Keyword copperheron."),
}
FILES = {
    "runbooks/backup.md": "# Backup\n\nThe nightly backup job writes to the NAS; check its "
                          "log when it fails. Keyword saffronotter.\n",
    "configs/sw1.cfg": "hostname sw1\n!\ninterface GigabitEthernet0/1\n description uplink "
                       "obsidianmoth\n!\n",
}
KEYS = {"zephyrquartz": "seed/web01-disk", "mauvelantern": "seed/db02-lag",
        "copperheron": "seed/vpn-flap", "saffronotter": "files/runbooks/backup.md",
        "obsidianmoth": "files/configs/sw1.cfg"}


@dataclass
class Hostile:
    daemon: Daemon
    c: Clients
    r: Any            # RetrievalServiceStub
    ask: Any          # AnswerServiceStub
    drop: Path        # the hostile directory source's root
    models: Path      # scratch space for model paths
    status: rpb.RetrievalStatusResponse
    listed: dict[str, tuple[int, str]]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def hostile(llama_server: str, tmp_path_factory: pytest.TempPathFactory
                  ) -> AsyncIterator[Hostile]:
    root = tmp_path_factory.mktemp("hostile")
    files, drop, models = root / "files", root / "drop", root / "models"
    for rel, text in FILES.items():
        (files / rel).parent.mkdir(parents=True, exist_ok=True)
        (files / rel).write_text(text)
    drop.mkdir()
    models.mkdir()
    async with serving(config_env("llama-server", LLAMAD_STATE_DIR=str(root / "state"),
                                  LLAMAD_RETRIEVAL_ALLOWED_ROOTS=str(root))) as (daemon, c):
        deadline = time.monotonic() + 30  # vectors need the embedding model's SHA-256
        while not daemon.children["embedding"].model.sha256:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        r = retrieval_pb2_grpc.RetrievalServiceStub(c.channel)
        await r.AddSource(rpb.AddSourceRequest(id="seed"))
        await r.AddSource(rpb.AddSourceRequest(id="files", path=str(files)))
        await r.AddSource(rpb.AddSourceRequest(id="hostile", path=str(drop)))
        for doc_id, (title, text) in PUSHED.items():
            await r.UpsertDocument(rpb.UpsertDocumentRequest(source_id="seed", id=doc_id,
                                                             title=title, text=text))
        done = [m async for m in r.Reindex(rpb.ReindexRequest(source_id="files"))][-1]
        assert (done.added, len(done.failed)) == (2, 0)
        h = Hostile(daemon, c, r, answer_pb2_grpc.AnswerServiceStub(c.channel),
                    drop, models, await r.Status(rpb.RetrievalStatusRequest()), {})
        h.listed = await listed(h)
        assert set(h.listed) == set(KEYS.values())
        assert h.status.documents_by_state == {"indexed": 5}
        assert h.status.chunks >= 5 and h.status.vectors == h.status.chunks
        await intact(h)
        yield h


@pytest.fixture
def drop(hostile: Hostile) -> Any:
    """The hostile source's directory, emptied after the case."""
    yield hostile.drop
    for path in hostile.drop.iterdir():
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


async def listed(h: Hostile) -> dict[str, tuple[int, str]]:
    docs = (await h.r.ListDocuments(rpb.ListDocumentsRequest())).documents
    return {d.id: (d.state, d.title) for d in docs}


async def intact(h: Hostile) -> None:
    """Nothing stored was lost or changed, search is still hybrid, and Generate answers."""
    status = await h.r.Status(rpb.RetrievalStatusRequest())
    assert (status.sources, status.chunks, status.vectors, status.embedded_chunks) == (
        h.status.sources, h.status.chunks, h.status.vectors, h.status.embedded_chunks)
    assert dict(status.documents_by_state) == dict(h.status.documents_by_state)
    assert await listed(h) == h.listed
    for word, doc_id in KEYS.items():
        found = await h.r.Search(rpb.SearchRequest(query=word, top_k=1))
        assert found.mode == rpb.SEARCH_MODE_HYBRID, found.warnings
        assert [hit.document_id for hit in found.hits] == [doc_id]
        assert word in found.hits[0].text
    out = [m async for m in h.c.inference.Generate(pb.GenerateRequest(
        prompt="The capital of France is", sampling=pb.SamplingParams(max_tokens=2)))]
    assert out[-1].finish_reason != pb.FINISH_REASON_UNSPECIFIED
    assert out[-1].usage.completion_tokens >= 1
    assert out[-1].model == SMALL_MODEL


async def refused(call: Awaitable[Any] | AsyncIterable[Any], code: grpc.StatusCode,
                  *needles: str) -> str:
    """Await a unary call or drain a stream; it must fail with ``code`` and a message
    holding every needle (and no raw control character: one printable line)."""
    with pytest.raises(grpc.aio.AioRpcError) as err:
        if isinstance(call, AsyncIterable):
            _ = [m async for m in call]
        else:
            await call
    details = err.value.details() or ""
    assert err.value.code() == code, details
    for needle in needles:
        assert needle in details, (needle, details)
    assert details.isprintable(), details
    return details


def _identity(data: bytes) -> bytes:
    return data


def raw(h: Hostile, method: str, payload: bytes, *, stream: bool = False) -> Any:
    """Call ``method`` with ``payload`` as the request's bytes, as they are."""
    channel = h.c.channel
    factory = channel.unary_stream if stream else channel.unary_unary
    return factory(method, request_serializer=_identity,
                   response_deserializer=_identity)(payload)


def with_bad_utf8(message: Any, marker: str = "@@") -> bytes:
    """``message`` serialized with its one ``marker`` replaced by two bytes that are not
    UTF-8 (same length, so every length prefix stays right)."""
    data: bytes = message.SerializeToString()
    assert data.count(marker.encode()) == 1
    return data.replace(marker.encode(), b"\xc3\x28")


async def reindex(h: Hostile) -> rpb.ReindexProgress:
    progress = [m async for m in h.r.Reindex(rpb.ReindexRequest(source_id="hostile"))]
    assert progress[-1].done
    last: rpb.ReindexProgress = progress[-1]
    return last


def failures(report: rpb.ReindexProgress) -> dict[str, str]:
    return {issue.path: issue.reason for issue in report.failed}


# --- prompts ---------------------------------------------------------------------------


async def test_empty_and_huge_prompts(hostile: Hostile) -> None:
    """Empty inputs, inputs past limits.*, past the model's context and past the gRPC
    message limit are refused, each saying which limit."""
    h = hostile
    inf, ask, r = h.c.inference, h.ask, h.r
    user = pb.CHAT_ROLE_USER
    await refused(inf.Generate(pb.GenerateRequest(prompt="")), INVALID, "prompt is empty")
    await refused(inf.Chat(pb.ChatRequest()), INVALID, "messages is empty")
    await refused(inf.Chat(pb.ChatRequest(messages=[pb.ChatMessage(role=user)])), INVALID,
                  "messages[0].content is empty")
    await refused(inf.Embed(pb.EmbedRequest()), INVALID, "texts is empty")
    await refused(inf.Embed(pb.EmbedRequest(texts=["ok", " \n"])), INVALID, "texts[1] is empty")
    await refused(r.Search(rpb.SearchRequest(query=" ")), INVALID, "query is empty")
    await refused(ask.Ask(apb.AskRequest(question="  ")), INVALID, "question is empty")

    over = "a" * 262_145
    await refused(inf.Generate(pb.GenerateRequest(prompt=over)), INVALID,
                  "prompt has 262145 characters; the limit is 262144 (limits.max_prompt_chars)")
    halves = [pb.ChatMessage(role=user, content="b" * 200_000)] * 2
    await refused(inf.Chat(pb.ChatRequest(messages=halves)), INVALID,
                  "messages have 400000 characters in all", "(limits.max_prompt_chars)")
    await refused(inf.Tokenize(pb.TokenizeRequest(text=over)), INVALID,
                  "(limits.max_prompt_chars)")
    await refused(r.Search(rpb.SearchRequest(query="q" * 2001)), INVALID,
                  "query has 2001 characters; the limit is 2000 (retrieval.max_query_chars)")
    await refused(ask.Ask(apb.AskRequest(question="q" * 4001)), INVALID,
                  "(answer.max_question_chars)")
    await refused(ask.Ask(apb.AskRequest(question="why?", attachment="x" * 100_001)), INVALID,
                  "(answer.max_attachment_chars)")

    # Within limits.max_prompt_chars but far past the model's 2048-token context.
    await refused(inf.Generate(pb.GenerateRequest(prompt="hello " * 40_000)), INVALID,
                  "the model refused the request", "exceeds the available context size")

    # Past the gRPC message limit (limits.max_message_bytes): refused by gRPC itself.
    for call in (inf.Generate(pb.GenerateRequest(prompt="a" * (MAX_MESSAGE + 1))),
                 r.UpsertDocument(rpb.UpsertDocumentRequest(
                     source_id="seed", id="seed/huge", text="word " * (MAX_MESSAGE // 5)))):
        await refused(call, grpc.StatusCode.RESOURCE_EXHAUSTED, "larger than max",
                      str(MAX_MESSAGE))
    await intact(h)


# --- bytes on the wire ---------------------------------------------------------------------


async def test_invalid_utf8_in_string_fields_on_the_wire(hostile: Hostile) -> None:
    """A string field holding bytes that are not UTF-8 (anywhere: top level, in a repeated
    field, in a nested message, in a document's body) is INVALID_ARGUMENT naming the
    message type and the field, never UNKNOWN; nothing is stored."""
    h = hostile
    user = pb.CHAT_ROLE_USER
    cases = [
        ("/llamad.v1.InferenceService/Generate", True, pb.GenerateRequest(prompt="say @@"),
         "llamad.v1.GenerateRequest: field prompt"),
        ("/llamad.v1.InferenceService/Chat", True, pb.ChatRequest(messages=[
            pb.ChatMessage(role=user, content="hi"), pb.ChatMessage(role=user, content="@@")]),
         "llamad.v1.ChatRequest: field messages[1].content"),
        ("/llamad.v1.InferenceService/Embed", False, pb.EmbedRequest(texts=["a", "b", "c@@"]),
         "llamad.v1.EmbedRequest: field texts[2]"),
        ("/llamad.v1.InferenceService/Tokenize", False, pb.TokenizeRequest(text="@@"),
         "llamad.v1.TokenizeRequest: field text"),
        ("/llamad.v1.RetrievalService/UpsertDocument", False, rpb.UpsertDocumentRequest(
            source_id="seed", id="seed/binary", title="t", text="body @@ body"),
         "llamad.v1.UpsertDocumentRequest: field text"),
        ("/llamad.v1.RetrievalService/UpsertDocument", False, rpb.UpsertDocumentRequest(
            source_id="seed", id="seed/binary@@", text="body"),
         "llamad.v1.UpsertDocumentRequest: field id"),
        ("/llamad.v1.RetrievalService/Search", False, rpb.SearchRequest(
            query="disk", filters=rpb.SearchFilters(sources=["seed", "@@"])),
         "llamad.v1.SearchRequest: field filters.sources[1]"),
        ("/llamad.v1.RetrievalService/AddSource", False, rpb.AddSourceRequest(id="x@@"),
         "llamad.v1.AddSourceRequest: field id"),
        ("/llamad.v1.AnswerService/Ask", True, apb.AskRequest(
            question="why?", history=[apb.Turn(role=user, content="@@")]),
         "llamad.v1.AskRequest: field history[0].content"),
        ("/llamad.v1.ControlService/Swap", True, control_pb2.SwapRequest(
            role=GEN, model_path="/models/@@.gguf"),
         "llamad.v1.SwapRequest: field model_path"),
        ("/grpc.health.v1.Health/Check", False, None, "grpc.health.v1.HealthCheckRequest"),
    ]
    for method, stream, message, needle in cases:
        payload = b"\x0a\x02\xc3\x28" if message is None else with_bad_utf8(message)
        await refused(raw(h, method, payload, stream=stream), INVALID,
                      f"request is not a valid {needle}", "not valid UTF-8", UTF8)
    await refused(h.r.GetDocument(rpb.GetDocumentRequest(id="seed/binary")),
                  grpc.StatusCode.NOT_FOUND)
    await intact(h)


async def test_malformed_protobuf_bytes(hostile: Hostile) -> None:
    """Bytes that are no protobuf message get INVALID_ARGUMENT saying where the wire
    format breaks; random bytes never get UNKNOWN or INTERNAL."""
    h = hostile
    methods = [
        ("/llamad.v1.InferenceService/Generate", True, "llamad.v1.GenerateRequest"),
        ("/llamad.v1.InferenceService/Embed", False, "llamad.v1.EmbedRequest"),
        ("/llamad.v1.RetrievalService/UpsertDocument", False, "llamad.v1.UpsertDocumentRequest"),
        ("/llamad.v1.RetrievalService/Status", False, "llamad.v1.RetrievalStatusRequest"),
        ("/llamad.v1.ControlService/Swap", True, "llamad.v1.SwapRequest"),
        ("/llamad.v1.AnswerService/Ask", True, "llamad.v1.AskRequest"),
        ("/grpc.health.v1.Health/Watch", True, "grpc.health.v1.HealthCheckRequest"),
    ]
    payloads = [
        (b"\xff\xff\xff\xff", "a varint cut off by the end of the data at byte 0"),
        (b"\x0a\x10abc", "at byte 0 claims 16 bytes but only 3 remain"),
        (b"\x0f", "has wire type 7, which does not exist"),
        (b"\x08" + b"\xff" * 11, "a varint longer than 10 bytes at byte 1"),
    ]
    for method, stream, type_name in methods:
        for payload, reason in payloads:
            await refused(raw(h, method, payload, stream=stream), INVALID,
                          f"request is not a valid {type_name}: ", reason)
    # Server reflection (grpcurl's way in) streams its requests: refused at the first bad one.
    reflect = h.c.channel.stream_stream(
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        request_serializer=_identity, response_deserializer=_identity)

    async def one(payload: bytes) -> AsyncIterator[bytes]:
        yield payload

    for payload, reason in payloads:
        await refused(reflect(one(payload)), INVALID, "request is not a valid "
                      "grpc.reflection.v1alpha.ServerReflectionRequest: ", reason)
    listing = [m async for m in reflect(one(
        reflection_pb2.ServerReflectionRequest(list_services="").SerializeToString()))]
    assert b"llamad.v1.InferenceService" in listing[0]

    rng = random.Random(20240613)
    codes: dict[str, int] = {}
    for i in range(300):
        payload = rng.randbytes(rng.randrange(1, 64))
        method = ("/llamad.v1.RetrievalService/Search", "/llamad.v1.InferenceService/Tokenize",
                  "/llamad.v1.RetrievalService/GetDocument")[i % 3]
        code, details = grpc.StatusCode.OK, "ok"
        try:
            await raw(h, method, payload)
        except grpc.aio.AioRpcError as exc:
            code, details = exc.code(), exc.details() or ""
        assert code not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL), (
            method, payload, details)
        assert details, (method, payload)
        codes[code.name] = codes.get(code.name, 0) + 1
    assert codes.get("INVALID_ARGUMENT", 0) > 200, codes
    await intact(h)


# --- numbers -------------------------------------------------------------------------------


def _negative_varint_sampling(field: int) -> bytes:
    """A GenerateRequest whose sampling field ``field`` (a uint32) holds -1 as a 10-byte
    varint, as a careless client's int64 would encode it."""
    sampling = bytes([field << 3]) + b"\xff" * 9 + b"\x01"
    return b"\x0a\x02hi" + b"\x12" + bytes([len(sampling)]) + sampling


async def test_absurd_numbers(hostile: Hostile) -> None:
    """Out-of-range, non-finite and negative numbers are refused with the valid range."""
    h = hostile
    inf = h.c.inference
    cases: list[tuple[dict[str, Any], str]] = [
        ({"top_k": 10**9}, "sampling.top_k must be at most 100000, got 1000000000"),
        ({"max_tokens": 0}, "sampling.max_tokens must be in 1..8192 (limits.max_tokens), got 0"),
        ({"max_tokens": 10**9}, "(limits.max_tokens), got 1000000000"),
        ({"temperature": float("nan")}, "sampling.temperature must be in 0..5, got nan"),
        ({"temperature": float("inf")}, "sampling.temperature must be in 0..5, got inf"),
        ({"temperature": float("-inf")}, "sampling.temperature must be in 0..5, got -inf"),
        ({"temperature": -1.0}, "sampling.temperature must be in 0..5, got -1.0"),
        ({"temperature": 1e30}, "sampling.temperature must be in 0..5"),
        ({"top_p": -0.5}, "sampling.top_p must be in (0, 1], got -0.5"),
        ({"top_p": 0.0}, "sampling.top_p must be in (0, 1], got 0.0"),
        ({"top_p": float("nan")}, "sampling.top_p must be in (0, 1], got nan"),
        ({"top_p": 1.5}, "sampling.top_p must be in (0, 1], got 1.5"),
        ({"seed": 2**64 - 1}, "sampling.seed must fit in 32 bits"),
        ({"stop": ["x"] * 9}, "sampling.stop has 9 strings; the limit is 8 (limits.max_stop)"),
        ({"stop": ["s" * 257]}, "sampling.stop strings must be 1..256 characters"),
    ]
    for fields, needle in cases:
        request = pb.GenerateRequest(prompt="hi", sampling=pb.SamplingParams(**fields))
        await refused(inf.Generate(request), INVALID, needle)
        await refused(inf.Chat(pb.ChatRequest(messages=[pb.ChatMessage(
            role=pb.CHAT_ROLE_USER, content="hi")], sampling=request.sampling)), INVALID, needle)
    # Negative numbers in unsigned fields arrive as 2**32 - 1.
    for field, name in ((1, "max_tokens must be in 1..8192"), (4, "top_k must be at most")):
        await refused(raw(h, "/llamad.v1.InferenceService/Generate",
                          _negative_varint_sampling(field), stream=True),
                      INVALID, f"sampling.{name}", "got 4294967295")
    await refused(h.r.Search(rpb.SearchRequest(query="disk", top_k=10**9)), INVALID,
                  "top_k must be at most 20 (retrieval.max_k), got 1000000000")
    await refused(h.ask.Ask(apb.AskRequest(question="disk full?", top_k=10**9)), INVALID,
                  "top_k must be at most 20 (retrieval.max_k), got 1000000000")
    await refused(h.ask.Ask(apb.AskRequest(question="disk full?", sampling=pb.SamplingParams(
        temperature=float("nan")))), INVALID, "sampling.temperature must be in 0..5, got nan")
    unknown: Any = 99  # enum values the schema does not define
    await refused(h.ask.Ask(apb.AskRequest(question="disk full?", task=unknown)), INVALID,
                  "unknown task 99")
    await refused(h.c.control.Swap(control_pb2.SwapRequest(role=GEN, ctx_size=2**31)), INVALID,
                  "ctx_size must be at most 1048576")
    await refused(h.c.control.Swap(control_pb2.SwapRequest(role=unknown, model_path="/x.gguf")),
                  INVALID, "unknown role 99")
    negative: Any = -5
    await refused(inf.Tokenize(pb.TokenizeRequest(text="x", role=negative)), INVALID,
                  "unknown role -5")
    await intact(h)


async def test_huge_embedding_batches(hostile: Hostile) -> None:
    """More texts than limits.max_embed_batch, texts past limits.max_embed_chars, and
    texts past the embedding model's context are refused, naming the text and the
    limit; a valid batch still embeds."""
    h = hostile
    inf = h.c.inference
    await refused(inf.Embed(pb.EmbedRequest(texts=["a"] * 257)), INVALID,
                  "257 texts; the limit is 256 (limits.max_embed_batch)")
    started = time.monotonic()
    await refused(inf.Embed(pb.EmbedRequest(texts=["a"] * 200_000)), INVALID,
                  "200000 texts; the limit is 256 (limits.max_embed_batch)")
    assert time.monotonic() - started < 10
    await refused(inf.Embed(pb.EmbedRequest(texts=["ok", "w" * 32_769])), INVALID,
                  "texts[1] has 32769 characters; the limit is 32768 (limits.max_embed_chars)")
    await refused(inf.Embed(pb.EmbedRequest(texts=["ok", "fine", "word " * 2000])), INVALID,
                  "texts[2] has", "tokens; the embedding model's context is 512 tokens",
                  "split it")
    got = await inf.Embed(pb.EmbedRequest(texts=["disk full", "replication lag", "vpn"]))
    assert len(got.embeddings) == 3 and got.dimension == 384
    await intact(h)


# --- documents and files -------------------------------------------------------------------


async def test_deeply_nested_and_gigantic_html(hostile: Hostile, drop: Path) -> None:
    """100k nested divs and tens of MB of HTML, pushed or in a scanned directory, are
    refused with the limit that stops them; pushed HTML is indexed as text, not markup."""
    h = hostile
    deep = "<html><body>" + "<div>" * 100_000 + "deep text" + "</div>" * 100_000
    started = time.monotonic()
    await refused(h.r.UpsertDocument(rpb.UpsertDocumentRequest(
        source_id="seed", id="seed/deep", kind="html", text=deep)), INVALID,
        "seed/deep: HTML elements nested deeper than 500 levels (retrieval.html_max_depth)")
    assert time.monotonic() - started < 10
    wordy = "<html><body><p>" + "lorem ipsum " * 500_000 + "</p></body></html>"
    await refused(h.r.UpsertDocument(rpb.UpsertDocumentRequest(
        source_id="seed", id="seed/wordy", kind="html", text=wordy)), INVALID,
        "the limit is 5000000 (retrieval.max_document_chars)")
    await refused(h.r.UpsertDocument(rpb.UpsertDocumentRequest(
        source_id="seed", id="seed/gigantic", kind="html",
        text="<p>hello</p>" * (30_000_000 // 12))),
        grpc.StatusCode.RESOURCE_EXHAUSTED, "larger than max")
    for doc_id in ("seed/deep", "seed/wordy", "seed/gigantic"):
        await refused(h.r.GetDocument(rpb.GetDocumentRequest(id=doc_id)),
                      grpc.StatusCode.NOT_FOUND)

    (drop / "deep.html").write_text(deep)
    with open(drop / "gigantic.html", "wb") as fh:
        fh.write(b"<p>hello world</p>\n" * (30_000_000 // 19))
    report = await reindex(h)
    assert report.added == 0
    failed = failures(report)
    assert "HTML elements nested deeper than 500 levels (retrieval.html_max_depth)" in \
        failed["deep.html"]
    assert "bytes is over the 20971520-byte limit (retrieval.max_file_mb)" in \
        failed["gigantic.html"]

    # Markup pushed as kind html is indexed as its text: no tags, no script.
    page = ("<html><head><title>Pager runbook</title><script>var leak = 'scriptonly';"
            "</script></head><body><h1>Pager</h1><p>Acknowledge the page within "
            "<b>five</b> minutes. Keyword lilacgarnet.</p></body></html>")
    doc = (await h.r.UpsertDocument(rpb.UpsertDocumentRequest(
        source_id="seed", id="seed/pager", kind="html", text=page))).document
    assert (doc.state, doc.title, doc.kind) == (rpb.DOCUMENT_STATE_INDEXED, "Pager runbook",
                                                "html")
    hit = (await h.r.Search(rpb.SearchRequest(query="lilacgarnet", top_k=1))).hits[0]
    assert hit.document_id == "seed/pager"
    assert "Acknowledge the page within five minutes." in hit.text
    assert "<" not in hit.text and "scriptonly" not in hit.text
    scripted = await h.r.Search(rpb.SearchRequest(query="scriptonly"))
    assert all("scriptonly" not in x.text for x in scripted.hits)
    assert (await h.r.DeleteDocument(rpb.DeleteDocumentRequest(id="seed/pager"))).deleted
    await intact(h)


def flate_bomb(size: int) -> bytes:
    """A zlib stream inflating to ``size`` NUL bytes, built directly (instantly, ~size/1000
    bytes): one dynamic-Huffman deflate block whose codes are a literal NUL and "repeat
    258 bytes at distance 1", each one bit long, so its body is all zero bytes."""
    out = bytearray(b"\x78\x01")
    acc = n = 0

    def put(value: int, count: int) -> None:  # deflate packs fields least significant first
        nonlocal acc, n
        acc |= value << n
        n += count
        while n >= 8:
            out.append(acc & 0xFF)
            acc >>= 8
            n -= 8

    def code(value: int, length: int) -> None:  # Huffman codes go most significant first
        put(int(format(value, f"0{length}b")[::-1], 2), length)

    put(1, 1)
    put(2, 2)                                  # the final block, dynamic Huffman codes
    put(286 - 257, 5)
    put(0, 5)
    put(18 - 4, 4)                             # 286 lit/len codes, 1 distance code
    lengths = {18: 1, 1: 2, 2: 2}              # code-length codes: 18 "0", 1 "10", 2 "11"
    for symbol in (16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1):
        put(lengths.get(symbol, 0), 3)
    code(3, 2)                                 # literal 0: length 2
    code(0, 1)
    put(138 - 11, 7)                           # literals 1..138 unused
    code(0, 1)
    put(117 - 11, 7)                           # literals 139..255 unused
    code(3, 2)                                 # 256, end of block: length 2
    code(0, 1)
    put(28 - 11, 7)                            # lengths 257..284 unused
    code(2, 2)                                 # 285, "length 258": length 1
    code(2, 2)                                 # distance 1: length 1
    code(2, 2)                                 # the literal NUL ("10")
    repeats = (size - 1) // 258
    zeros = 2 * repeats                        # each repeat is "0" + "0"
    out.append(acc & 0xFF)
    zeros -= 8 - n
    out += bytes(zeros // 8)
    acc, n = 0, zeros % 8
    code(3, 2)                                 # end of block ("11")
    if n:
        out.append(acc & 0xFF)
    out += (((1 + 258 * repeats) % 65521) << 16 | 1).to_bytes(4, "big")  # Adler-32
    return bytes(out)


async def test_hostile_pdfs(hostile: Hostile, drop: Path) -> None:
    """Malformed, truncated, mislabelled, encrypted, image-only PDFs and a decompression
    bomb (one FlateDecode stream inflating to 2 GiB) each fail with their own reason,
    quickly, and the daemon's memory does not grow by the bomb."""
    h = hostile
    bomb = flate_bomb(2 << 30)
    inflater = zlib.decompressobj()
    head = inflater.decompress(bomb, 64 << 20)
    assert head == bytes(64 << 20) and inflater.unconsumed_tail  # more than 64 MiB to come
    assert len(bomb) < 3_000_000
    (drop / "malformed.pdf").write_bytes(b"%PDF-1.4\n" + random.Random(3).randbytes(3000))
    (drop / "truncated.pdf").write_bytes(text_pdf(b"Hello runbook")[:150])
    (drop / "html.pdf").write_bytes(b"<html><body>not a pdf</body></html>")
    (drop / "encrypted.pdf").write_bytes(encrypted_pdf("s3cret"))
    (drop / "scan.pdf").write_bytes(image_only_pdf())
    (drop / "bomb.pdf").write_bytes(pdf_with_pages([bomb], flate=True))
    rss = _rss()
    started = time.monotonic()
    report = await reindex(h)
    assert time.monotonic() - started < 60
    assert _rss() - rss < 200 << 20
    assert (report.seen, report.added) == (6, 0)
    failed = failures(report)
    assert set(failed) == {"malformed.pdf", "truncated.pdf", "html.pdf", "encrypted.pdf",
                           "scan.pdf", "bomb.pdf"}
    for name in ("malformed.pdf", "truncated.pdf", "html.pdf"):
        assert f"{name}: cannot be parsed" in failed[name]
    assert "encrypted: a password is needed to open it" in failed["encrypted.pdf"]
    assert "no text layer (scanned/image-only PDF); OCR is not supported" in failed["scan.pdf"]
    assert "decompression" in failed["bomb.pdf"]
    for reason in failed.values():
        assert str(drop) in reason and reason.isprintable()
    assert [d for d in await listed(h) if d.startswith("hostile/")] == []
    await intact(h)


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def test_binary_files_named_md(hostile: Hostile, drop: Path) -> None:
    """Executables, images and random bytes named .md are refused as binary, saying so;
    a FIFO named .md is skipped without being opened (the scan does not block)."""
    h = hostile
    rng = random.Random(11)
    (drop / "tool.md").write_bytes(b"\x7fELF\x02\x01\x01\x00" + rng.randbytes(20_000))
    (drop / "diagram.md").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + rng.randbytes(4000))
    (drop / "noise.md").write_bytes(bytes(rng.randrange(1, 32) for _ in range(9000)))
    (drop / "wide.md").write_bytes("# Notes in UTF-16\n\nno BOM\n".encode("utf-16-le"))
    os.mkfifo(drop / "pipe.md")
    report = await asyncio.wait_for(reindex(h), 60)
    assert report.added == 0
    failed = failures(report)
    for name in ("tool.md", "diagram.md", "wide.md"):
        assert f"{name}: looks like a binary file (NUL bytes in the first 8 KiB), not " \
               "markdown text" in failed[name]
    assert "byte-order mark" in failed["wide.md"]
    assert "control characters), not markdown text" in failed["noise.md"]
    assert {i.path: i.reason for i in report.skipped} == {"pipe.md": "not a regular file"}
    await intact(h)


async def test_invalid_utf8_in_file_bodies(hostile: Hostile, drop: Path) -> None:
    """A file that is not UTF-8 and not a confidently detected legacy encoding is refused
    with "convert it to UTF-8"; a broken file after a byte-order mark says where."""
    h = hostile
    rng = random.Random(7)
    (drop / "junk.md").write_bytes(bytes(rng.randrange(0x80, 0x100) for _ in range(4000)))
    (drop / "bom8.txt").write_bytes(b"\xef\xbb\xbfgood start \xc3\x28 then broken")
    (drop / "bom16.txt").write_bytes(b"\xff\xfe" + "ok".encode("utf-16-le") + b"\x00\xd8")
    report = await reindex(h)
    assert report.added == 0
    failed = failures(report)
    assert "not valid UTF-8, and no legacy encoding was detected with confidence; convert " \
           "it to UTF-8" in failed["junk.md"]
    assert "starts with a UTF-8 byte-order mark but is not valid UTF-8 (at byte 14)" in \
        failed["bom8.txt"]
    assert "starts with a UTF-16 byte-order mark but is not valid UTF-16" in failed["bom16.txt"]
    await intact(h)


async def test_file_names_that_are_not_utf8(hostile: Hostile, drop: Path) -> None:
    """A file (or directory) whose name is not valid UTF-8 does not stop the scan: it is
    reported as skipped with its name escaped, the other files are indexed, and the source
    records its scan."""
    h = hostile
    raw_drop = os.fsencode(drop)
    with open(raw_drop + b"/bad\xff\xfe.txt", "wb") as f:
        f.write(b"a file with a bad name\n")
    os.mkdir(raw_drop + b"/dir\xc3\x28")
    with open(raw_drop + b"/dir\xc3\x28/inside.md", "wb") as f:
        f.write(b"# Inside\n\nunder a bad directory name\n")
    (drop / "fine.md").write_text("# Fine\n\nA fine file. Keyword tangerinewalrus.\n")
    report = await asyncio.wait_for(reindex(h), 60)
    assert (report.seen, report.added, list(report.failed)) == (1, 1, [])
    assert {i.path: i.reason for i in report.skipped} == {
        "bad\\xff\\xfe.txt": "file name is not valid UTF-8; rename it to index it",
        "dir\\xc3(": "directory name is not valid UTF-8; rename it to index it"}
    sources = {s.id: s for s in (await h.r.ListSources(rpb.ListSourcesRequest())).sources}
    assert sources["hostile"].HasField("last_scan") and sources["hostile"].last_error == ""
    found = await h.r.Search(rpb.SearchRequest(query="tangerinewalrus", top_k=1))
    assert [hit.document_id for hit in found.hits] == ["hostile/fine.md"]
    await h.r.DeleteDocument(rpb.DeleteDocumentRequest(id="hostile/fine.md"))
    await intact(h)


async def test_nul_and_control_characters(hostile: Hostile) -> None:
    """NUL characters (valid UTF-8, so they pass the wire) are refused in prompts, texts to
    embed and questions; in a pushed document they are dropped, as from a file, so no
    store, index or prompt carries them."""
    h = hostile
    inf = h.c.inference
    await refused(inf.Generate(pb.GenerateRequest(prompt="a\x00b")), INVALID,
                  "prompt contains a NUL character")
    await refused(inf.Chat(pb.ChatRequest(messages=[pb.ChatMessage(
        role=pb.CHAT_ROLE_USER, content="a\x00b")])), INVALID,
        "messages[0].content contains a NUL character")
    await refused(inf.Embed(pb.EmbedRequest(texts=["ok", "a\x00b"])), INVALID,
                  "texts[1] contains a NUL character")
    await refused(h.ask.Ask(apb.AskRequest(question="why\x00?")), INVALID,
                  "question or attachment contains a NUL character")
    doc = (await h.r.UpsertDocument(rpb.UpsertDocumentRequest(
        source_id="seed", id="seed/nul", title="Night\x00 shift",
        text="Page the\x00 on-call\x00 engineer \x01\x1b[1mnow\x1b[0m. Keyword ochreferret."))
        ).document
    assert (doc.state, doc.title) == (rpb.DOCUMENT_STATE_INDEXED, "Night shift")
    hit = (await h.r.Search(rpb.SearchRequest(query="ochreferret", top_k=1))).hits[0]
    assert hit.document_id == "seed/nul"
    assert "Page the on-call engineer" in hit.text and "\x00" not in hit.text
    assert (await h.r.DeleteDocument(rpb.DeleteDocumentRequest(id="seed/nul"))).deleted
    await intact(h)


# --- model paths ---------------------------------------------------------------------------


async def test_bad_model_paths_keep_the_old_child(hostile: Hostile) -> None:
    """Swapping to a directory, a FIFO, a symlink loop, a dangling symlink, a file that is
    not GGUF, an empty file or a device fails at validation: ABORTED naming the path and
    why, the FAILED stage carrying a permanent invalid_model cause, the old child serving
    on, untouched."""
    h = hostile
    m = h.models
    (m / "dir.gguf").mkdir()
    os.mkfifo(m / "fifo.gguf")
    (m / "loop-a.gguf").symlink_to(m / "loop-b.gguf")
    (m / "loop-b.gguf").symlink_to(m / "loop-a.gguf")
    (m / "dangling.gguf").symlink_to(m / "gone.gguf")
    (m / "notes.gguf").write_text("these are my notes, not a model\n")
    (m / "empty.gguf").write_bytes(b"")
    cases = [
        (GEN, m / "dir.gguf", "not a regular file: it is a directory"),
        (GEN, m / "fifo.gguf", "not a regular file: it is a FIFO"),
        (GEN, m / "loop-a.gguf", "symlink loop (too many levels of symbolic links)"),
        (GEN, m / "dangling.gguf", "no such file"),
        (GEN, m / "notes.gguf", "not a GGUF file (magic b'thes')"),
        (GEN, m / "empty.gguf", "empty file (0 bytes)"),
        (GEN, Path("/dev/zero"), "not a regular file: it is a character device"),
        (EMB, m / "dir.gguf", "not a regular file: it is a directory"),
    ]
    before = {c.role: c for c in (await h.c.control.Status(control_pb2.StatusRequest())).children}
    for role, path, reason in cases:
        seen: list[control_pb2.SwapProgress] = []
        started = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for p in h.c.control.Swap(control_pb2.SwapRequest(role=role,
                                                                     model_path=str(path))):
                seen.append(p)
        assert time.monotonic() - started < 10
        details = err.value.details() or ""
        assert err.value.code() == grpc.StatusCode.ABORTED, details
        assert f"invalid model {path}: {reason}" in details
        assert "the old child keeps serving" in details
        assert seen[-1].stage == control_pb2.SWAP_STAGE_FAILED
        assert (seen[-1].cause.kind, seen[-1].cause.permanent) == ("invalid_model", True)
        assert reason in seen[-1].cause.message
        now = await h.c.child(role)
        was = before[role]
        assert now.state == control_pb2.CHILD_STATE_RUNNING
        assert (now.pid, now.model_path, now.previous_model_path, now.restarts) == (
            was.pid, was.model_path, was.previous_model_path, was.restarts)
        assert reason in now.last_error
    await refused(h.c.control.Swap(control_pb2.SwapRequest(role=GEN, model_path="/m/\x00.gguf")),
                  INVALID, "model_path contains a NUL character")
    await intact(h)


# --- document ids --------------------------------------------------------------------------


async def test_document_ids_with_separators_and_control_characters(hostile: Hostile) -> None:
    """Ids that would escape or confuse (absolute, .., empty segments, backslashes,
    control characters, over-long) are refused by Upsert, Get and Delete alike, saying
    which rule, with the id escaped in a one-line message; nested ids with '/' work."""
    h = hostile
    cases = [
        ("/etc/passwd", "document id starts with '/'"),
        ("seed/../../etc/passwd", "document id has a '..' segment"),
        ("..", "document id has a '..' segment"),
        ("seed//x", "document id has an empty segment"),
        ("seed/x/", "document id has an empty segment"),
        ("seed\\..\\x", "document id contains a backslash (use '/')"),
        ("seed/a\x00b", "document id contains a control character (U+0000): 'seed/a\\x00b'"),
        ("seed/a\nb", "document id contains a control character (U+000A): 'seed/a\\nb'"),
        ("seed/a\rb", "control character (U+000D)"),
        ("seed/\x1b[31mred", "control character (U+001B)"),
        ("seed/a\x7fb", "control character (U+007F)"),
        ("seed/a\u0085b", "control character (U+0085)"),
        ("seed/" + "s" * 508, "document id is 513 characters long, the limit is 512"),
    ]
    for doc_id, reason in cases:
        for kind in ("text", "html"):
            await refused(h.r.UpsertDocument(rpb.UpsertDocumentRequest(
                source_id="seed", id=doc_id, text="<p>some text</p>", kind=kind)),
                INVALID, reason)
        await refused(h.r.GetDocument(rpb.GetDocumentRequest(id=doc_id)), INVALID, reason)
        await refused(h.r.DeleteDocument(rpb.DeleteDocumentRequest(id=doc_id)), INVALID, reason)
    await refused(h.r.GetDocument(rpb.GetDocumentRequest()), INVALID, "document id is empty")
    await refused(h.r.AddSource(rpb.AddSourceRequest(id="evil", path="/tmp/\x00x")), INVALID,
                  "path contains a NUL character")
    for source_id in ("../x", "Seed", "a/b", "a\nb", ""):
        await refused(h.r.AddSource(rpb.AddSourceRequest(id=source_id)), INVALID,
                      "must be 1-64 characters of a-z, 0-9, '_' and '-'")
    nested = "seed/runbooks/network/core/sw1.md"
    doc = (await h.r.UpsertDocument(rpb.UpsertDocumentRequest(
        source_id="seed", id=nested, text="Core switch notes. Keyword tealpagoda."))).document
    assert (doc.id, doc.state) == (nested, rpb.DOCUMENT_STATE_INDEXED)
    assert (await h.r.GetDocument(rpb.GetDocumentRequest(id=nested))).id == nested
    assert (await h.r.DeleteDocument(rpb.DeleteDocumentRequest(id=nested))).deleted
    await intact(h)


# --- secrets in a conversation's history ----------------------------------------------------


async def test_secrets_in_ask_history_never_reach_the_generation_endpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ask with a password in a user turn and an AWS key pair in an assistant turn (and a
    secret in the question and the attachment), through a real daemon whose generation
    role is an endpoint — a recording OpenAI-compatible server on a loopback port: the
    chat request it received holds every turn with its secret redacted, and neither the
    request, the search query, the audit record nor the daemon's log holds any of the
    secrets."""
    # This section was appended to the module: its imports are its own.
    import json
    import string

    from tests.support.fake_openai import serve_fake_openai

    rng = random.Random(1805)

    def fake(alphabet: str, n: int) -> str:  # built at run time: no scanner flags a literal
        return "".join(rng.choice(alphabet) for _ in range(n - 2)) + "Q7"

    password = "hunter2x" + fake(string.ascii_letters, 12)
    aws_key = "AK" + "IA" + fake(string.ascii_uppercase, 16)
    aws_secret = fake(string.ascii_letters + string.digits + "/+", 40)
    question_key = "s" + "k-" + fake(string.ascii_letters + string.digits, 48)
    attachment_password = fake(string.ascii_letters + string.digits, 20)
    secrets = [password, aws_key, aws_secret, question_key, attachment_password]
    history = [
        apb.Turn(role=pb.CHAT_ROLE_USER,
                 content=f"Last week I logged in to db02 with password={password} and it "
                         "worked."),
        apb.Turn(role=pb.CHAT_ROLE_ASSISTANT,
                 content=f"Noted. The backup job uses aws_access_key_id = {aws_key}\n"
                         f"aws_secret_access_key = {aws_secret}\nfor the NAS sync."),
    ]
    with serve_fake_openai() as (url, seen):
        daemon = make_daemon(config_env(
            "llama-server", LLAMAD_STATE_DIR=str(tmp_path / "state"),
            LLAMAD_GENERATION_MODE="endpoint", LLAMAD_GENERATION_ENDPOINT_URL=url,
            LLAMAD_EMBEDDING_MODE="disabled",
            # One document in the index: its BM25 scores are small, but it is relevant.
            LLAMAD_ANSWER_MIN_TEXT_SCORE="0.01"))
        c = Clients(await daemon.start())
        queries: list[str] = []
        try:
            assert daemon.retriever is not None
            search = daemon.retriever.search

            async def recorded(query: str, **kw: Any) -> Any:  # what the indexes are asked
                queries.append(query)
                return await search(query, **kw)

            daemon.retriever.search = recorded  # type: ignore[method-assign]
            await c.wait_serving("generation", timeout=30)
            r = retrieval_pb2_grpc.RetrievalServiceStub(c.channel)
            await r.AddSource(rpb.AddSourceRequest(id="notes"))
            await r.UpsertDocument(rpb.UpsertDocumentRequest(
                source_id="notes", id="notes/web01", title="web01 disk full",
                text="When web01 reports no space left on device, rotate the nginx logs."))
            stub = answer_pb2_grpc.AnswerServiceStub(c.channel)
            events = [e async for e in stub.Ask(apb.AskRequest(
                question=f"Why is the web01 disk full? (my key is {question_key})",
                task=apb.TASK_TYPE_DIAGNOSE, history=history,
                attachment=("df -h\n/dev/sda1 100% /var\n"
                            f"export DB_PASSWORD={attachment_password}\n"),
                sampling=pb.SamplingParams(max_tokens=8)))]
        finally:
            await c.close()
            await daemon.shutdown()

    done = events[-1].done
    assert "".join(e.text for e in events if e.WhichOneof("event") == "text") == \
        "The answer is 42. "
    cited = [s for e in events if e.WhichOneof("event") == "sources"
             for s in e.sources.citations]
    assert [s.document_id for s in cited] == ["notes/web01"]
    asked = [body for path, body, _ in seen
             if path.endswith("/chat/completions") and "Last week" in json.dumps(body)]
    assert asked, [path for path, _, _ in seen]
    messages = asked[-1]["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[1]["content"] == ("Last week I logged in to db02 with "
                                      "password=[REDACTED:password] and it worked.")
    assert "The backup job uses aws_access_key_id = [REDACTED:" in messages[2]["content"]
    assert "aws_secret_access_key = [REDACTED:" in messages[2]["content"]
    assert "web01 disk full" in messages[3]["content"]  # the source reached the prompt
    assert len(queries) == 1 and "Why is the web01 disk full?" in queries[0]
    wire = json.dumps(seen) + "\n".join(queries)
    audit = (tmp_path / "state" / "audit" / "answers.jsonl").read_text()
    assert json.loads(audit.splitlines()[-1])["prompt_sha256"] == done.prompt_sha256
    logged = capsys.readouterr()
    for secret in secrets:
        assert secret not in wire, secret
        assert secret not in audit, secret
        assert secret not in logged.out + logged.err, secret
