"""The synchronous llamad client: the model calls (InferenceService, ControlService,
health) here; the document calls it inherits from :mod:`clients._client_documents`, the
constructor and plumbing from :mod:`clients._base`.

Example:
    >>> from clients import Client
    >>> with Client("127.0.0.1:50051") as llamad:            # doctest: +SKIP
    ...     for chunk in llamad.generate("The capital of France is", max_tokens=8):
    ...         print(chunk.text, end="", flush=True)
    ...     hits = llamad.search("disk full on web01").hits
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Unpack

from grpc_health.v1 import health_pb2

from llamad_protocol.v1 import control_pb2

from . import _convert as cv
from . import _generation as gen
from . import _requests as rq
from ._base import serving, status_name, watch_ended
from ._channel import DEFAULT, Timeout
from ._client_documents import DocumentCalls
from ._generation import GenerationControls
from ._models import ModelInfo, model_info, model_list
from ._stream import Stream, TextStream
from ._tools import ToolInput
from ._types import (
    DaemonStatus,
    Embeddings,
    LogLine,
    Mode,
    Role,
    SwapProgress,
    Tokens,
    ToolChoice,
)
from .errors import NotFound

__all__ = ["DEFAULT", "Client"]


class Client(DocumentCalls):
    """A blocking client for llamad's gRPC API over one channel. Thread-safe.

    Every call has a deadline: ``timeout`` seconds for unary calls (default 30) and
    ``stream_timeout`` for streams (default None: no deadline), or the per-call
    ``timeout=`` (None: no deadline). A passed deadline raises
    :class:`~clients.errors.DeadlineExceeded`, and the daemon stops the work.
    UNAVAILABLE is retried by gRPC itself (see :mod:`clients._channel`); every other
    failure raises a :class:`~clients.errors.LlamadError` subclass at once.

    Args:
        address: ``host:port`` or ``unix:/path``; default ``$LLAMAD_ADDRESS``, else
            ``127.0.0.1:50051``.
        timeout: default deadline of unary calls, seconds (None: none).
        stream_timeout: default deadline of streaming calls, seconds (None: none).
        tls: use TLS (implied by any of the certificate files).
        ca_file: PEM roots to verify the daemon (default: the system's).
        cert_file: PEM client certificate chain, for mutual TLS (with ``key_file``).
        key_file: PEM private key of ``cert_file``.
        token: bearer token sent as ``authorization: Bearer <token>``.
        token_file: file holding the token (read once, stripped).
        server_name: expected name in the daemon's certificate, when it differs from
            the address's host.
        options: extra gRPC channel options.
        addresses: several daemons (instead of ``address``; or commas in ``address``):
            calls are balanced over the ones whose ``grpc.health.v1`` says SERVING, with
            gRPC's round_robin (a drained or stopping daemon gets no new calls). IP
            addresses and ports only. See docs/scale-out.md.

    Raises:
        ValueError: invalid connection options (unreadable files, empty token, several
            addresses that are not IP addresses, ...).

    Example:
        >>> from clients import Client
        >>> llamad = Client(timeout=10)                       # doctest: +SKIP
        >>> llamad.status().child("generation").state         # doctest: +SKIP
        'running'
        >>> llamad.close()                                    # doctest: +SKIP
    """

    # --- InferenceService -----------------------------------------------------------------

    def generate(
        self, prompt: str, *, model: str = "", timeout: Timeout = DEFAULT,
        **controls: Unpack[GenerationControls],
    ) -> TextStream:
        """Stream the completion of a raw prompt.

        Sampling arguments left as None use the daemon's defaults (``temperature=0`` is
        greedy). The stream yields :class:`~clients.GenerateChunk` s as the model produces
        them; the last one has ``finish_reason`` and ``usage``. Breaking out of the loop,
        closing the stream or its deadline passing stops the generation in the child.

        Generation controls (keyword arguments, typed by
        :class:`~clients._generation.GenerationControls`; all optional; the daemon refuses,
        naming it, one the serving runtime cannot honour, and a value out of range):

        Args:
            model: the catalog name or an alias of the model to use (``llamad models ps``
                lists them; empty: the generation default). It is loaded on demand; an
                unknown name raises :class:`~clients.errors.NotFound` naming the models
                that exist, an embedding model :class:`~clients.errors.InvalidArgument`.
                Each chunk's ``model_name`` says which model served.
            seed: the sampler's seed: the same request and seed give the same text.
            stop: strings that end the generation (not included).
            min_p: drop tokens less likely than ``min_p`` times the likeliest (0..1).
            repeat_penalty: divide the logits of recent tokens (> 0; 1 is off);
                ``repeat_last_n`` says how many tokens back (0: off).
            presence_penalty: OpenAI's: lowers tokens already present once (-2..2).
            frequency_penalty: OpenAI's: lowers them per occurrence (-2..2).
            logit_bias: token id (int) or text (str) to a bias in -100..100 (-100 bans).
            logprobs: return each token's log-probability (``GenerateChunk.logprobs``),
                with ``top_logprobs`` likeliest alternatives each.
            response_format: ``"json_object"`` (any JSON object) or ``"json_schema"``.
            json_schema: a JSON schema (text or mapping) the output must match.
            grammar: a GBNF grammar the output must match (not with response_format).
            dry_multiplier: llama.cpp's DRY repetition penalty (0 is off), with
                ``dry_base`` (>= 1), ``dry_allowed_length`` and ``dry_penalty_last_n``.

        Example:
            >>> with Client() as llamad:                                  # doctest: +SKIP
            ...     for chunk in llamad.generate("Once upon a time", max_tokens=16):
            ...         print(chunk.text, end="")
            ...     result = llamad.generate("2 + 2 =", max_tokens=4).collect()
            ...     print(result.text, result.usage.completion_tokens)
        """
        request = rq.generate(prompt, gen.sampling(**controls), model)
        return TextStream(self._call(self._inference.Generate, request, timeout),
                          cv.generate_chunk)

    def chat(
        self, messages: Iterable[cv.ChatInput], *, model: str = "",
        tools: Iterable[ToolInput] = (), tool_choice: ToolChoice | Mapping[str, Any] | None = None,
        parallel_tool_calls: bool | None = None, timeout: Timeout = DEFAULT,
        **controls: Unpack[GenerationControls],
    ) -> TextStream:
        """Stream a chat completion; the model's chat template formats the messages.

        Takes the generation controls of :meth:`generate`.

        Args:
            messages: :class:`~clients.Message` s, ``(role, content)`` tuples or dicts in
                OpenAI's shape (``role``, ``content``, ``tool_calls``, ``tool_call_id``);
                roles are ``system``, ``user``, ``assistant`` and ``tool``.
            model: the catalog name or an alias of the model (see :meth:`generate`).
            tools: functions the model may call: :class:`~clients.Tool` s or mappings
                (OpenAI's ``{"type": "function", "function": {...}}`` too). The daemon
                refuses them, naming the model, when its chat template cannot render
                tools. The calls stream in each chunk's ``tool_calls``; ``collect()``
                joins them (``GenerateResult.tool_calls``).
            tool_choice: ``auto`` (default), ``none``, ``required``, or a tool's name.
            parallel_tool_calls: whether the model may call several tools at once.

        Raises:
            ValueError: an unknown role, response_format, tool or tool_choice (before
                anything is sent).

        Example:
            >>> answer = Client().chat([("system", "Be terse."),            # doctest: +SKIP
            ...                         ("user", "Name a colour.")]).collect().text
        """
        request = rq.chat(messages, gen.sampling(**controls), model, tools=tools,
                          tool_choice=tool_choice, parallel_tool_calls=parallel_tool_calls)
        return TextStream(self._call(self._inference.Chat, request, timeout),
                          cv.generate_chunk)

    def embed(self, texts: str | Sequence[str], *, normalize: bool | None = None,
              model: str = "", timeout: Timeout = DEFAULT) -> Embeddings:
        """Embed texts with the embedding model, one vector per text, in order.

        Args:
            texts: the texts (a single string is one text).
            normalize: L2-normalise the vectors (the daemon's default is true).
            model: the catalog name or an alias of an embedding model (empty: the
                default); ``Embeddings.model_name`` says which served.

        Example:
            >>> Client().embed(["disk full", "no space left"]).dimension    # doctest: +SKIP
            384
        """
        request = rq.embed(texts, normalize, model)
        return cv.embeddings(self._unary(self._inference.Embed, request, timeout))

    def tokenize(self, text: str, *, role: Role = "generation", add_special: bool = False,
                 model: str = "", timeout: Timeout = DEFAULT) -> Tokens:
        """Tokenize ``text`` with the ``role`` model's own tokenizer, or ``model``'s (a
        catalog name or alias).

        Example:
            >>> Client().tokenize("hello world").count                      # doctest: +SKIP
            2
        """
        request = rq.tokenize(text, role, add_special, model)
        return cv.tokens(self._unary(self._inference.Tokenize, request, timeout))

    def detokenize(self, tokens: Sequence[int], *, role: Role = "generation",
                   model: str = "", timeout: Timeout = DEFAULT) -> str:
        """The text of ``tokens``, ids of the ``role`` model's own tokenizer or ``model``'s
        (:meth:`tokenize` gives them); an id outside its vocabulary is InvalidArgument.

        Example:
            >>> c = Client(); c.detokenize(c.tokenize("hello world").ids)    # doctest: +SKIP
            'hello world'
        """
        request = rq.detokenize(tokens, role, model)
        return cv.text(self._unary(self._inference.Detokenize, request, timeout))

    # --- ControlService -------------------------------------------------------------------

    def status(self, *, timeout: Timeout = DEFAULT) -> DaemonStatus:
        """A snapshot of every child (state, model, breaker, slots, queue) and the daemon.

        Example:
            >>> for child in Client().status().children:                    # doctest: +SKIP
            ...     print(child.role, child.state, child.model_path)
        """
        resp = self._unary(self._control.Status, control_pb2.StatusRequest(), timeout)
        return cv.daemon_status(resp)

    def tail_logs(self, role: Role = "generation", *, lines: int = 0, follow: bool = False,
                  timeout: Timeout = DEFAULT) -> Stream[LogLine]:
        """Stream a child's buffered output lines, oldest first.

        Args:
            lines: how many of the latest lines to send first (0: all buffered).
            follow: keep streaming new lines until the stream is closed, its deadline
                passes, or the daemon stops.

        Example:
            >>> for line in Client().tail_logs("generation", lines=20):     # doctest: +SKIP
            ...     print(line.text)
        """
        request = rq.tail_logs(role, lines, follow)
        return Stream(self._call(self._control.TailLogs, request, timeout), cv.log_line)

    def swap(
        self,
        role: Role = "generation",
        model_path: str | os.PathLike[str] = "",
        *,
        extra_args: str | None = None,
        ctx_size: int | None = None,
        rollback: bool = False,
        stop_old_first: bool = False,
        reason: str = "",
        name: str = "",
        timeout: Timeout = DEFAULT,
    ) -> Stream[SwapProgress]:
        """Replace a child's model and/or arguments, make-before-break, streaming stages.

        The stream yields :class:`~clients.SwapProgress` from ``validating`` to ``done``.
        A failed swap yields the ``failed`` stage (with its cause), then raises
        :class:`~clients.errors.Aborted`; the old child keeps serving. A concurrent swap
        or a model that does not fit beside the running one raises
        :class:`~clients.errors.FailedPrecondition` (unless ``stop_old_first``).
        Closing the stream early abandons the swap.

        Args:
            model_path: absolute path of the new GGUF model; empty keeps the current one.
            extra_args: replace the runtime's extra arguments (space separated):
                performance and model-behaviour options only; the daemon refuses any
                other (an option it sets, takes a file, or reaches the host) with
                INVALID_ARGUMENT naming it.
            ctx_size: replace the context size per slot.
            rollback: return to the model and arguments before the last swap.
            stop_old_first: stop the old child first when both cannot fit in memory.
            reason: why, recorded in Status.
            name: a resident catalog model (name or alias) to swap instead of the role's
                default (``role`` is then the model's own).

        Example:
            >>> for p in Client().swap("generation", "/models/new.gguf"):   # doctest: +SKIP
            ...     print(p.stage, p.message)
        """
        request = rq.swap(role, model_path, extra_args=extra_args, ctx_size=ctx_size,
                          rollback=rollback, stop_old_first=stop_old_first, reason=reason,
                          name=name)
        return Stream(self._call(self._control.Swap, request, timeout), cv.swap_progress)

    def set_mode(
        self,
        role: Role,
        mode: Mode,
        *,
        endpoint_url: str = "",
        endpoint_model: str = "",
        api_key_file: str = "",
        api_key_env: str = "",
        model_path: str | os.PathLike[str] = "",
        reason: str = "",
        timeout: Timeout = DEFAULT,
    ) -> Stream[SwapProgress]:
        """Switch a role between a supervised child (``embedded``), an external
        OpenAI-compatible ``endpoint``, and ``disabled``, make-before-break like
        :meth:`swap`, streaming the stages.

        A failed switch yields the ``failed`` stage (its cause names the reason: refused,
        auth, tls, not_openai, unknown_model, ...), then raises
        :class:`~clients.errors.Aborted`; the old mode keeps serving. A switch racing a
        swap or another switch raises :class:`~clients.errors.FailedPrecondition`.

        Args:
            endpoint_url: for ``endpoint``: base URL (empty: the role's configured one).
            endpoint_model: for ``endpoint``: model id (empty: the only one offered).
            api_key_file: a file on the daemon's machine holding the API key (the key
                itself is never sent over this API): inside the daemon's
                ``[endpoint_keys] dir``, or one its configuration names.
            api_key_env: or the name of an environment variable of the daemon starting
                with ``endpoint_keys.env_prefix`` (default ``LLAMAD_ENDPOINT_KEY_``), or
                one its configuration names.
            model_path: for ``embedded``: an absolute GGUF path (empty: the current one).
            reason: why, logged.

        Example:
            >>> for p in Client().set_mode("generation", "endpoint",        # doctest: +SKIP
            ...                            endpoint_url="http://10.0.0.5:8080/v1"):
            ...     print(p.stage, p.message)
        """
        request = rq.set_mode(role, mode, endpoint_url=endpoint_url,
                              endpoint_model=endpoint_model, api_key_file=api_key_file,
                              api_key_env=api_key_env, model_path=model_path, reason=reason)
        return Stream(self._call(self._control.SetMode, request, timeout), cv.swap_progress)

    def reset(self, role: Role = "generation", *, timeout: Timeout = DEFAULT) -> str:
        """Close a child's circuit breaker and retry its start now; return its state."""
        request = rq.reset(role)
        return cv.child_state(self._unary(self._control.Reset, request, timeout).state)

    def set_draining(self, draining: bool = True, *, reason: str = "",
                     timeout: Timeout = DEFAULT) -> int:
        """Drain the daemon (``draining=True``) or undrain it; return the calls running or
        queued on it now. Admin role. Idempotent.

        While drained, its ``grpc.health.v1`` says NOT_SERVING and its agent-check port
        ``drain``, so load balancers (and clients given several addresses) send it no new
        calls; calls that still reach it are served. Call this on one daemon (one
        address), and again until it returns 0 before stopping it.
        """
        request = control_pb2.SetDrainingRequest(draining=draining, reason=reason)
        return int(self._unary(self._control.SetDraining, request, timeout).in_flight)

    def list_models(self, *, timeout: Timeout = DEFAULT) -> list[ModelInfo]:
        """Every model of the daemon's catalog: its name (what ``model=`` names), role,
        aliases, state (unloaded, loading, ready, draining, failed), memory estimate, last
        use, calls in flight, pin, ttl, breaker and last error."""
        resp = self._unary(self._control.ListModels, control_pb2.ListModelsRequest(),
                           timeout)
        return model_list(resp)

    def load_model(self, name: str, *, timeout: Timeout = DEFAULT) -> ModelInfo:
        """Make the model ``name`` resident; return once it serves. Admin role."""
        request = control_pb2.LoadModelRequest(name=name)
        return model_info(self._unary(self._control.LoadModel, request, timeout).model)

    def unload_model(self, name: str, *, reason: str = "",
                     timeout: Timeout = DEFAULT) -> ModelInfo:
        """Take the model ``name`` out of residency (its running calls finish first).
        Admin role."""
        request = control_pb2.UnloadModelRequest(name=name, reason=reason)
        return model_info(self._unary(self._control.UnloadModel, request, timeout).model)

    # --- health ---------------------------------------------------------------------------

    def health(self, service: str = "", *, timeout: Timeout = DEFAULT) -> str:
        """The gRPC health of ``service``: ``serving``, ``not_serving`` or
        ``service_unknown``. ``""`` is the whole daemon; ``generation`` and ``embedding``
        are the children.

        Example:
            >>> Client().health("generation")                               # doctest: +SKIP
            'serving'
        """
        request = health_pb2.HealthCheckRequest(service=service)
        try:
            resp = self._unary(self._health.Check, request, timeout)
        except NotFound:
            return "service_unknown"
        return status_name(resp)

    def wait_serving(self, service: str = "", *, timeout: float = 120.0) -> None:
        """Block until ``service`` is SERVING, waiting for the daemon to come up too.

        Raises:
            DeadlineExceeded: not serving within ``timeout`` seconds.
        """
        with Stream(self._watch_health(service, timeout), serving) as updates:
            for _ in updates:
                return
        raise watch_ended()
