"""``POST /v1/llamad/ask``: grounded answers over HTTP, llamad's own extension (no OpenAI
route fits an answer with citations).

The body is a ``llamad.v1.AskRequest`` in protobuf's JSON mapping (field names as in the
proto or in lowerCamelCase, enums by name or number, times as RFC 3339: ``{"question":
"...", "top_k": 5, "task": "TASK_TYPE_DIAGNOSE", "sampling": {"max_tokens": 200}}``), plus
``"stream": true`` to stream. It is read here into a plain
:class:`~daemon.services.ask.Question` and answered by :class:`~daemon.services.ask.AskService`,
the service gRPC's AnswerService/Ask adapts too, so both APIs answer alike. Streamed, each
event is one ``AskResponse`` in the same JSON mapping: ``data: {"text": ...}`` pieces,
then ``data: {"sources": {...}}`` (the citations), then ``data: {"done": {...}}``, then
``data: [DONE]``. Whole: ``{"text", "sources", "done"}`` in one object. With ``"dry_run":
true`` a ``plan`` (an ``AskPlan``) comes instead of the text, and nothing is generated.
A refusal names its field in ``error.param`` (``history``, ``sampling.max_tokens`` as
``max_tokens``...).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from typing import Any

from aiohttp import web
from google.protobuf import json_format

from llamad_protocol.v1 import inference_pb2 as ipb
from retrieval import Filters, SearchMode
from supervisor import Sampling

from ..checks import validation
from ..config import Limits
from ..grpcapi.rpc import Call
from ..services.ask import AnswerSettings, AskEvent, Done, Plan, Question, Sources, Turn
from . import _parse
from ._context import Api, json_response, open_stream, time_remaining
from ._errors import ApiError, ParamError
from ._shapes import DONE, sse

_FIELDS = ("question", "filters", "top_k", "history", "task", "attachment", "sampling",
           "no_cache", "mode", "model", "dry_run")
_FILTERS = ("sources", "kinds", "categories", "tags", "indexed_since", "indexed_until",
            "dated_since", "dated_until")
# Each enum's names in the order of their numbers (0, 1, ...): a number given is read by
# its position (a test holds these to the proto's enums).
_TASKS = {"TASK_TYPE_UNSPECIFIED": "answer", "TASK_TYPE_ANSWER": "answer",
          "TASK_TYPE_EXPLAIN_OUTPUT": "explain_output", "TASK_TYPE_DIAGNOSE": "diagnose",
          "TASK_TYPE_SUMMARIZE": "summarize"}
_MODES = {"SEARCH_MODE_UNSPECIFIED": SearchMode.HYBRID,
          **{f"SEARCH_MODE_{m.name}": m for m in SearchMode}}
_ROLES = {"CHAT_ROLE_UNSPECIFIED": "unspecified", "CHAT_ROLE_SYSTEM": "system",
          "CHAT_ROLE_USER": "user", "CHAT_ROLE_ASSISTANT": "assistant",
          "CHAT_ROLE_TOOL": "tool"}
_UINT32 = 2**32 - 1


def _snake(name: str) -> str:
    """A lowerCamelCase key in the proto's spelling (``topK`` -> ``top_k``)."""
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


def _object(value: object, where: str, names: tuple[str, ...], message: str
            ) -> dict[str, Any]:
    """A JSON object's fields by their proto names.

    Raises:
        ParamError: not an object, a field given twice, or a field the message lacks.
    """
    if not isinstance(value, Mapping):
        raise ParamError(where or "body", f"{where or 'the body'} must be an object, not "
                                          f"{_parse.kind(value)}")
    fields: dict[str, Any] = {}
    for key, item in value.items():
        name = _snake(key) if key not in names else key
        path = f"{where}.{name}" if where else name
        if name not in names:
            raise ParamError(path, f'unknown field "{key}": a llamad.v1.{message} has '
                                   f"{', '.join(names)}")
        if name in fields:
            raise ParamError(path, f"{path} is given twice")
        fields[name] = item
    return {k: v for k, v in fields.items() if v is not None}  # null: the default


def _text(fields: Mapping[str, Any], name: str, where: str = "") -> str:
    value = fields.get(name, "")
    if not isinstance(value, str):
        raise ParamError(where + name, f"{where + name} must be a string, not "
                                       f"{_parse.kind(value)}")
    return value


def _count(fields: Mapping[str, Any], name: str) -> int:
    value = fields.get(name, 0)
    if isinstance(value, str) and value.isdigit():  # the JSON mapping allows "5"
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _UINT32:
        raise ParamError(name, f"{name} must be an integer in 0..{_UINT32}, not "
                               f"{value if isinstance(value, int) else _parse.kind(value)}")
    return value


