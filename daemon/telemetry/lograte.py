"""The log's rate limit: repeated identical lines are counted, not written (issue 25).

A flood (a listener failing every accept at the descriptor limit, a client repeating a
bad call thousands of times a second) must not turn into thousands of tracebacks a second
in the journal: it buries what matters and costs CPU. Lines are *identical* when their
logger, level, event (a stdlib record's first message line) and exception type are: the
fields that differ between them (a peer, an fd) do not make them different. Only warnings
and errors are limited: info and debug lines are routine, the calls' own summary lines
(event ``rpc`` and ``http``, one per call, warnings for failed calls) are the call log,
and a child's output and access denials have limits of their own (:data:`CALL_LINES`).

:class:`RateLimiter` lets the first ``limit`` identical lines of each ``interval`` through,
so a first occurrence is never lost; the rest are counted, and when the window of that
line ends (at its next occurrence, or at the latest when :meth:`RateLimiter.flush` runs,
which :func:`daemon.telemetry.logs.configure` schedules every interval) one summary line says how
many were suppressed. It is both a structlog processor (for structlog's events) and a
:class:`logging.Filter` (for stdlib records: asyncio's, grpc's, aiohttp's).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

import structlog

SUMMARY_EVENT = "log lines suppressed"
SUMMARY_LOGGER = "llamad.log"
MAX_KEYS = 4096
"""Distinct lines tracked at once; past it, windows that ended are dropped first, then a
new line is let through untracked (an attacker varying the line must not grow memory)."""

UNLIMITED_LEVELS = frozenset({"debug", "info", "notset"})
CALL_LINES = frozenset({("llamad.rpc", "rpc"), ("llamad.http", "http"),
                        ("llamad.child", "child output"), ("llamad.auth", "access denied")})
"""(logger, event) of lines never limited here: the calls' summary lines (one per call),
and the lines that have a limit of their own (a child's output:
:class:`daemon.telemetry.logs.ChildLogForwarder`; access denials: ``daemon.grpcapi.auth``), whose
summaries count what they drop."""

Key = tuple[str, str, str, str]
"""(logger, level, event, exception type)."""
Summary = Callable[[Key, int, float], None]
"""Called with a line's key, how many of it were suppressed, and the window's length."""


@dataclass
class _Window:
    start: float
    count: int = 0
    suppressed: int = 0


def _exc_name(exc_info: Any) -> str:
    if isinstance(exc_info, BaseException):
        return type(exc_info).__name__
    if isinstance(exc_info, tuple) and exc_info and exc_info[0] is not None:
        return str(getattr(exc_info[0], "__name__", ""))
    return ""


def _write_summary(key: Key, suppressed: int, interval: float) -> None:
    logger, level, event, exc = key
    structlog.get_logger(SUMMARY_LOGGER).warning(
        SUMMARY_EVENT, suppressed=suppressed, interval_s=interval, line_logger=logger,
        line_level=level, line_event=event, **({"exception": exc} if exc else {}))


class RateLimiter(logging.Filter):
    """At most ``limit`` identical lines per ``interval`` seconds, then a count.

    Args:
        limit: lines of one key written per window (0: no limit).
        interval: the window's length, seconds.
        clock: monotonic seconds (tests inject one).
        summary: writes a summary line (default: a warning on ``llamad.log``).

    Thread-safe: grpc's threads and the event loop log at once.
    """

    def __init__(self, limit: int, interval: float, *,
                 clock: Callable[[], float] = time.monotonic,
                 summary: Summary = _write_summary) -> None:
        super().__init__()
        self.limit = limit
        self.interval = interval
        self._clock = clock
        self._summary = summary
        self._windows: dict[Key, _Window] = {}
        self._lock = threading.Lock()

    def allow(self, key: Key) -> bool:
        """Whether a line of ``key`` is written now (False: it was counted)."""
        if (self.limit <= 0 or key[1] in UNLIMITED_LEVELS or (key[0], key[2]) in CALL_LINES
                or (key[0], key[2]) == (SUMMARY_LOGGER, SUMMARY_EVENT)):
            return True
        now = self._clock()
        ended: list[tuple[Key, int]] = []
        with self._lock:
            window = self._windows.get(key)
            if window is not None and now - window.start >= self.interval:
                if window.suppressed:
                    ended.append((key, window.suppressed))
                del self._windows[key]
                window = None
            if window is None:
                if len(self._windows) >= MAX_KEYS:
                    ended += self._expire(now)
                if len(self._windows) < MAX_KEYS:  # else let through, untracked
                    self._windows[key] = _Window(now, 1)
                allowed = True
            elif window.count < self.limit:
                window.count += 1
                allowed = True
            else:
                window.suppressed += 1
                allowed = False
        for k, suppressed in ended:  # before the line they precede, outside the lock
            self._summary(k, suppressed, self.interval)
        return allowed

    def _expire(self, now: float) -> list[tuple[Key, int]]:
        """Drop the windows that ended; return those that suppressed lines (lock held)."""
        done = [(k, w) for k, w in self._windows.items() if now - w.start >= self.interval]
        for k, _ in done:
            del self._windows[k]
        return [(k, w.suppressed) for k, w in done if w.suppressed]

    def flush(self) -> int:
        """Write the summaries of the windows that ended; return how many were written."""
        with self._lock:
            ended = self._expire(self._clock())
        for key, suppressed in ended:
            self._summary(key, suppressed, self.interval)
        return len(ended)

    # -- structlog: a processor, after the level and the logger's name are added ----------

    def __call__(self, logger: Any, method: str, event: MutableMapping[str, Any]
                 ) -> MutableMapping[str, Any]:
        key = (str(event.get("logger", "")), str(event.get("level", method)),
               str(event.get("event", ""))[:200], _exc_name(event.get("exc_info")))
        if not self.allow(key):
            raise structlog.DropEvent
        return event

    # -- stdlib: a filter on the daemon's handler ------------------------------------------

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, MutableMapping):  # structlog's, already let through
            return True
        first = str(record.msg).partition("\n")[0][:200]
        key = (record.name, record.levelname.lower(), first, _exc_name(record.exc_info))
        return self.allow(key)


class Flusher:
    """Calls :meth:`RateLimiter.flush` every interval from a daemon thread, so a flood's
    summary is written even when the flood stops (and with it the lines that would have
    ended its window)."""

    def __init__(self, limiter: RateLimiter) -> None:
        self._limiter = limiter
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="log-rate-flush", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._limiter.interval):
            try:
                self._limiter.flush()
            except Exception:  # a broken log stream never stops the flusher  # noqa: S112
                continue

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1)
