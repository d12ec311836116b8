"""Request messages from the clients' keyword arguments (shared by sync and asyncio).

The calls with many options (search, upsert_document, ask) take them in both clients as
``**options`` typed by a TypedDict here (:class:`SearchOptions`, :class:`UpsertOptions`,
:class:`AskOptions`), and forward them to the builder of the same name, whose signature
holds the defaults and refuses a misspelt option (TypeError).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypedDict

from llamad_protocol.v1 import answer_pb2, control_pb2, inference_pb2, retrieval_pb2

from . import _convert as cv
from . import _tools
from ._generation import sampling
from ._tools import ToolInput
from ._types import SearchMode, Task


def generate(prompt: str, sampling: inference_pb2.SamplingParams, model: str = ""
             ) -> inference_pb2.GenerateRequest:
    return inference_pb2.GenerateRequest(prompt=prompt, sampling=sampling, model=model)


def chat(messages: Iterable[cv.ChatInput], sampling: inference_pb2.SamplingParams,
         model: str = "", *, tools: Iterable[ToolInput] = (),
         tool_choice: str | Mapping[str, Any] | None = None,
         parallel_tool_calls: bool | None = None) -> inference_pb2.ChatRequest:
    return inference_pb2.ChatRequest(
        messages=cv.chat_messages(messages), sampling=sampling, model=model,
        tools=_tools.tools(tools), tool_choice=_tools.tool_choice(tool_choice),
        parallel_tool_calls=parallel_tool_calls)


def embed(texts: str | Sequence[str], normalize: bool | None, model: str = ""
          ) -> inference_pb2.EmbedRequest:
    batch = [texts] if isinstance(texts, str) else list(texts)
    return inference_pb2.EmbedRequest(texts=batch, normalize=normalize, model=model)


def tokenize(text: str, role: str, add_special: bool, model: str = ""
             ) -> inference_pb2.TokenizeRequest:
    return inference_pb2.TokenizeRequest(text=text, role=cv.role_enum(role),
                                         add_special=add_special, model=model)


def detokenize(tokens: Sequence[int], role: str, model: str
               ) -> inference_pb2.DetokenizeRequest:
    return inference_pb2.DetokenizeRequest(tokens=tokens, role=cv.role_enum(role),
                                           model=model)


def tail_logs(role: str, lines: int, follow: bool) -> control_pb2.TailLogsRequest:
    return control_pb2.TailLogsRequest(role=cv.role_enum(role), lines=lines,
                                       follow=follow)


def swap(role: str, model_path: str | os.PathLike[str], *, extra_args: str | None,
         ctx_size: int | None, rollback: bool, stop_old_first: bool,
         reason: str, name: str = "") -> control_pb2.SwapRequest:
    return control_pb2.SwapRequest(
        role=cv.role_enum(role), model_path=os.fspath(model_path),
        extra_args=extra_args, ctx_size=ctx_size, rollback=rollback,
        stop_old_first=stop_old_first, reason=reason, model=name)


def set_mode(role: str, mode: str, *, endpoint_url: str, endpoint_model: str,
             api_key_file: str, api_key_env: str, model_path: str | os.PathLike[str],
             reason: str) -> control_pb2.SetModeRequest:
    return control_pb2.SetModeRequest(
        role=cv.role_enum(role), mode=cv.mode_enum(mode), model_path=os.fspath(model_path),
        reason=reason, endpoint=control_pb2.EndpointSettings(
            url=endpoint_url, model=endpoint_model, api_key_file=api_key_file,
            api_key_env=api_key_env))


def reset(role: str) -> control_pb2.ResetRequest:
    return control_pb2.ResetRequest(role=cv.role_enum(role))


class SearchOptions(TypedDict, total=False):
    """What :func:`search` takes besides the query: ``Client.search``'s options."""

    top_k: int
    sources: Sequence[str]
    kinds: Sequence[str]
    categories: Sequence[str]
    tags: Sequence[str]
    indexed_since: datetime | None
    indexed_until: datetime | None
    mode: SearchMode
    min_score: float | None
    candidates: int
    text_weight: float | None
    vector_weight: float | None
    group_by_document: bool
    dated_since: datetime | None
    dated_until: datetime | None
    fusion: str


