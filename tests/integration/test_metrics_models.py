"""Every per-call series labelled by model, end to end (issue 28): a daemon with three
catalog models (real llama.cpp children), one loaded on demand by a call and one never
asked for; scrapes of the metrics listener show each model's series under the ids
``/v1/models`` lists, a call naming an unknown model leaves no series, and the model
nobody asked for stays unloaded."""

from __future__ import annotations

from pathlib import Path

import grpc
import httpx
import pytest

from llamad_protocol.v1 import control_pb2, inference_pb2
from tests.conftest import models_dir
from tests.support.daemon import catalog_env, serving
from tests.support.model_metrics import models_of, parse

pytestmark = pytest.mark.integration

SMOL, GEMMA = "SmolLM2-135M-Instruct.Q4_1", "gemma-3-270m-q4_k_m"
MODELS = ("smol", "gemma", "cold")
"""smol: the generation default; gemma: loaded when a call names it; cold: never asked
for (SmolLM2's file under another name)."""

async def test_a_scrape_shows_each_models_series_and_leaves_an_unloaded_one_unloaded(
        llama_server: str, tmp_path: Path) -> None:
    env = catalog_env(
        tmp_path,
        f'[generation]\nmodel = "smol"\n\n'
        f'[models.smol]\nmodel = "{models_dir() / (SMOL + ".gguf")}"\n\n'
        f'[models.gemma]\nmodel = "{models_dir() / (GEMMA + ".gguf")}"\n\n'
        f'[models.cold]\nmodel = "{models_dir() / (SMOL + ".gguf")}"\n',
        LLAMAD_METRICS_LISTEN="127.0.0.1:0", LLAMAD_HTTP_LISTEN="127.0.0.1:0",
        LLAMAD_GENERATION_PARALLEL="1")
    async with serving(env) as (daemon, clients):
        msgs = [m async for m in clients.inference.Generate(inference_pb2.GenerateRequest(
            prompt="The capital of France is", model="gemma",
            sampling=inference_pb2.SamplingParams(max_tokens=4, temperature=0.0)),
            timeout=120)]
        assert {m.model_name for m in msgs} == {"gemma"}
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            async for _ in clients.inference.Generate(inference_pb2.GenerateRequest(
                    prompt="hi", model="ghost-model")):
                pass
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND

        assert daemon._metrics_server is not None
        async with httpx.AsyncClient(trust_env=False, timeout=30) as http:
            ids = {m["id"] for m in
                   (await http.get(f"http://127.0.0.1:{daemon.http_port}/v1/models")
                    ).json()["data"]}
            for _ in range(3):  # scraping again and again wakes nothing either
                resp = await http.get(
                    f"http://127.0.0.1:{daemon._metrics_server.port}/metrics")
                assert resp.status_code == 200
        assert ids == set(MODELS)
        samples = parse(resp.text)

        # Each model's series, under the ids /v1/models lists and nothing else.
        for name in ("llamad_tokens_generated_total", "llamad_model_calls_total",
                     "llamad_queue_depth", "llamad_requests_in_flight",
                     "llamad_rejections_total", "llamad_child_restarts_total",
                     "llamad_child_exits_total", "llamad_time_to_first_token_seconds_count",
                     "llamad_inter_token_latency_seconds_count", "llamad_model_state"):
            assert models_of(samples, name) == ids, name
        # The children built: smol's and gemma's; the embedding role's (disabled, no
        # catalog model) is the one series outside the catalog, bounded as "other".
        assert models_of(samples, "llamad_child_state") == {"smol", "gemma", "other"}
        assert {(n, dict(labels)["role"]) for n, labels in samples
                if dict(labels).get("model") == "other"} == {
                    ("llamad_child_state", "embedding")}
        assert "ghost-model" not in resp.text

        def v(name: str, model: str, **labels: str) -> float | None:
            return samples.get((name, frozenset(
                {"role": "generation", "model": model, **labels}.items())))

        # gemma's call counted under gemma, not under the role's default.
        assert v("llamad_tokens_generated_total", "gemma") == \
            msgs[-1].usage.completion_tokens > 0
        assert v("llamad_time_to_first_token_seconds_count", "gemma") == 1
        assert v("llamad_model_calls_total", "gemma", outcome="ok") == 1
        assert v("llamad_model_calls_total", "smol", outcome="ok") == 0
        assert v("llamad_tokens_generated_total", "smol") == 0
        assert v("llamad_child_state", "gemma", state="running") == 1
        assert v("llamad_child_state", "smol", state="running") == 1
        assert v("llamad_model_state", "gemma", state="ready") == 1
        assert v("llamad_model_state", "smol", state="ready") == 1
        assert v("llamad_model_state", "cold", state="unloaded") == 1
        assert v("llamad_model_last_used_timestamp_seconds", "gemma") is not None
        assert v("llamad_model_last_used_timestamp_seconds", "cold") is None

        # cold stayed unloaded: never built, no child; the pool and ListModels say so.
        assert daemon.pool.model("cold") is None
        listed = await clients.control.ListModels(control_pb2.ListModelsRequest())
        states = {m.name: m.state for m in listed.models}
        assert states == {"smol": control_pb2.MODEL_STATE_READY,
                          "gemma": control_pb2.MODEL_STATE_READY,
                          "cold": control_pb2.MODEL_STATE_UNLOADED}
