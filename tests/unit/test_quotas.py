"""Per-token quotas (issue 28): the sliding window, the limiter's modes on an injected
clock, the token file's class, lane and quota terms, and the lane a token holds its calls
to."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from daemon.config.access import (
    MAX_CLASSES,
    TOKEN_LANES,
    AccessError,
    TokenEntry,
    load_tokens,
)
from daemon.errors import QuotaExceeded, map_error
from daemon.models.lanes import CLIENT_LANES, Lane
from daemon.services.quotas import QUOTA_METHODS, Quotas, Window, enter
from daemon.telemetry.metrics import Metrics

SECRET = "s3cret-token-0123456789abcdef"
OTHER_SECRET = "other-token-0123456789abcdef"
CHAT = "/llamad.v1.InferenceService/Chat"


class Clock:
    """Monotonic seconds that move only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def entry(*, rpm: int = 0, tpm: int = 0, klass: str = "etl", lane: str = "interactive",
          secret: str = SECRET) -> TokenEntry:
    return TokenEntry("read", secret.encode(), "fp-" + secret[:4], 1, klass, lane, rpm, tpm)


def notes() -> tuple[dict[str, object], Callable[..., None]]:
    noted: dict[str, object] = {}

    def note(**fields: object) -> None:
        noted.update(fields)

    return noted, note


def quota_series(metrics: Metrics) -> dict[tuple[str, str, str], float]:
    out = {}
    for family in metrics.registry.collect():
        if family.name == "llamad_quota_exceeded":
            for s in family.samples:
                if s.name.endswith("_total"):
                    out[(s.labels["class"], s.labels["limit"], s.labels["mode"])] = s.value
    return out


# --- the window -------------------------------------------------------------------------


def test_window_slides_and_says_when_it_frees_room() -> None:
    """Amounts leave 60 s after they came; wait() is the time until the total drops
    below the limit: the oldest entries' exit, not a fixed period."""
    w = Window(60.0)
    w.add(0.0, 1)
    w.add(10.0, 1)
    w.add(20.0, 1)
    assert w.total(20.0) == 3
    assert w.wait(20.0, 3) == pytest.approx(40.0)  # the call at 0 leaves at 60
    assert w.wait(20.0, 2) == pytest.approx(50.0)  # two must leave: the one at 10 too
    assert w.wait(20.0, 4) == 0.0
    assert w.total(60.0) == 2
    assert w.total(80.0) == 0


def test_window_merges_close_entries_and_stays_bounded() -> None:
    """Entries within 1/60 of the window merge (memory bounded: 61 entries for 10,000
    adds), and a merged entry leaves with its newest member, never earlier."""
    w = Window(60.0)
    for i in range(10_000):
        w.add(i * 0.006, 1)  # 60 s of calls, 6 ms apart
    assert len(w._entries) <= 61
    assert w.total(59.99) == 10_000
    w2 = Window(60.0)
    w2.add(0.0, 1)
    w2.add(0.9, 1)  # merged with the first
    assert w2.total(60.5) == 2  # the newest member came at 0.9: still counted
    assert w2.total(60.9) == 0


# --- the limiter ------------------------------------------------------------------------


def test_rpm_refuses_the_third_call_with_the_exact_wait_then_recovers() -> None:
    """rpm=2: two calls pass, the third is refused with the seconds until the first
    leaves the window; then one passes again. Another token is never affected."""
    clock = Clock()
    quotas = Quotas("enforce", 60.0, clock=clock)
    limited = entry(rpm=2)
    noted, note = notes()
    assert quotas.admit(limited, note) is not None
    clock.now += 5
    quotas.admit(limited, note)
    clock.now += 5
    with pytest.raises(QuotaExceeded) as info:
        quotas.admit(limited, note)
    assert info.value.limit == "requests"
    assert info.value.retry_after == pytest.approx(50.0)
    assert "used 2 calls of its 2 per 60 s" in str(info.value)
    assert SECRET not in str(info.value)
    other = entry(rpm=2, secret=OTHER_SECRET)
    quotas.admit(other, note)
    quotas.admit(other, note)
    clock.now += 50
    quotas.admit(limited, note)  # the first call left the window
    with pytest.raises(QuotaExceeded):
        quotas.admit(limited, note)
    assert noted["token_class"] == "etl"


