"""Metrics: values after calls, one-hot child state, bounded label values, histogram
buckets, and the loopback HTTP endpoint served for real on port 0."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import math
from collections.abc import AsyncIterator

import grpc
import httpx
import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from daemon.ops.metrics_http import (
    CONTENT_TYPE,
    MAX_HEAD_BYTES,
    MAX_HEADERS,
    MetricsServer,
    serve_metrics,
)
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

    assert value(m, "llamad_child_exits_total", role="generation", kind="oom") == 2
    assert value(m, "llamad_child_exits_total", role="embedding", kind="crash") == 1
    assert value(m, "llamad_child_exits_total", role="embedding", kind="oom") == 0
    assert value(m, "llamad_child_restarts_total", role="generation") == 1
    assert value(m, "llamad_child_restarts_total", role="embedding") == 0
    assert value(m, "llamad_breaker_opens_total", role="embedding") == 1
    assert value(m, "llamad_tokens_generated_total", role="generation") == 7
    assert value(m, "llamad_rejections_total", role="generation", reason="queue_full") == 1
    assert value(m, "llamad_rejections_total", role="generation", reason="deadline") == 0
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
        assert value(m, "llamad_child_restarts_total", role=role) == 0
        assert value(m, "llamad_queue_depth", role=role) == 0
        for kind in EXIT_KINDS:
            assert value(m, "llamad_child_exits_total", role=role, kind=kind) == 0


def test_gauges_are_set_not_added() -> None:
    """queue_depth and in_flight report the last value given."""
    m = Metrics()
    m.queue_depth("generation", 3)
    m.queue_depth("generation", 1)
    m.in_flight("generation", 4)
    m.in_flight("embedding", 2)
    assert value(m, "llamad_queue_depth", role="generation") == 1
    assert value(m, "llamad_requests_in_flight", role="generation") == 4
    assert value(m, "llamad_requests_in_flight", role="embedding") == 2


def test_odd_numbers_are_clamped_not_raised() -> None:
    """Negative counts and durations are clamped to 0 instead of raising in a listener."""
    m = Metrics()
    m.tokens("generation", -3)
    m.queue_depth("generation", -1)
    m.request("Status", "OK", -0.5)
    assert value(m, "llamad_tokens_generated_total", role="generation") == 0
    assert value(m, "llamad_queue_depth", role="generation") == 0
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
    assert value(m, "llamad_child_state", role="generation", state="other") == 1
    assert value(m, "llamad_child_state", role="generation", state="running") == 0
    m.child_state("generation", "backoff")
    assert value(m, "llamad_child_state", role="generation", state="other") == 0
    assert value(m, "llamad_child_state", role="generation", state="backoff") == 1


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
    assert value(m, "llamad_child_exits_total", role="generation", kind="other") == 1
    assert value(m, "llamad_requests_total", protocol="grpc", method="other", code="other") == 1
    assert value(m, "llamad_request_duration_seconds_count", protocol="grpc", method="other") == 1
    assert value(m, "llamad_rejections_total", role="generation", reason="other") == 1
    assert value(m, "llamad_swaps_total", role="generation", outcome="other") == 1
    assert value(m, "llamad_child_restarts_total", role="other") == 1
    assert value(m, "llamad_tokens_generated_total", role="other") == 3
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
    assert after[frozenset({("role", "generation"), ("kind", "other")})] == 1000


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
    assert value(a, "llamad_child_restarts_total", role="generation") == 1
    assert value(b, "llamad_child_restarts_total", role="generation") == 0
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
    assert bucket(m, name, "0.005", role="generation") == 0
    assert bucket(m, name, "0.01", role="generation") == 1
    assert bucket(m, name, "10.0", role="generation") == 1
    assert bucket(m, name, "30.0", role="generation") == 2
    assert bucket(m, name, "+Inf", role="generation") == 3
    assert value(m, f"{name}_count", role="generation") == 3


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
    assert bucket(m, name, "0.001", role="generation") == 1
    assert bucket(m, name, "0.0025", role="generation") == 2
    assert bucket(m, name, "2.0", role="generation") == 2
    assert bucket(m, name, "+Inf", role="generation") == 3


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


# -- the HTTP endpoint -------------------------------------------------------------------


@pytest.fixture
async def server() -> AsyncIterator[MetricsServer]:
    m = Metrics(version="9.9.9")
    m.child_state("generation", "running")
    srv = await serve_metrics(m, "127.0.0.1", 0)
    try:
        yield srv
    finally:
        await srv.close()


async def raw(port: int, data: bytes) -> bytes:
    """Send ``data`` on a fresh connection; return everything until the server closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        return await reader.read()
    finally:
        writer.close()
        await writer.wait_closed()


