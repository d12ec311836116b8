"""Lanes: which waiting call a model's admission lets in next.

Every call to a model travels in one of three lanes:

- ``interactive``: a person waits (Chat, Generate, Embed, Search's and Ask's query
  embedding, the HTTP API) — the default;
- ``batch``: a client asked for it (gRPC metadata or HTTP header ``x-llamad-lane: batch``)
  because nobody waits on each answer;
- ``background``: llamad's own work — the retriever's embeddings for ingest, backfill,
  Reprocess and re-embedding after review.

Each lane has its own bounded queue. A free slot goes to the interactive lane first, with
ageing so batch and background always progress: a lower-lane call at the head of its
queue is *promoted* (goes first) once ``promote_after`` interactive calls were admitted
while it waited, or once it waited ``promote_seconds``. Under a steady interactive stream a
lower lane so gets at least one slot per ``promote_after + 1`` admissions. Where a child has
two or more slots, batch and background together may hold at most all but one of them and
are never sent ahead into the child's own queue, so an interactive call finds a free slot
instead of waiting inside the child behind a batch (``reserve_interactive``); their
embedding requests go to the child ``slots - 1`` texts at a time
(:meth:`LanePolicy.texts_per_request`), as llama-server serves each text as a task of its
own on any free slot.

Two context variables carry lanes through a call: the lane its client asked for
(:func:`asking`, set by the transport from the header; :func:`asked`), and the lane the
retriever's embeddings run in (:func:`using`, :func:`current`): Search and Ask put their
retriever search in the asked lane, so the one query embedding they make travels there,
while the same embedder's ingest, backfill and Reprocess batches stay in the background
lane whatever the client asked for.
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
from collections.abc import Iterator
from dataclasses import dataclass

from ..config import Limits
from ..errors import InvalidArgument

LANE_HEADER = "x-llamad-lane"
"""The HTTP header and gRPC metadata key a client names its lane with."""


class Lane(enum.StrEnum):
    """A call's lane, highest priority first."""

    INTERACTIVE = "interactive"
    BATCH = "batch"
    BACKGROUND = "background"


CLIENT_LANES = (Lane.INTERACTIVE, Lane.BATCH)
"""The lanes a client may ask for (background is llamad's own)."""


@dataclass(frozen=True)
class LanePolicy:
    """How a model's admission orders its lanes (``[limits]`` options).

    Attributes:
        enabled: off: every call is interactive (one FIFO, as before lanes).
        batch_queue: calls that may wait in the batch lane.
        background_queue: calls that may wait in the background lane.
        promote_after: interactive admissions a waiting lower-lane call lets pass before
            it goes first.
        promote_seconds: seconds after which a waiting lower-lane call goes first.
        reserve_interactive: keep one of a multi-slot child's slots for interactive calls.
    """

    enabled: bool = True
    batch_queue: int = 64
    background_queue: int = 256
    promote_after: int = 4
    promote_seconds: float = 2.0
    reserve_interactive: bool = True

    def __post_init__(self) -> None:
        if self.batch_queue < 0 or self.background_queue < 0:
            raise ValueError("lane queue sizes must be >= 0")
        if self.promote_after < 1 or self.promote_seconds <= 0:
            raise ValueError("promote_after must be >= 1 and promote_seconds > 0")

    def lane_of(self, lane: Lane) -> Lane:
        """The lane a call asking for ``lane`` travels in (interactive when lanes are off)."""
        return lane if self.enabled else Lane.INTERACTIVE

    def lower_limit(self, slots: int, capacity: int) -> int:
        """Most batch and background calls let through at once to a child with ``slots``
        slots and ``capacity`` calls let through in all (slots plus those sent ahead)."""
        if self.reserve_interactive and slots >= 2:
            return slots - 1
        return capacity

    def texts_per_request(self, lane: Lane, slots: int) -> int:
        """Most texts one embedding request of a ``lane`` call sends to a child with
        ``slots`` slots (0: no limit).

        llama-server makes each text of a request a task of its own, served by any free
        slot in arrival order: a background batch of 32 texts fills every slot and puts an
        interactive query embedding behind the rest of them, whatever slot admission kept
        free. Sent ``slots - 1`` texts at a time, it leaves that slot free in the child too.
        """
        if (self.enabled and self.reserve_interactive and lane is not Lane.INTERACTIVE
                and slots >= 2):
            return slots - 1
        return 0


def policy_from(limits: Limits) -> LanePolicy:
    """The lane options of ``[limits]``."""
    return LanePolicy(enabled=limits.lanes, batch_queue=limits.batch_queue_size,
                      background_queue=limits.background_queue_size,
                      promote_after=limits.lane_promote_after,
                      promote_seconds=limits.lane_promote_seconds,
                      reserve_interactive=limits.interactive_reserved_slot)


def parse_lane(text: str, *, field: str = LANE_HEADER) -> Lane:
    """The lane a client named (case and surrounding blanks ignored; empty: interactive).

    Raises:
        InvalidArgument: not a lane a client may ask for, naming ``field``.
    """
    value = text.strip().lower()
    if not value:
        return Lane.INTERACTIVE
    for lane in CLIENT_LANES:
        if value == lane.value:
            return lane
    raise InvalidArgument(
        f"{field} must be one of {', '.join(lane.value for lane in CLIENT_LANES)}, "
        f"not {text.strip()[:32]!r}", field=field)


_asked: contextvars.ContextVar[Lane] = contextvars.ContextVar(
    "llamad_asked_lane", default=Lane.INTERACTIVE)
_current: contextvars.ContextVar[Lane | None] = contextvars.ContextVar(
    "llamad_lane", default=None)
_share: contextvars.ContextVar[int] = contextvars.ContextVar("llamad_texts_per_request",
                                                             default=0)


def texts_per_request() -> int:
    """Most texts the running call's embedding requests may carry (0: no limit), as its
    admission slot set it (:meth:`LanePolicy.texts_per_request`, :func:`sharing`)."""
    return _share.get()


@contextlib.contextmanager
def sharing(texts: int) -> Iterator[None]:
    """Run the body (a call holding its slot) with at most ``texts`` texts per embedding
    request (0: no limit)."""
    token = _share.set(texts)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):  # closed from another context: see asking
            _share.reset(token)


def asked() -> Lane:
    """The lane the client of the running call asked for (:func:`asking`): interactive
    unless it named batch."""
    return _asked.get()


@contextlib.contextmanager
def asking(lane: Lane) -> Iterator[None]:
    """Run a client's call (the body) in the lane it asked for (a transport sets it)."""
    token = _asked.set(lane)
    try:
        yield
    finally:
        # A streaming handler's generator may be closed from another context (finalized
        # by the loop): there, nothing of ours was set.
        with contextlib.suppress(ValueError):
            _asked.reset(token)


def current(default: Lane) -> Lane:
    """The lane the running task was put in by :func:`using`, else ``default``. Only the
    retriever's embedder reads it: the client's own lane (:func:`asked`) never moves
    llamad's background work (an ingest a client started) out of the background lane."""
    lane = _current.get()
    return default if lane is None else lane


@contextlib.contextmanager
def using(lane: Lane) -> Iterator[None]:
    """Run the body (and the tasks it creates) in ``lane``: the retriever's embeddings
    made in it wait there (a search's query embedding)."""
    token = _current.set(lane)
    try:
        yield
    finally:
        _current.reset(token)
