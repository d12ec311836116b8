"""AnswerService/Ask: retrieve, assemble under the token budget, stream, cite, audit.

Order of a call: fail fast if the generation child is down (UNAVAILABLE with a retry
hint) → retrieve (BM25-only when the embedding child is down, and the sources message
says so) → keep hits above the relevance floor → nothing relevant: answer that the
knowledge base has nothing on it, without generating → assemble the prompt (redacted
again) → response cache hit: replay it → else stream the generation → sources → summary
→ audit record.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc
import structlog
from google.protobuf.timestamp_pb2 import Timestamp

from llamad_protocol.v1 import answer_pb2 as apb
from llamad_protocol.v1 import answer_pb2_grpc
from llamad_protocol.v1 import inference_pb2 as ipb
from retrieval import Hit, Query, Retriever, VectorUnavailable, redact
from supervisor import TokenizeUnavailableError

from ..checks import validation
from ..config import AnswerConfig, Limits
from ..errors import InvalidArgument, OutOfRange
from ..grpcapi import rpc
from ..grpcapi.retrieval_wire import MODES, SOURCES, filters_from, mode_name
from ..models.router import InferenceRouter
from ..services.retrieval_bridge import estimate_tokens
from ..telemetry.audit import AuditLog
from ..telemetry.metrics import Metrics
from ._cache import CachedAnswer, ResponseCache
from ._prompt import PromptTooLarge, assemble

_log = structlog.get_logger("llamad.answer")

NO_CONTEXT_ANSWER = (
    "The knowledge base has nothing on this. No indexed document matched the question "
    "closely enough to answer from it."
)
_TASKS = {
    apb.TASK_TYPE_UNSPECIFIED: "answer",
    apb.TASK_TYPE_ANSWER: "answer",
    apb.TASK_TYPE_EXPLAIN_OUTPUT: "explain_output",
    apb.TASK_TYPE_DIAGNOSE: "diagnose",
    apb.TASK_TYPE_SUMMARIZE: "summarize",
}
_ROLES = {ipb.CHAT_ROLE_USER: "user", ipb.CHAT_ROLE_ASSISTANT: "assistant"}
_FINISH = {"stop": ipb.FINISH_REASON_STOP, "length": ipb.FINISH_REASON_LENGTH}
_CUT_MARGIN = 8192


AnswerSettings = AnswerConfig
"""The ``[answer]`` section is the Ask servicer's settings: declared once, in
:mod:`daemon.config` (the response cache and audit log fields are read at start only)."""


def relevant(hit: Hit, settings: AnswerSettings) -> bool:
    """Above the relevance floor: a close enough vector match, or a strong BM25 match.

    Cosine similarity is the better relevance signal (unrelated MiniLM sentences score
    under about 0.2); BM25 scores are not comparable across queries, so a BM25-only hit
    must clear a higher bar — it mostly catches exact identifiers (CVE ids, hostnames)
    that embeddings miss. Both floors are configuration.
    """
    if hit.vector_score is not None and hit.vector_score >= settings.min_vector_score:
        return True
    return hit.text_score is not None and hit.text_score >= settings.min_text_score


class AnswerServicer(answer_pb2_grpc.AnswerServiceServicer):
    def __init__(self, router: InferenceRouter, retriever: Retriever | None, limits: Limits,
                 *, settings: AnswerSettings, cache: ResponseCache, audit: AuditLog,
                 metrics: Metrics | None = None) -> None:
        self._router = router
        self._retriever = retriever
        self._limits = limits
        self._settings = settings
        self._cache = cache
        self._audit = audit
        self.metrics = metrics

    def configure(self, limits: Limits, settings: AnswerSettings) -> None:
        """New request limits and settings (a reload): the Asks that start after this
        call use them; those running keep theirs."""
        self._limits, self._settings = limits, settings

    def _check(self, request: apb.AskRequest) -> tuple[str, list[tuple[str, str]]]:
        s = self._settings
        question = request.question.strip()
        if not question:
            raise InvalidArgument("question is empty", field="question")
        if len(question) > s.max_question_chars:
            raise InvalidArgument(f"question has {len(question)} characters; the limit is "
                                  f"{s.max_question_chars} (answer.max_question_chars)",
                                  field="question")
        if len(request.attachment) > s.max_attachment_chars:
            raise InvalidArgument(
                f"attachment has {len(request.attachment)} characters; the limit is "
                f"{s.max_attachment_chars} (answer.max_attachment_chars)", field="attachment")
        if len(request.history) > s.max_history_turns:
            raise InvalidArgument(f"{len(request.history)} history turns; the limit is "
                                  f"{s.max_history_turns} (answer.max_history_turns)",
                                  field="history")
        history = []
        for i, turn in enumerate(request.history):
            role = _ROLES.get(turn.role)
            if role is None:
                raise InvalidArgument(f"history[{i}].role must be user or assistant",
                                      field=f"history[{i}].role")
            history.append((role, redacted_head(turn.content, s.max_question_chars)))
        if "\x00" in question or "\x00" in request.attachment:
            raise InvalidArgument("question or attachment contains a NUL character")
        return question, history

    @rpc.stream("Ask")
    async def Ask(
        self, request: apb.AskRequest, context: grpc.aio.ServicerContext, call: rpc.Call,
    ) -> AsyncIterator[apb.AskResponse]:
        received = time.perf_counter()
        question, history = self._check(request)
        task = _TASKS.get(request.task)
        if task is None:
            raise InvalidArgument(f"unknown task {request.task}", field="task")
        params = request.sampling
        if not params.HasField("max_tokens"):
            params = ipb.SamplingParams()
            params.CopyFrom(request.sampling)
            params.max_tokens = self._settings.default_max_tokens
        sampling = validation.sampling(params, self._limits, call="Ask",
                                       defaults=validation.answer_defaults(self._settings))
        k = request.top_k or self._settings.default_k
        options = Query(mode=mode_name(request.mode))
        # Fail fast: an unknown or embedding model (issue 14), or the default's child down
        # (UNAVAILABLE with a retry hint); a named model loads below, once needed.
        name = self._router.model_name("generation", request.model)
        if self._router.fixed("generation", request.model):
            self._router.backend("generation")
        call.note(task=task, question_chars=len(question), k=k, model=name)

        hits: list[Hit] = []
        mode, warnings = "text", ["retrieval is disabled: answering without sources"]
        if self._retriever is not None:
            filters = filters_from(request.filters)
            # The query leaves the process too (to the embedding child or endpoint), so
            # it is redacted.
            query = redact(question).text
            if request.attachment and task in ("explain_output", "diagnose"):
                # The evidence says what to look for as much as the question does.
                query = f"{query}\n{redacted_head(request.attachment, 600)}"
            query = query[:self._retriever.limits.max_query_chars]
            try:
                result = await self._retriever.search(query, k=k, filters=filters,
                                                      options=options)
            except Exception as exc:
                if isinstance(exc, InvalidArgument | VectorUnavailable):
                    raise  # the caller asked for what cannot be: said, not degraded
                result = None
                warnings = [f"retrieval failed ({type(exc).__name__}): answering without "
                            "sources"]
            if result is not None:
                hits = [h for h in result.hits if relevant(h, self._settings)]
                mode, warnings = result.mode, list(result.warnings)

        if not hits and request.attachment and task != "answer":
            warnings.append("no relevant sources: answering from the attachment alone")
        elif not hits:
            yield apb.AskResponse(text=NO_CONTEXT_ANSWER)
            yield apb.AskResponse(sources=apb.AskSources(
                retrieval_mode=MODES[mode], warnings=warnings))
            yield apb.AskResponse(done=apb.AskDone(no_context=True,
                                                   finish_reason=ipb.FINISH_REASON_STOP))
            self._audit.record(task=task, question=question, no_context=True, hits=[],
                               retrieval_mode=mode)
            call.note(no_context=True)
            return

        # From here on the call is under way: a shutdown's drain lets it finish.
        backend = (self._router.backend("generation", in_flight=True)
                   if self._router.fixed("generation", request.model)
                   else await self._router.backend_of("generation", request.model,
                                                      context.time_remaining()))

        async def count(text: str) -> int:
            if not text:
                return 0
            try:
                return len(await backend.tokenize(text))
            except TokenizeUnavailableError:
                # Only an endpoint has no tokenizer. A conservative estimate keeps the
                # prompt under the budget (it drops a source sooner than needed, never
                # overflows); said in the answer's warnings.
                if "token counts are estimated" not in " ".join(warnings):
                    warnings.append("token counts are estimated: the generation endpoint "
                                    "offers no tokenizer")
                return estimate_tokens(text)

        try:
            assembled = await assemble(
                question=question, task=task, hits=hits, history=history,
                attachment=request.attachment,
                budget=(backend.context_tokens or 2048) - sampling.max_tokens,
                count_tokens=count)
        except PromptTooLarge as exc:
            raise OutOfRange(str(exc)) from None
        citations = [
            apb.Citation(label=f"S{i}", chunk_id=h.chunk_id, document_id=h.doc_id,
                         title=h.title, path=h.path, score=h.fused_score, snippet=h.snippet,
                         search_source=SOURCES[h.search_source],
                         indexed_at=Timestamp(seconds=h.indexed_at), kind=h.kind,
                         source_id=h.source_id,
                         document_date=None if h.document_date is None
                         else Timestamp(seconds=h.document_date))
            for i, h in enumerate(assembled.hits, start=1)
        ]
        sources = apb.AskResponse(sources=apb.AskSources(
            citations=citations, retrieval_mode=MODES[mode], warnings=warnings))
        model = backend.provisional_identity  # the cache key's model part (sampling another)
        cached = (None if request.no_cache
                  else self._cache.get(model, assembled.sha256, sampling))
        first: float | None = None
        generated_at: float | None = None  # when the child's last chunk came (not cached)
        if cached is not None:
            text, completion, prompt_tokens, finish = (cached.text, cached.completion_tokens,
                                                       cached.prompt_tokens,
                                                       cached.finish_reason)
            first = time.perf_counter()
            yield apb.AskResponse(text=text)
        else:
            pieces: list[str] = []
            completion, prompt_tokens, finish = 0, assembled.prompt_tokens, "stop"
            async with self._router.admit("generation", context.time_remaining(),
                                          in_flight=True, model=request.model) as backend:
                async for chunk in backend.stream_chat(assembled.messages, sampling):
                    if chunk.finish_reason is None:
                        if first is None:
                            first = time.perf_counter()
                        completion += chunk.tokens
                        pieces.append(chunk.text)
                        yield apb.AskResponse(text=chunk.text)
                    else:
                        finish = chunk.finish_reason
                        completion = chunk.completion_tokens or completion
                        prompt_tokens = chunk.prompt_tokens or prompt_tokens
                        generated_at = time.perf_counter()
            text = "".join(pieces)
            self._cache.put(model, assembled.sha256, sampling,
                            CachedAnswer(text, completion, prompt_tokens, finish))
        yield sources
        end = time.perf_counter()
        ttft = ((first or end) - received) * 1000
        # As chat's Meter measures it: the tokens over the time from the first to the
        # last; 0 for an answer from the cache (nothing was generated).
        rate = (completion / (generated_at - first)
                if first is not None and generated_at is not None and generated_at > first
                else 0.0)
        yield apb.AskResponse(done=apb.AskDone(
            usage=ipb.Usage(prompt_tokens=prompt_tokens, completion_tokens=completion,
                            total_tokens=prompt_tokens + completion,
                            time_to_first_token_ms=ttft, tokens_per_second=rate),
            prompt_sha256=assembled.sha256, cached=cached is not None,
            finish_reason=_FINISH.get(finish, ipb.FINISH_REASON_STOP),
            chunks_dropped=assembled.dropped, attachment_clipped=assembled.attachment_clipped,
            template_version=assembled.template_version, model_name=name,
        ))
        await asyncio.to_thread(
            self._audit.record, task=task, question=question, model=model,
            prompt_sha256=assembled.sha256, cached=cached is not None,
            retrieval_mode=mode, prompt_tokens=prompt_tokens, completion_tokens=completion,
            hits=[{"label": c.label, "chunk_id": c.chunk_id, "score": round(c.score, 6)}
                  for c in citations],
            dropped=assembled.dropped, template=assembled.template_version)
        call.note(tokens=completion, cached=cached is not None, sources=len(citations),
                  prompt_sha256=assembled.sha256[:16])


def redacted_head(text: str, n: int) -> str:
    """The first ``n`` characters of ``text``, redacted before the cut: cut first, a secret
    crossing the cut would leave its head unrecognisable to redaction.

    Only ``n`` plus a margin is redacted (a history turn or an attachment may be
    megabytes). That is enough while the redacted prefix still reaches past ``n`` by the
    longest secret shape (a margin of twice it, an RSA-4096 private key block being about
    3.3 KB): whatever the margin's own cut left unrecognised then lies beyond ``n``. When
    placeholders shortened the prefix more than that, the whole text is redacted.
    """
    if len(text) <= n + _CUT_MARGIN:
        return redact(text).text[:n]
    head = redact(text[: n + _CUT_MARGIN]).text
    if len(head) < n + _CUT_MARGIN // 2:
        head = redact(text).text
    return head[:n]
