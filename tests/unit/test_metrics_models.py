"""Every per-call series labelled by model (issue 28): the label sets stay bounded by the
catalog (a name outside it is never a series), a stream counts under its model, and a
scrape shows every catalog model's series without loading or waking any of them."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from daemon.errors import UnknownModel
from daemon.ops.metrics_http import serve_metrics
from daemon.services.inference import Meter
from daemon.telemetry.metrics import EXIT_KINDS, Metrics
from daemon.telemetry.model_gauges import MODEL_STATES, ModelLife, model_lives
from supervisor import Chunk
from tests.support.model_metrics import RIG_MODELS, get, models_of, parse, routed
from tests.support.scripted_pool import Rig

PER_MODEL = ("llamad_child_state", "llamad_child_exits_total", "llamad_child_restarts_total",
             "llamad_breaker_opens_total", "llamad_tokens_generated_total",
             "llamad_model_calls_total", "llamad_queue_depth", "llamad_requests_in_flight",
             "llamad_rejections_total", "llamad_time_to_first_token_seconds_count",
             "llamad_inter_token_latency_seconds_count", "llamad_model_state",
             "llamad_model_last_used_timestamp_seconds")

# -- label sets --------------------------------------------------------------------------


def test_each_catalog_model_has_its_series_at_zero_under_its_role() -> None:
    """Given the catalog (name -> role), each model's counters and gauges exist at 0
    under its own role, and no "other" model series exists."""
    samples = parse(Metrics(version="t", models=RIG_MODELS).render().decode())
    for name in ("llamad_child_restarts_total", "llamad_tokens_generated_total",
                 "llamad_queue_depth", "llamad_requests_in_flight"):
        assert models_of(samples, name) == set(RIG_MODELS), name
    for model, role in RIG_MODELS.items():
        assert get(samples, "llamad_queue_depth", role=role, model=model) == 0
        assert get(samples, "llamad_model_calls_total", role=role, model=model,
                   outcome="error") == 0
        for kind in EXIT_KINDS:
            assert get(samples, "llamad_child_exits_total", role=role, model=model,
                       kind=kind) == 0
    assert get(samples, "llamad_queue_depth", role="embedding", model="gen-a") is None


def test_a_name_outside_the_catalog_is_never_a_series() -> None:
    """Every per-model method given a name outside the catalog counts it under
    model="other"; the name itself appears nowhere, whatever number of them comes."""
    m = Metrics(version="t", models=RIG_MODELS)
    for i in range(200):
        ghost = f"ghost-{i}"
        m.tokens("generation", 1, ghost)
        m.time_to_first_token("generation", 0.1, ghost)
        m.inter_token("generation", 0.01, ghost)
        m.call("generation", ghost, "ok")
        m.queue_depth("generation", 1, ghost)
        m.in_flight("generation", 1, ghost)
        m.rejected("generation", "queue_full", ghost)
        m.child_state("generation", "running", ghost)
        m.child_exit("generation", "crash", ghost)
        m.child_restart("generation", ghost)
        m.breaker_opened("generation", ghost)
    text = m.render().decode()
    assert "ghost" not in text
    samples = parse(text)
    assert get(samples, "llamad_tokens_generated_total", role="generation",
               model="other") == 200
    for name in PER_MODEL[:-2]:
        assert models_of(samples, name) <= set(RIG_MODELS) | {"other"}, name


def test_a_reloads_new_model_gets_its_series() -> None:
    """add_models with a new catalog name (a reload) gives it series from 0; until then
    it was "other"."""
    m = Metrics(version="t", models=RIG_MODELS)
    m.tokens("generation", 2, "gen-d")
    m.add_models({**RIG_MODELS, "gen-d": "generation"})
    m.tokens("generation", 3, "gen-d")
    samples = parse(m.render().decode())
    assert get(samples, "llamad_tokens_generated_total", role="generation", model="gen-d") == 3
    assert get(samples, "llamad_tokens_generated_total", role="generation",
               model="other") == 2


def test_the_meter_counts_a_stream_under_its_model() -> None:
    """A stream's tokens, its first token and its gaps land in its model's series only."""
    m = Metrics(version="t", models=RIG_MODELS)
    meter = Meter(m, time.perf_counter(), "gen-b")
    for _ in range(3):
        meter.piece(Chunk(text="x", tokens=2))
    usage = meter.finish(Chunk(text="", tokens=0, finish_reason="stop"))
    samples = parse(m.render().decode())
    labels = {"role": "generation", "model": "gen-b"}
    assert get(samples, "llamad_tokens_generated_total", **labels) == 6 == \
        usage.completion_tokens
    assert get(samples, "llamad_time_to_first_token_seconds_count", **labels) == 1
    assert get(samples, "llamad_inter_token_latency_seconds_count", **labels) == 2
    assert get(samples, "llamad_tokens_generated_total", role="generation",
               model="gen-a") == 0


def test_the_meter_adds_tokens_at_most_a_second_late_and_on_flush() -> None:
    """Tokens and gaps are added to the series together: within FLUSH_EVERY of the last
    addition they wait; a piece past it adds them all; flush (a stream left early, from
    the caller's finally) adds the rest, once."""
    m = Metrics(version="t", models=RIG_MODELS)
    labels = {"role": "generation", "model": "gen-a"}

    def counted() -> tuple[float | None, float | None]:
        samples = parse(m.render().decode())
        return (get(samples, "llamad_tokens_generated_total", **labels),
                get(samples, "llamad_inter_token_latency_seconds_count", **labels))

    meter = Meter(m, time.perf_counter(), "gen-a")
    for _ in range(3):
        meter.piece(Chunk(text="x", tokens=1))
    assert counted() == (0, 0)
    meter._flushed -= Meter.FLUSH_EVERY  # as if the last addition were a second ago
    meter.piece(Chunk(text="x", tokens=2))
    assert counted() == (5, 3)
    meter.piece(Chunk(text="x", tokens=1))
    assert counted() == (5, 3)
    meter.flush()
    meter.flush()
    assert counted() == (6, 4)


def test_lifecycle_gauges_leave_out_names_outside_the_catalog() -> None:
    """The scrape-time gauges are one-hot over the model states, carry last used when
    known and the expected rest of a load under way; a view of a name outside the catalog
    is left out; registering does not call the source."""
    calls: list[int] = []

    def source() -> list[ModelLife]:
        calls.append(1)
        return [ModelLife("gen-a", "generation", "ready", 1700000000.0),
                ModelLife("gen-b", "generation", "loading", None, 4.5),
                ModelLife("intruder", "generation", "ready", 1.0),
                ModelLife("emb", "embedding", "exploded")]

    m = Metrics(version="t", models=RIG_MODELS)
    m.watch_models(source)
    assert calls == []
    samples = parse(m.render().decode())
    assert calls == [1]
    state = "llamad_model_state"
    assert {s: get(samples, state, role="generation", model="gen-a", state=s)
            for s in MODEL_STATES} == {s: float(s == "ready") for s in MODEL_STATES}
    assert get(samples, state, role="generation", model="gen-b", state="loading") == 1
    assert get(samples, state, role="embedding", model="emb", state="other") == 1
    assert get(samples, "llamad_model_last_used_timestamp_seconds", role="generation",
               model="gen-a") == 1700000000.0
    assert get(samples, "llamad_model_load_expected_seconds", role="generation",
               model="gen-b") == 4.5
    assert models_of(samples, "llamad_model_last_used_timestamp_seconds") == {"gen-a"}
    assert "intruder" not in m.render().decode()


# -- a scrape ----------------------------------------------------------------------------


async def test_a_scrape_shows_every_model_and_wakes_none(tmp_path: Path) -> None:
    """With the role's default serving, gen-b loaded on demand by a call, and gen-c and
    emb never asked for: a scrape of the endpoint shows each one's series (gen-b's call
    under gen-b), and gen-c stays unloaded: never built, never launched."""
    metrics = Metrics(version="t", models=RIG_MODELS)
    rig = Rig(tmp_path, metrics=metrics)
    router = await routed(rig, metrics)
    metrics.watch_models(lambda: model_lives(rig.pool))
    async with router.admit("generation", None, model="gen-b"):
        pass
    with pytest.raises(UnknownModel):
        async with router.admit("generation", None, model="ghost"):
            pass
    server = await serve_metrics(metrics, "127.0.0.1", 0)
    try:
        async with httpx.AsyncClient(trust_env=False) as http:
            for _ in range(3):
                resp = await http.get(f"http://127.0.0.1:{server.port}/metrics")
                assert resp.status_code == 200
    finally:
        await server.close()
    samples = parse(resp.text)
    generation = {name for name, role in RIG_MODELS.items() if role == "generation"}
    for name in PER_MODEL[1:-1]:  # child state: set by the server as each child moves
        streamed = "token" in name and "tokens_generated" not in name  # the histograms
        assert models_of(samples, name) == (generation if streamed else set(RIG_MODELS)), name
    assert models_of(samples, "llamad_model_last_used_timestamp_seconds") == {"gen-b"}
    state = "llamad_model_state"
    assert get(samples, state, role="generation", model="gen-a", state="ready") == 1
    assert get(samples, state, role="generation", model="gen-b", state="ready") == 1
    assert get(samples, state, role="generation", model="gen-c", state="unloaded") == 1
    assert get(samples, state, role="embedding", model="emb", state="unloaded") == 1
    assert get(samples, "llamad_model_calls_total", role="generation", model="gen-b",
               outcome="ok") == 1
    assert get(samples, "llamad_model_calls_total", role="generation", model="gen-a",
               outcome="ok") == 0
    assert "ghost" not in resp.text and 'model="other"' not in resp.text
    # Nothing was woken: gen-c and emb were never built nor launched; the pool says so.
    assert rig.built == ["gen-b"]
    assert rig.pool.model("gen-c") is None and rig.pool.model("emb") is None
    assert rig.launches("gen-c") == rig.launches("emb") == 0
    assert rig.state("gen-c") == rig.state("emb") == "unloaded"
    assert not rig.pool.is_resident("gen-c")
