"""The fake AnswerService of :class:`clients.testing.FakeLlamad`: a canned answer, cited
from the fake retrieval's hits."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import grpc

from llamad_protocol.v1 import answer_pb2, answer_pb2_grpc, inference_pb2, retrieval_pb2

from ._inference import usage
from ._retrieval import FakeRetrieval

if TYPE_CHECKING:
    from ..testing import FakeLlamad


class FakeAnswer(answer_pb2_grpc.AnswerServiceServicer):
    def __init__(self, fake: FakeLlamad, retrieval: FakeRetrieval | None = None) -> None:
        self.fake = fake
        self.retrieval = retrieval or FakeRetrieval(fake)

    def Ask(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        self.fake.requests["AnswerService/Ask"] = request
        if not request.question.strip():
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "question is empty")
        hits = self.retrieval.hits(request.question, request.top_k, request.filters)

        def items() -> Iterator[Any]:
            if request.dry_run:
                yield from _dry_run(request, hits)
                return
            if self.fake.endless:
                for _ in self.fake.until_cancelled(context):
                    yield answer_pb2.AskResponse(text=" more")
                return
            answer = self.fake.answer if hits else "The knowledge base has nothing on it."
            for word in answer.split(" "):
                yield answer_pb2.AskResponse(text=word + " ")
            yield _sources(hits)
            yield answer_pb2.AskResponse(done=answer_pb2.AskDone(
                usage=usage(len(answer.split())), prompt_sha256="0" * 64,
                no_context=not hits, finish_reason=inference_pb2.FINISH_REASON_STOP,
                template_version="fake-1",
                model_name="" if not hits else request.model or "fake-model"))

        return self.fake.stream("AnswerService/Ask", context, items())


_BUDGET = 2048
"""The fake model's context, less nothing: a dry run's budget."""


def _sources(hits: list[retrieval_pb2.SearchHit]) -> answer_pb2.AskResponse:
    return answer_pb2.AskResponse(sources=answer_pb2.AskSources(
        citations=[answer_pb2.Citation(label=f"S{i}", chunk_id=h.chunk_id,
                                       document_id=h.document_id, title=h.title,
                                       path=h.path, score=h.score, snippet=h.snippet,
                                       source_id=h.source_id, kind=h.kind,
                                       heading=h.heading, document_date=h.document_date
                                       if h.HasField("document_date") else None)
                   for i, h in enumerate(hits, 1)],
        retrieval_mode=retrieval_pb2.SEARCH_MODE_HYBRID))


def _dry_run(request: Any, hits: list[retrieval_pb2.SearchHit]) -> Iterator[Any]:
    """As the daemon's dry run: the plan (every hit kept, under its label; a system and a
    user section, a token a word), the sources, and done with the prompt's tokens and
    nothing generated."""
    system = "Answer from the sources; cite them as [S1]."
    user = "\n\n".join([*(f"[S{i}] {h.title}\n{h.text}" for i, h in enumerate(hits, 1)),
                         f"Question: {request.question}"])
    sections = [answer_pb2.PromptSection(role=role, content=text, tokens=len(text.split()))
                for role, text in ((inference_pb2.CHAT_ROLE_SYSTEM, system),
                                   (inference_pb2.CHAT_ROLE_USER, user))] if hits else []
    tokens = sum(s.tokens for s in sections)
    yield answer_pb2.AskResponse(plan=answer_pb2.AskPlan(
        hits=[answer_pb2.PlannedHit(chunk_id=h.chunk_id, document_id=h.document_id,
                                    title=h.title, path=h.path, ordinal=1, score=h.score,
                                    text_score=h.text_score, vector_score=h.vector_score,
                                    verdict=answer_pb2.HIT_VERDICT_KEPT, label=f"S{i}")
              for i, h in enumerate(hits, 1)],
        sections=sections, prompt_tokens=tokens, budget=_BUDGET if hits else 0))
    yield _sources(hits)
    if not hits:
        yield answer_pb2.AskResponse(done=answer_pb2.AskDone(
            no_context=True, finish_reason=inference_pb2.FINISH_REASON_STOP, dry_run=True))
        return
    yield answer_pb2.AskResponse(done=answer_pb2.AskDone(
        usage=inference_pb2.Usage(prompt_tokens=tokens, total_tokens=tokens),
        prompt_sha256="0" * 64, template_version="fake-1", dry_run=True,
        model_name=request.model or "fake-model"))
