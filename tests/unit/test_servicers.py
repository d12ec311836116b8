"""InferenceService and AnswerService through a real in-process gRPC server, the real
router and admission, and a scripted backend (no child process): what each call sends to
the backend, what it relays back, and how refusals reach the caller."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
import numpy as np
import pytest

from daemon.config import Limits
from daemon.grpcapi.answer import AnswerServicer
from daemon.grpcapi.inference import InferenceServicer
from daemon.models.admission import Admission
from daemon.models.backend import DisabledBackend
from daemon.models.router import InferenceRouter
from daemon.services.ask import AnswerSettings, ResponseCache
from daemon.telemetry.audit import AuditLog
from llamad_protocol.v1 import answer_pb2 as apb
from llamad_protocol.v1 import answer_pb2_grpc, common_pb2, inference_pb2_grpc
from llamad_protocol.v1 import inference_pb2 as ipb
from llamad_protocol.v1 import retrieval_pb2 as rpb
from llamad_protocol.v1.wire import RETRY_AFTER_KEY
from supervisor import ChildNotReadyError, ChildRequestError
from tests.support.backend import FakeBackend, FakeRole
from tests.support.embedder import HashEmbedder, filled
from tests.support.inprocess import serving
from tests.support.load import patience


class Inference:
    """An InferenceService stub over a router with a generation and an embedding role."""

    def __init__(self, channel: grpc.aio.Channel, router: InferenceRouter,
                 generation: FakeRole, embedding: FakeRole) -> None:
        self.stub = inference_pb2_grpc.InferenceServiceStub(channel)
        self.router, self.generation, self.embedding = router, generation, embedding

    async def generate(self, prompt: str = "Say hello",
                       sampling: ipb.SamplingParams | None = None) -> list[ipb.GenerateResponse]:
        request = ipb.GenerateRequest(prompt=prompt, sampling=sampling)
        return [msg async for msg in self.stub.Generate(request)]


@pytest.fixture
async def inference() -> AsyncIterator[Inference]:
    generation = FakeRole(FakeBackend())
    embedding = FakeRole(FakeBackend(model_name="fake-embedder", context_tokens=16),
                         Admission("embedding", 2, 4))
    router = InferenceRouter({"generation": generation, "embedding": embedding})
    servicer = InferenceServicer(router, Limits())
    async with serving(lambda s: inference_pb2_grpc.add_InferenceServiceServicer_to_server(
            servicer, s)) as channel:
        yield Inference(channel, router, generation, embedding)


def backend_of(role: FakeRole) -> FakeBackend:
    assert isinstance(role.served, FakeBackend)
    return role.served


async def refused(call: Callable[[], Awaitable[object]]) -> grpc.aio.AioRpcError:
    """The error a call ends with (it must end with one)."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call()
    return info.value


# --- Generate and Chat ----------------------------------------------------------------


async def test_generate_relays_each_piece_then_usage(inference: Inference) -> None:
    """Generate sends the prompt and sampling to the backend, relays each piece in order
    with the model's name, and ends with the finish reason and the backend's usage."""
    messages = await inference.generate(
        "Say hello", ipb.SamplingParams(max_tokens=3, temperature=0.0))
    backend = backend_of(inference.generation)
    assert backend.prompts == ["Say hello"]
    assert backend.samplings[0].max_tokens == 3
    assert [m.text for m in messages] == ["Hello", ",", " world", ""]
    assert {m.model for m in messages} == {"fake-model"}
    last = messages[-1]
    assert last.finish_reason == ipb.FINISH_REASON_LENGTH
    assert (last.usage.prompt_tokens, last.usage.completion_tokens,
            last.usage.total_tokens) == (7, 3, 10)
    assert last.usage.time_to_first_token_ms > 0
    assert inference.generation.admission.in_flight == 0


async def test_chat_sends_the_conversation_in_order(inference: Inference) -> None:
    """Chat hands the backend every message as (role, content), in the caller's order."""
    request = ipb.ChatRequest(messages=[
        ipb.ChatMessage(role=ipb.CHAT_ROLE_SYSTEM, content="Be brief."),
        ipb.ChatMessage(role=ipb.CHAT_ROLE_USER, content="Hi"),
        ipb.ChatMessage(role=ipb.CHAT_ROLE_ASSISTANT, content="Hello."),
        ipb.ChatMessage(role=ipb.CHAT_ROLE_USER, content="Again"),
    ])
    messages = [m async for m in inference.stub.Chat(request)]
    assert backend_of(inference.generation).chats == [
        [("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello."), ("user", "Again")]]
    assert "".join(m.text for m in messages) == "Hello, world"


