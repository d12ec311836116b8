"""Hostile requests against a real daemon (real llama-server children on SmolLM2 and
MiniLM, real gRPC clients on port 0): empty and huge prompts, string fields that are not
UTF-8 and malformed protobuf bytes on the wire, absurd numbers, huge embedding batches and
bad model paths to swap to. Every case gets a clear status code and a message that says what
is wrong, and afterwards nothing already stored is lost or changed.

One daemon serves the whole module (the ``hostile`` fixture, tests/integration/conftest.py):
before the first case it indexes a few documents; ``intact`` then checks, after each case,
that RetrievalService Status reports the same counts, every document is still listed and
found by its own unique word (hybrid search), and Generate still answers.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pool
from grpc_reflection.v1alpha import reflection_pb2

from llamad_protocol.v1 import answer_pb2 as apb
from llamad_protocol.v1 import common_pb2, control_pb2
from llamad_protocol.v1 import inference_pb2 as pb
from llamad_protocol.v1 import retrieval_pb2 as rpb
from tests.support.hostile import INVALID, Hostile, intact, refused

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

GEN = common_pb2.CHILD_ROLE_GENERATION
EMB = common_pb2.CHILD_ROLE_EMBEDDING


MAX_MESSAGE = 16 * 1024 * 1024  # limits.max_message_bytes, default
UTF8 = "proto3 string fields must be UTF-8"


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
    # Unary and streaming methods of each service; how each is called and the request type
    # the refusal must name are the proto's.
    methods = ["/llamad.v1.InferenceService/Generate", "/llamad.v1.InferenceService/Embed",
               "/llamad.v1.RetrievalService/UpsertDocument", "/llamad.v1.RetrievalService/Status",
               "/llamad.v1.ControlService/Swap", "/llamad.v1.AnswerService/Ask",
               "/grpc.health.v1.Health/Watch"]
    payloads = [
        (b"\xff\xff\xff\xff", "a varint cut off by the end of the data at byte 0"),
        (b"\x0a\x10abc", "at byte 0 claims 16 bytes but only 3 remain"),
        (b"\x0f", "has wire type 7, which does not exist"),
        (b"\x08" + b"\xff" * 11, "a varint longer than 10 bytes at byte 1"),
    ]
    for method in methods:
        proto = descriptor_pool.Default().FindMethodByName(method[1:].replace("/", "."))
        for payload, reason in payloads:
            await refused(raw(h, method, payload, stream=proto.server_streaming), INVALID,
                          f"request is not a valid {proto.input_type.full_name}: ", reason)
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
    unknown_mode: Any = 99
    await refused(h.r.Search(rpb.SearchRequest(query="disk", mode=unknown_mode)), INVALID,
                  "unknown search mode 99")
    await refused(h.ask.Ask(apb.AskRequest(question="disk full?", mode=unknown_mode)),
                  INVALID, "unknown search mode 99")
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
        (GEN, m / "notes.gguf", "not a GGUF file (it does not start with GGUF's magic)"),
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
