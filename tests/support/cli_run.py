"""Running the ``llamad`` command in-process, as the client verbs' unit tests do."""

from __future__ import annotations

import io
from collections.abc import Callable

import pytest

from daemon.cli import main

Run = Callable[..., tuple[int, str, str]]
"""``run(*args, stdin="")``: the exit status, stdout and stderr of ``llamad ARGS``."""


def runner(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Run:
    """A :data:`Run` of ``daemon.cli.main`` reading ``stdin`` (a text) as its stdin."""
    def run(*args: str, stdin: str = "") -> tuple[int, str, str]:
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
        status = main(list(args))
        out, err = capsys.readouterr()
        return status, out, err

    return run