def test_tpm_counts_tokens_when_calls_end_and_never_cuts_a_running_call() -> None:
    """tpm=100: tokens count when a call ends (prompt + generated); a call admitted under
    the limit finishes even if it takes the window past it; the next is refused until
    enough tokens leave."""
    clock = Clock()
    quotas = Quotas("enforce", 60.0, clock=clock)
    limited = entry(tpm=100)
    _, note = notes()
    first = quotas.admit(limited, note)
    second = quotas.admit(limited, note)  # both running: nothing counted yet
    assert first is not None and second is not None
    first.finish({"prompt_tokens": 30, "tokens": 40})
    clock.now += 10
    second.finish({"prompt_tokens": 50, "tokens": 60, "model": "x"})  # 180 > 100
    with pytest.raises(QuotaExceeded) as info:
        quotas.admit(limited, note)
    assert info.value.limit == "tokens"
    # 180 - 70 = 110 is still >= 100: both must leave; the second leaves at +70.
    assert info.value.retry_after == pytest.approx(60.0)
    clock.now += 60
    assert quotas.admit(limited, note) is not None


def test_shadow_never_refuses_but_counts_and_logs_without_the_token() -> None:
    """Shadow: the would-be refusal is counted (mode=shadow) and logged as a warning with
    the class and the fingerprint, the call notes quota_shadow, and, as enforcement
    would, the call is not counted in the window; the secret is nowhere."""
    clock = Clock()
    metrics = Metrics()
    quotas = Quotas("shadow", 60.0, clock=clock, metrics=metrics)
    limited = entry(rpm=1)
    quotas.keep([limited])
    noted, note = notes()
    quotas.admit(limited, note)
    with capture_logs() as logs:
        for _ in range(3):
            assert quotas.admit(limited, note) is None
    assert noted["quota_shadow"] == "requests"
    assert quota_series(metrics)[("etl", "requests", "shadow")] == 3
    assert quota_series(metrics)[("etl", "requests", "enforce")] == 0
    line = logs[0]
    assert (line["event"], line["log_level"], line["token_class"]) == (
        "quota exceeded", "warning", "etl")
    assert line["token"] == limited.fingerprint
    assert SECRET not in repr(logs) and SECRET not in metrics.render().decode()
    quotas.configure("enforce", 60.0)
    with pytest.raises(QuotaExceeded):  # only the one admitted call is in the window
        quotas.admit(limited, note)
    clock.now += 60
    quotas.admit(limited, note)


def test_off_and_unlimited_tokens_count_nothing() -> None:
    """Mode off, or a token without rpm and tpm: every call passes, no ticket."""
    clock = Clock()
    quotas = Quotas("off", 60.0, clock=clock)
    _, note = notes()
    for _ in range(10):
        assert quotas.admit(entry(rpm=1), note) is None
    quotas.configure("enforce", 60.0)
    for _ in range(10):
        assert quotas.admit(entry(), note) is None


def test_reload_keeps_the_windows_of_tokens_still_configured() -> None:
    """keep(): a token still in the file keeps its count; a removed one's is dropped; a
    new window length starts every count afresh. Classes outside the file count as
    other (bounded labels)."""
    clock = Clock()
    metrics = Metrics()
    quotas = Quotas("enforce", 60.0, clock=clock, metrics=metrics)
    a, b = entry(rpm=1), entry(rpm=1, secret=OTHER_SECRET, klass="nightly")
    quotas.keep([a])
    _, note = notes()
    quotas.admit(a, note)
    quotas.admit(b, note)
    quotas.keep([a])  # b removed
    with pytest.raises(QuotaExceeded):
        quotas.admit(a, note)
    quotas.admit(b, note)  # a fresh window: b's earlier call was dropped with it
    with pytest.raises(QuotaExceeded):
        quotas.admit(b, note)
    assert quota_series(metrics)[("other", "requests", "enforce")] == 1
    quotas.configure("enforce", 30.0)
    quotas.admit(a, note)