async def test_chat_takes_the_configured_defaults_and_generate_stays_greedy(
        inference: Inference) -> None:
    """A Chat that sets no sampling gets limits.chat_* (temperature and repetition
    guard); a Generate that sets none is greedy without a guard."""
    request = ipb.ChatRequest(messages=[ipb.ChatMessage(role=ipb.CHAT_ROLE_USER, content="Hi")])
    _ = [m async for m in inference.stub.Chat(request)]
    await inference.generate("Say hello")
    chat, generate = backend_of(inference.generation).samplings
    limits = Limits()
    assert chat.temperature == pytest.approx(limits.chat_temperature)
    assert chat.dry_multiplier == (limits.chat_dry_multiplier or None)
    assert (generate.temperature, generate.requested()) == (0.0, [])


async def test_an_invalid_request_never_reaches_the_backend(inference: Inference) -> None:
    """An empty prompt is INVALID_ARGUMENT, and the backend is not called."""
    error = await refused(lambda: inference.generate(""))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert backend_of(inference.generation).prompts == []


async def test_a_disabled_role_is_refused_before_it_queues(inference: Inference) -> None:
    """A disabled role is FAILED_PRECONDITION naming how to switch it on, even when its
    slots and queue are full (it never waits for a slot)."""
    inference.generation.served = DisabledBackend("generation")
    admission = inference.generation.admission = Admission("generation", 1, 0)
    async with admission.slot(None):
        error = await refused(inference.generate)
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "SetMode" in (error.details() or "")


async def test_a_role_not_ready_is_unavailable_with_a_retry_hint(inference: Inference) -> None:
    """A child that is backing off is UNAVAILABLE, with its retry hint in milliseconds."""
    inference.generation.unready = ChildNotReadyError("generation", "backoff", 2.5)
    error = await refused(inference.generate)
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    trailing = dict(error.trailing_metadata() or ())
    assert trailing[RETRY_AFTER_KEY] == "2500"


async def test_a_stream_that_breaks_is_unavailable(inference: Inference) -> None:
    """A child connection dropped mid-stream ends the call UNAVAILABLE after the pieces
    already sent; the slot is given back."""
    backend_of(inference.generation).fail_stream_after = 2
    received: list[str] = []
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for msg in inference.stub.Generate(ipb.GenerateRequest(prompt="x")):
            received.append(msg.text)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert received == ["Hello", ","]
    assert inference.generation.admission.in_flight == 0


async def test_calls_beyond_the_slots_and_queue_are_resource_exhausted(
        inference: Inference) -> None:
    """With one slot and a queue of one, a third concurrent call is RESOURCE_EXHAUSTED
    at once; the two admitted ones complete when the backend proceeds."""
    queued = asyncio.Event()
    inference.generation.admission = Admission(
        "generation", 1, 1, on_change=lambda a: queued.set() if a.queued else None)
    gate = backend_of(inference.generation).gate = asyncio.Event()
    first = asyncio.ensure_future(inference.generate())
    second = asyncio.ensure_future(inference.generate())
    await asyncio.wait_for(queued.wait(), patience(5))
    error = await refused(inference.generate)
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    gate.set()
    assert len(await first) == len(await second) == 4


async def test_draining_refuses_new_calls(inference: Inference) -> None:
    """Once the daemon drains, a new call is UNAVAILABLE saying it shuts down."""
    inference.router.draining = True
    error = await refused(inference.generate)
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert "shutting down" in (error.details() or "")


# --- Embed and Tokenize ---------------------------------------------------------------


async def test_embed_normalises_rows_unless_told_not_to(inference: Inference) -> None:
    """Embed returns one unit-length row per text by default, the backend's raw rows with
    normalize=false, with the dimension and the embedding model's name."""
    texts = ["disk full", "db lag"]
    unit = await inference.stub.Embed(ipb.EmbedRequest(texts=texts))
    raw = await inference.stub.Embed(ipb.EmbedRequest(texts=texts, normalize=False))
    assert unit.model == "fake-embedder"
    assert unit.dimension == 4
    for row in unit.embeddings:
        assert np.linalg.norm(np.array(row.values)) == pytest.approx(1.0, abs=1e-6)
    assert [list(r.values) for r in raw.embeddings] == [[9, 0, 0, 1], [6, 0, 0, 1]]
    assert unit.prompt_tokens == 4


async def test_a_text_over_the_embedding_context_is_refused_by_name(
        inference: Inference) -> None:
    """A text whose token count exceeds the embedding context (16) is INVALID_ARGUMENT
    naming its index and count; nothing is embedded. Short texts are not tokenized."""
    long = " ".join(["word"] * 20)
    error = await refused(lambda: inference.stub.Embed(ipb.EmbedRequest(texts=["ok", long])))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "texts[1] has 22 tokens" in (error.details() or "")
    backend = backend_of(inference.embedding)
    assert backend.embedded == []
    assert [text for text, _ in backend.tokenized] == [long]


