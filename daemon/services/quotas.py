"""Per-token quotas: calls and tokens per sliding window, refused or only counted (issue 28).

A token of ``auth.token_file`` may carry ``rpm`` (calls that spend model time per window)
and ``tpm`` (their prompt plus generated tokens per window), and a class that names it
in metrics and logs (:mod:`daemon.config.access`). Limits are per token: two tokens of
one class each have their own; the class is only their name (bounded: at most 32 in a
file). The calls counted are those of :data:`QUOTA_METHODS` — Generate, Chat, Embed,
Search (its query embedding), Ask — over gRPC and over HTTP (the OpenAI routes,
Responses, Messages, rerank, the knowledge base's search and ask), which name the same
methods.

The window is a sliding log, not a token bucket. "120 calls per minute" then means what
an operator reads: at most 120 in any 60 s, with no burst allowance beyond it, and the
retry hint is exact: the time until the oldest calls leave the window and leave room for
one more. Tokens are known only when a call ends (a running call is never cut), so the
token window may go past ``tpm``: new calls are refused until enough of it has aged
out. A token bucket would need a burst size nobody asked for and would go negative on
such a call. To bound memory, entries closer than 1/60 of the window are merged; a
merged entry leaves the window with its newest member, so a call may count up to 1 s (of
a 60 s window) longer than exact, never shorter.

Modes (``auth.quota_mode``): ``enforce`` refuses a call past a limit with
:class:`daemon.errors.QuotaExceeded` (RESOURCE_EXHAUSTED with ``google.rpc.RetryInfo``
and ``retry-after-ms``; HTTP 429 with ``Retry-After`` in whole seconds, in the route's
own error shape); ``shadow`` never refuses but counts and logs what it would have
refused (and, as enforcement would, does not count that call against the window);
``off`` does nothing. Every refusal, real or shadow, is counted in
``llamad_quota_exceeded{class, limit, mode}`` and logged as ``quota exceeded`` (a
warning: the log's rate limit, :mod:`daemon.telemetry.lograte`, keeps a flood short),
with the class and the token's fingerprint, never the token.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import math
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Counter

from ..config.access import TokenEntry
from ..errors import QuotaExceeded
from ..models.lanes import Lane
from ..telemetry.metrics import OTHER, Metrics

_log = structlog.get_logger("llamad.quota")

MODES = ("enforce", "shadow", "off")
LIMITS = ("requests", "tokens")
QUOTA_METHODS = frozenset({
    "/llamad.v1.InferenceService/Generate",
    "/llamad.v1.InferenceService/Chat",
    "/llamad.v1.InferenceService/Embed",
    "/llamad.v1.RetrievalService/Search",
    "/llamad.v1.AnswerService/Ask",
})
"""The calls that spend model time, by full gRPC method name (HTTP routes name theirs)."""
_ORDER = list(Lane)  # highest priority first
SLICES = 60
"""Entries per window at most (per token and limit): closer ones are merged."""


class Window:
    """A sliding log of amounts over the last ``seconds`` (module docstring)."""

    def __init__(self, seconds: float, slices: int = SLICES) -> None:
        self.seconds = seconds
        self._merge = seconds / slices
        # [first time, last time, amount], oldest first.
        self._entries: collections.deque[list[float]] = collections.deque()
        self._total = 0.0

    def _expire(self, now: float) -> None:
        while self._entries and self._entries[0][1] + self.seconds <= now:
            self._total -= self._entries.popleft()[2]

    def total(self, now: float) -> int:
        """The amounts added within the last ``seconds``."""
        self._expire(now)
        return round(self._total)

    def add(self, now: float, amount: int) -> None:
        """Add ``amount`` at ``now``."""
        if amount <= 0:
            return
        self._expire(now)
        last = self._entries[-1] if self._entries else None
        if last is not None and now - last[0] < self._merge:
            last[1] = max(last[1], now)
            last[2] += amount
        else:
            self._entries.append([now, now, float(amount)])
        self._total += amount

    def wait(self, now: float, limit: int) -> float:
        """Seconds until the window holds less than ``limit`` (0: it does now)."""
        self._expire(now)
        left = self._total
        if left < limit:
            return 0.0
        for _, last, amount in self._entries:
            left -= amount
            if left < limit:
                return max(0.0, last + self.seconds - now)
        return 0.0  # not reached: the window empties


@dataclass
class _Usage:
    requests: Window
    tokens: Window


@dataclass
class Ticket:
    """An admitted call: :meth:`finish` counts its tokens when it ends."""

    usage: _Usage | None
    clock: Callable[[], float] = field(repr=False)

    def finish(self, fields: dict[str, Any]) -> None:
        """Count the call's prompt and generated tokens (``prompt_tokens`` and ``tokens``
        of its summary line's fields; absent: none)."""
        if self.usage is None:
            return
        spent = 0
        for name in ("prompt_tokens", "tokens"):
            value = fields.get(name)
            if isinstance(value, int) and value > 0:
                spent += value
        self.usage.tokens.add(self.clock(), spent)


