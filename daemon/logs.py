"""Structured logging: JSON when stdout is not a terminal, readable console otherwise.

stdlib logging (grpc, httpx, asyncio) is routed through the same structlog pipeline, so
every line of the daemon's output has one shape.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from typing import Any, TextIO

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR}


def configure(fmt: str = "auto", level: str = "info", stream: TextIO | None = None) -> None:
    """Configure structlog and stdlib logging once for the process."""
    stream = stream or sys.stderr
    as_json = fmt == "json" or (fmt == "auto" and not stream.isatty())
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: Any = (
        structlog.processors.JSONRenderer() if as_json
        else structlog.dev.ConsoleRenderer(colors=stream.isatty())
    )
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info if as_json else _identity,
            renderer,
        ],
    )
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(_LEVELS[level])
    # httpx logs every request to the child at INFO; that is our per-RPC line's job.
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, _LEVELS[level]))


def _identity(_: Any, __: str, event: Any) -> Any:
    return event


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