def search(query: str, *, top_k: int = 0, sources: Sequence[str] = (),
           kinds: Sequence[str] = (), categories: Sequence[str] = (), tags: Sequence[str] = (),
           indexed_since: datetime | None = None, indexed_until: datetime | None = None,
           mode: SearchMode = "hybrid", min_score: float | None = None, candidates: int = 0,
           text_weight: float | None = None, vector_weight: float | None = None,
           group_by_document: bool = False, dated_since: datetime | None = None,
           dated_until: datetime | None = None, fusion: str = "",
           ) -> retrieval_pb2.SearchRequest:
    request = retrieval_pb2.SearchRequest(
        query=query, top_k=top_k, filters=cv.filters(
            sources=sources, kinds=kinds, categories=categories, tags=tags,
            indexed_since=indexed_since, indexed_until=indexed_until,
            dated_since=dated_since, dated_until=dated_until),
        mode=cv.search_mode_enum(mode), candidates=candidates,
        group_by_document=group_by_document, fusion=fusion,
        # None leaves an optional field unset: the daemon's default.
        min_score=min_score, text_weight=text_weight, vector_weight=vector_weight)
    return request


class UpsertOptions(TypedDict, total=False):
    """What :func:`upsert_document` takes besides the source and the text:
    ``Client.upsert_document``'s options."""

    document_id: str
    title: str
    kind: str
    category: str
    tags: Sequence[str]
    content: bytes
    content_type: str
    wait: bool
    review: bool
    document_date: datetime | None


def upsert_document(source_id: str, text: str = "", *, document_id: str = "", title: str = "",
                    kind: str = "text", category: str = "", tags: Sequence[str] = (),
                    content: bytes = b"", content_type: str = "", wait: bool = True,
                    review: bool = False, document_date: datetime | None = None
    ) -> retrieval_pb2.UpsertDocumentRequest:
    request = retrieval_pb2.UpsertDocumentRequest(
        source_id=source_id, id=document_id, title=title, text=text, kind=kind,
        category=category, tags=list(tags), content=content, content_type=content_type,
        review=review, document_date=cv.timestamp(document_date))
    if not wait:
        request.wait = False
    return request


def add_source(source_id: str, path: str | os.PathLike[str], *, category: str,
               tags: Sequence[str], review_required: bool = False, history: bool = False,
               max_age_days: int = 0, max_items: int = 0,
               exclude: Sequence[str] = ()) -> retrieval_pb2.AddSourceRequest:
    return retrieval_pb2.AddSourceRequest(id=source_id, path=os.fspath(path),
                                          category=category, tags=list(tags),
                                          review_required=review_required, history=history,
                                          max_age_days=max_age_days, max_items=max_items,
                                          exclude=list(exclude))


class AskOptions(TypedDict, total=False):
    """What :func:`ask` takes besides the question: ``Client.ask``'s options."""

    top_k: int
    sources: Sequence[str]
    kinds: Sequence[str]
    categories: Sequence[str]
    tags: Sequence[str]
    history: Iterable[cv.ChatInput]
    task: Task
    attachment: str
    max_tokens: int | None
    temperature: float | None
    seed: int | None
    no_cache: bool
    mode: SearchMode
    dated_since: datetime | None
    dated_until: datetime | None
    model: str
    dry_run: bool


def ask(question: str, *, top_k: int = 0, sources: Sequence[str] = (),
        kinds: Sequence[str] = (), categories: Sequence[str] = (), tags: Sequence[str] = (),
        history: Iterable[cv.ChatInput] = (), task: Task = "answer", attachment: str = "",
        max_tokens: int | None = None, temperature: float | None = None,
        seed: int | None = None, no_cache: bool = False, mode: SearchMode = "hybrid",
        dated_since: datetime | None = None, dated_until: datetime | None = None,
        model: str = "", dry_run: bool = False) -> answer_pb2.AskRequest:
    return answer_pb2.AskRequest(
        question=question, top_k=top_k, history=cv.turns(history), model=model,
        dry_run=dry_run,
        task=cv.task_enum(task), attachment=attachment, no_cache=no_cache,
        mode=cv.search_mode_enum(mode),
        filters=cv.filters(sources=sources, kinds=kinds, categories=categories, tags=tags,
                           dated_since=dated_since, dated_until=dated_until),
        sampling=sampling(max_tokens=max_tokens, temperature=temperature, seed=seed))
