"""llamad's daemon: configuration, gRPC servicers, health, and the composition root."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .config import Config, ConfigError, load

if TYPE_CHECKING:
    from .server import Daemon

__all__ = ["Config", "ConfigError", "Daemon", "load"]


def __getattr__(name: str) -> Any:
    # The composition root (servicers, retrieval, the HTTP API) is imported on first use,
    # so the client verbs of `llamad` (a probe's `llamad health`) start without it.
    if name == "Daemon":
        from .server import Daemon  # noqa: PLC0415

        return Daemon
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
