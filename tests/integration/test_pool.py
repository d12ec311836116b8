"""The model pool with real llama-server children (issue 14): every GGUF of models_dir is
a model by name; a call naming a model that is not resident loads it under its own
supervisor and is served by it; unknown names and wrong roles are refused; unloading
drains and stops its child while the roles' models serve on."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import grpc
import httpx
import pytest

from daemon import Daemon, load
from llamad_protocol.v1 import control_pb2, inference_pb2
from llamad_protocol.v1.wire import RETRY_AFTER_KEY
from supervisor import State
from tests.conftest import models_dir
from tests.support.daemon import GEN, Clients, catalog_env, config_env, serving
from tests.support.procs import alive

pytestmark = pytest.mark.integration

SMOL, GEMMA, MINILM = ("SmolLM2-135M-Instruct.Q4_1", "gemma-3-270m-q4_k_m",
                       "all-MiniLM-L6-v2-f16")


def _states(listed: control_pb2.ListModelsResponse) -> dict[str, int]:
    return {m.name: m.state for m in listed.models}


async def _generate(stub: object, model: str) -> list[inference_pb2.GenerateResponse]:
    request = inference_pb2.GenerateRequest(
        prompt="The capital of France is", model=model,
        sampling=inference_pb2.SamplingParams(max_tokens=4, temperature=0.0))
    return [msg async for msg in stub.Generate(request, timeout=120)]  # type: ignore[attr-defined]


async def test_naming_models_routes_to_them_and_loads_on_demand(llama_server: str) -> None:
    env = config_env("llama-server", LLAMAD_MODELS_DIR=str(models_dir()),
                     LLAMAD_GENERATION_PARALLEL="1", LLAMAD_HTTP_LISTEN="127.0.0.1:0")
    async with serving(env) as (daemon, clients):
        listed = await clients.control.ListModels(control_pb2.ListModelsRequest())
        assert _states(listed) == {SMOL: control_pb2.MODEL_STATE_READY,
                                   MINILM: control_pb2.MODEL_STATE_READY,
                                   GEMMA: control_pb2.MODEL_STATE_UNLOADED}
        smol_pid = daemon.children["generation"].serving_pid

        # The default, by no name and by its name and alias.
        for name in ("", SMOL, "generation"):
            msgs = await _generate(clients.inference, name)
            assert {m.model_name for m in msgs} == {SMOL}
            assert msgs[-1].usage.completion_tokens > 0

        # gemma is not resident: the call loads it, under its own child, and it serves.
        msgs = await _generate(clients.inference, GEMMA)
        assert {m.model_name for m in msgs} == {GEMMA}
        assert {m.model for m in msgs} == {f"{GEMMA}.gguf"}
        gemma = daemon.pool.model(GEMMA)
        assert gemma is not None and gemma.serving_pid not in (0, smol_pid)
        listed = await clients.control.ListModels(control_pb2.ListModelsRequest())
        assert _states(listed)[GEMMA] == control_pb2.MODEL_STATE_READY
        info = next(m for m in listed.models if m.name == GEMMA)
        assert info.HasField("last_used") and info.memory_estimate_bytes > 0
        assert daemon.children["generation"].serving_pid == smol_pid  # untouched
        await clients.wait_serving(f"model/{GEMMA}", timeout=10)  # its health entry

        # The HTTP API shows the same catalog and routes a name to its model.
        async with httpx.AsyncClient(trust_env=False, timeout=120) as http:
            base = f"http://127.0.0.1:{daemon.http_port}/v1"
            page = (await http.get(base + "/models")).json()
            assert {m["id"]: m["loaded"] for m in page["data"]} == {
                SMOL: True, GEMMA: True, MINILM: True}
            for name in (GEMMA, f"{GEMMA}.gguf"):
                reply = (await http.post(base + "/completions", json={
                    "model": name, "prompt": "The capital of France is", "max_tokens": 4,
                    "temperature": 0})).json()
                assert reply["model"] == GEMMA, reply  # the id /v1/models lists
            reply = (await http.post(base + "/embeddings", json={
                "model": MINILM, "input": "a cat"})).json()
            assert len(reply["data"][0]["embedding"]) == 384
            missing = await http.post(base + "/completions", json={
                "model": "nope", "prompt": "x", "max_tokens": 1})
            assert missing.status_code == 404 and GEMMA in missing.json()["error"]["message"]

        embedded = await clients.inference.Embed(
            inference_pb2.EmbedRequest(texts=["a cat"], model=MINILM), timeout=60)
        assert embedded.model_name == MINILM and embedded.dimension == 384
        tokens = await clients.inference.Tokenize(
            inference_pb2.TokenizeRequest(text="hello world", model=GEMMA), timeout=60)
        assert tokens.model_name == GEMMA and tokens.count > 0

        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await _generate(clients.inference, "nope")
        assert unknown.value.code() is grpc.StatusCode.NOT_FOUND
        assert GEMMA in (unknown.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as wrong:
            await _generate(clients.inference, MINILM)
        assert wrong.value.code() is grpc.StatusCode.INVALID_ARGUMENT

        gemma_pid = gemma.serving_pid
        unloaded = await clients.control.UnloadModel(
            control_pb2.UnloadModelRequest(name=GEMMA), timeout=60)
        assert unloaded.model.state == control_pb2.MODEL_STATE_UNLOADED
        assert gemma.serving_pid == 0
        assert gemma_pid != 0
        # The roles serve on; a new call for gemma loads it again.
        assert {m.model_name for m in await _generate(clients.inference, "")} == {SMOL}
        loaded = await clients.control.LoadModel(
            control_pb2.LoadModelRequest(name=GEMMA), timeout=120)
        assert loaded.model.state == control_pb2.MODEL_STATE_READY
        status = await clients.control.Status(control_pb2.StatusRequest())
        gen = next(c for c in status.children if c.role == GEN)
        assert gen.model_path.endswith(f"{SMOL}.gguf") and gen.pid == smol_pid


async def test_room_for_two_of_three_evicts_the_idle_one(llama_server: str) -> None:
    """max_resident 2 with the embedding role disabled: SmolLM2 (the generation default)
    and one more. A call for gemma loads it; a call for MiniLM then unloads gemma (idle,
    not a default) and loads MiniLM; the default serves throughout."""
    env = config_env("llama-server", LLAMAD_MODELS_DIR=str(models_dir()),
                     LLAMAD_EMBEDDING_MODE="disabled", LLAMAD_MODELS_MAX_RESIDENT="2")
    async with serving(env) as (daemon, clients):
        smol_pid = daemon.children["generation"].serving_pid
        assert {m.model_name for m in await _generate(clients.inference, GEMMA)} == {GEMMA}
        gemma = daemon.pool.model(GEMMA)
        assert gemma is not None
        gemma_child = gemma.serving_pid
        embedded = await clients.inference.Embed(
            inference_pb2.EmbedRequest(texts=["a cat"], model=MINILM), timeout=120)
        assert embedded.model_name == MINILM and embedded.dimension == 384
        listed = await clients.control.ListModels(control_pb2.ListModelsRequest())
        assert _states(listed) == {SMOL: control_pb2.MODEL_STATE_READY,
                                   GEMMA: control_pb2.MODEL_STATE_UNLOADED,
                                   MINILM: control_pb2.MODEL_STATE_READY}
        assert gemma.serving_pid == 0 and gemma_child != 0
        assert daemon.children["generation"].serving_pid == smol_pid
        # And back: gemma evicts MiniLM.
        assert {m.model_name for m in await _generate(clients.inference, GEMMA)} == {GEMMA}
        listed = await clients.control.ListModels(control_pb2.ListModelsRequest())
        assert _states(listed)[MINILM] == control_pb2.MODEL_STATE_UNLOADED


async def test_nothing_to_evict_is_resource_exhausted_with_a_retry_hint(
        llama_server: str) -> None:
    """Room for two, both taken by the roles' defaults (never evicted): a call for gemma
    is refused with RESOURCE_EXHAUSTED and a retry hint; the defaults serve on."""
    env = config_env("llama-server", LLAMAD_MODELS_DIR=str(models_dir()),
                     LLAMAD_MODELS_MAX_RESIDENT="2")
    async with serving(env) as (_, clients):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _generate(clients.inference, GEMMA)
        assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "does not fit" in (refused.value.details() or "")
        trailers = dict(refused.value.trailing_metadata() or ())
        assert int(trailers[RETRY_AFTER_KEY]) > 0
        assert {m.model_name for m in await _generate(clients.inference, "")} == {SMOL}


async def test_kill9_of_one_models_child_leaves_the_others_serving(llama_server: str) -> None:
    env = config_env("llama-server", LLAMAD_MODELS_DIR=str(models_dir()))
    async with serving(env) as (daemon, clients):
        await _generate(clients.inference, GEMMA)
        gemma = daemon.pool.model(GEMMA)
        assert gemma is not None
        killed = gemma.serving_pid
        os.kill(killed, signal.SIGKILL)
        # The default serves meanwhile; gemma's own supervisor brings it back.
        assert {m.model_name for m in await _generate(clients.inference, "")} == {SMOL}
        await gemma.supervisor.wait_for(State.RUNNING, timeout=120)
        for _ in range(600):
            if gemma.supervisor.state is State.RUNNING and gemma.serving_pid != killed:
                break
            await asyncio.sleep(0.1)
        assert gemma.serving_pid not in (0, killed)
        assert {m.model_name for m in await _generate(clients.inference, GEMMA)} == {GEMMA}


async def test_a_catalog_models_own_settings_and_environment(llama_server: str,
                                                            tmp_path: Path) -> None:
    """A [models.NAME] table runs its child with its own settings and environment (as a
    CUDA_VISIBLE_DEVICES would be given), beside the roles' children; GOMP_SPINCOUNT
    comes from its role section."""
    toml = tmp_path / "llamad.toml"
    toml.write_text(f"""
