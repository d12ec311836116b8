"""The pool's views on the wire: :class:`~daemon.models.pool.ModelView` as a ``ModelInfo``,
and a start's :class:`supervisor.LoadProgress` as a ``LoadProgress``."""

from __future__ import annotations

from llamad_protocol.v1 import control_pb2
from supervisor import LoadProgress

from ..models.pool import ModelView
from .inference import ROLE_ENUMS, _timestamp

_STATES = {
    "unloaded": control_pb2.MODEL_STATE_UNLOADED,
    "loading": control_pb2.MODEL_STATE_LOADING,
    "ready": control_pb2.MODEL_STATE_READY,
    "draining": control_pb2.MODEL_STATE_DRAINING,
    "failed": control_pb2.MODEL_STATE_FAILED,
}


_PHASES = {
    "launching": control_pb2.LOAD_PHASE_LAUNCHING,
    "loading": control_pb2.LOAD_PHASE_LOADING,
    "warming_up": control_pb2.LOAD_PHASE_WARMING_UP,
    "probing": control_pb2.LOAD_PHASE_PROBING,
}


def load_progress(progress: LoadProgress) -> control_pb2.LoadProgress:
    """How far a start is, as ControlService's ``LoadProgress``."""
    return control_pb2.LoadProgress(
        phase=_PHASES.get(progress.phase, control_pb2.LOAD_PHASE_UNSPECIFIED),
        seconds=progress.seconds, expected_seconds=progress.expected_seconds)


def model_info(view: ModelView) -> control_pb2.ModelInfo:
    """``view`` as ControlService's ``ModelInfo``."""
    info = control_pb2.ModelInfo(
        name=view.name, role=ROLE_ENUMS[view.role], aliases=list(view.aliases),
        state=_STATES.get(view.state, control_pb2.MODEL_STATE_UNSPECIFIED),
        memory_estimate_bytes=view.memory_estimate, in_flight=view.in_flight,
        pinned=view.pinned, ttl_seconds=view.ttl,
        breaker=(control_pb2.BREAKER_STATE_OPEN if view.breaker_open
                 else control_pb2.BREAKER_STATE_CLOSED),
        last_error=view.last_error, path=view.path, is_default=view.is_default,
        preload=view.preload, origin=view.origin, lane_instance=view.lane_instance)
    if view.last_used is not None:
        info.last_used.CopyFrom(_timestamp(view.last_used))
    if view.loading is not None:
        info.loading.CopyFrom(load_progress(view.loading))
    return info
