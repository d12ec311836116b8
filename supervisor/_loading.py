"""How far a child's start has come: its phase, read from what it prints (issue 28).

A start goes through four phases, in order (a phase never goes back):

============  ===========================================================================
phase         entered when
============  ===========================================================================
launching     the process is spawned; it has printed nothing we know yet
loading       it reads the model: llama-server's ``load_model: loading model``, llama.cpp's
              ``llama_model_loader:`` and ``load_tensors:`` lines (both runtimes), or its
              ``/health`` answering 503 "loading"
warming_up    the weights are in: llama.cpp builds the context (``llama_context:
              constructing``), warms the model up (``warming up the model``), and
              llama-server sets up its slots (``load_model: initializing``)
probing       the server says it is up (``model loaded``, ``listening on``, Uvicorn's
              ``running on``) or its ``/health`` answers 200: llamad's own readiness
              request (one token, or one embedding) is all that is left
============  ===========================================================================

Why phases and not a percentage: the llama-server llamad runs (llama.cpp 0.5.0-dev,
commit 0c1e570) prints no figure of the weights read — no progress dots at any verbosity
(``-v`` included), and its weights, memory-mapped, are paged in while it warms up, so no
byte count of its output or of its reads (``/proc/PID/io``) says how far it is. At its
default verbosity it prints ``loading model`` (the weights and the warm-up follow, in one
phase as far as its output tells), then ``initializing`` and ``model loaded`` within
milliseconds of being ready. What can honestly be said is the phase, the seconds so far,
and how long this model's last start took (:class:`LoadProgress`).

The watch of a start (:class:`LoadWatch`) is made by the supervisor and found by the
launcher through :data:`WATCH` / :func:`current` (a context variable: the launch runs in
the supervisor's task), so no launcher's signature changes.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from dataclasses import dataclass

PHASES = ("launching", "loading", "warming_up", "probing")
"""A start's phases, in order."""

_WORDS = {"launching": "launching", "loading": "loading the model",
          "warming_up": "warming up", "probing": "answering llamad's readiness request"}

# (phase, what a line holds), checked later phases first: a line that says the server
# is up outranks one that mentions loading.
_MARKERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # Not "HTTP server is listening, hostname: ...": older llama-servers print that
    # before they load the model (and "server is listening on ..." once it is loaded).
    ("probing", ("llama_server: model loaded", "main: model loaded", "server is listening on",
                 "listening on http", "Uvicorn running on")),
    ("warming_up", ("llama_context: constructing", "warming up the model",
                    "load_model: initializing", "llama_new_context_with_model")),
    ("loading", ("load_model: loading model", "llama_model_loader:", "load_tensors:",
                 "llama_model_load")),
)


def phase_of(line: str) -> str | None:
    """The phase a line of a child's output shows it in, or None (most lines)."""
    for phase, markers in _MARKERS:
        if any(marker in line for marker in markers):
            return phase
    return None


@dataclass(frozen=True)
class LoadProgress:
    """How far a start is.

    Attributes:
        phase: one of :data:`PHASES`.
        seconds: since the start began.
        expected_seconds: how long this model's last successful start took (0: unknown,
            none yet).
    """

    phase: str
    seconds: float
    expected_seconds: float = 0.0

    @property
    def step(self) -> int:
        """1-based position of the phase among :data:`PHASES`."""
        return PHASES.index(self.phase) + 1

    def describe(self) -> str:
        """One line for a message: ``loading the model (phase 2 of 4), 3.1 s so far of
        about 5.0 s``."""
        text = (f"{_WORDS[self.phase]} (phase {self.step} of {len(PHASES)}), "
                f"{self.seconds:.1f} s so far")
        if self.expected_seconds > 0:
            text += f" of about {self.expected_seconds:.1f} s (its last start)"
        return text

    def retry_after(self) -> float:
        """Seconds after which a call may find the child ready: what is left of its last
        start's duration (1 s before any start finished; at least 0.1 s), and no more
        than 0.5 s once it warms up or 0.25 s once it is up (what is left then is short
        whatever the model's size)."""
        left = max(0.1, (self.expected_seconds or 1.0) - self.seconds)
        cap = {"probing": 0.25, "warming_up": 0.5}.get(self.phase)
        return left if cap is None else min(left, cap)


class LoadWatch:
    """The phase of one start, fed by the launcher: the child's lines and its stages."""

    def __init__(self, now: Callable[[], float]) -> None:
        self._now = now
        self.began = now()
        self.phase = PHASES[0]

    def _reach(self, phase: str) -> None:
        if PHASES.index(phase) > PHASES.index(self.phase):
            self.phase = phase

    def line(self, text: str) -> None:
        """A line the child printed."""
        phase = phase_of(text)
        if phase is not None:
            self._reach(phase)

    def stage(self, stage: str) -> None:
        """A stage of the launch: ``loading`` (its /health says so), ``probing``."""
        if stage in PHASES:
            self._reach(stage)

    def progress(self, expected_seconds: float = 0.0) -> LoadProgress:
        """Where the start is now."""
        return LoadProgress(self.phase, max(0.0, self._now() - self.began), expected_seconds)


WATCH: contextvars.ContextVar[LoadWatch | None] = contextvars.ContextVar(
    "llamad_load_watch", default=None)
"""The watch of the start under way in this task (None: nobody watches): set by the
supervisor around its launch, fed by :class:`supervisor._child.ProcessChild`."""


def current() -> LoadWatch | None:
    """The watch of the start under way in this task (:data:`WATCH`)."""
    return WATCH.get()
