"""What load balancers see of this node: the administrative drain (ControlService
SetDraining) and the HAProxy agent-check port (``agent_listen``).

Drain. A node is *drained* by an admin (``llamad drain``) or *draining* for shutdown
(SIGTERM). Either way ``grpc.health.v1`` reports NOT_SERVING for every service and the
agent port answers ``drain``, so HAProxy, Kubernetes, Envoy and gRPC's client-side
round_robin stop sending it new calls. An admin drain refuses nothing: a call that still
arrives (a client that has not noticed yet, a direct connection) is served, the way a
Kubernetes pod that failed readiness still serves its open connections; ``llamad
undrain`` ends it. Shutdown is the sequence of docs/scale-out.md: drain reported, then
(after ``drain_notice`` seconds) new calls refused with GOAWAY and UNAVAILABLE, running
calls given ``drain_grace`` seconds, then exit.

Agent check. HAProxy's ``agent-check`` connects to ``agent_listen`` every
``agent-inter`` and reads one line, terminated by ``\\n`` (HAProxy's configuration manual,
"agent-check"). This port reads nothing, writes that line and closes:

=====================  =============================================================
reply                  when
=====================  =============================================================
``up ready N%``        some model serves (a role's or one loaded on demand); N is the
                       share of its slots that are free
                       (1 to 100: never 0, which HAProxy takes as a drain). ``ready``
                       undoes an earlier ``drain``: only the agent can.
``drain``              drained by SetDraining, or draining for shutdown
``down#<reason>``      no model can serve (each is disabled, starting, backing off or
                       failed); the reason names each one's state
=====================  =============================================================

Failing to reach the agent is not a failure to HAProxy (its regular ``check`` tests the
gRPC port): a daemon that is gone is caught by that check, not here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from typing import Protocol

import structlog

from supervisor import State

from ..config.inference_mode import InferenceMode

_log = structlog.get_logger("llamad.balancing")


class _Admission(Protocol):
    @property
    def limit(self) -> int: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def queued(self) -> int: ...


class _Mode(Protocol):
    @property
    def kind(self) -> InferenceMode: ...


class _Supervisor(Protocol):
    @property
    def state(self) -> State: ...


class Served(Protocol):
    """What this module reads of a model (a :class:`daemon.models.model.Model`: a role's, or one
    the pool loaded on demand)."""

    @property
    def mode(self) -> _Mode: ...
    @property
    def supervisor(self) -> _Supervisor: ...
    @property
    def admission(self) -> _Admission: ...


def in_flight(children: Mapping[str, Served]) -> int:
    """Calls running or waiting for a slot, every model of ``children``."""
    return sum(c.admission.in_flight + c.admission.queued for c in children.values())


def _state(child: Served) -> str:
    if child.mode.kind is InferenceMode.DISABLED:
        return "disabled"
    return child.supervisor.state.value


def agent_reply(children: Mapping[str, Served], *, draining: bool) -> str:
    """The agent-check line (with its ``\\n``) for the node's state now: see the table in
    the module docstring."""
    if draining:
        return "drain\n"
    serving = {role: c for role, c in children.items()
               if c.mode.kind is not InferenceMode.DISABLED
               and c.supervisor.state is State.RUNNING}
    if not serving:
        why = ", ".join(f"{role} {_state(c)}" for role, c in children.items())
        return f"down#no model can serve: {why}\n"
    slots = sum(c.admission.limit for c in serving.values())
    busy = sum(c.admission.in_flight for c in serving.values())
    free = max(0, slots - busy)
    weight = max(1, min(100, round(100 * free / slots))) if slots else 100
    return f"up ready {weight}%\n"


class Drainer:
    """The administrative drain: set by ControlService SetDraining, read by health and
    the agent port. Not persisted: a daemon starts undrained."""

    def __init__(self, models: Callable[[], Mapping[str, Served]],
                 on_change: Callable[[bool], object]) -> None:
        """Args:
            models: every model now, the roles' and those loaded on demand
                (:meth:`daemon.models.pool.Pool.every_model`), for :meth:`in_flight`.
            on_change: told the new state whenever it changes (health re-evaluates).
        """
        self._models = models
        self._on_change = on_change
        self.drained = False

    def set(self, draining: bool, reason: str = "") -> None:
        """Drain (True) or undrain (False); idempotent. Logged with ``reason``."""
        if draining == self.drained:
            return
        self.drained = draining
        _log.info("drained" if draining else "undrained", reason=reason or None,
                  in_flight=self.in_flight())
        self._on_change(draining)

    def in_flight(self) -> int:
        """Calls running or waiting for a slot on this node."""
        return in_flight(self._models())


class AgentServer:
    """The agent-check listener: one line per connection, at most ``max_connections`` at
    once (more are closed unanswered), each closed after ``timeout`` seconds at most."""

    def __init__(self, reply: Callable[[], str], *, max_connections: int,
                 timeout: float) -> None:
        self._reply = reply
        self._max = max_connections
        self._timeout = timeout
        self._open = 0
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self, listen: str) -> int:
        """Listen on ``host:port``; return the bound port.

        Raises:
            OSError: the address cannot be bound (one line naming it).
        """
        host, _, port = listen.rpartition(":")
        try:
            self._server = await asyncio.start_server(
                self._answer, host.strip("[]") or None, int(port), reuse_address=True)
        except OSError as exc:
            raise OSError(f"cannot answer agent checks on {listen}: "
                          f"{exc.strerror or exc}") from None
        self.port = self._server.sockets[0].getsockname()[1]
        _log.info("agent check listening", address=listen, port=self.port)
        return self.port

    async def _answer(self, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        if self._open >= self._max:  # over the cap: no reply, which HAProxy ignores
            writer.transport.abort()
            return
        self._open += 1
        try:
            writer.write(self._reply().encode("ascii"))
            await asyncio.wait_for(writer.drain(), self._timeout)
            writer.close()
            await asyncio.wait_for(writer.wait_closed(), self._timeout)
        except (OSError, TimeoutError):
            writer.transport.abort()
        finally:
            self._open -= 1

    async def close(self) -> None:
        """Stop listening (connections being answered finish within their timeout)."""
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), self._timeout)
            self._server = None
