"""kill -9 of the daemon leaves no child of any model (issue 14): the roles' children and
a child the pool started for a catalog model all go with it (parent-death signal)."""

from __future__ import annotations

import grpc
import pytest

from llamad_protocol.v1 import control_pb2, control_pb2_grpc
from tests.conftest import models_dir
from tests.support.daemon import config_env
from tests.support.procs import descendants, gone
from tests.support.serve_process import ServeProcess, child_pids

pytestmark = pytest.mark.integration


def test_sigkill_of_daemon_leaves_no_child_of_any_model(
        llama_server: str, spawned: list[ServeProcess]) -> None:
    d = ServeProcess(config_env("llama-server", LLAMAD_MODELS_DIR=str(models_dir())))
    spawned.append(d)
    address = str(d.wait_event("listening")["address"])
    d.wait_running(2)
    roles = child_pids(address)
    with grpc.insecure_channel(address) as channel:
        stub = control_pb2_grpc.ControlServiceStub(channel)
        loaded = stub.LoadModel(control_pb2.LoadModelRequest(name="gemma-3-270m-q4_k_m"),
                                timeout=120)
    assert loaded.model.state == control_pb2.MODEL_STATE_READY
    pids = descendants(d.proc.pid)
    assert set(roles) < pids  # the roles' children, and the pool's child beside them
    d.proc.kill()
    d.proc.wait()
    assert not gone(sorted(pids), 5), "a child outlived the daemon"