async def test_get_metrics(server: MetricsServer) -> None:
    """GET /metrics answers 200, the 0.0.4 text content type, and a parseable body."""
    assert server.port > 0
    async with httpx.AsyncClient() as client:
        resp = await client.get(f"http://127.0.0.1:{server.port}/metrics")
    assert resp.status_code == 200
    assert resp.headers["content-type"] == CONTENT_TYPE == (
        "text/plain; version=0.0.4; charset=utf-8")
    assert resp.headers["connection"] == "close"
    names = {f.name for f in text_string_to_metric_families(resp.text)}
    assert {"llamad_build_info", "llamad_child_state", "llamad_requests"} <= names
    assert 'llamad_child_state{role="generation",state="running"} 1.0' in resp.text
    assert 'llamad_build_info{version="9.9.9"} 1.0' in resp.text


async def test_query_string_is_ignored(server: MetricsServer) -> None:
    """A scraper's query parameters do not change the answer."""
    async with httpx.AsyncClient() as client:
        resp = await client.get(f"http://127.0.0.1:{server.port}/metrics?name[]=x")
    assert resp.status_code == 200


async def test_head_metrics_has_no_body(server: MetricsServer) -> None:
    """HEAD /metrics answers 200 with the length of the body it does not send."""
    resp = await raw(server.port, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    head, _, body = resp.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert body == b""
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")))
    assert length > 0


async def test_other_paths_are_404(server: MetricsServer) -> None:
    """Any path other than /metrics answers 404."""
    async with httpx.AsyncClient() as client:
        for path in ("/x", "/", "/metrics/", "/metricsx"):
            resp = await client.get(f"http://127.0.0.1:{server.port}{path}")
            assert resp.status_code == 404, path


async def test_other_methods_are_405(server: MetricsServer) -> None:
    """POST /metrics answers 405 and says which methods are allowed."""
    async with httpx.AsyncClient() as client:
        resp = await client.post(f"http://127.0.0.1:{server.port}/metrics", content=b"")
    assert resp.status_code == 405
    assert resp.headers["allow"] == "GET, HEAD"


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GARBAGE\r\n\r\n",
        b"GET /metrics\r\n\r\n",
        b"GET /metrics HTTP/2.0\r\n\r\n",
        b"get /metrics HTTP/1.1\r\n\r\n",
        b"GET metrics HTTP/1.1\r\n\r\n",
        b"GET /met rics HTTP/1.1\r\n\r\n",
        b"GET /m\xe9trics HTTP/1.1\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nHost: x\r\n folded: y\r\n\r\n",
    ],
)
async def test_malformed_requests_are_400(server: MetricsServer, request_bytes: bytes) -> None:
    """A malformed request line or header gets 400 and the connection is closed."""
    resp = await raw(server.port, request_bytes)
    assert resp.startswith(b"HTTP/1.1 400 Bad Request\r\n")


async def test_oversized_request_line_is_400(server: MetricsServer) -> None:
    """A request line longer than the head cap gets 400 without the server buffering it all."""
    line = b"GET /" + b"a" * (MAX_HEAD_BYTES + 100) + b" HTTP/1.1\r\n\r\n"
    resp = await raw(server.port, line)
    assert resp.startswith(b"HTTP/1.1 400 ")
    assert resp.endswith(b"a line is longer than 8192 bytes\n")


async def test_oversized_headers_are_400(server: MetricsServer) -> None:
    """Headers over the byte cap, or over the count cap, get 400."""
    big = b"GET /metrics HTTP/1.1\r\n" + b"X-A: " + b"a" * 5000 + b"\r\n" \
        + b"X-B: " + b"b" * 5000 + b"\r\n\r\n"
    resp = await raw(server.port, big)
    assert resp.startswith(b"HTTP/1.1 400 ")
    assert resp.endswith(b"request head is longer than 8192 bytes\n")
    many = b"GET /metrics HTTP/1.1\r\n" + b"X: y\r\n" * (MAX_HEADERS + 1) + b"\r\n"
    resp = await raw(server.port, many)
    assert resp.startswith(b"HTTP/1.1 400 ")
    assert resp.endswith(b"more than 64 headers\n")
    enough = b"GET /metrics HTTP/1.1\r\n" + b"X: y\r\n" * MAX_HEADERS + b"\r\n"
    assert (await raw(server.port, enough)).startswith(b"HTTP/1.1 200 ")


