"""Protobuf messages to :mod:`clients._types` and keyword arguments to requests.

Shared by the sync and the asyncio client, so both speak exactly the same dataclasses.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

from google.protobuf import timestamp_pb2

from llamad_protocol.v1 import answer_pb2, common_pb2, control_pb2, inference_pb2, retrieval_pb2

from . import _generation, _tools
from ._types import (
    AskDone,
    AskEvent,
    AskPlan,
    AskSources,
    AskText,
    ChildStatus,
    Citation,
    DaemonStatus,
    Document,
    Embeddings,
    ExitCause,
    FileIssue,
    GenerateChunk,
    LoadProgress,
    LogLine,
    Message,
    PlannedHit,
    PromptSection,
    ReindexProgress,
    Reprocessed,
    RetrievalStatus,
    SearchHit,
    SearchResult,
    SearchStats,
    Source,
    SwapInfo,
    SwapProgress,
    Tokens,
    Usage,
    VectorBackfill,
    VectorRebuild,
)

ChatInput = Message | tuple[str, str] | Mapping[str, Any]
"""A chat message as callers may give it: a Message, ``(role, content)`` or a dict
(OpenAI's shape: ``role``, ``content``, and ``tool_calls`` or ``tool_call_id``)."""

_ROLES: dict[str, common_pb2.ChildRole.ValueType] = {
    "generation": common_pb2.CHILD_ROLE_GENERATION,
    "embedding": common_pb2.CHILD_ROLE_EMBEDDING,
}
_CHAT_ROLES: dict[str, inference_pb2.ChatRole.ValueType] = {
    "system": inference_pb2.CHAT_ROLE_SYSTEM,
    "user": inference_pb2.CHAT_ROLE_USER,
    "assistant": inference_pb2.CHAT_ROLE_ASSISTANT,
    "tool": inference_pb2.CHAT_ROLE_TOOL,
}
_MODES: dict[str, control_pb2.InferenceMode.ValueType] = {
    "embedded": control_pb2.INFERENCE_MODE_EMBEDDED,
    "endpoint": control_pb2.INFERENCE_MODE_ENDPOINT,
    "disabled": control_pb2.INFERENCE_MODE_DISABLED,
}
_TASKS: dict[str, answer_pb2.TaskType.ValueType] = {
    "answer": answer_pb2.TASK_TYPE_ANSWER,
    "explain_output": answer_pb2.TASK_TYPE_EXPLAIN_OUTPUT,
    "diagnose": answer_pb2.TASK_TYPE_DIAGNOSE,
    "summarize": answer_pb2.TASK_TYPE_SUMMARIZE,
}


class _Enum(Protocol):
    """A generated enum (its class, whose metaclass is protobuf's EnumTypeWrapper)."""

    def Name(self, number: Any) -> str: ...  # number: the enum's ValueType


def enum_name(wrapper: _Enum, value: int, prefix: str) -> str:
    """``CHILD_STATE_RUNNING`` -> ``running``; unknown numbers -> ``unknown(N)``."""
    try:
        name = str(wrapper.Name(value))
    except ValueError:
        return f"unknown({value})"
    return name.removeprefix(prefix).lower()


def role_enum(role: str) -> common_pb2.ChildRole.ValueType:
    """The ChildRole number of ``"generation"`` or ``"embedding"``.

    Raises:
        ValueError: any other name.
    """
    try:
        return _ROLES[role]
    except KeyError:
        raise ValueError(f"role must be 'generation' or 'embedding', not {role!r}") from None


def mode_enum(mode: str) -> control_pb2.InferenceMode.ValueType:
    try:
        return _MODES[mode]
    except KeyError:
        raise ValueError(f"mode must be embedded, endpoint or disabled, not {mode!r}") from None


def task_enum(task: str) -> answer_pb2.TaskType.ValueType:
    try:
        return _TASKS[task]
    except KeyError:
        raise ValueError(f"task must be one of {', '.join(_TASKS)}, not {task!r}") from None


def _time(msg: Any, name: str) -> datetime | None:
    if not msg.HasField(name):
        return None
    ts: timestamp_pb2.Timestamp = getattr(msg, name)
    return ts.ToDatetime(tzinfo=UTC)


def timestamp(value: datetime | None) -> timestamp_pb2.Timestamp | None:
    if value is None:
        return None
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(value if value.tzinfo else value.replace(tzinfo=UTC))
    return ts


# --- requests ---------------------------------------------------------------------------

def message(item: ChatInput) -> Message:
    """Normalise one chat message; the role must be system, user, assistant or tool."""
    if isinstance(item, Message):
        msg = item
    elif isinstance(item, tuple):
        msg = Message(item[0], item[1])  # type: ignore[arg-type]
    else:
        msg = _tools.message_from_mapping(item)
    if msg.role not in _CHAT_ROLES:
        raise ValueError(f"chat role must be system, user, assistant or tool, not "
                         f"{msg.role!r}")
    return msg


def chat_messages(items: Iterable[ChatInput]) -> list[inference_pb2.ChatMessage]:
    return [inference_pb2.ChatMessage(role=_CHAT_ROLES[m.role], content=m.content,
                                      tool_calls=_tools.wire_calls(m.tool_calls),
                                      tool_call_id=m.tool_call_id)
            for m in map(message, items)]


def turns(items: Iterable[ChatInput]) -> list[answer_pb2.Turn]:
    """Ask's history: system, user and assistant turns (no tool calls)."""
    out = []
    for m in map(message, items):
        if m.role == "tool" or m.tool_calls:
            raise ValueError("history: Ask's turns are system, user or assistant text, "
                             "without tool calls")
        out.append(answer_pb2.Turn(role=_CHAT_ROLES[m.role], content=m.content))
    return out


def filters(*, sources: Sequence[str] = (), kinds: Sequence[str] = (),
            categories: Sequence[str] = (), tags: Sequence[str] = (),
            indexed_since: datetime | None = None,
            indexed_until: datetime | None = None, dated_since: datetime | None = None,
            dated_until: datetime | None = None) -> retrieval_pb2.SearchFilters:
    return retrieval_pb2.SearchFilters(
        sources=list(sources), kinds=list(kinds), categories=list(categories), tags=list(tags),
        indexed_since=timestamp(indexed_since), indexed_until=timestamp(indexed_until),
        dated_since=timestamp(dated_since), dated_until=timestamp(dated_until))


# --- responses --------------------------------------------------------------------------

def usage(msg: inference_pb2.Usage) -> Usage:
    return Usage(prompt_tokens=msg.prompt_tokens, completion_tokens=msg.completion_tokens,
                 total_tokens=msg.total_tokens,
                 time_to_first_token_ms=msg.time_to_first_token_ms,
                 tokens_per_second=msg.tokens_per_second)


def finish_reason(value: int) -> str:
    return enum_name(inference_pb2.FinishReason, value, "FINISH_REASON_")


def generate_chunk(msg: inference_pb2.GenerateResponse) -> GenerateChunk:
    last = msg.HasField("usage") or msg.finish_reason != inference_pb2.FINISH_REASON_UNSPECIFIED
    return GenerateChunk(
        text=msg.text, tokens=msg.tokens, model=msg.model,
        finish_reason=finish_reason(msg.finish_reason) if last else None,
        usage=usage(msg.usage) if msg.HasField("usage") else None,
        logprobs=_generation.logprobs(msg) if msg.logprobs else (),
        model_name=msg.model_name, tool_calls=_tools.deltas(msg) if msg.tool_calls else (),
    )


def embeddings(msg: inference_pb2.EmbedResponse) -> Embeddings:
    return Embeddings(vectors=tuple(tuple(e.values) for e in msg.embeddings), model=msg.model,
                      dimension=msg.dimension, prompt_tokens=msg.prompt_tokens,
                      model_name=msg.model_name)


def tokens(msg: inference_pb2.TokenizeResponse) -> Tokens:
    return Tokens(ids=tuple(msg.tokens), count=msg.count, model=msg.model,
                  model_name=msg.model_name)


def text(msg: inference_pb2.DetokenizeResponse) -> str:
    return msg.text


def role_name(value: int) -> str:
    return enum_name(common_pb2.ChildRole, value, "CHILD_ROLE_")


def exit_cause(msg: control_pb2.ExitCause) -> ExitCause:
    return ExitCause(kind=msg.kind, message=msg.message,
                     exit_code=msg.exit_code if msg.HasField("exit_code") else None,
                     signal=msg.signal, permanent=msg.permanent, at=_time(msg, "at"))


def child_status(msg: control_pb2.ChildStatus) -> ChildStatus:
    swap = msg.last_swap
    return ChildStatus(
        role=role_name(msg.role),
        state=enum_name(control_pb2.ChildState, msg.state, "CHILD_STATE_"),
        enabled=msg.enabled, pid=msg.pid, model_path=msg.model_path,
        model_sha256=msg.model_sha256, runtime=msg.runtime, port=msg.port, socket=msg.socket,
        uptime_seconds=msg.uptime_seconds, restarts=msg.restarts,
        breaker=enum_name(control_pb2.BreakerState, msg.breaker, "BREAKER_STATE_"),
        consecutive_failures=msg.consecutive_failures,
        last_exit=exit_cause(msg.last_exit) if msg.HasField("last_exit") else None,
        model_architecture=msg.model_architecture,
        model_context_length=msg.model_context_length,
        previous_model_path=msg.previous_model_path,
        last_swap=SwapInfo(from_model=swap.from_model, to_model=swap.to_model,
                           at=_time(swap, "at"), reason=swap.reason,
                           duration_seconds=swap.duration_seconds)
        if msg.HasField("last_swap") else None,
        in_flight=msg.in_flight, queued=msg.queued, slots=msg.slots,
        mode=enum_name(control_pb2.InferenceMode, msg.mode, "INFERENCE_MODE_"),
        endpoint_url=msg.endpoint_url, endpoint_model=msg.endpoint_model,
        last_error=msg.last_error, queue_ahead=msg.queue_ahead,
        chat_template=msg.chat_template,
        loading=LoadProgress(
            phase=enum_name(control_pb2.LoadPhase, msg.loading.phase, "LOAD_PHASE_"),
            seconds=msg.loading.seconds, expected_seconds=msg.loading.expected_seconds)
        if msg.HasField("loading") else None,
    )


def daemon_status(msg: control_pb2.StatusResponse) -> DaemonStatus:
    from ._models import model_info  # noqa: PLC0415 (_models converts with this module)

    return DaemonStatus(children=tuple(child_status(c) for c in msg.children),
                        version=msg.version, uptime_seconds=msg.daemon_uptime_seconds,
                        draining=msg.draining, drained=msg.drained,
                        models=tuple(model_info(m) for m in msg.models))


def log_line(msg: control_pb2.LogLine) -> LogLine:
    return LogLine(role=role_name(msg.role), pid=msg.pid, stream=msg.stream, text=msg.text,
                   time=_time(msg, "time"), seq=msg.seq)


def swap_progress(msg: control_pb2.SwapProgress) -> SwapProgress:
    return SwapProgress(stage=enum_name(control_pb2.SwapStage, msg.stage, "SWAP_STAGE_"),
                        message=msg.message, elapsed_seconds=msg.elapsed_seconds,
                        cause=exit_cause(msg.cause) if msg.HasField("cause") else None)


def child_state(value: int) -> str:
    return enum_name(control_pb2.ChildState, value, "CHILD_STATE_")


def document(msg: retrieval_pb2.Document) -> Document:
    return Document(
        id=msg.id, source_id=msg.source_id, title=msg.title, kind=msg.kind,
        category=msg.category, tags=tuple(msg.tags),
        state=enum_name(retrieval_pb2.DocumentState, msg.state, "DOCUMENT_STATE_"),
        error=msg.error, indexed_at=_time(msg, "indexed_at"), path=msg.path,
        redactions=msg.redactions, review_note=msg.review_note,
        document_date=_time(msg, "document_date"))


def source(msg: retrieval_pb2.Source) -> Source:
    return Source(id=msg.id, kind=msg.kind, path=msg.path, category=msg.category,
                  tags=tuple(msg.tags), last_scan=_time(msg, "last_scan"),
                  last_error=msg.last_error, documents=msg.documents, disabled=msg.disabled,
                  review_required=msg.review_required, max_age_days=msg.max_age_days,
                  max_items=msg.max_items, pruned=msg.pruned, exclude=tuple(msg.exclude),
                  excluded=msg.excluded)


def reindex_progress(msg: retrieval_pb2.ReindexProgress) -> ReindexProgress:
    return ReindexProgress(
        source_id=msg.source_id, seen=msg.seen, added=msg.added, changed=msg.changed,
        unchanged=msg.unchanged, deleted=msg.deleted,
        failed=tuple(FileIssue(f.path, f.reason) for f in msg.failed),
        skipped=tuple(FileIssue(f.path, f.reason) for f in msg.skipped), done=msg.done,
        failed_total=max(msg.failed_total, len(msg.failed)),
        skipped_total=max(msg.skipped_total, len(msg.skipped)),
        limit_reached=msg.limit_reached, excluded=msg.excluded)


def _opt(msg: Any, name: str) -> Any:
    return getattr(msg, name) if msg.HasField(name) else None


def search_mode(value: int) -> str:
    return enum_name(retrieval_pb2.SearchMode, value, "SEARCH_MODE_")


def document_state_enums(states: Iterable[str]) -> list[retrieval_pb2.DocumentState.ValueType]:
    """The DocumentState numbers of state names (``review_required``, ...).

    Raises:
        ValueError: an unknown name.
    """
    out = []
    for state in states:
        try:
            out.append(retrieval_pb2.DocumentState.Value(f"DOCUMENT_STATE_{state.upper()}"))
        except ValueError:
            raise ValueError("state must be one of pending, processing, indexed, failed, "
                             f"review_required, rejected, not {state!r}") from None
    return out


def search_mode_enum(mode: str) -> retrieval_pb2.SearchMode.ValueType:
    try:
        return retrieval_pb2.SearchMode.Value(f"SEARCH_MODE_{mode.upper()}")
    except ValueError:
        raise ValueError(f"mode must be hybrid, text or vector, not {mode!r}") from None


def search_result(msg: retrieval_pb2.SearchResponse) -> SearchResult:
    hits = tuple(
        SearchHit(
            chunk_id=h.chunk_id, document_id=h.document_id, title=h.title,
            source_id=h.source_id, path=h.path, heading=h.heading, text=h.text,
            snippet=h.snippet,
            search_source=enum_name(retrieval_pb2.SearchSource, h.search_source,
                                    "SEARCH_SOURCE_"),
            fused_score=h.fused_score, text_rank=_opt(h, "text_rank"),
            text_score=_opt(h, "text_score"), vector_rank=_opt(h, "vector_rank"),
            vector_score=_opt(h, "vector_score"), indexed_at=_time(h, "indexed_at"),
            score=h.score, kind=h.kind, category=h.category, tags=tuple(h.tags),
            ordinal=h.ordinal, modified_at=_time(h, "modified_at"),
            other_chunk_ids=tuple(h.other_chunk_ids),
            document_date=_time(h, "document_date"), also_in=tuple(h.also_in))
        for h in msg.hits)
    st = msg.stats
    stats = SearchStats(
        text_chunks=st.text_chunks, vector_chunks=st.vector_chunks,
        text_depth=st.text_depth, vector_depth=st.vector_depth,
        text_candidates=st.text_candidates, vector_candidates=st.vector_candidates,
        fused=st.fused, stages_ms=dict(st.stages_ms))
    return SearchResult(hits=hits, mode=search_mode(msg.mode), warnings=tuple(msg.warnings),
                        vector_model=msg.vector_model, stats=stats)


def retrieval_status(msg: retrieval_pb2.RetrievalStatusResponse) -> RetrievalStatus:
    return RetrievalStatus(
        sources=msg.sources, chunks=msg.chunks,
        documents_by_state=dict(msg.documents_by_state),
        embedded_chunks=msg.embedded_chunks, vectors=msg.vectors,
        embedding_model=msg.embedding_model, disk_bytes=msg.disk_bytes,
        repaired=dict(msg.repaired), source_list=tuple(source(s) for s in msg.source_list),
        backfill=VectorBackfill(
            running=msg.backfill.running, model=msg.backfill.model,
            pending=msg.backfill.pending, done=msg.backfill.done,
            failed=msg.backfill.failed, last_error=msg.backfill.last_error),
        rebuild=VectorRebuild(
            running=msg.rebuild.running, model=msg.rebuild.model,
            serving_model=msg.rebuild.serving_model, pending=msg.rebuild.pending,
            done=msg.rebuild.done),
        pruned=msg.pruned, store=msg.store or "embedded",
        lexical_ranking=msg.lexical_ranking, store_target=msg.store_target)


def reprocessed(msg: retrieval_pb2.ReprocessResponse) -> Reprocessed:
    return Reprocessed(chunks=msg.chunks, reason=msg.reason)


def ask_event(msg: answer_pb2.AskResponse) -> AskEvent | None:
    """The event in one Ask message; None for an empty (unknown) one, which is skipped."""
    kind = msg.WhichOneof("event")
    if kind == "text":
        return AskText(msg.text)
    if kind == "sources":
        s = msg.sources
        return AskSources(
            citations=tuple(Citation(label=c.label, chunk_id=c.chunk_id,
                                     document_id=c.document_id, title=c.title, path=c.path,
                                     score=c.score, snippet=c.snippet,
                                     search_source=enum_name(
                                         retrieval_pb2.SearchSource, c.search_source,
                                         "SEARCH_SOURCE_"),
                                     indexed_at=_time(c, "indexed_at"),
                                     document_date=_time(c, "document_date"),
                                     kind=c.kind, source_id=c.source_id,
                                     chunk_ids=tuple(c.chunk_ids),
                                     heading=c.heading)
                            for c in s.citations),
            retrieval_mode=search_mode(s.retrieval_mode), warnings=tuple(s.warnings))
    if kind == "done":
        d = msg.done
        return AskDone(usage=usage(d.usage), prompt_sha256=d.prompt_sha256, cached=d.cached,
                       no_context=d.no_context, finish_reason=finish_reason(d.finish_reason),
                       chunks_dropped=d.chunks_dropped,
                       attachment_clipped=d.attachment_clipped,
                       template_version=d.template_version, model_name=d.model_name,
                       history_turns_dropped=d.history_turns_dropped, dry_run=d.dry_run)
    if kind == "plan":
        return ask_plan(msg.plan)
    return None


def ask_plan(p: answer_pb2.AskPlan) -> AskPlan:
    """A dry run's plan; verdicts and roles by their short names (kept, user...)."""
    return AskPlan(
        hits=tuple(PlannedHit(
            chunk_id=h.chunk_id, document_id=h.document_id, title=h.title, path=h.path,
            ordinal=h.ordinal, score=h.score,
            text_score=h.text_score if h.HasField("text_score") else None,
            vector_score=h.vector_score if h.HasField("vector_score") else None,
            verdict=enum_name(answer_pb2.HitVerdict, h.verdict, "HIT_VERDICT_"),
            label=h.label) for h in p.hits),
        sections=tuple(PromptSection(
            role=enum_name(inference_pb2.ChatRole, s.role, "CHAT_ROLE_"), content=s.content,
            tokens=s.tokens) for s in p.sections),
        prompt_tokens=p.prompt_tokens, budget=p.budget)
