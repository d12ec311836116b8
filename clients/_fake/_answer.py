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
            if self.fake.endless:
                for _ in self.fake.until_cancelled(context):
                    yield answer_pb2.AskResponse(text=" more")
                return
            answer = self.fake.answer if hits else "The knowledge base has nothing on it."
            for word in answer.split(" "):
                yield answer_pb2.AskResponse(text=word + " ")
            yield answer_pb2.AskResponse(sources=answer_pb2.AskSources(
                citations=[answer_pb2.Citation(label=f"S{i}", chunk_id=h.chunk_id,
                                               document_id=h.document_id, title=h.title,
                                               path=h.path, score=h.score,
                                               snippet=h.snippet, source_id=h.source_id,
                                               kind=h.kind, heading=h.heading,
                                               document_date=h.document_date
                                               if h.HasField("document_date") else None)
                           for i, h in enumerate(hits, 1)],
                retrieval_mode=retrieval_pb2.SEARCH_MODE_HYBRID))
            yield answer_pb2.AskResponse(done=answer_pb2.AskDone(
                usage=usage(len(answer.split())), prompt_sha256="0" * 64,
                no_context=not hits, finish_reason=inference_pb2.FINISH_REASON_STOP,
                template_version="fake-1",
                model_name="" if not hits else request.model or "fake-model"))

        return self.fake.stream("AnswerService/Ask", context, items())
