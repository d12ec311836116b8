"""Ask, free of any wire: retrieve, assemble under the token budget, stream, cite, audit.

Order of a call: the question checked (each refusal names its field) → fail fast if the
generation model is unknown or the default's child is down (UNAVAILABLE with a retry
hint) → retrieve (BM25-only when the embedding child is down, and the sources say so) →
keep hits above the relevance floor → nothing relevant: answer that the knowledge base has
nothing on it, without generating → assemble the prompt (redacted again) → response cache
hit: replay it → else stream the generation → sources → done → audit record. A dry run
(:attr:`Question.dry_run`) stops after assembly: a :class:`~._plan.Plan` (every hit and
what became of it, the prompt's sections and tokens), the sources, done; nothing generated.

A document is one source (its chunks joined under one label, :mod:`._prompt`); an
over-long conversation loses its oldest turns, said in the sources' warnings and
:attr:`Done.history_turns_dropped`, and is refused (OUT_OF_RANGE) only when the question
and templates alone do not fit.

gRPC's AnswerService (:mod:`daemon.grpcapi.answer`) and HTTP's ``/v1/llamad/ask``
(:mod:`daemon.httpapi`) translate their requests into a :class:`Question` and a checked
:class:`~supervisor.Sampling`, and the events of :meth:`AskService.ask` back into theirs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import structlog

from retrieval import (
    MODES,
    Filters,
    Hit,
    Query,
    Retriever,
    SearchMode,
    VectorUnavailable,
    redact,
)
from supervisor import Sampling, TokenizeUnavailableError

from ...config import AnswerConfig, ConfigError, Limits, Role
from ...config.answer_templates import TemplateSet, load_templates
from ...errors import InvalidArgument, OutOfRange
from ...models import lanes
from ...models.router import InferenceRouter
from ...telemetry.audit import AuditLog
from ..retrieval_bridge import estimate_tokens
from ._cache import CachedAnswer, ResponseCache
from ._plan import Plan, planned, sections
from ._prompt import TASKS, Assembled, PromptTooLarge, assemble

NO_CONTEXT_ANSWER = (
    "The knowledge base has nothing on this. No indexed document matched the question "
    "closely enough to answer from it."
)
"""The packaged ``no_context`` template's answer (an operator's may replace it)."""
ROLES = ("user", "assistant")
"""The roles a history turn may have."""
_CUT_MARGIN = 8192

AnswerSettings = AnswerConfig
"""The ``[answer]`` section is Ask's settings: declared once, in :mod:`daemon.config`
(the response cache and audit log fields are read at start only)."""

SamplingCheck = Callable[[Limits, AnswerSettings], Sampling]
"""How a call's sampling parameters are checked, given the limits and settings in force."""

Note = Callable[..., None]
"""Where a call records fields of its summary line (``note(task=..., k=...)``)."""


def _no_note(**_: Any) -> None:
    return None


@dataclass(frozen=True)
class Turn:
    """One earlier turn of the conversation: ``role`` user or assistant."""

    role: str
    content: str


@dataclass(frozen=True)
class Question:
    """What an Ask call asks.

    Attributes:
        question: what to answer (stripped; not empty).
        task: one of :data:`TASKS` (answer, explain_output, diagnose, summarize).
        attachment: evidence to explain or diagnose (a log, a command's output).
        history: the earlier turns, oldest first.
        top_k: sources to retrieve (0: ``answer.default_k``).
        mode: the search mode (hybrid, text or vector).
        filters: what the sources may be.
        model: the generation model ("": the role's default).
        no_cache: generate even if the response cache holds the answer.
        dry_run: retrieve and assemble only: a :class:`Plan` instead of an answer.
    """

    question: str
    task: str = "answer"
    attachment: str = ""
    history: tuple[Turn, ...] = ()
    top_k: int = 0
    mode: str = SearchMode.HYBRID
    filters: Filters = field(default_factory=Filters)
    model: str = ""
    no_cache: bool = False
    dry_run: bool = False


