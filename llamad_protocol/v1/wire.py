"""Wire constants of llamad.v1 that the ``.proto`` files cannot hold.

The daemon sends them and the clients read them; both import them from here so the two
sides cannot drift. Changing a value is a protocol change.
"""

from __future__ import annotations

from typing import Final

# --- metadata ---------------------------------------------------------------------------

RETRY_AFTER_KEY: Final = "retry-after-ms"
"""Trailing metadata of a retryable failure (UNAVAILABLE, RESOURCE_EXHAUSTED): how long to
wait before retrying, in whole milliseconds as decimal text. The same delay is also sent as
a ``google.rpc.RetryInfo`` detail under :data:`STATUS_DETAILS_KEY`."""

STATUS_DETAILS_KEY: Final = "grpc-status-details-bin"
"""Trailing metadata holding a serialized ``google.rpc.Status`` (gRPC's rich error model)."""

AUTHORIZATION_KEY: Final = "authorization"
"""Call metadata carrying the token when the daemon requires one: ``Bearer <token>``."""

BEARER_SCHEME: Final = "Bearer"
"""The scheme of :data:`AUTHORIZATION_KEY` (compared case-insensitively by the daemon)."""

# --- grpc.health.v1 ---------------------------------------------------------------------

HEALTH_SERVICE: Final = "grpc.health.v1.Health"
"""The health service's full name; it is served without a token."""

INFERENCE_SERVICE: Final = "llamad.v1.InferenceService"
CONTROL_SERVICE: Final = "llamad.v1.ControlService"
RETRIEVAL_SERVICE: Final = "llamad.v1.RetrievalService"
ANSWER_SERVICE: Final = "llamad.v1.AnswerService"
"""Full names of llamad's services (the ``.proto`` packages' ``service`` declarations)."""

HEALTH_OVERALL: Final = ""
"""Health entry: SERVING when not draining and every role that is not disabled is ready."""
HEALTH_GENERATION: Final = "generation"
"""Health entry: SERVING when generation is ready."""
HEALTH_EMBEDDING: Final = "embedding"
"""Health entry: SERVING when embedding is ready."""

HEALTH_NAMES: Final = (HEALTH_OVERALL, HEALTH_GENERATION, HEALTH_EMBEDDING, INFERENCE_SERVICE,
                       CONTROL_SERVICE, RETRIEVAL_SERVICE)
"""Every fixed service name llamad reports to grpc.health.v1 (``daemon/grpcapi/health.py`` says when
each is SERVING); besides these, one :data:`HEALTH_MODEL_PREFIX` entry per catalog model;
any other name is SERVICE_UNKNOWN."""
HEALTH_MODEL_PREFIX: Final = "model/"
"""Health entries ``model/<catalog name>``: SERVING while that model is resident and ready
(a model that is not loaded is NOT_SERVING, though a call naming it loads it)."""
