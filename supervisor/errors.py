"""Errors raised by the supervisor core.

The tree::

    SupervisorError
    ├── InvalidModelError        the GGUF file is missing, unreadable or not a valid GGUF
    ├── ChildNotReadyError       no running child to serve a request (retry later)
    ├── ChildRequestError        the child answered a request with an error
    │   ├── ChildBadRequestError the child rejected the request itself (4xx): do not retry
    │   ├── ChildUnresponsiveError the child was taken out of service by its outcomes
    │   │                        (calls failing, a 1-token probe failed or stalled)
    │   └── EndpointError        an external endpoint failed, with a named reason (``kind``):
    │                            refused, unreachable, timeout, tls, auth, api_key,
    │                            not_openai, unknown_model, not_chat, no_embeddings,
    │                            endpoint_error
    ├── TokenizeUnavailableError the inference endpoint offers no tokenizer
    ├── UnsupportedParameterError a generation parameter the runtime cannot honour
    └── IllegalTransitionError   a state change the state machine does not allow (a bug)

None of these import or know about gRPC; ``daemon.errors`` maps them to status codes.
"""

from __future__ import annotations

from pathlib import Path


class SupervisorError(Exception):
    """Base of every error raised by ``supervisor``."""


class InvalidModelError(SupervisorError):
    """A model file cannot be used. Permanent: retrying the same file cannot help.

    Attributes:
        path: the file that was checked.
        reason: one line saying what is wrong with it.
    """

    def __init__(self, path: str | Path, reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"invalid model {self.path}: {reason}")


class ChildNotReadyError(SupervisorError):
    """The child for a role is not running (starting, backing off, failed or stopped).

    Attributes:
        role: the child's role ("generation" or "embedding").
        state: its current state name.
        retry_after: seconds after which a retry may succeed, or None if unknown
            (for example while the circuit breaker is open with no cool-down).
        progress: while it starts, how far (``loading the model (phase 2 of 4), 3.1 s so
            far``); "" otherwise.
    """

    def __init__(self, role: str, state: str, retry_after: float | None,
                 progress: str = "") -> None:
        self.role = role
        self.state = state
        self.retry_after = retry_after
        self.progress = progress
        detail = f"; {progress}" if progress else ""
        super().__init__(f"{role} child is not running (state: {state}{detail})")


class ChildRequestError(SupervisorError):
    """The child failed a request: a 5xx answer, a dropped connection, a bad stream.

    Attributes:
        status: the HTTP status, or None when no answer arrived.
    """

    def __init__(self, message: str, status: int | None = None) -> None:
        self.status = status
        super().__init__(message)


class ChildBadRequestError(ChildRequestError):
    """The child refused the request as invalid (HTTP 4xx); retrying will not help."""


class ChildUnresponsiveError(ChildRequestError):
    """The child serving the call was taken out of service while it said it was healthy
    (its calls failed in a row, or its 1-token probe failed or got no answer): the call
    is ended at once, naming why; the child is being replaced, so a retry may succeed.

    Attributes:
        kind: the cause's kind (``calls_failing``, ``probe_failed``, ``probe_stalled``).
    """

    def __init__(self, message: str, *, kind: str = "") -> None:
        self.kind = kind
        super().__init__(message)


class IllegalTransitionError(SupervisorError):
    """The state machine was asked for a transition its table does not allow."""


class EndpointError(ChildRequestError):
    """An external OpenAI-compatible endpoint cannot be used, and why.

    Attributes:
        kind: the reason, named (see :data:`supervisor.endpoint._client.ENDPOINT_KINDS`).
        permanent: True when retrying the same endpoint settings cannot help (a wrong
            key, a model it does not offer, a server that is not an OpenAI endpoint).
        status: the HTTP status when one arrived.
    """

    def __init__(self, kind: str, message: str, *, permanent: bool,
                 status: int | None = None) -> None:
        self.kind = kind
        self.permanent = permanent
        super().__init__(message, status=status)


class TokenizeUnavailableError(SupervisorError):
    """The inference endpoint has no tokenizer API (only llama-server offers /tokenize)."""


class UnsupportedParameterError(SupervisorError):
    """The request sets generation parameters the serving runtime cannot honour; nothing
    was sent (refused rather than silently ignored).

    Attributes:
        params: the parameters, by their SamplingParams names.
        runtime: names the runtime that cannot take them.
    """

    def __init__(self, params: list[str], runtime: str) -> None:
        self.params = list(params)
        self.runtime = runtime
        shown = ", ".join(f"sampling.{p}" if p != "logit_bias_text" else
                          "sampling.logit_bias by text" for p in self.params)
        verb = "is" if len(self.params) == 1 else "are"
        super().__init__(f"{shown} {verb} not supported by {runtime}")
