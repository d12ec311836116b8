"""Metrics: values after calls, one-hot child state, bounded label values and histogram
buckets (the loopback HTTP endpoint serving them: test_metrics_http.py)."""

from __future__ import annotations

import math

import grpc
import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from daemon.telemetry.metrics import CHILD_STATES, CODES, EXIT_KINDS, METHODS, Metrics

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples(metrics: Metrics) -> Samples:
    """Every sample of ``render()``, parsed back, keyed by (name, labels)."""
    out: Samples = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return samples(metrics).get((name, frozenset(labels.items())))


def series(metrics: Metrics, name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: v for (n, labels), v in samples(metrics).items() if n == name}


# -- values ------------------------------------------------------------------------------


def test_counters_count_calls() -> None:
    """Each counting method adds to its own series, and only to it."""
    m = Metrics()
    m.child_exit("generation", "oom")
    m.child_exit("generation", "oom")
    m.child_exit("embedding", "crash")
    m.child_restart("generation")
    m.breaker_opened("embedding")
    m.tokens("generation", 5)
    m.tokens("generation", 2)
    m.rejected("generation", "queue_full")
    m.request("Generate", "OK", 0.2)
    m.request("Generate", "OK", 0.3)
    m.request("Embed", "UNAVAILABLE", 0.001)
    m.request("Generate", "OK", 0.1, protocol="http")
    m.swap("generation", "ok", 4.0)

    assert value(m, "llamad_child_exits_total", role="generation", model="other", kind="oom") == 2
    assert value(m, "llamad_child_exits_total", role="embedding", model="other", kind="crash") == 1
    assert value(m, "llamad_child_exits_total", role="embedding", model="other", kind="oom") == 0
    assert value(m, "llamad_child_restarts_total", role="generation", model="other") == 1
    assert value(m, "llamad_child_restarts_total", role="embedding", model="other") == 0
    assert value(m, "llamad_breaker_opens_total", role="embedding", model="other") == 1
    assert value(m, "llamad_tokens_generated_total", role="generation", model="other") == 7
    rejections = "llamad_rejections_total"
    assert value(m, rejections, role="generation", model="other", reason="queue_full") == 1
    assert value(m, rejections, role="generation", model="other", reason="deadline") == 0
    grpc_ = {"protocol": "grpc"}
    assert value(m, "llamad_requests_total", **grpc_, method="Generate", code="OK") == 2
    assert value(m, "llamad_requests_total", **grpc_, method="Embed", code="UNAVAILABLE") == 1
    assert value(m, "llamad_request_duration_seconds_count", **grpc_, method="Generate") == 2
    assert value(m, "llamad_request_duration_seconds_sum", **grpc_,
                 method="Generate") == pytest.approx(0.5)
    # The same series, told apart by the API the call came in on.
    assert value(m, "llamad_requests_total", protocol="http", method="Generate", code="OK") == 1
    assert value(m, "llamad_request_duration_seconds_count", protocol="http",
                 method="Generate") == 1
    assert value(m, "llamad_swaps_total", role="generation", outcome="ok") == 1
    assert value(m, "llamad_swap_duration_seconds_sum", role="generation") == 4.0


def test_role_series_start_at_zero() -> None:
    """A fresh registry already exports the per-role counters and gauges at 0."""
    m = Metrics()
    for role in ("generation", "embedding"):
        assert value(m, "llamad_child_restarts_total", role=role, model="other") == 0
        assert value(m, "llamad_queue_depth", role=role, model="other") == 0
        for kind in EXIT_KINDS:
            assert value(m, "llamad_child_exits_total", role=role, model="other", kind=kind) == 0


def test_gauges_are_set_not_added() -> None:
    """queue_depth and in_flight report the last value given."""
    m = Metrics()
    m.queue_depth("generation", 3)
    m.queue_depth("generation", 1)
    m.in_flight("generation", 4)
    m.in_flight("embedding", 2)
    assert value(m, "llamad_queue_depth", role="generation", model="other") == 1
    assert value(m, "llamad_requests_in_flight", role="generation", model="other") == 4
    assert value(m, "llamad_requests_in_flight", role="embedding", model="other") == 2


