"""The skip gate of CI (tests/skips.py), on inner pytest sessions run in this process: on
CI a skip whose reason is not allowed fails the session, however the test skipped; an
allowed reason, an xfail, or any skip off CI does not."""

from __future__ import annotations

import pytest

from tests.skips import ALLOWED_ON_CI

UNLISTED = "needs a tool this machine lacks"
LISTED = next(iter(ALLOWED_ON_CI))

# The ways a test skips, each with {reason} to fill in.
STYLES = {
    "call": "import pytest\ndef test_it():\n    pytest.skip({reason!r})\n",
    "skipif": "import pytest\n@pytest.mark.skipif(True, reason={reason!r})\ndef test_it():\n"
              "    pass\n",
    "fixture": "import pytest\n@pytest.fixture\ndef tool():\n    pytest.skip({reason!r})\n"
               "def test_it(tool):\n    pass\n",
    "module": "import pytest\npytest.skip({reason!r}, allow_module_level=True)\n"
              "def test_it():\n    pass\n",
}


def run(pytester: pytest.Pytester, source: str) -> pytest.RunResult:
    """An inner session with the gate, on ``source`` beside a passing test (without the
    plugins it does not need: hypothesis's re-imports its internals each time, ~1 s)."""
    pytester.makepyfile(test_inner=source, test_fine="def test_fine():\n    pass\n")
    return pytester.runpytest("-p", "tests.skips", "-p", "no:asyncio",
                              "-p", "no:hypothesispytest")


@pytest.fixture
def on_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    """The inner sessions run under CI=true."""
    monkeypatch.setenv("CI", "true")


@pytest.mark.usefixtures("on_ci")
@pytest.mark.parametrize("style", STYLES)
def test_an_unlisted_skip_fails_the_session_on_ci(pytester: pytest.Pytester, style: str) -> None:
    """Under CI=true the session fails, naming the test and its reason."""
    result = run(pytester, STYLES[style].format(reason=UNLISTED))
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        "*skips not allowed on CI*",
        f"test_inner.py*: {UNLISTED}",
        "CI fails on 1 skip(s) not in tests/skips.py ALLOWED_ON_CI*",
    ])


@pytest.mark.usefixtures("on_ci")
@pytest.mark.parametrize("style", STYLES)
def test_a_listed_skip_passes_on_ci(pytester: pytest.Pytester, style: str) -> None:
    """A reason on the allow-list is accepted on CI."""
    result = run(pytester, STYLES[style].format(reason=LISTED))
    assert result.ret == pytest.ExitCode.OK
    assert "skips not allowed on CI" not in result.stdout.str()


@pytest.mark.parametrize("ci", [None, "", "false", "0"])
def test_off_ci_an_unlisted_skip_is_only_reported(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: str | None) -> None:
    """Without CI (unset, empty, false, 0) a skip is a skip: the session passes."""
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    result = run(pytester, STYLES["call"].format(reason=UNLISTED))
    assert result.ret == pytest.ExitCode.OK
    result.assert_outcomes(passed=1, skipped=1)


@pytest.mark.usefixtures("on_ci")
def test_an_xfail_is_not_a_skip(pytester: pytest.Pytester) -> None:
    """An expected failure is reported as xfailed and does not trip the gate."""
    result = run(pytester, "import pytest\n@pytest.mark.xfail(reason='known', strict=True)\n"
                           "def test_it():\n    assert False\n")
    assert result.ret == pytest.ExitCode.OK
    result.assert_outcomes(passed=1, xfailed=1)


@pytest.mark.usefixtures("on_ci")
def test_a_failing_session_keeps_its_own_status(pytester: pytest.Pytester) -> None:
    """A session that already failed stays failed, the unlisted skip listed as well."""
    result = run(pytester, STYLES["call"].format(reason=UNLISTED)
                 + "def test_broken():\n    assert False\n")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=1, failed=1, skipped=1)
    result.stdout.fnmatch_lines(["*skips not allowed on CI*"])
