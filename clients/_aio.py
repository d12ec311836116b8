"""The asyncio llamad client: the same calls as :class:`clients.Client`, awaitable.

Unary calls are coroutines; streaming calls return async iterators at once (the RPC
starts on the first read). Cancelling the awaiting task cancels the RPC, and the daemon
stops the work; so does leaving ``async with`` / ``aclose()`` / dropping a stream.

Example:
    >>> import asyncio
    >>> from clients import AsyncClient
    >>> async def main() -> None:
    ...     async with AsyncClient() as llamad:
    ...         async for chunk in llamad.generate("Hello", max_tokens=8):
    ...             print(chunk.text, end="")
    ...         print((await llamad.status()).version)
    >>> asyncio.run(main())                                       # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Unpack

from grpc_health.v1 import health_pb2

from llamad_protocol.v1 import control_pb2, retrieval_pb2

from . import _convert as cv
from . import _generation as gen
from . import _requests as rq
from ._base import AsyncBase, serving, status_name, watch_ended
from ._channel import DEFAULT, Timeout
from ._generation import GenerationControls
from ._models import ModelInfo, model_info, model_list
from ._stream import AsyncAskStream, AsyncStream, AsyncTextStream
from ._tools import ToolInput
from ._types import (
    DaemonStatus,
    Document,
    DocumentState,
    Embeddings,
    LogLine,
    Mode,
    ReindexProgress,
    Reprocessed,
    RetrievalStatus,
    Role,
    SearchResult,
    Source,
    SwapProgress,
    Tokens,
    ToolChoice,
)
from .errors import NotFound

__all__ = ["AsyncClient"]


class AsyncClient(AsyncBase):
    """An asyncio client for llamad over one ``grpc.aio`` channel.

    Takes the same arguments as :class:`clients.Client`, with the same deadlines, retries
    and errors. Create it inside the event loop that uses it (gRPC binds the channel to
    that loop), and ``await close()`` it, or use ``async with``.
    """

    # --- InferenceService -----------------------------------------------------------------

    def generate(self, prompt: str, *, model: str = "", timeout: Timeout = DEFAULT,
                 **controls: Unpack[GenerationControls]) -> AsyncTextStream:
        """Stream the completion of a raw prompt by ``model`` (a catalog name or alias;
        empty: the default), with the generation controls of :meth:`Client.generate`."""
        request = rq.generate(prompt, gen.sampling(**controls), model)
        return AsyncTextStream(self._call(self._inference.Generate, request, timeout),
                               cv.generate_chunk)

    def chat(self, messages: Iterable[cv.ChatInput], *, model: str = "",
             tools: Iterable[ToolInput] = (),
             tool_choice: ToolChoice | Mapping[str, Any] | None = None,
             parallel_tool_calls: bool | None = None, timeout: Timeout = DEFAULT,
             **controls: Unpack[GenerationControls]) -> AsyncTextStream:
        """Stream a chat completion, tools and all (see :meth:`Client.chat`)."""
        request = rq.chat(messages, gen.sampling(**controls), model, tools=tools,
                          tool_choice=tool_choice, parallel_tool_calls=parallel_tool_calls)
        return AsyncTextStream(self._call(self._inference.Chat, request, timeout),
                               cv.generate_chunk)

    async def embed(self, texts: str | Sequence[str], *, normalize: bool | None = None,
                    model: str = "", timeout: Timeout = DEFAULT) -> Embeddings:
        """Embed texts, one vector per text (see :meth:`Client.embed`)."""
        request = rq.embed(texts, normalize, model)
        resp = await self._unary(self._inference.Embed, request, timeout)
        return cv.embeddings(resp)

    async def tokenize(self, text: str, *, role: Role = "generation",
                       add_special: bool = False, model: str = "",
                       timeout: Timeout = DEFAULT) -> Tokens:
        """Tokenize with the ``role`` model's tokenizer (see :meth:`Client.tokenize`)."""
        request = rq.tokenize(text, role, add_special, model)
        return cv.tokens(await self._unary(self._inference.Tokenize, request, timeout))

    async def detokenize(self, tokens: Sequence[int], *, role: Role = "generation",
                         model: str = "", timeout: Timeout = DEFAULT) -> str:
        """The text of token ids (see :meth:`Client.detokenize`)."""
        request = rq.detokenize(tokens, role, model)
        return cv.text(await self._unary(self._inference.Detokenize, request, timeout))

    # --- ControlService -------------------------------------------------------------------

    async def status(self, *, timeout: Timeout = DEFAULT) -> DaemonStatus:
        """A snapshot of every child and the daemon (see :meth:`Client.status`)."""
        resp = await self._unary(self._control.Status, control_pb2.StatusRequest(), timeout)
        return cv.daemon_status(resp)

    def tail_logs(self, role: Role = "generation", *, lines: int = 0, follow: bool = False,
                  timeout: Timeout = DEFAULT) -> AsyncStream[LogLine]:
        """Stream a child's output lines (see :meth:`Client.tail_logs`)."""
        request = rq.tail_logs(role, lines, follow)
        return AsyncStream(self._call(self._control.TailLogs, request, timeout), cv.log_line)

    def swap(self, role: Role = "generation", model_path: str | os.PathLike[str] = "", *,
             extra_args: str | None = None, ctx_size: int | None = None,
             rollback: bool = False, stop_old_first: bool = False, reason: str = "",
             name: str = "", timeout: Timeout = DEFAULT) -> AsyncStream[SwapProgress]:
        """Swap a child's model, streaming stages (see :meth:`Client.swap`)."""
        request = rq.swap(role, model_path, extra_args=extra_args, ctx_size=ctx_size,
                          rollback=rollback, stop_old_first=stop_old_first, reason=reason,
                          name=name)
        return AsyncStream(self._call(self._control.Swap, request, timeout),
                           cv.swap_progress)

    def set_mode(self, role: Role, mode: Mode, *, endpoint_url: str = "",
                 endpoint_model: str = "", api_key_file: str = "", api_key_env: str = "",
                 model_path: str | os.PathLike[str] = "", reason: str = "",
                 timeout: Timeout = DEFAULT) -> AsyncStream[SwapProgress]:
        """Switch a role's inference mode, streaming stages (see :meth:`Client.set_mode`)."""
        request = rq.set_mode(role, mode, endpoint_url=endpoint_url,
                              endpoint_model=endpoint_model, api_key_file=api_key_file,
                              api_key_env=api_key_env, model_path=model_path, reason=reason)
        return AsyncStream(self._call(self._control.SetMode, request, timeout),
                           cv.swap_progress)

    async def reset(self, role: Role = "generation", *, timeout: Timeout = DEFAULT) -> str:
        """Close a child's breaker and retry its start; return its state."""
        resp = await self._unary(self._control.Reset, rq.reset(role), timeout)
        return cv.child_state(resp.state)

    async def set_draining(self, draining: bool = True, *, reason: str = "",
                           timeout: Timeout = DEFAULT) -> int:
        """Drain the daemon or undrain it; return its calls in flight (see
        :meth:`Client.set_draining`)."""
        request = control_pb2.SetDrainingRequest(draining=draining, reason=reason)
        resp = await self._unary(self._control.SetDraining, request, timeout)
        return int(resp.in_flight)

    async def list_models(self, *, timeout: Timeout = DEFAULT) -> list[ModelInfo]:
        """Every model of the daemon's catalog (see :meth:`Client.list_models`)."""
        resp = await self._unary(self._control.ListModels, control_pb2.ListModelsRequest(),
                                 timeout)
        return model_list(resp)

    async def load_model(self, name: str, *, timeout: Timeout = DEFAULT) -> ModelInfo:
        """Make a model resident (see :meth:`Client.load_model`)."""
        request = control_pb2.LoadModelRequest(name=name)
        resp = await self._unary(self._control.LoadModel, request, timeout)
        return model_info(resp.model)

    async def unload_model(self, name: str, *, reason: str = "",
                           timeout: Timeout = DEFAULT) -> ModelInfo:
        """Take a model out of residency (see :meth:`Client.unload_model`)."""
        request = control_pb2.UnloadModelRequest(name=name, reason=reason)
        resp = await self._unary(self._control.UnloadModel, request, timeout)
        return model_info(resp.model)

    # --- RetrievalService -----------------------------------------------------------------

    async def search(self, query: str, *, timeout: Timeout = DEFAULT,
                     **options: Unpack[rq.SearchOptions]) -> SearchResult:
        """Hybrid search (see :meth:`Client.search`)."""
        request = rq.search(query, **options)
        return cv.search_result(await self._unary(self._retrieval.Search, request, timeout))

    async def upsert_document(self, source_id: str, text: str = "", *,
                              timeout: Timeout = DEFAULT,
                              **options: Unpack[rq.UpsertOptions]) -> Document:
        """Index a pushed document (see :meth:`Client.upsert_document`)."""
        request = rq.upsert_document(source_id, text, **options)
        resp = await self._unary(self._retrieval.UpsertDocument, request, timeout)
        return cv.document(resp.document)

    async def delete_document(self, document_id: str, *,
                              timeout: Timeout = DEFAULT) -> bool:
        """Delete a document; return whether it existed."""
        request = retrieval_pb2.DeleteDocumentRequest(id=document_id)
        resp = await self._unary(self._retrieval.DeleteDocument, request, timeout)
        return bool(resp.deleted)

    async def get_document(self, document_id: str, *, timeout: Timeout = DEFAULT) -> Document:
        """A document's metadata and state; raises NotFound when there is none."""
        request = retrieval_pb2.GetDocumentRequest(id=document_id)
        return cv.document(await self._unary(self._retrieval.GetDocument, request, timeout))

    async def list_documents(self, source_id: str = "", *,
                             states: Sequence[DocumentState] = (),
                             timeout: Timeout = DEFAULT) -> list[Document]:
        """Documents of a source (or of every source), of ``states`` when given (see
        :meth:`Client.list_documents`)."""
        request = retrieval_pb2.ListDocumentsRequest(
            source_id=source_id, states=cv.document_state_enums(states))
        resp = await self._unary(self._retrieval.ListDocuments, request, timeout)
        return [cv.document(d) for d in resp.documents]

    async def approve_document(self, document_id: str, note: str = "", *,
                               timeout: Timeout = DEFAULT) -> Document:
        """Approve a document awaiting review (see :meth:`Client.approve_document`)."""
        request = retrieval_pb2.ReviewDocumentRequest(id=document_id, note=note)
        return cv.document(await self._unary(self._retrieval.ApproveDocument, request,
                                             timeout))

    async def reject_document(self, document_id: str, note: str = "", *,
                              timeout: Timeout = DEFAULT) -> Document:
        """Reject a document awaiting review (see :meth:`Client.reject_document`)."""
        request = retrieval_pb2.ReviewDocumentRequest(id=document_id, note=note)
        return cv.document(await self._unary(self._retrieval.RejectDocument, request,
                                             timeout))

    async def add_source(self, source_id: str, path: str | os.PathLike[str] = "", *,
                         category: str = "", tags: Sequence[str] = (),
                         review_required: bool = False, history: bool = False,
                         max_age_days: int = 0, max_items: int = 0,
                         exclude: Sequence[str] = (),
                         timeout: Timeout = DEFAULT) -> Source:
        """Add (or update) a directory, push or history source (see
        :meth:`Client.add_source`)."""
        request = rq.add_source(source_id, path, category=category, tags=tags,
                                review_required=review_required, history=history,
                                max_age_days=max_age_days, max_items=max_items,
                                exclude=exclude)
        return cv.source(await self._unary(self._retrieval.AddSource, request, timeout))

    async def remove_source(self, source_id: str, *, timeout: Timeout = DEFAULT) -> int:
        """Remove a source and its documents; return how many chunks were removed."""
        request = retrieval_pb2.RemoveSourceRequest(id=source_id)
        resp = await self._unary(self._retrieval.RemoveSource, request, timeout)
        return int(resp.chunks_removed)

    async def list_sources(self, *, timeout: Timeout = DEFAULT) -> list[Source]:
        """Every source, with its document count and last scan."""
        resp = await self._unary(self._retrieval.ListSources,
                                 retrieval_pb2.ListSourcesRequest(), timeout)
        return [cv.source(s) for s in resp.sources]

    async def set_source_disabled(self, source_id: str, disabled: bool = True, *,
                                  timeout: Timeout = DEFAULT) -> Source:
        """Disable (or enable) a source (see :meth:`Client.set_source_disabled`)."""
        request = retrieval_pb2.SetSourceDisabledRequest(id=source_id, disabled=disabled)
        return cv.source(await self._unary(self._retrieval.SetSourceDisabled, request,
                                           timeout))

    def reindex(self, source_id: str = "", *, since: datetime | None = None,
                timeout: Timeout = DEFAULT) -> AsyncStream[ReindexProgress]:
        """Rescan directory sources, streaming progress (see :meth:`Client.reindex`)."""
        request = retrieval_pb2.ReindexRequest(source_id=source_id,
                                               since=cv.timestamp(since))
        return AsyncStream(self._call(self._retrieval.Reindex, request, timeout),
                           cv.reindex_progress)

    async def retrieval_status(self, *, timeout: Timeout = DEFAULT) -> RetrievalStatus:
        """Sizes of the retrieval index."""
        resp = await self._unary(self._retrieval.Status,
                                 retrieval_pb2.RetrievalStatusRequest(), timeout)
        return cv.retrieval_status(resp)

    async def reprocess(self, *, document_id: str = "", source_id: str = "",
                        timeout: Timeout = DEFAULT) -> Reprocessed:
        """Embed the chunks without vectors in the background (see
        :meth:`Client.reprocess`)."""
        request = retrieval_pb2.ReprocessRequest(document_id=document_id, source_id=source_id)
        return cv.reprocessed(await self._unary(self._retrieval.Reprocess, request, timeout))

    # --- AnswerService --------------------------------------------------------------------

    def ask(self, question: str, *, timeout: Timeout = DEFAULT,
            **options: Unpack[rq.AskOptions]) -> AsyncAskStream:
        """A grounded answer, streamed, then its sources (see :meth:`Client.ask`)."""
        request = rq.ask(question, **options)
        return AsyncAskStream(self._call(self._answer.Ask, request, timeout), cv.ask_event)

    # --- health ---------------------------------------------------------------------------
    async def health(self, service: str = "", *, timeout: Timeout = DEFAULT) -> str:
        """``serving``, ``not_serving`` or ``service_unknown`` (see :meth:`Client.health`)."""
        request = health_pb2.HealthCheckRequest(service=service)
        try:
            resp = await self._unary(self._health.Check, request, timeout)
        except NotFound:
            return "service_unknown"
        return status_name(resp)

    async def wait_serving(self, service: str = "", *, timeout: float = 120.0) -> None:
        """Wait until ``service`` is SERVING, waiting for the daemon to come up too.

        Raises:
            DeadlineExceeded: not serving within ``timeout`` seconds.
        """
        async with AsyncStream(self._watch_health(service, timeout), serving) as updates:
            async for _ in updates:
                return
        raise watch_ended()