[models.g]
model = "{models_dir() / f'{GEMMA}.gguf'}"
ctx_size = 1024
env = {{ LLAMAD_TEST_MARK = "seven" }}
""")
    env = config_env("llama-server", LLAMAD_MODELS_DIR=str(models_dir()),
                     LLAMAD_CONFIG=str(toml))
    async with serving(env) as (daemon, clients):
        loaded = await clients.control.LoadModel(control_pb2.LoadModelRequest(name="g"),
                                                 timeout=120)
        assert loaded.model.origin == "models.g"
        model = daemon.pool.model("g")
        assert model is not None and model.setup.spec.ctx_size == 1024
        environ = Path(f"/proc/{model.serving_pid}/environ").read_bytes().split(b"\0")
        assert b"LLAMAD_TEST_MARK=seven" in environ
        assert b"GOMP_SPINCOUNT=300" in environ
        smol = daemon.children["generation"].serving_pid
        assert b"LLAMAD_TEST_MARK=seven" not in Path(
            f"/proc/{smol}/environ").read_bytes().split(b"\0")
        assert {m.model_name for m in await _generate(clients.inference, "g")} == {"g"}


async def test_two_models_with_room_for_one_serve_every_call(llama_server: str,
                                                             tmp_path: Path) -> None:
    """Room for one generation model, SmolLM2 the default with ``pin = false``, gemma the
    other: six concurrent streams alternating between them all complete, each served by
    the model it named, without a refusal (a switch serves the queued calls first; calls
    arriving meanwhile wait for the next load); at most one child runs at any time."""
    env = catalog_env(
        tmp_path,
        f'[generation]\nmodel = "smol"\n\n'
        f'[models.smol]\nmodel = "{models_dir() / (SMOL + ".gguf")}"\npin = false\n\n'
        f'[models.gemma]\nmodel = "{models_dir() / (GEMMA + ".gguf")}"\n',
        LLAMAD_MODELS_MAX_RESIDENT="1", LLAMAD_MODELS_TURN="1")
    async with serving(env) as (daemon, clients):
        most = 0

        async def watch() -> None:
            nonlocal most
            while True:
                most = max(most, sum(1 for m in (daemon.pool.model("smol"),
                                                 daemon.pool.model("gemma"))
                                     if m is not None and m.serving_pid))
                await asyncio.sleep(0.01)

        watcher = asyncio.create_task(watch())
        names = ["gemma", "smol", "gemma", "", "smol", "gemma"]
        served = await asyncio.gather(*(_generate(clients.inference, n) for n in names))
        watcher.cancel()
        assert [{m.model_name for m in s} for s in served] == [
            {n or "smol"} for n in names]
        assert all(s[-1].finish_reason for s in served)
        assert most == 1
        listed = await clients.control.ListModels(control_pb2.ListModelsRequest())
        assert sorted(_states(listed).values()).count(control_pb2.MODEL_STATE_READY) == 1


async def test_a_reload_adds_and_removes_catalog_models(llama_server: str,
                                                        tmp_path: Path) -> None:
    """SIGHUP's reload with a [models.gemma] table added: gemma is served by name at once;
    with the table gone again: gemma's child is stopped and a call naming it NOT_FOUND."""
    file = tmp_path / "llamad.toml"
    empty = tmp_path / "no-models"
    empty.mkdir()
    env = config_env("llama-server", LLAMAD_MODELS_DIR=str(empty),
                     LLAMAD_EMBEDDING_MODE="disabled")
    file.write_text("[models]\nmax_resident = 3\n")
    daemon = Daemon(load(None, env=env, file=file), reload=lambda: load(None, env=env,
                                                                         file=file))
    clients = Clients(await daemon.start())
    try:
        await clients.wait_serving("generation")
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await _generate(clients.inference, "gemma")
        assert unknown.value.code() is grpc.StatusCode.NOT_FOUND
        file.write_text("[models]\nmax_resident = 3\n\n[models.gemma]\n"
                        f'model = "{models_dir() / (GEMMA + ".gguf")}"\n')
        report = await daemon.reload()
        assert report.changes.get("models.*") == "applied", report
        assert {m.model_name for m in await _generate(clients.inference, "gemma")} == {
            "gemma"}
        gemma = daemon.pool.model("gemma")
        assert gemma is not None and gemma.serving_pid
        pid = gemma.serving_pid
        # A reload's queue size reaches the model loaded on demand, as the role's.
        file.write_text("[limits]\nqueue_size = 3\n\n[models]\nmax_resident = 3\n\n"
                        f'[models.gemma]\nmodel = "{models_dir() / (GEMMA + ".gguf")}"\n')
        report = await daemon.reload()
        assert report.changes.get("limits.queue_size") == "applied", report
        assert (gemma.admission.queue_size, daemon.children["generation"].admission.queue_size,
                gemma.serving_pid) == (3, 3, pid)
        file.write_text("[models]\nmax_resident = 3\n")
        report = await daemon.reload()
        assert report.changes.get("models.*") == "applied", report
        assert not alive(pid)
        with pytest.raises(grpc.aio.AioRpcError) as gone:
            await _generate(clients.inference, "gemma")
        assert gone.value.code() is grpc.StatusCode.NOT_FOUND
    finally:
        await clients.channel.close()
        await daemon.shutdown()