async def test_truncated_request_is_400(server: MetricsServer) -> None:
    """A client that half-closes after part of a request gets 400."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    writer.write_eof()
    try:
        assert (await reader.read()).startswith(b"HTTP/1.1 400 ")
    finally:
        writer.close()
        await writer.wait_closed()


async def read_until_closed(reader: asyncio.StreamReader) -> bytes:
    """What arrives before the server closes the connection (a reset counts as closed)."""
    try:
        return await reader.read()
    except ConnectionResetError:
        return b""


async def close_quietly(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(ConnectionResetError):
        await writer.wait_closed()


async def test_slow_client_is_dropped_after_read_timeout() -> None:
    """A client that never finishes its request head is disconnected without an answer."""
    srv = await serve_metrics(Metrics(), "127.0.0.1", 0, read_timeout=0.05)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        writer.write(b"GET /metrics HTTP/1.1\r\n")
        assert await read_until_closed(reader) == b""
        await close_quietly(writer)
    finally:
        await srv.close()


async def test_connections_past_the_cap_are_closed_unanswered() -> None:
    """With max_connections held open, a new connection is closed at once and unanswered,
    and once one of them ends, a scrape is served again."""
    srv = await serve_metrics(Metrics(), "127.0.0.1", 0, max_connections=3)
    held = [await asyncio.open_connection("127.0.0.1", srv.port) for _ in range(3)]
    try:
        for _, writer in held:  # each is being served: its head is half sent
            writer.write(b"GET /metr")
            await writer.drain()
        await asyncio.sleep(0.05)
        try:  # aborted: an RST, or an end before its request was read
            refused = await raw(srv.port, b"GET /metrics HTTP/1.1\r\n\r\n")
        except ConnectionResetError:
            refused = b""
        assert refused == b""
        await close_quietly(held.pop()[1])
        await asyncio.sleep(0.05)
        assert (await raw(srv.port, b"GET /metrics HTTP/1.1\r\n\r\n")).startswith(
            b"HTTP/1.1 200 OK")
    finally:
        for _, writer in held:
            await close_quietly(writer)
        await srv.close()


async def test_close_drops_idle_connections_and_stops_listening() -> None:
    """close() ends open connections and the port refuses new ones; a second close is a no-op."""
    srv = await serve_metrics(Metrics(), "127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
    writer.write(b"GET /metr")
    await writer.drain()
    await srv.close()
    assert await read_until_closed(reader) == b""
    await close_quietly(writer)
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", srv.port)
    await srv.close()


async def test_async_context_manager_closes() -> None:
    """``async with`` closes the server on exit."""
    async with await serve_metrics(Metrics(), "localhost", 0) as srv:
        async with httpx.AsyncClient() as client:
            resp = await client.get(f"http://127.0.0.1:{srv.port}/metrics")
        assert resp.status_code == 200
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", srv.port)


@pytest.mark.parametrize(
    "host", ["0.0.0.0", "", "::", "192.168.1.10", "example.com", "localhost.evil", "[::]"]
)
async def test_non_loopback_hosts_are_refused(host: str) -> None:
    """Anything but a loopback address is refused with ValueError before binding."""
    with pytest.raises(ValueError, match="not a loopback address"):
        await serve_metrics(Metrics(), host, 0)


async def test_port_out_of_range_is_refused() -> None:
    """A port outside 0..65535 is refused with ValueError."""
    with pytest.raises(ValueError, match="out of range"):
        await serve_metrics(Metrics(), "127.0.0.1", 70000)


async def test_port_in_use_is_oserror(server: MetricsServer) -> None:
    """Binding a port that is taken raises OSError (EADDRINUSE)."""
    with pytest.raises(OSError, match="error while attempting to bind") as info:
        await serve_metrics(Metrics(), "127.0.0.1", server.port)
    assert info.value.errno == errno.EADDRINUSE
