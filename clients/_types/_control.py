"""What the control calls return: the children's status, their logs, swaps and exits."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Literal, TypeAlias

if TYPE_CHECKING:
    from .._models import ModelInfo

Role: TypeAlias = Literal["generation", "embedding"]
"""A supervised child: the generation or the embedding model."""

Mode: TypeAlias = Literal["embedded", "endpoint", "disabled"]
"""Where a role's inference runs: a supervised llama.cpp child, an external
OpenAI-compatible endpoint, or nowhere."""


@dataclass(frozen=True, slots=True)
class ExitCause:
    """Why a child process ended (``kind`` is e.g. ``crash``, ``oom``, ``model_error``)."""

    kind: str
    message: str = ""
    exit_code: int | None = None
    signal: str = ""
    permanent: bool = False
    at: datetime | None = None


@dataclass(frozen=True, slots=True)
class LoadProgress:
    """How far a child's start is: ``phase`` is ``launching``, ``loading``,
    ``warming_up`` or ``probing`` (read from what the child prints: llama.cpp prints no
    percentage), ``seconds`` since it began, ``expected_seconds`` how long the model's
    last start took (0: none yet)."""

    phase: str
    seconds: float
    expected_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class SwapInfo:
    """The last model swap of a child."""

    from_model: str
    to_model: str
    at: datetime | None
    reason: str
    duration_seconds: float


@dataclass(frozen=True, slots=True)
class ChildStatus:
    """A snapshot of one role's child (or endpoint).

    ``state`` is one of ``idle``, ``starting``, ``running``, ``backoff``, ``failed``,
    ``stopped``; ``breaker`` is ``closed`` or ``open``; ``mode`` is ``embedded``,
    ``endpoint`` or ``disabled`` (in endpoint mode no process is described: pid, socket and
    the model fields are empty, ``runtime`` is ``endpoint``). ``socket`` is the child's
    private UNIX socket (``port`` is always 0: no child listens on TCP). ``last_error`` is the
    role's latest failure in words (empty once it serves again after a switch).
    ``chat_template`` (generation children) says which chat template Chat and Ask are
    formatted with and why: the model's own, a known one, or ``none: ...`` (refused).
    ``in_flight`` counts calls sent to the child: up to ``slots`` running plus
    ``queue_ahead`` waiting in the child's own queue; ``queued`` wait in llamad.
    ``loading`` says how far a start is while ``state`` is ``starting`` (else None).
    """

    role: str
    state: str
    enabled: bool
    pid: int
    model_path: str
    model_sha256: str
    runtime: str
    port: int
    uptime_seconds: float
    restarts: int
    breaker: str
    consecutive_failures: int
    last_exit: ExitCause | None
    model_architecture: str
    model_context_length: int
    previous_model_path: str
    last_swap: SwapInfo | None
    in_flight: int
    queued: int
    slots: int
    mode: str = "embedded"
    endpoint_url: str = ""
    endpoint_model: str = ""
    last_error: str = ""
    queue_ahead: int = 0
    chat_template: str = ""
    socket: str = ""
    loading: LoadProgress | None = None


@dataclass(frozen=True, slots=True)
class DaemonStatus:
    """Every child's status, the daemon's version and uptime, and whether it drains (for
    shutdown) or is drained (by :meth:`~clients.Client.set_draining`)."""

    children: tuple[ChildStatus, ...]
    version: str
    uptime_seconds: float
    draining: bool
    drained: bool = False
    models: tuple[ModelInfo, ...] = ()  # every catalog model, as ListModels lists them

    def child(self, role: str) -> ChildStatus | None:
        """The child with this role (``"generation"`` or ``"embedding"``), or None."""
        return next((c for c in self.children if c.role == role), None)


@dataclass(frozen=True, slots=True)
class LogLine:
    """One output line of a child, from the daemon's ring buffer."""

    role: str
    pid: int
    stream: str
    text: str
    time: datetime | None
    seq: int


@dataclass(frozen=True, slots=True)
class SwapProgress:
    """One stage of a swap: ``validating``, ``launching``, ``loading``, ``probing``,
    ``swapping``, ``draining``, ``done`` or ``failed`` (then ``cause`` says why)."""

    stage: str
    message: str
    elapsed_seconds: float
    cause: ExitCause | None = None