async def test_the_childs_too_large_answer_becomes_invalid_argument(
        inference: Inference) -> None:
    """llama.cpp's HTTP 500 "input is too large" is the caller's to fix: INVALID_ARGUMENT
    naming the context, not UNAVAILABLE."""
    backend_of(inference.embedding).fail_embed = ChildRequestError(
        "/v1/embeddings: HTTP 500: input is too large to process", status=500)
    error = await refused(lambda: inference.stub.Embed(ipb.EmbedRequest(texts=["a"])))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "16 tokens" in (error.details() or "")


async def test_tokenize_asks_the_named_role(inference: Inference) -> None:
    """Tokenize goes to the role asked for (generation by default), with add_special."""
    gen = await inference.stub.Tokenize(ipb.TokenizeRequest(text="ab cde"))
    emb = await inference.stub.Tokenize(ipb.TokenizeRequest(
        text="ab cde", role=common_pb2.CHILD_ROLE_EMBEDDING, add_special=True))
    assert (list(gen.tokens), gen.count, gen.model) == ([2, 3], 2, "fake-model")
    assert (list(emb.tokens), emb.model) == ([1, 2, 3, 2], "fake-embedder")
    assert backend_of(inference.embedding).tokenized == [("ab cde", True)]


async def test_tokenize_over_the_prompt_limit_is_refused_naming_the_option(
        inference: Inference) -> None:
    """A text longer than limits.max_prompt_chars is refused before the backend sees it."""
    text = "x" * (Limits().max_prompt_chars + 1)
    error = await refused(lambda: inference.stub.Tokenize(ipb.TokenizeRequest(text=text)))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "limits.max_prompt_chars" in (error.details() or "")
    assert backend_of(inference.generation).tokenized == []


# --- Ask ------------------------------------------------------------------------------


class Answer:
    def __init__(self, channel: grpc.aio.Channel, backend: FakeBackend) -> None:
        self.stub = answer_pb2_grpc.AnswerServiceStub(channel)
        self.backend = backend

    async def ask(self, question: str, *, no_cache: bool = False,
                  sampling: ipb.SamplingParams | None = None, top_k: int = 0,
                  mode: rpb.SearchMode.ValueType = rpb.SEARCH_MODE_UNSPECIFIED,
                  ) -> list[apb.AskResponse]:
        request = apb.AskRequest(question=question, no_cache=no_cache, sampling=sampling,
                                 top_k=top_k, mode=mode)
        return [m async for m in self.stub.Ask(request)]


@pytest.fixture
async def answer(tmp_path: Path) -> AsyncIterator[Answer]:
    retriever = await filled(tmp_path / "index", HashEmbedder("hash"))
    backend = FakeBackend(pieces=["Rotate", " the logs", " [S1]."], finish="stop")
    router = InferenceRouter({"generation": FakeRole(backend)})
    servicer = AnswerServicer(
        router, retriever, Limits(), settings=AnswerSettings(),
        cache=ResponseCache(ttl=60, max_entries=8),
        audit=AuditLog(tmp_path / "audit.jsonl", max_bytes=1 << 20, backups=1))
    try:
        async with serving(lambda s: answer_pb2_grpc.add_AnswerServiceServicer_to_server(
                servicer, s)) as channel:
            yield Answer(channel, backend)
    finally:
        await retriever.close()


async def test_ask_answers_from_the_retrieved_sources_and_cites_them(answer: Answer) -> None:
    """Ask puts the retrieved runbook into the prompt it sends the backend, streams the
    answer, then the citations (S1 is the runbook), then the usage."""
    messages = await answer.ask("web01 disk full: what do I do?")
    text = "".join(m.text for m in messages if m.text)
    assert text == "Rotate the logs [S1]."
    sources = next(m.sources for m in messages if m.HasField("sources"))
    assert sources.citations[0].label == "S1"
    assert sources.citations[0].document_id == "docs/disk"
    done = messages[-1].done
    assert done.finish_reason == ipb.FINISH_REASON_STOP
    assert done.usage.completion_tokens == 3
    assert done.model_name == "generation"  # the role's default model, by its name
    prompt = "\n".join(m[1] for m in answer.backend.chats[0] if isinstance(m, tuple))
    assert "rotate nginx logs" in prompt
    assert "web01 disk full: what do I do?" in prompt


