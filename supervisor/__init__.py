"""Supervision of llama.cpp children: state machine, backoff, breaker, process hygiene.

The same machinery runs an external OpenAI-compatible endpoint in place of a child
(:class:`EndpointLauncher`): readiness, liveness, backoff and make-before-break swaps.

This package never imports gRPC; the daemon maps its errors to status codes.
"""

from ._args import (
    ArgumentRefused,
    check_api_args,
    check_child_env,
    check_operator_args,
)
from ._backoff import BreakerState, CircuitBreaker, RestartPolicy
from ._child import (
    Launcher,
    LiveChild,
    ProcessChild,
    ProcessLauncher,
    StageSink,
    StartFailure,
    Timeouts,
)
from ._client import ApiShape, EmbedResult, Health, InferenceClient
from ._clock import Clock, ManualClock, SystemClock
from ._drain import drain
from ._exits import ExitCause, classify_exit
from ._loading import LoadProgress
from ._logring import LogLine, LogRing
from ._process import ChildProcess, can_lower_niceness, renice
from ._runtime import (
    DEFAULT_CACHE_RAM_MIB,
    BundledRuntime,
    LaunchSpec,
    LlamaServerRuntime,
    Runtime,
    find_llama_server,
    pick_runtime,
    prompt_cache_bytes,
)
from ._sampling import (
    BUNDLED,
    LLAMA_CPP,
    OPENAI,
    Dialect,
    LogitBias,
    Sampling,
    TokenLogprob,
    TokenLogprobs,
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
from ._templates import (
    KNOWN_TEMPLATES,
    ChatTemplate,
    choose_chat_template,
    fallback_chat_template,
)
from ._tools import Message, Tool, ToolCall, ToolCallDelta, ToolUse, Turn
from .endpoint._client import (
    ENDPOINT_KINDS,
    EndpointClient,
    display_url,
    normalise_url,
    read_api_key,
    transport_error,
)
from .endpoint._launch import EndpointLauncher, EndpointLink, EndpointSpec, pick_model
from .errors import (
    ChildBadRequestError,
    ChildNotReadyError,
    ChildRequestError,
    ChildUnresponsiveError,
    EndpointError,
    IllegalTransitionError,
    InvalidModelError,
    SupervisorError,
    TokenizeUnavailableError,
    UnsupportedParameterError,
)
from .gguf._check import GGUFInfo, read_gguf_info, sha256_file
from .http._events import Chunk
from .http._json import NotAJsonObject, json_object

__all__ = [
    "BUNDLED",
    "DEFAULT_CACHE_RAM_MIB",
    "ENDPOINT_KINDS",
    "KNOWN_TEMPLATES",
    "LLAMA_CPP",
    "OPENAI",
    "STAGES",
    "TRANSITIONS",
    "ApiShape",
    "ArgumentRefused",
    "BreakerState",
    "BundledRuntime",
    "ChatTemplate",
    "ChildBadRequestError",
    "ChildNotReadyError",
    "ChildProcess",
    "ChildRequestError",
    "ChildUnresponsiveError",
    "Chunk",
    "CircuitBreaker",
    "Clock",
    "Dialect",
    "EmbedResult",
    "EndpointClient",
    "EndpointError",
    "EndpointLauncher",
    "EndpointLink",
    "EndpointSpec",
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
    "LoadProgress",
    "LogLine",
    "LogRing",
    "LogitBias",
    "ManualClock",
    "Message",
    "NotAJsonObject",
    "ProcessChild",
    "ProcessLauncher",
    "RestartPolicy",
    "Runtime",
    "Sampling",
    "StageSink",
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
    "TokenLogprob",
    "TokenLogprobs",
    "TokenizeUnavailableError",
    "Tool",
    "ToolCall",
    "ToolCallDelta",
    "ToolUse",
    "Turn",
    "UnsupportedParameterError",
    "can_lower_niceness",
    "check_api_args",
    "check_child_env",
    "check_operator_args",
    "check_transition",
    "choose_chat_template",
    "classify_exit",
    "display_url",
    "drain",
    "fallback_chat_template",
    "find_llama_server",
    "json_object",
    "normalise_url",
    "pick_model",
    "pick_runtime",
    "prompt_cache_bytes",
    "read_api_key",
    "read_gguf_info",
    "renice",
    "sha256_file",
    "transport_error",
]

# Marker checked by the daemon at start: proves this `supervisor` is llamad's and not
# the unrelated Supervisor (supervisord) distribution, which uses the same import name.
LLAMAD_PACKAGE = True
