"""The test tiers (tests/tiers.py), on inner pytest sessions run in this process: each test
gets one tier and its timeout, and a unit test that starts a process fails."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
from hypothesis import HealthCheck, settings

from tests import tiers
from tests.support import load
from tests.tiers import TIMEOUTS, tier

SPAWNS = "import subprocess\n@pytest.mark.unit\ndef test_it():\n    {body}\n"


def run(pytester: pytest.Pytester, source: str) -> pytest.RunResult:
    pytester.makepyfile(test_inner="import pytest\n" + source)
    return pytester.runpytest("-p", "tests.tiers", "-p", "no:asyncio",
                              "-p", "no:hypothesispytest")


@pytest.mark.parametrize("body", [
    "subprocess.run(['true'], check=True)",
    "try:\n        subprocess.run(['true'], check=True)\n    except Exception:\n        pass",
], ids=["raises", "swallowed"])
def test_a_unit_test_that_starts_a_process_fails(pytester: pytest.Pytester, body: str) -> None:
    """The refusal names the command and the fix, even when the code swallows it."""
    result = run(pytester, SPAWNS.format(body=body))
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*a unit test started a process*['true']*"
                                 "mark*@pytest.mark.process*"])


def test_each_tier_has_its_timeout_unless_the_test_sets_one(pytester: pytest.Pytester) -> None:
    """Outside tests/unit the default tier is process; a test's own timeout wins."""
    result = run(pytester, f"""
def timeout(request):
    return request.node.get_closest_marker("timeout").args[0]

def test_default(request):
    assert request.node.get_closest_marker("process")
    assert timeout(request) == {TIMEOUTS["process"]}

@pytest.mark.unit
def test_unit(request):
    assert timeout(request) == {TIMEOUTS["unit"]}

@pytest.mark.integration
def test_integration(request):
    assert not request.node.get_closest_marker("process")
    assert timeout(request) == {TIMEOUTS["integration"]}

@pytest.mark.timeout(45)
@pytest.mark.unit
def test_own(request):
    assert timeout(request) == 45
""")
    result.assert_outcomes(passed=4)


def test_two_tiers_are_refused(pytester: pytest.Pytester) -> None:
    """A test marked with two tiers stops the session at collection."""
    result = run(pytester, "@pytest.mark.unit\n@pytest.mark.process\ndef test_it():\n    pass\n")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*test_it is marked process and unit: one tier*"])


def _item(path: Path, *markers: str) -> pytest.Item:
    """What tier() reads of an item: its path, node id and markers."""
    marks = {name: getattr(pytest.mark, name) for name in markers}
    return cast(pytest.Item, SimpleNamespace(
        path=path, nodeid=f"{path.name}::test_it", get_closest_marker=marks.get))


def test_a_unit_test_outside_tests_unit_is_refused() -> None:
    """`make check` collects tests/unit alone and `make test` runs every tier but unit, so a
    test marked unit elsewhere in tests/ stops the session; a file outside tests/ (an inner
    session's) may be unit, and a test in tests/unit is unit unmarked."""
    tests = Path(tiers.__file__).resolve().parent
    with pytest.raises(pytest.UsageError, match="test_it is marked unit outside tests/unit"):
        tier(_item(tests / "integration" / "test_x.py", "unit"))
    assert tier(_item(tests / "integration" / "test_x.py")) == "process"
    assert tier(_item(tests.parent.parent / "elsewhere" / "test_x.py", "unit")) == "unit"
    assert tier(_item(tests / "unit" / "test_x.py")) == "unit"
    assert tier(_item(tests / "unit" / "test_x.py", "process")) == "process"


def test_every_wait_is_stretched_by_the_load_factor() -> None:
    """The tiers' timeouts are a quiet machine's seconds times LOAD: 10 by default, read
    from $LLAMAD_TEST_LOAD, never below 1 (a busy machine is not a hang)."""
    assert TIMEOUTS == {"unit": 20 * load.LOAD, "process": 60 * load.LOAD,
                        "integration": 300 * load.LOAD}
    assert load.patience(2.0) == 2.0 * load.LOAD
    for value, expected in (("", 10.0), ("3", 3.0), ("1", 1.0)):
        assert loaded(value) == expected
    for bad in ("0.5", "nan", "-1"):
        with pytest.raises(ValueError, match="LLAMAD_TEST_LOAD"):
            loaded(bad)


def loaded(value: str) -> float:
    """tests/support/load.py's LOAD as $LLAMAD_TEST_LOAD=value makes it (a fresh module
    object, the imported one left alone)."""
    spec = importlib.util.spec_from_file_location("load_copy", load.__file__)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LLAMAD_TEST_LOAD", value)
        spec.loader.exec_module(module)
    return float(module.LOAD)


def test_no_property_test_is_timed() -> None:
    """Hypothesis's wall-clock checks are off for every test (tests/conftest.py's profile):
    no deadline, no "too slow" or "data too large" health check; a test's own @settings
    inherit that."""
    default = settings.default
    assert default is not None and default.deadline is None
    assert {HealthCheck.too_slow, HealthCheck.data_too_large} <= set(
        default.suppress_health_check)
    own = settings(max_examples=5)
    assert own.deadline is None and HealthCheck.too_slow in own.suppress_health_check
