"""Structured logging: JSON when stdout is not a terminal, readable console otherwise.

structlog's own events are rendered by structlog's native pipeline and written as one
line each (no stdlib LogRecord on the way: a summary line per RPC costs ~9 us instead of
~35); stdlib logging (grpc, httpx, asyncio) is routed through the same processors by a
``ProcessorFormatter``, so every line of the daemon's output has one shape. Both kinds
are written by one handler, under its lock, to one stream, and both pass one rate limit
(:mod:`daemon.telemetry.lograte`: identical lines past ``log.rate_limit`` per ``log.rate_interval``
are counted and summarised, never written one by one).
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from collections.abc import MutableMapping
from typing import Any, TextIO

import orjson
import structlog

from .lograte import Flusher, RateLimiter

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR}


class _Output(logging.StreamHandler):  # type: ignore[type-arg]
    """The daemon's log stream: stdlib records and structlog's rendered lines."""

    def write_line(self, line: str) -> None:
        with self.lock:  # type: ignore[union-attr]  # created by StreamHandler.__init__
            try:
                self.stream.write(line + "\n")
                self.flush()
            except (OSError, ValueError):
                pass  # as logging does: a broken log stream never fails the caller


class _Current:
    """The output :func:`configure` set up last (loggers cached earlier follow it)."""

    output: _Output | None = None
    flusher: Flusher | None = None


class _LineLogger:
    """structlog's final logger: hands the rendered line to the configured output."""

    __slots__ = ("name",)

    def __init__(self, name: str = "") -> None:
        self.name = name

    def msg(self, line: str) -> None:
        output = _Current.output
        if output is not None:
            output.write_line(line)

    debug = info = warning = warn = error = err = critical = fatal = exception = msg


def _logger_name(logger: Any, _: str, event: MutableMapping[str, Any]
                 ) -> MutableMapping[str, Any]:
    event["logger"] = getattr(logger, "name", "")
    return event


def _dumps(obj: Any, **kw: Any) -> str:
    try:
        return orjson.dumps(obj, default=kw.get("default"),
                            option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:  # e.g. an integer past 64 bits
        return json.dumps(obj, **kw)


def configure(fmt: str = "auto", level: str = "info", stream: TextIO | None = None, *,
              rate_limit: int = 0, rate_interval: float = 10.0) -> None:
    """Configure structlog and stdlib logging once for the process.

    Args:
        fmt: auto (JSON unless ``stream`` is a terminal), json or console.
        level: the lowest level written.
        stream: where lines go (default: stderr).
        rate_limit: identical lines written per ``rate_interval`` seconds (0: all).
        rate_interval: the rate limit's window, seconds.
    """
    stream = stream or sys.stderr
    limiter = RateLimiter(rate_limit, rate_interval)
    as_json = fmt == "json" or (fmt == "auto" and not stream.isatty())
    stamp = structlog.processors.TimeStamper(fmt="iso", utc=True)
    renderer: Any = (
        structlog.processors.JSONRenderer(serializer=_dumps) if as_json
        else structlog.dev.ConsoleRenderer(colors=stream.isatty())
    )
    tail: list[Any] = [structlog.processors.format_exc_info, renderer] if as_json else [renderer]
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars,
                    structlog.processors.add_log_level, _logger_name, limiter, stamp,
                    *tail],
        logger_factory=_LineLogger,
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.contextvars.merge_contextvars,
                           structlog.stdlib.add_log_level,
                           structlog.stdlib.add_logger_name, stamp],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *tail],
    )
    handler = _Output(stream)
    handler.setFormatter(formatter)
    handler.addFilter(limiter)
    _Current.output = handler
    if _Current.flusher is not None:
        _Current.flusher.stop()
    _Current.flusher = Flusher(limiter) if rate_limit > 0 else None
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(_LEVELS[level])
    # httpx logs every request to the child at INFO; that is our per-RPC line's job.
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, _LEVELS[level]))


# llama.cpp's log prefix ("0.08.547.880 I slot ...": time, then a level letter) and
# uvicorn's ("INFO:     127.0.0.1:40000 - \"POST /v1/embeddings ...\" 200 OK").
_LLAMA_LEVEL = re.compile(r"^\d+\.\d+\.\d+\.\d+ ([DIWE]) ")
_UVICORN_LEVEL = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL):\s")
_CHILD_LEVELS = {"D": logging.DEBUG, "I": logging.DEBUG, "W": logging.WARNING,
                 "E": logging.ERROR, "DEBUG": logging.DEBUG, "INFO": logging.DEBUG,
                 "WARNING": logging.WARNING, "ERROR": logging.ERROR,
                 "CRITICAL": logging.ERROR}


def child_line_level(line: str) -> int:
    """The level a child's output line is logged at.

    The runtimes' own info lines (several per request: slot selected, task launched,
    released; uvicorn's access line) are routine, so they go to debug; their warnings and
    errors keep their level; a line in no known format (a crash message, a fake child's
    output) is logged at info. TailLogs keeps every line whatever its level.
    """
    match = _LLAMA_LEVEL.match(line) or _UVICORN_LEVEL.match(line)
    return _CHILD_LEVELS[match.group(1)] if match else logging.INFO


class ChildLogForwarder:
    """Forwards a child's output lines to the log, at most ``rate`` lines per second.

    A child flooding its output must not flood the daemon's log (or its CPU): past the
    rate, lines are counted, kept in the ring buffer for TailLogs, and summarised. Lines
    below the log level (see :func:`child_line_level`) cost one regex match and count
    against nothing.
    """

    def __init__(self, role: str, rate: int = 100) -> None:
        self._log = structlog.get_logger("llamad.child").bind(role=role)
        self._stdlib = logging.getLogger("llamad.child")  # its level decides
        self._rate = rate
        self._window = 0.0
        self._count = 0
        self._suppressed = 0
        self._pid = 0

    def __call__(self, pid: int, stream: str, line: str) -> None:
        level = child_line_level(line)
        if not self._stdlib.isEnabledFor(level):
            return
        self._pid = pid
        now = time.monotonic()
        if now - self._window >= 1.0:
            if self._suppressed:
                self._log.warning("child output suppressed", pid=self._pid,
                                  lines=self._suppressed, rate_limit=self._rate)
            self._window, self._count, self._suppressed = now, 0, 0
        self._count += 1
        if self._count > self._rate:
            self._suppressed += 1
            return
        if line:
            self._log.log(level, "child output", pid=pid, stream=stream, line=line)
