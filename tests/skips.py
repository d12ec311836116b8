"""Skips that may not hide an invariant (a pytest plugin, loaded by ``tests/conftest.py``).

A test that skips because the machine lacks something (a tool, a capability, the prepared
models) proves nothing there. On a developer's machine that is reported (``-ra``) and
accepted; on CI (``CI`` set in the environment, as ``.ci/run`` is run) the session fails
on any skip whose reason is not in :data:`ALLOWED_ON_CI`, so a missing tool cannot
silently turn a test of an invariant into a pass. The machine must provide the tool (the
Makefile installs the Debian packages the tests need, see its ``test-tools`` target), or
the reason must be added here with why skipping it on CI is acceptable.
"""

from __future__ import annotations

import os

import pytest

# The reason a test gives to pytest.skip or skipif, exactly -> why CI may skip it.
ALLOWED_ON_CI: dict[str, str] = {
    "root reads files regardless of mode":
        "CI runs as root, and root reads a file whatever its mode: there is no refusal to "
        "observe. The unreadable-file path itself is tested with missing files and dangling "
        "links (test_extract_files.py::test_missing_and_dangling_paths_are_unreadable).",
}

_OFF = {"", "0", "false", "no"}


def on_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in _OFF


def skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    """The reason given to pytest.skip, without pytest's ``Skipped: `` prefix."""
    longrepr = report.longrepr
    message = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return message.removeprefix("Skipped: ")


class SkipGate:
    """Collects the session's skips; on CI, fails the session on unlisted ones."""

    def __init__(self) -> None:
        self.unlisted: list[tuple[str, str]] = []

    def _record(self, report: pytest.TestReport | pytest.CollectReport) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):
            reason = skip_reason(report)
            if reason not in ALLOWED_ON_CI:
                self.unlisted.append((report.nodeid, reason))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._record(report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self._record(report)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        passed = (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED)
        if self.unlisted and on_ci() and session.exitstatus in passed:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not (self.unlisted and on_ci()):
            return
        terminalreporter.section("skips not allowed on CI", sep="=", red=True, bold=True)
        for nodeid, reason in self.unlisted:
            terminalreporter.line(f"{nodeid}: {reason}", red=True)
        terminalreporter.line(
            f"CI fails on {len(self.unlisted)} skip(s) not in tests/skips.py ALLOWED_ON_CI: "
            "provide what they need on this machine, or allow the reason there with why.")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(SkipGate(), "llamad-skip-gate")