def test_odd_numbers_are_clamped_not_raised() -> None:
    """Negative counts and durations are clamped to 0 instead of raising in a listener."""
    m = Metrics()
    m.tokens("generation", -3)
    m.queue_depth("generation", -1)
    m.request("Status", "OK", -0.5)
    assert value(m, "llamad_tokens_generated_total", role="generation", model="other") == 0
    assert value(m, "llamad_queue_depth", role="generation", model="other") == 0
    assert value(m, "llamad_request_duration_seconds_sum", protocol="grpc", method="Status") == 0
    assert value(m, "llamad_request_duration_seconds_bucket", protocol="grpc", method="Status",
                 le="0.005") == 1


def test_build_info() -> None:
    """llamad_build_info carries the version and the value 1."""
    assert value(Metrics(version="1.2.3"), "llamad_build_info", version="1.2.3") == 1
    default = series(Metrics(), "llamad_build_info")
    assert len(default) == 1
    assert next(iter(default.values())) == 1


# -- child state -------------------------------------------------------------------------


def test_child_state_is_one_hot() -> None:
    """Exactly the current state is 1 for a role; the other five are 0; roles are separate."""
    m = Metrics()
    m.child_state("generation", "starting")
    m.child_state("embedding", "starting")
    m.child_state("generation", "running")
    gen = {dict(k)["state"]: v for k, v in series(m, "llamad_child_state").items()
           if dict(k)["role"] == "generation"}
    emb = {dict(k)["state"]: v for k, v in series(m, "llamad_child_state").items()
           if dict(k)["role"] == "embedding"}
    assert gen == {s: float(s == "running") for s in CHILD_STATES}
    assert emb == {s: float(s == "starting") for s in CHILD_STATES}


def test_unknown_child_state_is_other_and_one_hot() -> None:
    """An unknown state shows as state="other" = 1, and goes back to 0 on a known state."""
    m = Metrics()
    m.child_state("generation", "running")
    m.child_state("generation", "exploded")
    assert value(m, "llamad_child_state", role="generation", model="other", state="other") == 1
    assert value(m, "llamad_child_state", role="generation", model="other", state="running") == 0
    m.child_state("generation", "backoff")
    assert value(m, "llamad_child_state", role="generation", model="other", state="other") == 0
    assert value(m, "llamad_child_state", role="generation", model="other", state="backoff") == 1


# -- cardinality -------------------------------------------------------------------------


def test_unknown_label_values_fold_to_other() -> None:
    """kind, code, method, reason, outcome and role outside their sets become "other"."""
    m = Metrics()
    m.child_exit("generation", "/tmp/model.gguf exploded")
    m.request("Frobnicate", "I_AM_A_TEAPOT", 0.1)
    m.rejected("generation", "because")
    m.swap("generation", "maybe", 1.0)
    m.child_restart("reranker-17")
    m.tokens("pid-4242", 3)
    assert value(m, "llamad_child_exits_total", role="generation", model="other", kind="other") == 1
    assert value(m, "llamad_requests_total", protocol="grpc", method="other", code="other") == 1
    assert value(m, "llamad_request_duration_seconds_count", protocol="grpc", method="other") == 1
    assert value(m, "llamad_rejections_total", role="generation", model="other",
                 reason="other") == 1
    assert value(m, "llamad_swaps_total", role="generation", outcome="other") == 1
    assert value(m, "llamad_child_restarts_total", role="other", model="other") == 1
    assert value(m, "llamad_tokens_generated_total", role="other", model="other") == 3
    text = m.render().decode()
    for leaked in ("exploded", "Frobnicate", "TEAPOT", "because", "maybe", "reranker", "4242"):
        assert leaked not in text


def test_many_distinct_bad_values_add_one_series() -> None:
    """A thousand distinct unknown values make a single "other" series, not a thousand."""
    m = Metrics()
    before = len(series(m, "llamad_child_exits_total"))
    for i in range(1000):
        m.child_exit("generation", f"weird-{i}")
    after = series(m, "llamad_child_exits_total")
    assert len(after) == before + 1
    assert after[frozenset({("role", "generation"), ("model", "other"), ("kind", "other")})] == 1000


