"""The fake ControlService of :class:`clients.testing.FakeLlamad`: two running children,
canned logs, swaps that check only that the model file exists, a drain flag, a catalog of
three models that load and unload at once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from llamad_protocol.v1 import common_pb2, control_pb2, control_pb2_grpc

from ._faults import Abort

if TYPE_CHECKING:
    from ..testing import FakeLlamad


def _child(role: common_pb2.ChildRole.ValueType, model: str, port: int) -> control_pb2.ChildStatus:
    return control_pb2.ChildStatus(
        role=role, state=control_pb2.CHILD_STATE_RUNNING, pid=4242 + role,
        model_path=f"/models/{model}", runtime="llama-server", port=port, uptime_seconds=75.0,
        restarts=1, breaker=control_pb2.BREAKER_STATE_CLOSED, enabled=True,
        model_architecture="llama", model_context_length=2048, in_flight=1, queued=0,
        slots=2 if role == common_pb2.CHILD_ROLE_GENERATION else 1,
        queue_ahead=0 if role == common_pb2.CHILD_ROLE_GENERATION else 2,
        chat_template="the model's own (tokenizer.chat_template)"
        if role == common_pb2.CHILD_ROLE_GENERATION else "",
        last_exit=control_pb2.ExitCause(kind="crash", exit_code=1, message="boom"))


class FakeControl(control_pb2_grpc.ControlServiceServicer):
    def __init__(self, fake: FakeLlamad) -> None:
        self.fake = fake
        self.drained = False
        # The catalog: name -> state.
        self.models: dict[str, control_pb2.ModelState.ValueType] = {
            "fake-model": control_pb2.MODEL_STATE_READY,
            "fake-embed": control_pb2.MODEL_STATE_READY,
            "fake-other": control_pb2.MODEL_STATE_UNLOADED,
        }

    def Status(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.enter("ControlService/Status", context)
        return control_pb2.StatusResponse(
            children=[_child(common_pb2.CHILD_ROLE_GENERATION, "fake-model.gguf", 40001),
                      _child(common_pb2.CHILD_ROLE_EMBEDDING, "fake-embed.gguf", 40002)],
            version="0.0.0-fake", daemon_uptime_seconds=3725.0, drained=self.drained)

    def ListModels(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.enter("ControlService/ListModels", context)
        return control_pb2.ListModelsResponse(
            models=[self._model(name) for name in self.models],
            skipped=["/models/notes.gguf: not a GGUF file"])

    def LoadModel(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.enter("ControlService/LoadModel", context)
        self._known(request.name, context)
        self.models[request.name] = control_pb2.MODEL_STATE_READY
        return control_pb2.LoadModelResponse(model=self._model(request.name))

    def UnloadModel(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.enter("ControlService/UnloadModel", context)
        self._known(request.name, context)
        self.models[request.name] = control_pb2.MODEL_STATE_UNLOADED
        return control_pb2.UnloadModelResponse(model=self._model(request.name))

    def _known(self, name: str, context: grpc.ServicerContext) -> None:
        if name not in self.models:
            context.abort(grpc.StatusCode.NOT_FOUND, f"model {name!r} does not exist; the "
                          f"models are: {', '.join(self.models)}")

    def _model(self, name: str) -> control_pb2.ModelInfo:
        embedding = name == "fake-embed"
        return control_pb2.ModelInfo(
            name=name, role=(common_pb2.CHILD_ROLE_EMBEDDING if embedding
                             else common_pb2.CHILD_ROLE_GENERATION),
            aliases=["embedding"] if embedding else [], state=self.models[name],
            memory_estimate_bytes=300 * 1024 * 1024, in_flight=0, pinned=embedding,
            ttl_seconds=0 if embedding else 600.0, breaker=control_pb2.BREAKER_STATE_CLOSED,
            path=f"/models/{name}.gguf", is_default=name != "fake-other",
            origin="models_dir" if name == "fake-other" else "generation")

    def SetDraining(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.enter("ControlService/SetDraining", context)
        self.drained = request.draining
        return control_pb2.SetDrainingResponse(draining=self.drained, in_flight=1)

    def TailLogs(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        lines = self.fake.log_lines[-request.lines:] if request.lines else self.fake.log_lines
        role = request.role or common_pb2.CHILD_ROLE_GENERATION

        def items() -> Iterator[Any]:
            for seq, text in enumerate(lines, 1):
                yield control_pb2.LogLine(role=role, pid=4243, stream="stderr", text=text,
                                          seq=seq)
            if request.follow:
                # Nothing more to send: wait (in this worker) until the client cancels.
                while context.is_active():
                    time.sleep(0.01)

        return self.fake.stream("ControlService/TailLogs", context, items())

    def Swap(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        path = request.model_path
        if path and not path.startswith("/"):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "model_path must be absolute")

        def items() -> Iterator[Any]:
            yield control_pb2.SwapProgress(stage=control_pb2.SWAP_STAGE_VALIDATING,
                                           message="checking the model")
            if path and not Path(path).is_file():
                cause = control_pb2.ExitCause(kind="invalid_model", permanent=True,
                                              message=f"{path}: no such file")
                yield control_pb2.SwapProgress(stage=control_pb2.SWAP_STAGE_FAILED,
                                               message=cause.message, cause=cause,
                                               elapsed_seconds=0.01)
                yield Abort(grpc.StatusCode.ABORTED,
                            f"swap failed: {path}: no such file; the old child keeps serving")
                return
            for stage in (control_pb2.SWAP_STAGE_LAUNCHING, control_pb2.SWAP_STAGE_PROBING,
                          control_pb2.SWAP_STAGE_SWAPPING, control_pb2.SWAP_STAGE_DONE):
                yield control_pb2.SwapProgress(stage=stage, elapsed_seconds=0.1 * stage)

        return self.fake.stream("ControlService/Swap", context, items())

    def SetMode(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        self.fake.last_set_mode = request

        def items() -> Iterator[Any]:
            for stage in (control_pb2.SWAP_STAGE_VALIDATING, control_pb2.SWAP_STAGE_PROBING,
                          control_pb2.SWAP_STAGE_SWAPPING, control_pb2.SWAP_STAGE_DONE):
                yield control_pb2.SwapProgress(stage=stage, elapsed_seconds=0.1 * stage)

        return self.fake.stream("ControlService/SetMode", context, items())

    def Reset(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.enter("ControlService/Reset", context)
        return control_pb2.ResetResponse(state=control_pb2.CHILD_STATE_STARTING)