async def test_shared_first_start_ttl_unload_and_a_broken_file_alone(
        llama_server: str, tmp_path: Path) -> None:
    """Real children: four concurrent first calls for gemma make one start (one load,
    one child) and are all served by it; a catalog model whose file is a cut-off GGUF
    fails its own calls, naming the file, while the default and gemma serve on; gemma
    (``ttl`` 2 s) is unloaded once idle that long, the pinned default is not."""
    broken = tmp_path / "cut.gguf"
    with (models_dir() / f"{SMOL}.gguf").open("rb") as whole:
        broken.write_bytes(whole.read(256 * 1024))  # the header, then nothing
    env = catalog_env(
        tmp_path,
        f'[models]\nttl_check_interval = 0.2\n\n'
        f'[models.gemma]\nmodel = "{models_dir() / (GEMMA + ".gguf")}"\nttl = 2\n\n'
        f'[models.cut]\nmodel = "{broken}"\nrole = "generation"\n',
        LLAMAD_GENERATION_PARALLEL="2")
    async with serving(env) as (daemon, clients):
        registry = daemon.metrics.registry

        def count(metric: str, **labels: str) -> float:
            return registry.get_sample_value(f"{metric}_total", labels) or 0.0

        smol_pid = daemon.children["generation"].serving_pid
        served = await asyncio.gather(*(_generate(clients.inference, "gemma")
                                        for _ in range(4)))
        assert [{m.model_name for m in s} for s in served] == [{"gemma"}] * 4
        assert count("llamad_model_loads", model="gemma", outcome="ok") == 1
        gemma = daemon.pool.model("gemma")
        assert gemma is not None and gemma.serving_pid not in (0, smol_pid)
        assert gemma.supervisor.restarts == 0

        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _generate(clients.inference, "cut")
        assert "cut.gguf" in (refused.value.details() or "")
        assert refused.value.code() is not grpc.StatusCode.OK
        assert count("llamad_model_loads", model="cut", outcome="failed") >= 1
        # Its failure is its own: the default and gemma serve on, their children untouched.
        gemma_pid = gemma.serving_pid
        assert {m.model_name for m in await _generate(clients.inference, "")} == {SMOL}
        assert {m.model_name for m in await _generate(clients.inference, "gemma")} == {"gemma"}
        assert gemma.serving_pid == gemma_pid
        assert daemon.children["generation"].serving_pid == smol_pid

        # Idle for its ttl: gemma is unloaded (its child gone), the pinned default stays.
        # The pool counts the unload once the unload has returned: the child can be gone
        # a turn of the loop before the count.
        for _ in range(200):
            if gemma.serving_pid == 0 and not alive(gemma_pid) and \
                    count("llamad_model_unloads", model="gemma", reason="ttl"):
                break
            await asyncio.sleep(0.1)
        assert gemma.serving_pid == 0 and not alive(gemma_pid)
        assert count("llamad_model_unloads", model="gemma", reason="ttl") == 1
        listed = await clients.control.ListModels(control_pb2.ListModelsRequest())
        assert _states(listed)["gemma"] == control_pb2.MODEL_STATE_UNLOADED
        assert _states(listed)[SMOL] == control_pb2.MODEL_STATE_READY
        assert daemon.children["generation"].serving_pid == smol_pid