_COUNTERS: weakref.WeakKeyDictionary[CollectorRegistry, Counter] = (
    weakref.WeakKeyDictionary())


def _counter(metrics: Metrics) -> Counter:
    """``llamad_quota_exceeded`` in ``metrics``' registry (made once per registry)."""
    counter = _COUNTERS.get(metrics.registry)
    if counter is None:
        counter = _COUNTERS[metrics.registry] = Counter(
            "llamad_quota_exceeded", "Calls past their token's rpm (limit=requests) or tpm "
            "(limit=tokens), by the token's class: refused (mode=enforce) or only counted "
            "(mode=shadow).", ["class", "limit", "mode"], registry=metrics.registry)
    return counter


class Quotas:
    """The windows of every token with limits, and what to do past them.

    Args:
        mode: ``enforce``, ``shadow`` or ``off``.
        window: seconds of the sliding window.
        clock: monotonic seconds (injected by tests).
        metrics: where refusals are counted (None: not counted).
    """

    def __init__(self, mode: str = "enforce", window: float = 60.0, *,
                 clock: Callable[[], float] = time.monotonic,
                 metrics: Metrics | None = None) -> None:
        self._clock = clock
        self._counter = None if metrics is None else _counter(metrics)
        self._usage: dict[bytes, _Usage] = {}
        self._classes: frozenset[str] = frozenset()
        self.mode = "off"
        self.window = window
        self.configure(mode, window)

    def configure(self, mode: str, window: float) -> None:
        """Take ``auth.quota_mode`` and ``auth.quota_window`` (a reload); a new window
        length starts every token's count afresh."""
        if mode not in MODES:
            raise ValueError(f"quota mode must be one of {', '.join(MODES)}")
        if window <= 0:
            raise ValueError("the quota window must be > 0 seconds")
        if window != self.window:
            self._usage.clear()
        self.mode, self.window = mode, window

    def keep(self, entries: Iterable[TokenEntry]) -> None:
        """The tokens configured now (a reload): their windows go on, those of tokens
        no longer configured are dropped; their classes may label the metric."""
        entries = tuple(entries)
        digests = {entry.digest for entry in entries}
        for digest in [d for d in self._usage if d not in digests]:
            del self._usage[digest]
        self._classes = frozenset(entry.klass for entry in entries)
        if self._counter is not None:
            for klass in self._classes:
                for limit in LIMITS:
                    for mode in ("enforce", "shadow"):
                        self._counter.labels(klass, limit, mode)

    def admit(self, entry: TokenEntry, note: Callable[..., None]) -> Ticket | None:
        """Let a call of ``entry``'s token in, or refuse it (mode ``enforce``).

        ``note`` records fields of the call's summary line (its class; a shadow
        refusal). Returns the ticket whose :meth:`Ticket.finish` counts its tokens, or
        None when nothing is counted for it.

        Raises:
            QuotaExceeded: past ``rpm`` or ``tpm`` in mode ``enforce``; carries the
                seconds until the window frees enough for one more call.
        """
        note(token_class=entry.klass)
        if self.mode == "off" or not (entry.rpm or entry.tpm):
            return None
        now = self._clock()
        usage = self._usage.get(entry.digest)
        if usage is None:
            usage = self._usage[entry.digest] = _Usage(Window(self.window),
                                                       Window(self.window))
        past = self._past(entry, usage, now)
        if past is not None:
            limit, used, allowed, wait = past
            self._refused(entry, limit, wait)
            if self.mode == "enforce":
                unit = "calls" if limit == "requests" else "tokens"
                raise QuotaExceeded(
                    f"quota exceeded: this token (class {entry.klass}) used {used} {unit} "
                    f"of its {allowed} per {self.window:g} s (auth.quota_window); "
                    f"retry in {math.ceil(wait)} s", retry_after=wait, limit=limit)
            note(quota_shadow=limit)
            return None  # as enforcement would: the call is not counted in the window
        usage.requests.add(now, 1)
        return Ticket(usage if entry.tpm else None, self._clock)

    @staticmethod
    def _past(entry: TokenEntry, usage: _Usage,
              now: float) -> tuple[str, int, int, float] | None:
        """(limit, used, allowed, seconds until room) of the first limit ``entry`` is at,
        or None."""
        found: tuple[str, int, int, float] | None = None
        for limit, allowed, window in (("requests", entry.rpm, usage.requests),
                                       ("tokens", entry.tpm, usage.tokens)):
            used = window.total(now)
            if allowed and used >= allowed:
                wait = window.wait(now, allowed)
                if found is None or wait > found[3]:  # room needs both: the longer wait
                    found = (limit, used, allowed, wait)
        return found

    def _refused(self, entry: TokenEntry, limit: str, wait: float) -> None:
        klass = entry.klass if entry.klass in self._classes else OTHER
        if self._counter is not None:
            self._counter.labels(klass, limit, self.mode).inc()
        _log.warning("quota exceeded", token_class=klass, token=entry.fingerprint,
                     limit=limit, mode=self.mode, retry_after_s=math.ceil(wait))