async def test_a_repeated_question_is_answered_from_the_cache(answer: Answer) -> None:
    """The same question over the same sources and model is generated once; no_cache
    generates again."""
    first = await answer.ask("web01 disk full?")
    second = await answer.ask("web01 disk full?")
    assert [m.text for m in first if m.text] != []
    assert "".join(m.text for m in second) == "".join(m.text for m in first)
    assert len(answer.backend.chats) == 1
    await answer.ask("web01 disk full?", no_cache=True)
    assert len(answer.backend.chats) == 2


async def test_another_model_does_not_reuse_the_cached_answer(answer: Answer) -> None:
    """A cached answer belongs to the model that wrote it: after a swap (a new identity)
    the question is generated again."""
    await answer.ask("web01 disk full?")
    answer.backend.identity = "other.gguf@fedcba9876543210"
    await answer.ask("web01 disk full?")
    assert len(answer.backend.chats) == 2


async def test_other_sampling_does_not_reuse_the_cached_answer(answer: Answer) -> None:
    """A cached answer belongs to the sampling that produced it: the same question with
    another temperature, seed, penalty, DRY setting or max_tokens is generated again; the
    same settings again are served from the cache."""
    variants = [
        ipb.SamplingParams(),
        ipb.SamplingParams(temperature=0.7, seed=1),
        ipb.SamplingParams(temperature=0.7, seed=2),
        ipb.SamplingParams(repeat_penalty=1.1),
        ipb.SamplingParams(dry_multiplier=0.8),
        ipb.SamplingParams(max_tokens=64),
    ]
    for sampling in variants:
        await answer.ask("web01 disk full?", sampling=sampling)
    assert len(answer.backend.chats) == len(variants)
    second = await answer.ask("web01 disk full?",
                              sampling=ipb.SamplingParams(temperature=0.7, seed=2))
    assert second[-1].done.cached
    assert len(answer.backend.chats) == len(variants)


async def test_a_question_without_relevant_sources_is_not_generated(answer: Answer) -> None:
    """With no source over the relevance floor, Ask says it has no context and never
    calls the model."""
    messages = await answer.ask("zebra quantum kettle")
    assert messages[-1].done.no_context
    assert answer.backend.chats == []


async def test_a_prompt_that_cannot_fit_the_context_is_out_of_range(answer: Answer) -> None:
    """When the model's context cannot hold even the question and the reserved answer
    tokens, Ask is OUT_OF_RANGE and the model is not called."""
    answer.backend.context_tokens = 64
    error = await refused(lambda: answer.ask("web01 disk full? " * 20,
                                             sampling=ipb.SamplingParams(max_tokens=32)))
    assert error.code() == grpc.StatusCode.OUT_OF_RANGE
    assert answer.backend.chats == []


async def test_ask_searches_as_asked_and_says_where_each_source_came_from(
        answer: Answer) -> None:
    """mode=text: the sources come from BM25 alone and each citation says so, with when
    its document was indexed; a top_k above retrieval.max_k is clamped, with a warning."""
    messages = await answer.ask("web01 disk full?", top_k=500, mode=rpb.SEARCH_MODE_TEXT)
    sources = next(m.sources for m in messages if m.HasField("sources"))
    assert sources.retrieval_mode == rpb.SEARCH_MODE_TEXT
    assert sources.citations
    assert all(c.search_source == rpb.SEARCH_SOURCE_TEXT for c in sources.citations)
    assert all(c.indexed_at.seconds > 0 for c in sources.citations)
    assert any("retrieval.max_k = 20" in w for w in sources.warnings)


async def test_ask_refuses_controls_that_would_break_a_cited_answer(answer: Answer) -> None:
    """Ask takes the penalties (they reach the backend) but refuses a grammar,
    response_format and logprobs by name: its answer is prose with citations."""
    await answer.ask("web01 disk full?", sampling=ipb.SamplingParams(
        max_tokens=8, repeat_penalty=1.2, dry_multiplier=0.8))
    sent = answer.backend.samplings[0]
    assert (sent.repeat_penalty, sent.dry_multiplier) == (ipb.SamplingParams(
        repeat_penalty=1.2).repeat_penalty, ipb.SamplingParams(dry_multiplier=0.8).dry_multiplier)
    for sampling in (ipb.SamplingParams(grammar='root ::= "a"'),
                     ipb.SamplingParams(logprobs=True),
                     ipb.SamplingParams(response_format=ipb.ResponseFormat(
                         type=ipb.RESPONSE_FORMAT_TYPE_JSON_OBJECT))):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await answer.ask("web01 disk full?", sampling=sampling)
        error = info.value
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "not available on Ask" in (error.details() or "")
    assert len(answer.backend.chats) == 1