def test_quota_refusal_maps_to_resource_exhausted_with_a_retry_hint() -> None:
    """RESOURCE_EXHAUSTED with google.rpc.RetryInfo and retry-after-ms, as a full lane."""
    mapped = map_error(QuotaExceeded("quota exceeded", retry_after=12.5, limit="requests"))
    assert mapped.code.name == "RESOURCE_EXHAUSTED"
    assert mapped.retry_after == 12.5
    assert ("retry-after-ms", "12500") in mapped.trailing_metadata()


# --- lanes ------------------------------------------------------------------------------


def test_a_batch_token_holds_its_calls_to_the_batch_lane() -> None:
    """A batch token's calls travel in batch even when they ask for interactive; an
    interactive token may ask for batch; calls that spend no model time pass as they
    are, and so does a daemon without tokens."""
    quotas = Quotas("enforce", 60.0, clock=Clock())
    _, note = notes()
    batch = entry(lane="batch")
    assert enter(quotas, batch, CHAT, Lane.INTERACTIVE, note)[0] is Lane.BATCH
    assert enter(quotas, entry(), CHAT, Lane.BATCH, note)[0] is Lane.BATCH
    assert enter(quotas, entry(), CHAT, Lane.INTERACTIVE, note)[0] is Lane.INTERACTIVE
    status = "/llamad.v1.ControlService/Status"
    assert status not in QUOTA_METHODS
    assert enter(quotas, entry(rpm=1), status, Lane.INTERACTIVE, note) == (
        Lane.INTERACTIVE, None)
    assert enter(None, None, CHAT, Lane.INTERACTIVE, note) == (Lane.INTERACTIVE, None)
    assert tuple(lane.value for lane in CLIENT_LANES) == TOKEN_LANES


# --- the token file ---------------------------------------------------------------------


def private(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path


def test_token_lines_take_class_lane_and_quotas(tmp_path: Path) -> None:
    """Terms after the token, in any order; absent ones default (class default,
    interactive, no limits)."""
    table = load_tokens(private(tmp_path / "t", (
        f"read {SECRET} tpm=5000 class=nightly.etl lane=batch rpm=120\n"
        f"admin {OTHER_SECRET}\n")))
    first, second = table.entries
    assert (first.klass, first.lane, first.rpm, first.tpm) == ("nightly.etl", "batch", 120,
                                                               5000)
    assert (second.klass, second.lane, second.rpm, second.tpm) == ("default", "interactive",
                                                                   0, 0)
    found = table.entry_of(SECRET)
    assert found is not None and found.klass == "nightly.etl"
    assert table.entry_of("nope-0123456789abcdef") is None
    assert table.classes() == {"nightly.etl", "default"}


@pytest.mark.parametrize(("terms", "says"), [
    (f"class={SECRET}!", "class must be 1 to 32"),
    ("lane=background", "lane must be interactive or batch"),
    ("rpm=-1", "rpm must be a whole number"),
    ("tpm=1e3", "tpm must be a whole number"),
    ("rpm=" + "9" * 5000, "rpm must be a whole number"),
    ("rpm=1 rpm=2", "rpm given twice"),
    (OTHER_SECRET, "term 1 after the token is not one of"),
    (f"x={OTHER_SECRET}", "term 1 after the token is not one of"),
])
def test_bad_terms_are_refused_naming_the_line_never_a_value(
        tmp_path: Path, terms: str, says: str) -> None:
    """A bad term names its line and what is wrong, and never quotes a value: a token
    written in the wrong place must not reach the log."""
    path = private(tmp_path / "t", f"# ops\nread {SECRET} {terms}\n")
    with pytest.raises(AccessError) as info:
        load_tokens(path)
    message = str(info.value)
    assert "line 2" in message and says in message
    assert SECRET not in message and OTHER_SECRET not in message


def test_the_number_of_classes_is_bounded(tmp_path: Path) -> None:
    """More than MAX_CLASSES class names in a file: refused (they label a metric)."""
    lines = "".join(f"read token-{i:04d}-0123456789abcdef class=c{i}\n"
                    for i in range(MAX_CLASSES + 1))
    with pytest.raises(AccessError, match="at most 32"):
        load_tokens(private(tmp_path / "t", lines))
