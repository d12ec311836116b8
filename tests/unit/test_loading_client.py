"""A start's progress as the Python client and the CLI show it (issue 28): Status's
ChildStatus.loading converted, and ``llamad status`` saying how far a starting child is
(against the fake daemon of clients.testing)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from clients._convert import child_status
from clients._fake import _control
from llamad_protocol.v1 import common_pb2, control_pb2
from tests.support.cli_run import Run


def starting(role: common_pb2.ChildRole.ValueType, *args: Any) -> control_pb2.ChildStatus:
    """A child that starts: loading its model for 2.5 s, its last start took 3 s."""
    return control_pb2.ChildStatus(
        role=role, state=control_pb2.CHILD_STATE_STARTING, enabled=True,
        model_path="/models/fake-model.gguf", runtime="llama-server",
        loading=control_pb2.LoadProgress(phase=control_pb2.LOAD_PHASE_LOADING, seconds=2.5,
                                         expected_seconds=3.0))


def test_the_client_converts_a_starts_progress() -> None:
    """loading becomes a LoadProgress (phase by name); a running child has none."""
    status = child_status(starting(common_pb2.CHILD_ROLE_GENERATION))
    assert status.state == "starting"
    assert status.loading is not None
    assert (status.loading.phase, status.loading.seconds,
            status.loading.expected_seconds) == ("loading", 2.5, 3.0)
    running = child_status(control_pb2.ChildStatus(state=control_pb2.CHILD_STATE_RUNNING))
    assert running.loading is None


def test_status_says_how_far_a_starting_child_is(
        llamad: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    """llamad status prints one line per starting child with its phase and seconds;
    --json carries the same under loading."""
    monkeypatch.setattr(_control, "_child", starting)
    status, out, _ = llamad("status")
    assert status == 0
    assert ("generation: starting, loading, 2.5 s so far (its last start took 3.0 s)"
            in out.splitlines())
    status, out, _ = llamad("status", "--json")
    doc = json.loads(out)
    assert doc["children"][0]["loading"] == {"phase": "loading", "seconds": 2.5,
                                             "expected_seconds": 3.0}