_caller: contextvars.ContextVar[tuple[Quotas, TokenEntry, str] | None] = (
    contextvars.ContextVar("llamad_quota_caller", default=None))


def enter(quotas: Quotas | None, entry: TokenEntry | None, method: str, lane: Lane,
          note: Callable[..., None]) -> tuple[Lane, Ticket | None]:
    """Admit a call of ``method`` by ``entry``'s token (None: no token needed) asking for
    ``lane``: the lane it travels in (held to its token's: a batch token's calls wait
    in the batch lane even when they ask for interactive) and its ticket (None: nothing
    to count). Calls of other methods pass as they are.

    Raises:
        QuotaExceeded: as :meth:`Quotas.admit`.
    """
    if quotas is None or entry is None or method not in QUOTA_METHODS:
        return lane, None
    held = Lane(entry.lane)
    if _ORDER.index(held) > _ORDER.index(lane):
        lane = held
    return lane, quotas.admit(entry, note)


@contextlib.contextmanager
def calling(quotas: Quotas, entry: TokenEntry, method: str) -> Iterator[None]:
    """Run a gRPC call of ``method`` (the body) by ``entry``'s token:
    :func:`enter_current` finds them (the handler's frame, :mod:`daemon.grpcapi.rpc`,
    runs inside the body)."""
    token = _caller.set((quotas, entry, method))
    try:
        yield
    finally:
        # A streaming handler's generator may be closed from another context.
        with contextlib.suppress(ValueError):
            _caller.reset(token)


def enter_current(lane: Lane, note: Callable[..., None]) -> tuple[Lane, Ticket | None]:
    """:func:`enter` for the running gRPC call (:func:`calling`; outside one: as is)."""
    current = _caller.get()
    if current is None:
        return lane, None
    quotas, entry, method = current
    return enter(quotas, entry, method, lane, note)
