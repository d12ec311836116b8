"""The log's rate limit (daemon.telemetry.lograte) with an injected clock: identical lines past the
limit are counted and summarised, the first ones always written; and as configured in the
daemon's logging, a flood of identical tracebacks becomes a bounded number of lines."""

from __future__ import annotations

import io
import json
import logging

import structlog

from daemon.telemetry import logs
from daemon.telemetry.lograte import MAX_KEYS, SUMMARY_EVENT, Key, RateLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


KEY: Key = ("asyncio", "error", "socket.accept() out of system resource", "OSError")


def limiter(limit: int = 3, interval: float = 10.0
            ) -> tuple[RateLimiter, Clock, list[tuple[Key, int, float]]]:
    clock = Clock()
    summaries: list[tuple[Key, int, float]] = []
    rl = RateLimiter(limit, interval, clock=clock,
                     summary=lambda k, n, i: summaries.append((k, n, i)))
    return rl, clock, summaries


def test_first_lines_pass_then_counted_and_summarised_when_the_window_ends() -> None:
    """The first `limit` identical lines pass, the rest are counted; the next one after
    the window passes and is preceded by a summary of how many were suppressed."""
    rl, clock, summaries = limiter(limit=3, interval=10)
    passed = [rl.allow(KEY) for _ in range(1000)]
    assert passed[:3] == [True] * 3 and not any(passed[3:])
    assert summaries == []
    clock.now += 9.9
    assert not rl.allow(KEY)  # still the same window
    clock.now += 0.1
    assert rl.allow(KEY)
    assert summaries == [(KEY, 998, 10)]


def test_flush_writes_the_summary_of_a_flood_that_stopped() -> None:
    """A flood that stops still gets its summary, at the flush after its window."""
    rl, clock, summaries = limiter(limit=2, interval=5)
    for _ in range(50):
        rl.allow(KEY)
    assert rl.flush() == 0  # the window has not ended
    clock.now += 5
    assert rl.flush() == 1
    assert summaries == [(KEY, 48, 5)]
    assert rl.flush() == 0 and len(summaries) == 1  # once


def test_different_lines_have_their_own_windows() -> None:
    """A flood of one line does not suppress another line's first occurrence."""
    rl, _, _ = limiter(limit=1)
    other: Key = ("llamad.daemon", "error", "index write failed", "OSError")
    assert rl.allow(KEY) and not rl.allow(KEY)
    assert rl.allow(other)


def test_info_lines_and_call_summaries_are_never_limited() -> None:
    """Routine lines, the calls' own summary lines (one per call) and lines limited on
    their own (a child's output, access denials) always pass."""
    rl, _, summaries = limiter(limit=1)
    for key in [("llamad.daemon", "info", "listening", ""),
                ("llamad.rpc", "warning", "rpc", ""), ("llamad.http", "info", "http", ""),
                ("llamad.child", "error", "child output", ""),
                ("llamad.auth", "warning", "access denied", ""),
                ("llamad.log", "warning", SUMMARY_EVENT, "")]:
        assert all(rl.allow(key) for _ in range(100)), key
    assert summaries == []


def test_zero_limit_lets_everything_through() -> None:
    rl, _, _ = limiter(limit=0)
    assert all(rl.allow(KEY) for _ in range(100))


def test_distinct_lines_are_bounded_in_memory() -> None:
    """Past MAX_KEYS distinct lines at once, new ones pass untracked: memory stays bounded
    and nothing is dropped that was never seen."""
    rl, clock, _ = limiter(limit=1)
    for i in range(MAX_KEYS + 500):
        assert rl.allow(("x", "error", f"line {i}", ""))
    assert len(rl._windows) == MAX_KEYS
    clock.now += 10  # the windows end: room again
    assert rl.allow(("x", "error", "a new line", ""))
    assert len(rl._windows) == 1


def test_a_traceback_flood_in_the_daemons_log_is_bounded(restore_logging: None) -> None:
    """Configured as the daemon does: 5,000 identical stdlib tracebacks (asyncio's accept
    failing) and 5,000 identical structlog errors make at most limit lines each plus their
    summaries, the first of each written in full."""
    out = io.StringIO()
    logs.configure("json", "info", out, rate_limit=5, rate_interval=60)
    try:
        log = logging.getLogger("asyncio")
        slog = structlog.get_logger("llamad.test")
        for fd in range(5000):
            try:
                raise OSError(24, "Too many open files")
            except OSError as exc:
                log.error("socket.accept() out of system resource\nsocket: <fd=%d>", fd,
                          exc_info=exc)
                slog.error("accept failed", fd=fd, exc_info=exc)
        lines = [json.loads(line) for line in out.getvalue().splitlines()]
        assert len(lines) == 10
        assert "Too many open files" in lines[0]["exception"]
        assert lines[0]["event"].startswith("socket.accept() out of system resource")
        assert [r["event"] for r in lines].count("accept failed") == 5
        limiter_ = next(f for f in logging.getLogger().handlers[0].filters
                        if isinstance(f, RateLimiter))
        limiter_.interval = 0.0  # every window has ended
        assert limiter_.flush() == 2
        summaries = [json.loads(line) for line in out.getvalue().splitlines()][10:]
        assert {(s["event"], s["line_event"], s["suppressed"]) for s in summaries} == {
            (SUMMARY_EVENT, "socket.accept() out of system resource", 4995),
            (SUMMARY_EVENT, "accept failed", 4995)}
    finally:
        logs.configure("json", "info", io.StringIO())  # stops its summary thread
