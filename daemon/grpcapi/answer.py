"""AnswerService/Ask over gRPC: a thin adapter over :class:`daemon.services.ask.AskService`.

It reads an ``AskRequest`` into a :class:`~daemon.services.ask.Question` and a checked
sampling, relays the service's events as ``AskResponse`` messages (text pieces, then the
sources, then done), and leaves the rest to the service: retrieval, redaction, prompt
assembly, cache and audit. Errors are the service's own; :mod:`daemon.grpcapi.rpc` maps
them to status codes (an invalid field is named in a ``google.rpc.BadRequest`` detail).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from llamad_protocol.v1 import answer_pb2 as apb
from llamad_protocol.v1 import answer_pb2_grpc
from llamad_protocol.v1 import inference_pb2 as ipb
from retrieval import Retriever, SearchMode
from supervisor import Sampling

from ..checks import validation
from ..config import Limits
from ..models.router import InferenceRouter
from ..services.ask import (
    AnswerSettings,
    AskEvent,
    AskService,
    Done,
    Plan,
    Question,
    ResponseCache,
    Sources,
    Turn,
)
from ..telemetry.audit import AuditLog
from ..telemetry.metrics import Metrics
from . import rpc
from .retrieval_wire import MODES, SOURCES, filters_from

_TASKS = {
    apb.TASK_TYPE_UNSPECIFIED: "answer",
    apb.TASK_TYPE_ANSWER: "answer",
    apb.TASK_TYPE_EXPLAIN_OUTPUT: "explain_output",
    apb.TASK_TYPE_DIAGNOSE: "diagnose",
    apb.TASK_TYPE_SUMMARIZE: "summarize",
}
_MODE_NAMES = {v: k for k, v in MODES.items()}
_FINISH = {"stop": ipb.FINISH_REASON_STOP, "length": ipb.FINISH_REASON_LENGTH}


def _role(value: int) -> str:
    """A history turn's role by name (user, assistant; any other the service refuses)."""
    if value in ipb.ChatRole.values():
        return ipb.ChatRole.Name(value).removeprefix("CHAT_ROLE_").lower()  # type: ignore[arg-type]
    return str(value)


def question_from(request: apb.AskRequest) -> Question:
    """The question an ``AskRequest`` asks; its fields are checked by the service."""
    mode = request.mode or MODES[SearchMode.HYBRID]
    return Question(
        question=request.question, task=_TASKS.get(request.task, str(request.task)),
        attachment=request.attachment,
        history=tuple(Turn(_role(t.role), t.content) for t in request.history),
        top_k=request.top_k,
        mode=_MODE_NAMES.get(mode, str(mode)),
        filters=filters_from(request.filters), model=request.model,
        no_cache=request.no_cache, dry_run=request.dry_run)


def _timestamp(seconds: int) -> Timestamp:
    return Timestamp(seconds=seconds)


def _sources(s: Sources) -> apb.AskSources:
    return apb.AskSources(
        citations=[apb.Citation(
            label=c.label, chunk_id=c.chunk_id, document_id=c.document_id, title=c.title,
            path=c.path, score=c.score, snippet=c.snippet,
            search_source=SOURCES[c.search_source], indexed_at=_timestamp(c.indexed_at),
            kind=c.kind, source_id=c.source_id,
            document_date=None if c.document_date is None
            else _timestamp(c.document_date), chunk_ids=c.chunk_ids, heading=c.heading)
            for c in s.citations],
        retrieval_mode=MODES[s.retrieval_mode], warnings=s.warnings)


def _done(d: Done) -> apb.AskDone:
    finish = _FINISH.get(d.finish_reason, ipb.FINISH_REASON_STOP)
    if d.no_context:  # nothing was generated: no usage, no model
        return apb.AskDone(no_context=True, finish_reason=finish, dry_run=d.dry_run)
    return apb.AskDone(
        usage=ipb.Usage(prompt_tokens=d.prompt_tokens, completion_tokens=d.completion_tokens,
                        total_tokens=d.total_tokens,
                        time_to_first_token_ms=d.time_to_first_token_ms,
                        tokens_per_second=d.tokens_per_second),
        prompt_sha256=d.prompt_sha256, cached=d.cached, finish_reason=finish,
        chunks_dropped=d.chunks_dropped, attachment_clipped=d.attachment_clipped,
        template_version=d.template_version, model_name=d.model_name,
        history_turns_dropped=d.history_turns_dropped, dry_run=d.dry_run)


_VERDICTS = {"kept": apb.HIT_VERDICT_KEPT, "below_floor": apb.HIT_VERDICT_BELOW_FLOOR,
             "over_budget": apb.HIT_VERDICT_OVER_BUDGET}
_ROLES = {"system": ipb.CHAT_ROLE_SYSTEM, "user": ipb.CHAT_ROLE_USER,
          "assistant": ipb.CHAT_ROLE_ASSISTANT}


def _plan(p: Plan) -> apb.AskPlan:
    return apb.AskPlan(
        hits=[apb.PlannedHit(
            chunk_id=h.chunk_id, document_id=h.doc_id, title=h.title, path=h.path,
            ordinal=h.ordinal, score=h.score, text_score=h.text_score,
            vector_score=h.vector_score, verdict=_VERDICTS[h.verdict], label=h.label)
            for h in p.hits],
        sections=[apb.PromptSection(role=_ROLES[s.role], content=s.content, tokens=s.tokens)
                  for s in p.sections],
        prompt_tokens=p.prompt_tokens, budget=max(0, p.budget))


def response(event: AskEvent) -> apb.AskResponse:
    """One event of :meth:`AskService.ask` as an ``AskResponse``."""
    if isinstance(event, str):
        return apb.AskResponse(text=event)
    if isinstance(event, Sources):
        return apb.AskResponse(sources=_sources(event))
    if isinstance(event, Plan):
        return apb.AskResponse(plan=_plan(event))
    return apb.AskResponse(done=_done(event))


class AnswerServicer(answer_pb2_grpc.AnswerServiceServicer):
    """AnswerService over an :class:`AskService` (made here from the same arguments)."""

    def __init__(self, router: InferenceRouter, retriever: Retriever | None, limits: Limits,
                 *, settings: AnswerSettings, cache: ResponseCache, audit: AuditLog,
                 metrics: Metrics | None = None) -> None:
        self.service = AskService(router, retriever, limits, settings=settings, cache=cache,
                                  audit=audit)
        self.metrics = metrics

    def configure(self, limits: Limits, settings: AnswerSettings) -> None:
        """New request limits and settings (a reload): see :meth:`AskService.configure`."""
        self.service.configure(limits, settings)

    @rpc.stream("Ask")
    async def Ask(
        self, request: apb.AskRequest, context: grpc.aio.ServicerContext, call: rpc.Call,
    ) -> AsyncIterator[apb.AskResponse]:
        def sampling(limits: Limits, settings: AnswerSettings) -> Sampling:
            return validation.ask_sampling(request.sampling, limits, settings)

        events = self.service.ask(question_from(request), sampling,
                                  time_remaining=context.time_remaining, note=call.note)
        try:
            async for event in events:
                yield response(event)
        finally:
            await events.aclose()  # type: ignore[attr-defined]
