"""Child output in the daemon's log: the runtimes' routine per-request lines go to debug,
their warnings and errors keep their level, anything unrecognised is info."""

from __future__ import annotations

import io
import json
import logging

import pytest
import structlog

from daemon.telemetry import logs
from daemon.telemetry.logs import ChildLogForwarder, child_line_level


@pytest.mark.parametrize(("line", "level"), [
    ("0.08.547.880 I slot launch_slot_: id  0 | task 1250 | processing task", logging.DEBUG),
    ("0.00.012.001 D ggml_backend: something", logging.DEBUG),
    ("0.01.000.000 W srv  load_model: the context is larger than trained", logging.WARNING),
    ("0.01.000.000 E llama_model_load: error loading model: invalid magic", logging.ERROR),
    ('INFO:     127.0.0.1:40000 - "POST /v1/embeddings HTTP/1.1" 200 OK', logging.DEBUG),
    ("WARNING:  Invalid HTTP request received.", logging.WARNING),
    ("ERROR:    Exception in ASGI application", logging.ERROR),
    ("Segmentation fault (core dumped)", logging.INFO),
    ("gguf_init_from_file_impl: invalid magic characters 'XXXX'", logging.INFO),
    ("fake child: crash-at-start", logging.INFO),
    ("", logging.INFO),
])
def test_child_line_levels(line: str, level: int) -> None:
    assert child_line_level(line) == level


@pytest.fixture(autouse=True)
def _restored(restore_logging: None) -> None:
    """Every test here configures the daemon's logging: put it back afterwards."""


@pytest.fixture
def captured() -> io.StringIO:
    out = io.StringIO()
    logs.configure("json", "info", stream=out)
    return out


def test_routine_lines_stay_out_of_an_info_log(captured: io.StringIO) -> None:
    sink = ChildLogForwarder("embedding")
    sink(7, "stderr", "0.08.547.880 I slot launch_slot_: id  0 | task 1 | processing task")
    sink(7, "stderr", "0.08.547.990 E srv  send_error: input is too large")
    sink(7, "stdout", "something the runtime printed its own way")
    records = [json.loads(line) for line in captured.getvalue().splitlines()]
    assert [(r["level"], r["line"]) for r in records if r["event"] == "child output"] == [
        ("error", "0.08.547.990 E srv  send_error: input is too large"),
        ("info", "something the runtime printed its own way"),
    ]


def test_a_debug_log_shows_routine_lines() -> None:
    out = io.StringIO()
    logs.configure("json", "debug", stream=out)
    ChildLogForwarder("generation")(7, "stderr", "0.08.547.880 I slot release: id 0 | task 1")
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["level"] for r in records if r["event"] == "child output"] == ["debug"]


def test_structlog_and_stdlib_lines_share_one_json_stream() -> None:
    """structlog's own events (rendered natively) and stdlib records (grpc, asyncio...)
    come out as one stream of JSON lines of the same shape, filtered at the same level."""
    out = io.StringIO()
    logs.configure("json", "info", stream=out)
    structlog.get_logger("llamad.test").info("native", n=1, ratio=0.5, path=logs)
    structlog.get_logger("llamad.test").debug("hidden")
    logging.getLogger("grpc._server").warning("foreign %s", "arg")
    logging.getLogger("grpc._server").info("foreign info")
    logging.getLogger("grpc._server").debug("foreign hidden")
    try:
        raise ValueError("boom")
    except ValueError:
        structlog.get_logger("llamad.test").exception("failed")
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(r["event"], r["level"], r["logger"]) for r in records] == [
        ("native", "info", "llamad.test"),
        ("foreign arg", "warning", "grpc._server"),
        ("foreign info", "info", "grpc._server"),
        ("failed", "error", "llamad.test"),
    ]
    assert records[0]["n"] == 1 and records[0]["ratio"] == 0.5
    assert "daemon.telemetry.logs" in records[0]["path"]  # not JSON-able: written as its repr
    assert all(r["timestamp"].endswith("Z") for r in records)
    assert "ValueError: boom" in records[3]["exception"]
