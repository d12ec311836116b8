"""ControlService's ListModels, LoadModel and UnloadModel over a real gRPC server, on the
model pool of scripted models (issue 14)."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest

from daemon.config import Config
from daemon.grpcapi.control import ControlServicer
from daemon.models.modes import ModeManager
from daemon.models.swaps import SwapManager
from llamad_protocol.v1 import common_pb2, control_pb2, control_pb2_grpc
from tests.support.inprocess import serving
from tests.support.scripted import PERMANENT
from tests.support.scripted_pool import Rig


def _no_config() -> Config:
    raise AssertionError("not used")


def _servicer(rig: Rig) -> ControlServicer:
    return ControlServicer(rig.pool, "test", time.monotonic(), lambda: False,
                           swaps=SwapManager(rig.pool), modes=ModeManager(rig.pool, _no_config))


async def test_list_load_unload(tmp_path: Path) -> None:
    rig = await Rig(tmp_path).started()
    servicer = _servicer(rig)
    rig.outcomes["gen-c"] = [PERMANENT]
    async with serving(
            lambda s: control_pb2_grpc.add_ControlServiceServicer_to_server(servicer, s)
    ) as channel:
        stub = control_pb2_grpc.ControlServiceStub(channel)
        listed = await stub.ListModels(control_pb2.ListModelsRequest())
        models = {m.name: m for m in listed.models}
        assert list(models) == ["gen-a", "gen-b", "gen-c", "emb"]
        assert models["gen-a"].state == control_pb2.MODEL_STATE_READY
        assert models["gen-a"].is_default
        assert models["gen-b"].state == control_pb2.MODEL_STATE_UNLOADED
        assert models["emb"].role == common_pb2.CHILD_ROLE_EMBEDDING
        assert list(models["gen-b"].aliases) == ["b"]
        assert models["gen-b"].memory_estimate_bytes > 0
        assert not models["gen-b"].HasField("last_used")

        loaded = await stub.LoadModel(control_pb2.LoadModelRequest(name="b"))
        assert (loaded.model.name, loaded.model.state) == ("gen-b",
                                                           control_pb2.MODEL_STATE_READY)
        status = await stub.Status(control_pb2.StatusRequest())  # the pool, in one call
        assert {m.name: m.state for m in status.models} == {
            "gen-a": control_pb2.MODEL_STATE_READY, "gen-b": control_pb2.MODEL_STATE_READY,
            "gen-c": control_pb2.MODEL_STATE_UNLOADED,
            "emb": control_pb2.MODEL_STATE_UNLOADED}
        unloaded = await stub.UnloadModel(control_pb2.UnloadModelRequest(name="gen-b"))
        assert unloaded.model.state == control_pb2.MODEL_STATE_UNLOADED

        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await stub.LoadModel(control_pb2.LoadModelRequest(name="nope"))
        assert missing.value.code() is grpc.StatusCode.NOT_FOUND
        assert "gen-a, gen-b, gen-c, emb" in (missing.value.details() or "")

        with pytest.raises(grpc.aio.AioRpcError) as broken:
            await stub.LoadModel(control_pb2.LoadModelRequest(name="gen-c"))
        assert broken.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert "'gen-c' could not be loaded: error loading model" in (
            broken.value.details() or "")
        listed = await stub.ListModels(control_pb2.ListModelsRequest())
        gen_c = next(m for m in listed.models if m.name == "gen-c")
        assert gen_c.state == control_pb2.MODEL_STATE_UNLOADED
        assert "error loading model" in gen_c.last_error
    await rig.pool.stop()
    await rig.default.stop()


async def test_swap_of_a_named_model(tmp_path: Path) -> None:
    """Swap with ``model`` replaces what serves that resident pool model, make-before-break
    (a new child launched beside it), the role's default untouched; a model that is not
    resident is refused, naming LoadModel."""
    rig = await Rig(tmp_path).started()
    servicer = _servicer(rig)
    async with serving(
            lambda s: control_pb2_grpc.add_ControlServiceServicer_to_server(servicer, s)
    ) as channel:
        stub = control_pb2_grpc.ControlServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as idle:
            async for _ in stub.Swap(control_pb2.SwapRequest(model="b", ctx_size=1024)):
                pass
        assert idle.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert "'gen-b' is not resident" in (idle.value.details() or "")
        await stub.LoadModel(control_pb2.LoadModelRequest(name="b"))
        gen_b = rig.pool.model("gen-b")
        assert gen_b is not None
        old_pid = gen_b.serving_pid
        stages = [p.stage async for p in stub.Swap(control_pb2.SwapRequest(
            model="b", ctx_size=1024, reason="smaller context"))]
        assert stages[-1] == control_pb2.SWAP_STAGE_DONE
        assert rig.launches("gen-b") == 2 and rig.launches("gen-a") == 1
        assert gen_b.setup.spec.ctx_size == 1024 and gen_b.serving_pid != old_pid
        assert rig.default.setup.spec.ctx_size != 1024
    await rig.pool.stop()
    await rig.default.stop()
