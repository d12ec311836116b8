"""Inference modes end to end, as configured: a real daemon whose roles are served by real
llama-server processes it does not supervise (endpoint mode, with and without an embedding
endpoint, behind a strict OpenAI-compatible server without /tokenize) or by nothing
(disabled), and what generation, health and retrieval do in each.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from llamad_protocol.v1 import (
    answer_pb2,
    answer_pb2_grpc,
    control_pb2,
    retrieval_pb2,
    retrieval_pb2_grpc,
)
from llamad_protocol.v1 import inference_pb2 as pb
from tests.conftest import EMBED_MODEL
from tests.support.daemon import EMB, GEN, NOT_SERVING, SERVING, Clients
from tests.support.fake_openai import serve_fake_openai
from tests.support.modes import DISABLED, ENDPOINT, KEY, MakeDaemon, Server, generate, wait_state

pytestmark = pytest.mark.integration


async def index_note(c: Clients, doc_id: str, title: str, text: str
                     ) -> retrieval_pb2_grpc.RetrievalServiceStub:
    r = retrieval_pb2_grpc.RetrievalServiceStub(c.channel)
    await r.AddSource(retrieval_pb2.AddSourceRequest(id="notes"))
    await r.UpsertDocument(retrieval_pb2.UpsertDocumentRequest(
        source_id="notes", id=doc_id, title=title, text=text))
    return r


# --- endpoint mode -----------------------------------------------------------------------


async def test_endpoint_mode_from_configuration(servers: dict[str, Server],
                                                daemon_for: MakeDaemon) -> None:
    """Both roles configured as endpoints (URLs with /v1, one with a trailing slash):
    generation, chat, tokenize and detokenize (an id outside the vocabulary the endpoint
    reports refused), embeddings and hybrid search go through them; Status and
    health say so; no child process is started."""
    gen, emb = servers["gen"], servers["emb"]
    daemon, c = await daemon_for(
        LLAMAD_GENERATION_MODE="endpoint", LLAMAD_GENERATION_ENDPOINT_URL=gen.url + "/",
        LLAMAD_EMBEDDING_MODE="endpoint", LLAMAD_EMBEDDING_ENDPOINT_URL=emb.url,
        LLAMAD_EMBEDDING_ENDPOINT_MODEL=EMBED_MODEL)
    await c.wait_serving("", timeout=60)
    out = await generate(c)
    assert out[-1].finish_reason != pb.FINISH_REASON_UNSPECIFIED
    assert out[-1].model == str(gen.model)  # llama-server names its model by path
    assert out[-1].usage.completion_tokens == 8
    chat = [m async for m in c.inference.Chat(pb.ChatRequest(
        messages=[pb.ChatMessage(role=pb.CHAT_ROLE_USER, content="Say hi")],
        sampling=pb.SamplingParams(max_tokens=4)))]
    assert "".join(m.text for m in chat)
    tokens = await c.inference.Tokenize(pb.TokenizeRequest(text="hello world"))
    assert tokens.count == 2
    text = await c.inference.Detokenize(pb.DetokenizeRequest(tokens=tokens.tokens))
    assert text.text == "hello world"
    with pytest.raises(grpc.aio.AioRpcError) as refused:  # n_vocab of its /v1/models
        await c.inference.Detokenize(pb.DetokenizeRequest(tokens=[4_000_000_000]))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    vectors = await c.inference.Embed(pb.EmbedRequest(texts=["disk full", "no space left"]))
    assert vectors.dimension == 384
    assert vectors.model == str(emb.model)

    status = await c.child(GEN)
    assert status.mode == ENDPOINT
    assert status.state == control_pb2.CHILD_STATE_RUNNING
    assert status.endpoint_url == gen.url + "/"
    assert status.endpoint_model == str(gen.model)
    assert (status.pid, status.port, status.socket, status.runtime) == (0, 0, "", "endpoint")
    assert status.model_context_length > 0  # from /v1/models' metadata
    assert await c.status("generation") == SERVING
    assert await c.status("embedding") == SERVING

    r = await index_note(c, "notes/disk", "Disk full",
                         "When web01 reports no space left on device, rotate the nginx logs.")
    found = await r.Search(retrieval_pb2.SearchRequest(query="disk is full on web01"))
    assert found.mode == retrieval_pb2.SEARCH_MODE_HYBRID
    assert found.hits[0].document_id == "notes/disk"
    assert daemon.children["generation"].supervisor.pid == 0


async def test_endpoint_without_embeddings_leaves_retrieval_bm25_only(
    servers: dict[str, Server], daemon_for: MakeDaemon
) -> None:
    """An embedding endpoint without an embeddings API never becomes ready: Status says
    why, and search answers BM25-only, saying so."""
    _, c = await daemon_for(
        LLAMAD_GENERATION_MODE="disabled",
        LLAMAD_EMBEDDING_MODE="endpoint", LLAMAD_EMBEDDING_ENDPOINT_URL=servers["gen"].url)
    status = await wait_state(c, EMB, control_pb2.CHILD_STATE_FAILED)
    assert status.mode == ENDPOINT
    assert status.last_exit.kind == "no_embeddings"
    assert "no embeddings API" in status.last_error
    assert await c.status("embedding") == NOT_SERVING
    r = await index_note(c, "notes/vpn", "VPN", "The IPsec tunnel flaps.")
    found = await r.Search(retrieval_pb2.SearchRequest(query="IPsec tunnel"))
    assert found.mode == retrieval_pb2.SEARCH_MODE_TEXT
    assert found.hits[0].document_id == "notes/vpn"
    assert any("embedding endpoint is unavailable" in w and "no embeddings API" in w
               and "BM25-only" in w for w in found.warnings), found.warnings


async def test_disabled_mode(daemon_for: MakeDaemon) -> None:
    """Disabled roles refuse calls with FAILED_PRECONDITION and say how to enable them;
    health reports them NOT_SERVING; retrieval keeps working, BM25-only."""
    _, c = await daemon_for(LLAMAD_GENERATION_MODE="disabled",
                            LLAMAD_EMBEDDING_MODE="disabled")
    for call in (generate(c), c.inference.Embed(pb.EmbedRequest(texts=["x"])),
                 c.inference.Tokenize(pb.TokenizeRequest(text="x"))):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "disabled" in (err.value.details() or "")
        assert "SetMode" in (err.value.details() or "")
    assert await c.status("generation") == NOT_SERVING
    assert await c.status("llamad.v1.InferenceService") == NOT_SERVING
    assert await c.status("llamad.v1.RetrievalService") == SERVING
    status = await c.child(GEN)
    assert (status.mode, status.enabled) == (DISABLED, False)
    r = await index_note(c, "notes/db", "db02", "Replication lag on db02.")
    found = await r.Search(retrieval_pb2.SearchRequest(query="replication lag"))
    assert found.mode == retrieval_pb2.SEARCH_MODE_TEXT
    assert any("embedding is disabled" in w for w in found.warnings)


async def test_endpoint_without_tokenizer(daemon_for: MakeDaemon, tmp_path: Path) -> None:
    """A strict OpenAI-compatible server (no /tokenize; rejects stream_options and top_k)
    behind a key: calls stream after one retry per rejected parameter; Tokenize is
    FAILED_PRECONDITION, said plainly; Ask assembles its prompt with estimated token
    counts and says so."""
    key = tmp_path / "gateway.key"
    key.write_text(f"{KEY}\n")
    key.chmod(0o600)
    with serve_fake_openai(key=KEY, prefix="/llm") as (url, seen):
        _, c = await daemon_for(
            LLAMAD_GENERATION_MODE="endpoint", LLAMAD_GENERATION_ENDPOINT_URL=url,
            LLAMAD_GENERATION_API_KEY_FILE=str(key), LLAMAD_EMBEDDING_MODE="disabled")
        await c.wait_serving("generation", timeout=30)
        out = [m async for m in c.inference.Generate(pb.GenerateRequest(
            prompt="Q:", sampling=pb.SamplingParams(max_tokens=3, top_k=5)))]
        assert "".join(m.text for m in out) == "The answer is "
        assert out[-1].model == "tiny-chat"
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.inference.Tokenize(pb.TokenizeRequest(text="hello"))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "tokenization not available from this endpoint" in (err.value.details() or "")
        answer = [m async for m in answer_pb2_grpc.AnswerServiceStub(c.channel).Ask(
            answer_pb2.AskRequest(question="What does this output mean?",
                                  task=answer_pb2.TASK_TYPE_EXPLAIN_OUTPUT,
                                  attachment="ERROR: disk quota exceeded on /var"))]
        assert "".join(m.text for m in answer).startswith("The answer is 42.")
        warnings = [w for m in answer if m.HasField("sources") for w in m.sources.warnings]
        assert any("token counts are estimated" in w for w in warnings), warnings
        assert all(auth == f"Bearer {KEY}" for _, _, auth in seen)
        streamed = [body for path, body, _ in seen if body.get("stream")]
        assert "stream_options" not in streamed[-1] and "top_k" not in streamed[-1]
