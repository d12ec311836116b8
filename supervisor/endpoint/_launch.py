"""An external endpoint as something the supervisor can "launch": readiness and liveness.

The supervisor drives children through a :class:`~supervisor._child.Launcher`; an
endpoint plugs into the same state machine, backoff, breaker and make-before-break swap
through :class:`EndpointLauncher`, whose :meth:`~EndpointLauncher.launch` runs the same
readiness gate as a child's start — the endpoint answers ``GET /v1/models``, offers the
configured model (or exactly one), and serves a tiny real request (a one-token chat, or
one embedding) — and returns an :class:`EndpointLink`, the "live child": no process
(pid 0), a client, a liveness watch (``GET /v1/models`` every probe interval) and a
stop that closes the connections.

Failures carry the named reason of :class:`~supervisor.errors.EndpointError` as the
:class:`~supervisor.ExitCause` kind, so Status says "auth" or "refused", not "crash".
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from .._child import StageSink, StartFailure, Timeouts
from .._client import InferenceClient
from .._clock import Clock
from .._exits import ExitCause
from .._liveness import ProbeFailure, watch_liveness
from .._sampling import Sampling
from ..errors import ChildRequestError, EndpointError
from ._client import EndpointClient, display_url, read_api_key

_log = structlog.get_logger("llamad.endpoint")


@dataclass(frozen=True)
class EndpointSpec:
    """Where an external endpoint is and how to authenticate (names only, never the key).

    Attributes:
        url: root URL, with or without ``/v1``.
        model: the model id to use; empty means the one model the endpoint offers.
        api_key_file: a file holding the key (must not be world-readable).
        api_key_env: the name of an environment variable holding the key.
    """

    url: str
    model: str = ""
    api_key_file: str = ""
    api_key_env: str = ""
    environ: Mapping[str, str] | None = field(default=None, compare=False, repr=False)
    """Where ``api_key_env`` is looked up (default: the process environment)."""

    @property
    def display_url(self) -> str:
        """The URL without credentials."""
        return display_url(self.url)

    def __repr__(self) -> str:
        return (f"EndpointSpec(url={self.display_url!r}, model={self.model!r}, "
                f"api_key_file={self.api_key_file!r}, api_key_env={self.api_key_env!r})")


def pick_model(models: Sequence[Mapping[str, Any]], wanted: str,
               where: str) -> Mapping[str, Any]:
    """The ``/v1/models`` entry to use: ``wanted`` (by id, alias, or file name when the id
    is a path, as llama-server reports it), or the only one when none is wanted.

    Raises:
        EndpointError: kind ``unknown_model``.
    """
    ids = [str(m.get("id", "")) for m in models]
    listed = ", ".join(ids[:8]) + (", …" if len(ids) > 8 else "")
    if not models:
        raise EndpointError("unknown_model", f"{where} offers no models", permanent=True)
    if wanted:
        for m in models:
            aliases = m.get("aliases")
            if m.get("id") == wanted or (isinstance(aliases, list) and wanted in aliases):
                return m
        by_name = [m for m in models if str(m.get("id", "")).rsplit("/", 1)[-1] == wanted]
        if len(by_name) == 1:
            return by_name[0]
        raise EndpointError("unknown_model",
                            f"{where} does not offer the model {wanted!r}; it offers: {listed}",
                            permanent=True)
    if len(models) == 1:
        return models[0]
    raise EndpointError("unknown_model",
                        f"{where} offers {len(models)} models ({listed}); choose one "
                        "(endpoint_model)", permanent=True)


def unusable(exc: ChildRequestError, *, embedding: bool, where: str, model: str) -> EndpointError:
    """Name the failure of the readiness request (a tiny chat, or one embedding)."""
    if isinstance(exc, EndpointError):
        return exc
    status, text = exc.status, str(exc).lower()
    if embedding:
        says = "embedding" in text and any(w in text for w in ("support", "enable", "not"))
        if status in (404, 405, 501) or (status in (400, 422, 500) and says):
            return EndpointError("no_embeddings", f"{where} has no embeddings API for {model} "
                                 f"({exc})", permanent=True, status=status)
    else:
        says = any(w in text for w in ("chat", "template", "does not support",
                                       "not supported", "logits"))
        if status in (404, 405, 501) or (status in (400, 422, 500) and says):
            return EndpointError("not_chat", f"{where}: the model {model} does not serve chat "
                                 f"completions ({exc})", permanent=True, status=status)
    permanent = status is not None and 400 <= status < 500
    return EndpointError("endpoint_error", f"{where}: the readiness request failed ({exc})",
                         permanent=permanent, status=status)


def _cause(exc: EndpointError, at: float) -> ExitCause:
    return ExitCause(exc.kind, exc.permanent, str(exc), at=at)


class EndpointLink:
    """A ready endpoint, as the supervisor sees a live child (no process: pid 0)."""

    def __init__(self, client: EndpointClient, clock: Clock, timeouts: Timeouts) -> None:
        self.client: InferenceClient = client
        self.endpoint = client
        self.pid = 0
        self.socket = ""
        self._clock = clock
        self._timeouts = timeouts

    async def watch(self) -> ExitCause:
        """Probe ``GET /v1/models`` every probe interval; return the cause once
        ``probe_failures`` probes in a row failed (or the model is no longer offered)."""
        client = self.endpoint

        async def probe() -> ProbeFailure | None:
            try:
                models = await client.discover(timeout=self._timeouts.probe_timeout)
                pick_model(models, client.model_id, f"endpoint {client.display_url}")
            except EndpointError as exc:
                return ProbeFailure(exc.kind, exc.permanent, str(exc))
            return None

        return await watch_liveness(probe, activity=client.activity, clock=self._clock,
                                    policy=self._timeouts.probes)

    async def stop(self) -> None:
        """Close the connections (calls still running on them fail). Idempotent."""
        await self.endpoint.aclose()


class EndpointLauncher:
    """"Launches" an external endpoint: runs the readiness gate, returns a link.

    Args:
        spec: where the endpoint is, which model, which key.
        embedding: the role is embedding (readiness embeds one text) rather than
            generation (readiness asks for one chat token).
        timeouts: ``start`` bounds the readiness gate; probes use the probe settings.
        read_timeout: the longest silence of the endpoint during a request.
        max_connections: HTTP connections kept to the endpoint.
    """

    def __init__(self, spec: EndpointSpec, *, embedding: bool, clock: Clock,
                 timeouts: Timeouts | None = None, read_timeout: float = 300.0,
                 max_connections: int = 64) -> None:
        self.spec = spec
        self.embedding = embedding
        self.timeouts = timeouts or Timeouts()
        self._clock = clock
        self._read_timeout = read_timeout
        self._max_connections = max_connections

    async def launch(self, on_stage: StageSink | None = None) -> EndpointLink:
        """Check the endpoint is usable; return the link, or raise :class:`StartFailure`
        with the named cause. Cancellation closes the half-made client."""
        spec = self.spec
        where = f"endpoint {spec.display_url}"
        try:
            key = read_api_key(spec.api_key_file, spec.api_key_env,
                               os.environ if spec.environ is None else spec.environ)
            client = EndpointClient(spec.url, api_key=key, read_timeout=self._read_timeout,
                                    max_connections=self._max_connections,
                                    now=self._clock.monotonic)
        except EndpointError as exc:
            raise StartFailure(_cause(exc, self._clock.wall())) from None
        except ValueError as exc:
            raise StartFailure(ExitCause("not_openai", True, str(exc),
                                         at=self._clock.wall())) from None
        _log.info("connecting to endpoint", endpoint=spec.display_url, model=spec.model or None,
                  role="embedding" if self.embedding else "generation", key=key is not None)
        try:
            if on_stage is not None:
                on_stage("probing")
            async with asyncio.timeout(self.timeouts.start):
                models = await client.discover(timeout=min(10.0, self.timeouts.start))
                entry = pick_model(models, spec.model, where)
                client.use_model(str(entry["id"]), entry)
                await self._prove_usable(client, where)
        except TimeoutError:
            await client.aclose()
            raise StartFailure(ExitCause(
                "timeout", False, f"{where} did not pass readiness within "
                f"{self.timeouts.start:g}s", at=self._clock.wall())) from None
        except EndpointError as exc:
            await client.aclose()
            raise StartFailure(_cause(exc, self._clock.wall())) from None
        except BaseException:
            await client.aclose()
            raise
        _log.info("endpoint ready", endpoint=spec.display_url, model=client.model_id,
                  context=client.context_length or None)
        return EndpointLink(client, self._clock, self.timeouts)

    async def _prove_usable(self, client: EndpointClient, where: str) -> None:
        try:
            if self.embedding:
                result = await client.embed(["ready"])
                if result.matrix.size == 0:
                    raise EndpointError("no_embeddings", f"{where} answered an empty embedding",
                                        permanent=True)
            else:
                await client.complete_chat([("user", "Hello")],
                                           Sampling(max_tokens=1, temperature=0.0))
        except ChildRequestError as exc:
            raise unusable(exc, embedding=self.embedding, where=where,
                           model=client.model_id) from exc
