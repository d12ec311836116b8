"""The daemon's model catalog as the clients see it (ControlService/ListModels)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from llamad_protocol.v1 import control_pb2

from ._convert import _time, enum_name, role_name


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """One model of the daemon's catalog.

    Attributes:
        name: what a request's ``model`` names (aliases name it too).
        state: ``unloaded``, ``loading``, ``ready``, ``draining`` or ``failed``.
        memory_estimate_bytes: resident memory estimated from the GGUF metadata.
        last_used: when it was last given a call (None: never).
        in_flight: calls running on it or waiting for its slots.
        breaker: ``closed`` or ``open``.
        origin: where it was declared (``models.NAME``, ``models_preset [NAME]``,
            ``models_dir``, ``generation``, ``embedding``).
        lane_instance: its background instance, the niced second child serving its
            batch and background lanes: ``""`` none, ``"off"``, ``"refused: <why>"``,
            ``"failed: <why>"``, or its state, pid and nice (``"running pid 42 nice +10"``).
    """

    name: str
    role: str
    aliases: tuple[str, ...]
    state: str
    memory_estimate_bytes: int
    last_used: datetime | None
    in_flight: int
    pinned: bool
    ttl_seconds: float
    breaker: str
    last_error: str
    path: str
    is_default: bool
    preload: bool
    origin: str
    lane_instance: str


def model_info(msg: control_pb2.ModelInfo) -> ModelInfo:
    return ModelInfo(
        name=msg.name, role=role_name(msg.role), aliases=tuple(msg.aliases),
        state=enum_name(control_pb2.ModelState, msg.state, "MODEL_STATE_"),
        memory_estimate_bytes=msg.memory_estimate_bytes, last_used=_time(msg, "last_used"),
        in_flight=msg.in_flight, pinned=msg.pinned, ttl_seconds=msg.ttl_seconds,
        breaker=enum_name(control_pb2.BreakerState, msg.breaker, "BREAKER_STATE_"),
        last_error=msg.last_error, path=msg.path, is_default=msg.is_default,
        preload=msg.preload, origin=msg.origin, lane_instance=msg.lane_instance)


def model_list(msg: control_pb2.ListModelsResponse) -> list[ModelInfo]:
    return [model_info(m) for m in msg.models]