def _flag(fields: Mapping[str, Any], name: str) -> bool:
    value = fields.get(name, False)
    if not isinstance(value, bool):
        raise ParamError(name, f"{name} must be true or false, not {_parse.kind(value)}")
    return value


def _enum(value: object, names: Mapping[str, str], where: str, what: str) -> str:
    """An enum given by name or number, as the service names it (an unknown number is
    passed on as such, for the service to refuse as gRPC's is)."""
    if isinstance(value, int) and not isinstance(value, bool):
        known = list(names.values())
        return known[value] if 0 <= value < len(known) else str(value)
    if isinstance(value, str) and value in names:
        return names[value]
    raise ParamError(where, f"{where} must be a {what} name ({', '.join(names)}), not "
                            f"{value!r}"[:300])


def _strings(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ParamError(where, f"{where} must be an array of strings")
    return tuple(value)


_MIN_SECONDS, _MAX_SECONDS = -62_135_596_800, 253_402_300_799
"""0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z: the range of a protobuf Timestamp."""


def _seconds(value: object, where: str) -> int:
    """An RFC 3339 time (``2026-01-31T00:00:00Z``) in unix seconds, within the years 1
    to 9999 (UTC), as a protobuf Timestamp."""
    try:
        if not isinstance(value, str):
            raise ValueError
        when = dt.datetime.fromisoformat(value)
        if when.tzinfo is None:
            raise ValueError
        seconds = int(when.timestamp())
        if not _MIN_SECONDS <= seconds <= _MAX_SECONDS:
            raise ValueError
    except (ValueError, OverflowError):
        raise ParamError(where, f"{where} must be an RFC 3339 time with its offset, within "
                                f"the years 1 to 9999 (2026-01-31T00:00:00Z), not "
                                f"{value!r}"[:300]) from None
    return seconds


def _filters(value: object) -> Filters:
    fields = _object(value, "filters", _FILTERS, "SearchFilters")
    lists = {n: _strings(fields.get(n, []), f"filters.{n}") for n in _FILTERS[:4]}
    times = {n: _seconds(fields[n], f"filters.{n}") for n in _FILTERS[4:] if n in fields}
    return Filters(sources=lists["sources"], kinds=lists["kinds"],
                   categories=lists["categories"], tags=lists["tags"],
                   since=times.get("indexed_since"), until=times.get("indexed_until"),
                   dated_since=times.get("dated_since"), dated_until=times.get("dated_until"))


def _history(value: object) -> tuple[Turn, ...]:
    if not isinstance(value, list):
        raise ParamError("history", f"history must be an array, not {_parse.kind(value)}")
    turns = []
    for i, item in enumerate(value):
        where = f"history[{i}]"
        fields = _object(item, where, ("role", "content"), "Turn")
        turns.append(Turn(_enum(fields.get("role", 0), _ROLES, f"{where}.role", "ChatRole"),
                          _text(fields, "content", f"{where}.")))
    return tuple(turns)


def _sampling(value: object) -> ipb.SamplingParams:
    """``sampling`` read into the message the shared checks take
    (:func:`daemon.checks.validation.ask_sampling`), as the chat routes' parameters are."""
    params = ipb.SamplingParams()
    if not isinstance(value, Mapping):
        raise ParamError("sampling", f"sampling must be an object, not {_parse.kind(value)}")
    try:
        json_format.ParseDict(dict(value), params)
    except json_format.ParseError as exc:
        raise ParamError("sampling", f"sampling is not a valid llamad.v1.SamplingParams: "
                                     f"{exc}"[:400]) from None
    return params


def read(body: _parse.Body) -> tuple[Question, ipb.SamplingParams]:
    """The question a body asks and its sampling parameters (checked by the service).

    Raises:
        ParamError: a field of the wrong type or unknown, naming it.
    """
    fields = _object({k: v for k, v in body.items() if k != "stream"}, "", _FIELDS, "AskRequest")
    question = Question(
        question=_text(fields, "question"),
        task=_enum(fields.get("task", 0), _TASKS, "task", "TaskType"),
        attachment=_text(fields, "attachment"),
        history=_history(fields.get("history", [])),
        top_k=_count(fields, "top_k"),
        mode=_enum(fields.get("mode", 0), _MODES, "mode", "SearchMode"),
        filters=_filters(fields.get("filters", {})),
        model=_text(fields, "model"),
        no_cache=_flag(fields, "no_cache"), dry_run=_flag(fields, "dry_run"))
    return question, _sampling(fields.get("sampling", {}))


def _time(seconds: int) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _set(**fields: Any) -> dict[str, Any]:
    """The fields not at their default, as protobuf's JSON mapping writes them."""
    return {k: v for k, v in fields.items() if v not in ("", 0, False, (), None)}


_SOURCE_NAMES = {"text": "SEARCH_SOURCE_TEXT", "vector": "SEARCH_SOURCE_VECTOR",
                 "hybrid": "SEARCH_SOURCE_HYBRID"}
_FINISH_NAMES = {"stop": "FINISH_REASON_STOP", "length": "FINISH_REASON_LENGTH"}


def event_json(event: AskEvent) -> dict[str, Any]:
    """One event of the answer as an ``AskResponse`` in protobuf's JSON mapping."""
    if isinstance(event, str):
        return {"text": event}
    if isinstance(event, Sources):
        citations = [
            _set(label=c.label, chunk_id=c.chunk_id, document_id=c.document_id,
                 title=c.title, path=c.path, score=c.score, snippet=c.snippet,
                 search_source=_SOURCE_NAMES[c.search_source],
                 indexed_at=_time(c.indexed_at), kind=c.kind, source_id=c.source_id,
                 document_date=None if c.document_date is None else _time(c.document_date),
                 chunk_ids=list(c.chunk_ids), heading=c.heading)
            for c in event.citations]
        return {"sources": _set(citations=citations,
                                retrieval_mode=f"SEARCH_MODE_{event.retrieval_mode.upper()}",
                                warnings=list(event.warnings))}
    if isinstance(event, Plan):
        return {"plan": _plan(event)}
    return {"done": _done(event)}


def _plan(p: Plan) -> dict[str, Any]:
    hits = [{**_set(chunk_id=h.chunk_id, document_id=h.doc_id, title=h.title,
                    path=h.path, ordinal=h.ordinal, score=h.score, label=h.label,
                    verdict=f"HIT_VERDICT_{h.verdict.upper()}"),
             # optional fields: present when set, even at 0
             **({} if h.text_score is None else {"text_score": h.text_score}),
             **({} if h.vector_score is None else {"vector_score": h.vector_score})}
            for h in p.hits]
    sections = [_set(role=f"CHAT_ROLE_{s.role.upper()}", content=s.content, tokens=s.tokens)
                for s in p.sections]
    return _set(hits=hits, sections=sections, prompt_tokens=p.prompt_tokens,
                budget=max(0, p.budget))


def _done(d: Done) -> dict[str, Any]:
    finish = _FINISH_NAMES.get(d.finish_reason, "FINISH_REASON_STOP")
    if d.no_context:  # nothing was generated: no usage, no model
        return {"no_context": True, "finish_reason": finish, **_set(dry_run=d.dry_run)}
    usage = _set(prompt_tokens=d.prompt_tokens, completion_tokens=d.completion_tokens,
                 total_tokens=d.total_tokens, time_to_first_token_ms=d.time_to_first_token_ms,
                 tokens_per_second=d.tokens_per_second)
    return {"usage": usage, **_set(
        prompt_sha256=d.prompt_sha256, cached=d.cached, finish_reason=finish,
        chunks_dropped=d.chunks_dropped, attachment_clipped=d.attachment_clipped,
        template_version=d.template_version, model_name=d.model_name,
        history_turns_dropped=d.history_turns_dropped, dry_run=d.dry_run)}


async def ask(api: Api, request: web.BaseRequest, call: Call,
              body: _parse.Body) -> web.StreamResponse:
    """Answer with citations, whole or streamed (module docstring)."""
    if api.answer is None:
        raise ApiError(404, "Ask is not served by this daemon", code="not_found")
    stream = _parse.streaming(body).stream
    question, params = read(body)

    def sampling(limits: Limits, settings: AnswerSettings) -> Sampling:
        return validation.ask_sampling(params, limits, settings)

    events = api.answer.ask(question, sampling, time_remaining=lambda: time_remaining(call),
                            note=call.note)
    try:
        if not stream:
            answer: dict[str, Any] = {"text": ""}
            async for event in events:
                fields = event_json(event)
                answer["text"] += fields.pop("text", "")
                answer.update(fields)
            return json_response(request, answer)
        first = await anext(events, None)  # before the headers: a refusal is a status
        response = await open_stream(request)
        while first is not None:
            await response.write(sse(event_json(first)))
            first = await anext(events, None)
        await response.write(DONE)
        await response.write_eof()
        return response
    finally:
        await events.aclose()  # type: ignore[attr-defined]