@dataclass(frozen=True)
class Citation:
    """One source of the answer, a document: ``label`` (S1, S2, ...) is how the answer
    cites it; ``chunk_id``, ``score`` and ``snippet`` are its best chunk's, ``chunk_ids``
    every chunk of it the prompt holds, in document order."""

    label: str
    chunk_id: str
    document_id: str
    title: str
    path: str
    score: float
    snippet: str
    search_source: str  # text | vector | hybrid: which index found it
    indexed_at: int  # unix seconds
    kind: str
    source_id: str
    document_date: int | None  # the document's own date, unix seconds (None: none)
    chunk_ids: tuple[str, ...] = ()
    heading: str = ""  # the section the best chunk came from ("" for none)


@dataclass(frozen=True)
class Sources:
    """The answer's sources, how they were retrieved, and what degraded."""

    citations: tuple[Citation, ...]
    retrieval_mode: str  # hybrid | text | vector
    warnings: tuple[str, ...]


@dataclass(frozen=True)
class Done:
    """The end of an answer: usage, and what the prompt was.

    Attributes:
        time_to_first_token_ms: from the call's arrival to the first piece of text.
        tokens_per_second: completion tokens over the time from the first piece to the
            last (0 for an answer from the response cache: nothing was generated).
        prompt_sha256: the assembled prompt's SHA-256 (with the model and sampling, the
            response cache's key).
        no_context: nothing relevant was retrieved: the no_context template answered and
            no model ran.
        chunks_dropped: relevant chunks left out of the prompt to fit its token budget.
        template_version: the system and task templates' versions and the template
            set's hash (``system/<v>+<task>/<v>@<hash>``).
        model_name: the catalog name of the model that answered ("" when none ran).
        history_turns_dropped: conversation turns left out, oldest first, to fit.
        dry_run: a dry run: nothing was generated (the usage is the prompt's tokens).
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    time_to_first_token_ms: float = 0.0
    tokens_per_second: float = 0.0
    prompt_sha256: str = ""
    cached: bool = False
    no_context: bool = False
    finish_reason: str = "stop"  # stop | length
    chunks_dropped: int = 0
    attachment_clipped: bool = False
    template_version: str = ""
    model_name: str = ""
    history_turns_dropped: int = 0
    dry_run: bool = False

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


AskEvent = str | Plan | Sources | Done
"""What :meth:`AskService.ask` yields: the answer's text in pieces (``str``), or a dry
run's :class:`Plan`; then its :class:`Sources`, then :class:`Done`."""


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


def check(q: Question, settings: AnswerSettings) -> tuple[str, list[tuple[str, str]]]:
    """The stripped question and the redacted history of ``q``.

    Raises:
        InvalidArgument: naming the field at fault (question, attachment, history,
            history[i].role, task, mode).
    """
    question = q.question.strip()
    if not question:
        raise InvalidArgument("question is empty", field="question")
    if len(question) > settings.max_question_chars:
        raise InvalidArgument(f"question has {len(question)} characters; the limit is "
                              f"{settings.max_question_chars} (answer.max_question_chars)",
                              field="question")
    if len(q.attachment) > settings.max_attachment_chars:
        raise InvalidArgument(
            f"attachment has {len(q.attachment)} characters; the limit is "
            f"{settings.max_attachment_chars} (answer.max_attachment_chars)",
            field="attachment")
    if len(q.history) > settings.max_history_turns:
        raise InvalidArgument(f"{len(q.history)} history turns; the limit is "
                              f"{settings.max_history_turns} (answer.max_history_turns)",
                              field="history")
    history = []
    for i, turn in enumerate(q.history):
        if turn.role not in ROLES:
            raise InvalidArgument(f"history[{i}].role must be user or assistant",
                                  field=f"history[{i}].role")
        history.append((turn.role, redacted_head(turn.content, settings.max_question_chars)))
    if "\x00" in question or "\x00" in q.attachment:
        raise InvalidArgument("question or attachment contains a NUL character",
                              field="question" if "\x00" in question else "attachment")
    if q.task not in TASKS:
        raise InvalidArgument(f"unknown task {q.task}", field="task")
    if q.mode not in MODES:
        raise InvalidArgument(f"unknown search mode {q.mode}", field="mode")
    return question, history


