"""The Python client's view of ListModels: every field a model's entry carries reaches
``ModelInfo``, including its background instance (issue 28)."""

from __future__ import annotations

from clients._models import model_info, model_list
from llamad_protocol.v1 import common_pb2, control_pb2


def test_a_listed_model_carries_its_background_instance() -> None:
    msg = control_pb2.ModelInfo(
        name="minilm", role=common_pb2.CHILD_ROLE_EMBEDDING, aliases=["embedding"],
        state=control_pb2.MODEL_STATE_READY, memory_estimate_bytes=123, in_flight=2,
        origin="embedding", is_default=True, lane_instance="running pid 42 nice +10")
    info = model_info(msg)
    assert (info.name, info.role, info.aliases, info.state) == (
        "minilm", "embedding", ("embedding",), "ready")
    assert (info.in_flight, info.is_default, info.origin) == (2, True, "embedding")
    assert info.lane_instance == "running pid 42 nice +10"
    refused = control_pb2.ModelInfo(name="big", lane_instance="refused: over the budget")
    listed = model_list(control_pb2.ListModelsResponse(models=[msg, refused]))
    assert [m.lane_instance for m in listed] == ["running pid 42 nice +10",
                                                "refused: over the budget"]
    assert model_info(control_pb2.ModelInfo(name="gen")).lane_instance == ""
