"""Supervision of llama.cpp children: state machine, backoff, breaker, process hygiene.

This package never imports gRPC; the daemon maps its errors to status codes.
"""

from ._backoff import BreakerState, CircuitBreaker, RestartPolicy
from ._child import Launcher, LiveChild, ProcessChild, ProcessLauncher, StartFailure, Timeouts
from ._client import ApiShape, Chunk, EmbedResult, Health, InferenceClient, Sampling
from ._clock import Clock, ManualClock, SystemClock
from ._exits import ExitCause, classify_exit
from ._gguf import GGUFInfo, read_gguf_info, sha256_file
from ._logring import LogLine, LogRing
from ._process import ChildProcess
from ._runtime import (
    BundledRuntime,
    LaunchSpec,
    LlamaServerRuntime,
    Runtime,
    fallback_chat_template,
    find_llama_server,
    pick_runtime,
)
from ._states import TRANSITIONS, State, check_transition
from ._supervisor import StateChange, Supervisor
from ._swap import (
    STAGES,
    SwapError,
    SwapFailedError,
    SwapInProgressError,
    SwapProgress,
    SwapRecord,
    SwapRefusedError,
)
from .errors import (
    ChildBadRequestError,
    ChildNotReadyError,
    ChildRequestError,
    IllegalTransitionError,
    InvalidModelError,
    SupervisorError,
)

__all__ = [
    "STAGES",
    "TRANSITIONS",
    "ApiShape",
    "BreakerState",
    "BundledRuntime",
    "ChildBadRequestError",
    "ChildNotReadyError",
    "ChildProcess",
    "ChildRequestError",
    "Chunk",
    "CircuitBreaker",
    "Clock",
    "EmbedResult",
    "ExitCause",
    "GGUFInfo",
    "Health",
    "IllegalTransitionError",
    "InferenceClient",
    "InvalidModelError",
    "LaunchSpec",
    "Launcher",
    "LiveChild",
    "LlamaServerRuntime",
    "LogLine",
    "LogRing",
    "ManualClock",
    "ProcessChild",
    "ProcessLauncher",
    "RestartPolicy",
    "Runtime",
    "Sampling",
    "StartFailure",
    "State",
    "StateChange",
    "Supervisor",
    "SupervisorError",
    "SwapError",
    "SwapFailedError",
    "SwapInProgressError",
    "SwapProgress",
    "SwapRecord",
    "SwapRefusedError",
    "SystemClock",
    "Timeouts",
    "check_transition",
    "classify_exit",
    "fallback_chat_template",
    "find_llama_server",
    "pick_runtime",
    "read_gguf_info",
    "sha256_file",
]

# Marker checked by the daemon at start: proves this `supervisor` is llamad's and not
# the unrelated Supervisor (supervisord) distribution, which uses the same import name.
LLAMAD_PACKAGE = True