class _InForce(NamedTuple):
    """What a reload replaces, as one: an Ask takes all three as they are when it starts."""

    limits: Limits
    settings: AnswerSettings
    templates: TemplateSet


class AskService:
    """Grounded answers with citations (module docstring): one instance per daemon."""

    def __init__(self, router: InferenceRouter, retriever: Retriever | None, limits: Limits,
                 *, settings: AnswerSettings, cache: ResponseCache, audit: AuditLog) -> None:
        self._router = router
        self._retriever = retriever
        self._cache = cache
        self._audit = audit
        self._in_force = _InForce(limits, settings, load_templates(settings.templates_dir))

    def configure(self, limits: Limits, settings: AnswerSettings) -> None:
        """New request limits and settings (a reload): the Asks that start after this
        call use them; those running keep theirs. The templates are read again (the
        configuration's load checked them; one broken since keeps the set in force)."""
        templates = self._in_force.templates
        try:
            templates = load_templates(settings.templates_dir)
        except ConfigError as exc:
            structlog.get_logger("llamad.ask").warning("answer templates kept", error=str(exc))
        self._in_force = _InForce(limits, settings, templates)

    async def ask(self, q: Question, sampling: Sampling | SamplingCheck, *,
                  time_remaining: Callable[[], float | None] = lambda: None,
                  note: Note = _no_note) -> AsyncIterator[AskEvent]:
        """Answer ``q`` from the knowledge base: text pieces, then :class:`Sources`, then
        :class:`Done` (module docstring for the order of the work).

        Args:
            q: the question and how to search for its sources.
            sampling: the checked sampling, or how to check it against the limits and
                settings in force (called once ``q`` has passed its checks: the adapters
                pass their request's parameters to
                :func:`daemon.checks.validation.ask_sampling`).
            time_remaining: seconds left before the call's deadline (None: none); the
                wait for a generation slot or a model's load is bounded by it.
            note: where the call's summary line fields go.

        Closing the iterator early (the caller cancelled, or its deadline passed) stops
        the generation: the child's stream is closed and its slot released. The audit
        record is written once :class:`Done` has been taken and the iterator resumed.

        Raises:
            InvalidArgument: a field of ``q`` (named by the error's ``field``), or a
                search the retriever cannot take.
            VectorUnavailable: vector mode asked for while vectors cannot be searched.
            UnknownModel, Disabled, ChildNotReadyError, Draining, Overloaded,
                DeadlineUnmeetable: see :meth:`InferenceRouter.admit`.
            OutOfRange: even the question and templates exceed the model's context.
        """
        received = time.perf_counter()
        limits, settings, templates = self._in_force  # this call's, whatever a reload does
        question, history = check(q, settings)
        if not isinstance(sampling, Sampling):
            sampling = sampling(limits, settings)
        task = q.task
        k = q.top_k or settings.default_k
        # Fail fast: an unknown or embedding model (issue 14), or the default's child down
        # (UNAVAILABLE with a retry hint); a named model loads below, once needed.
        name = self._router.model_name(Role.GENERATION, q.model)
        if self._router.fixed(Role.GENERATION, q.model):
            self._router.backend(Role.GENERATION)
        note(task=task, question_chars=len(question), k=k, model=name, dry_run=q.dry_run)

        retrieved, mode, warnings = await self._retrieve(q, question, k)
        hits = [h for h in retrieved if relevant(h, settings)]
        if not hits and q.attachment and task != "answer":
            warnings.append("no relevant sources: answering from the attachment alone")
        elif not hits:
            if q.dry_run:
                yield Plan(planned(retrieved, lambda h: relevant(h, settings), None))
            else:
                yield templates["no_context"].text.format(question=question)
            yield Sources((), mode, tuple(warnings))
            yield Done(no_context=True, dry_run=q.dry_run)
            self._audit.record(task=task, question=question, no_context=True, hits=[],
                               retrieval_mode=mode, dry_run=q.dry_run,
                               template_set=templates.sha256)
            note(no_context=True)
            return

        # From here on the call is under way: a shutdown's drain lets it finish.
        backend = (self._router.backend(Role.GENERATION, in_flight=True)
                   if self._router.fixed(Role.GENERATION, q.model)
                   else await self._router.backend_of(Role.GENERATION, q.model,
                                                      time_remaining()))

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
                attachment=q.attachment,
                budget=(backend.context_tokens or 2048) - sampling.max_tokens,
                count_tokens=count, templates=templates)
        except PromptTooLarge as exc:
            raise OutOfRange(str(exc)) from None
        if assembled.turns_dropped:
            warnings.append(f"the conversation was trimmed: its {assembled.turns_dropped} "
                            "oldest turns were left out to fit the model's context")
        citations = cite(assembled)
        if q.dry_run:
            yield Plan(planned(retrieved, lambda h: relevant(h, settings), assembled),
                       await sections(assembled, count), assembled.prompt_tokens,
                       assembled.budget)
            yield Sources(citations, mode, tuple(warnings))
            yield Done(prompt_tokens=assembled.prompt_tokens, prompt_sha256=assembled.sha256,
                       chunks_dropped=assembled.dropped,
                       attachment_clipped=assembled.attachment_clipped,
                       template_version=assembled.template_version, model_name=name,
                       history_turns_dropped=assembled.turns_dropped, dry_run=True)
            await asyncio.to_thread(
                self._audit.record, task=task, question=question, dry_run=True,
                prompt_sha256=assembled.sha256, retrieval_mode=mode,
                prompt_tokens=assembled.prompt_tokens, template=assembled.template_version,
                template_set=templates.sha256,
                hits=[{"label": c.label, "chunk_ids": list(c.chunk_ids)} for c in citations])
            note(prompt_tokens=assembled.prompt_tokens, sources=len(citations))
            return
        model = backend.provisional_identity  # the cache key's model part (sampling another)
        cached = None if q.no_cache else self._cache.get(model, assembled.sha256, sampling)
        first: float | None = None
        generated_at: float | None = None  # when the child's last chunk came (not cached)
        if cached is not None:
            text, completion, prompt_tokens, finish = (cached.text, cached.completion_tokens,
                                                       cached.prompt_tokens,
                                                       cached.finish_reason)
            first = time.perf_counter()
            yield text
        else:
            pieces: list[str] = []
            completion, prompt_tokens, finish = 0, assembled.prompt_tokens, "stop"
            # Noted as they come: a stream cut short counts what it cost (its token's tpm).
            note(prompt_tokens=prompt_tokens, tokens=0)
            async with self._router.admit(Role.GENERATION, time_remaining(),
                                          in_flight=True, model=q.model,
                                          lane=lanes.asked()) as backend:
                async for chunk in backend.stream_chat(assembled.messages, sampling):
                    if chunk.finish_reason is None:
                        if first is None:
                            first = time.perf_counter()
                        completion += chunk.tokens
                        note(tokens=completion)
                        pieces.append(chunk.text)
                        yield chunk.text
                    else:
                        finish = chunk.finish_reason
                        completion = chunk.completion_tokens or completion
                        prompt_tokens = chunk.prompt_tokens or prompt_tokens
                        generated_at = time.perf_counter()
            text = "".join(pieces)
            note(prompt_tokens=prompt_tokens)  # the child's own count, when it gave one
            self._cache.put(model, assembled.sha256, sampling,
                            CachedAnswer(text, completion, prompt_tokens, finish))
        yield Sources(citations, mode, tuple(warnings))
        end = time.perf_counter()
        # As chat's Meter measures it: the tokens over the time from the first to the
        # last; 0 for an answer from the cache (nothing was generated).
        rate = (completion / (generated_at - first)
                if first is not None and generated_at is not None and generated_at > first
                else 0.0)
        yield Done(prompt_tokens=prompt_tokens, completion_tokens=completion,
                   time_to_first_token_ms=((first or end) - received) * 1000,
                   tokens_per_second=rate, prompt_sha256=assembled.sha256,
                   cached=cached is not None, finish_reason=finish,
                   chunks_dropped=assembled.dropped,
                   attachment_clipped=assembled.attachment_clipped,
                   template_version=assembled.template_version, model_name=name,
                   history_turns_dropped=assembled.turns_dropped)
        await asyncio.to_thread(
            self._audit.record, task=task, question=question, model=model,
            prompt_sha256=assembled.sha256, cached=cached is not None,
            retrieval_mode=mode, prompt_tokens=prompt_tokens, completion_tokens=completion,
            hits=[{"label": c.label, "chunk_id": c.chunk_id, "chunk_ids": list(c.chunk_ids),
                   "score": round(c.score, 6)} for c in citations],
            dropped=assembled.dropped, turns_dropped=assembled.turns_dropped,
            template=assembled.template_version, template_set=templates.sha256)
        note(tokens=completion, cached=cached is not None, sources=len(citations),
             prompt_sha256=assembled.sha256[:16])

    async def _retrieve(self, q: Question, question: str, k: int
                        ) -> tuple[list[Hit], str, list[str]]:
        """The hits (before the relevance floor), the search mode that found them, and
        the warnings."""
        if self._retriever is None:
            return [], "text", ["retrieval is disabled: answering without sources"]
        # The query leaves the process too (to the embedding child or endpoint), so it is
        # redacted.
        query = redact(question).text
        if q.attachment and q.task in ("explain_output", "diagnose"):
            # The evidence says what to look for as much as the question does.
            query = f"{query}\n{redacted_head(q.attachment, 600)}"
        query = query[:self._retriever.limits.max_query_chars]
        try:
            # The query's embedding waits in the asker's lane, not the retriever's own.
            with lanes.using(lanes.asked()):
                result = await self._retriever.search(query, k=k, filters=q.filters,
                                                      options=Query(mode=q.mode))
        except Exception as exc:
            if isinstance(exc, InvalidArgument | VectorUnavailable):
                raise  # the caller asked for what cannot be: said, not degraded
            return [], SearchMode.TEXT, [f"retrieval failed ({type(exc).__name__}): "
                                         "answering without sources"]
        return list(result.hits), result.mode, list(result.warnings)


def cite(assembled: Assembled) -> tuple[Citation, ...]:
    """One citation per document of the prompt, labelled as the prompt labels it: its best
    chunk's id, score and snippet, and every chunk of it the prompt holds."""
    rank = {h.chunk_id: i for i, h in enumerate(assembled.hits)}
    citations = []
    for i, chunks in enumerate(assembled.documents, start=1):
        h = min(chunks, key=lambda c: rank[c.chunk_id])
        citations.append(Citation(
            label=f"S{i}", chunk_id=h.chunk_id, document_id=h.doc_id, title=h.title,
            # Search's scale (normalised, 1: ranked first by every index), not raw RRF.
            path=h.path, score=h.score, snippet=h.snippet,
            search_source=h.search_source, indexed_at=h.indexed_at, kind=h.kind,
            source_id=h.source_id, document_date=h.document_date,
            chunk_ids=tuple(c.chunk_id for c in chunks), heading=h.heading))
    return tuple(citations)


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