def test_methods_can_be_extended() -> None:
    """A method outside METHODS folds to "other" unless it is passed in ``methods``."""
    assert {"Generate", "Chat", "Embed", "Tokenize", "Status", "TailLogs", "Swap",
            "Reset"} <= set(METHODS)
    default = Metrics()
    default.request("Rerank", "OK", 1.0)
    assert value(default, "llamad_requests_total", protocol="grpc", method="other", code="OK") == 1
    extended = Metrics(methods=(*METHODS, "Rerank"))
    extended.request("Rerank", "OK", 1.0)
    assert value(extended, "llamad_requests_total", protocol="grpc", method="Rerank",
                 code="OK") == 1


def test_codes_are_the_grpc_status_code_names() -> None:
    """CODES lists exactly grpc.StatusCode's names, so every real code keeps its label."""
    assert set(CODES) == {code.name for code in grpc.StatusCode}


def test_names_follow_prometheus_conventions() -> None:
    """Every family is llamad_-prefixed, has HELP text, counters end in _total, and no
    _created series is exported."""
    m = Metrics()
    m.request("Generate", "OK", 0.1)
    families = list(text_string_to_metric_families(m.render().decode()))
    assert families
    for family in families:
        assert family.name.startswith("llamad_")
        assert family.documentation
        assert not family.name.endswith("_created")
        if family.type == "counter":
            assert all(s.name.endswith("_total") for s in family.samples)
        if family.type == "histogram":
            assert family.name.endswith("_seconds")


def test_registries_are_separate_from_each_other_and_the_global_one() -> None:
    """Two Metrics in one process do not share values, and nothing lands in REGISTRY."""
    a, b = Metrics(), Metrics()
    a.child_restart("generation")
    assert value(a, "llamad_child_restarts_total", role="generation", model="other") == 1
    assert value(b, "llamad_child_restarts_total", role="generation", model="other") == 0
    assert b"llamad_" not in prometheus_client.generate_latest(prometheus_client.REGISTRY)


# -- histograms --------------------------------------------------------------------------


def bucket(m: Metrics, name: str, le: str, **labels: str) -> float | None:
    return value(m, f"{name}_bucket", le=le, **labels)


def test_time_to_first_token_buckets() -> None:
    """7 ms falls in le=0.01 (not 0.005), 20 s in le=30, 45 s only in +Inf."""
    m = Metrics()
    name = "llamad_time_to_first_token_seconds"
    for seconds in (0.007, 20.0, 45.0):
        m.time_to_first_token("generation", seconds)
    assert bucket(m, name, "0.005", role="generation", model="other") == 0
    assert bucket(m, name, "0.01", role="generation", model="other") == 1
    assert bucket(m, name, "10.0", role="generation", model="other") == 1
    assert bucket(m, name, "30.0", role="generation", model="other") == 2
    assert bucket(m, name, "+Inf", role="generation", model="other") == 3
    assert value(m, f"{name}_count", role="generation", model="other") == 3


def test_inter_token_buckets() -> None:
    """The inter-token buckets run from 1 ms to 2 s, and a value on a bound is in it."""
    m = Metrics()
    name = "llamad_inter_token_latency_seconds"
    for seconds in (0.001, 0.0015, 2.5):
        m.inter_token("generation", seconds)
    bounds = sorted(
        float(dict(k)["le"]) for k in series(m, f"{name}_bucket") if dict(k)["role"] == "generation"
    )
    assert bounds[0] == 0.001
    assert bounds[-2] == 2.0
    assert math.isinf(bounds[-1])
    assert bucket(m, name, "0.001", role="generation", model="other") == 1
    assert bucket(m, name, "0.0025", role="generation", model="other") == 2
    assert bucket(m, name, "2.0", role="generation", model="other") == 2
    assert bucket(m, name, "+Inf", role="generation", model="other") == 3


def test_request_and_swap_buckets() -> None:
    """A 3 s call lands in le=5.0 of its method; a 90 s swap in le=120.0 of its role."""
    m = Metrics()
    m.request("Chat", "OK", 3.0)
    m.swap("embedding", "failed", 90.0)
    assert bucket(m, "llamad_request_duration_seconds", "2.5", protocol="grpc", method="Chat") == 0
    assert bucket(m, "llamad_request_duration_seconds", "5.0", protocol="grpc", method="Chat") == 1
    assert bucket(m, "llamad_swap_duration_seconds", "60.0", role="embedding") == 0
    assert bucket(m, "llamad_swap_duration_seconds", "120.0", role="embedding") == 1
    assert value(m, "llamad_swaps_total", role="embedding", outcome="failed") == 1
