"""llamad's daemon: configuration, gRPC servicers, health, and the composition root."""

from .config import Config, ConfigError, load
from .server import Daemon

__all__ = ["Config", "ConfigError", "Daemon", "load"]
