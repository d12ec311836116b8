"""What the daemon says as it starts: its version, the prepared default models it picked,
each role's mode in a few words, and a warning when directory sources could index a hard
link to any file (:class:`daemon.server.Daemon` calls these; they decide nothing)."""

from __future__ import annotations

from importlib import metadata

import structlog

from retrieval import protected_hardlinks

from ..config import Config, Role
from ..config.inference_mode import InferenceMode
from ..models.model import Model

_log = structlog.get_logger("llamad.daemon")


def version() -> str:
    """The installed llamad's version ("0+unknown" from a checkout not installed)."""
    try:
        return metadata.version("llamad")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def describe_mode(child: Model) -> str:
    """A role's mode in a few words, for logs: never an endpoint's credentials."""
    if child.mode.endpoint is not None:
        return f"endpoint {child.mode.endpoint.display_url}"
    if child.mode.kind is InferenceMode.EMBEDDED and child.current is not None:
        return f"embedded {child.current.spec.model} ({child.current.runtime.name})"
    return child.mode.kind.value


def warn_unprotected_hard_links(config: Config) -> None:
    """Directory sources read hard links like any file (docs/security.md, "What a source can
    read"); with the kernel's fs.protected_hardlinks off, anyone who can write in a source
    can link any file of the same filesystem into it."""
    r = config.settings.retrieval
    if r.allowed_roots and not r.refuse_hard_links and protected_hardlinks() is False:
        _log.warning("hard links unprotected",
                     reason="fs.protected_hardlinks is 0: a user who can write in a "
                            "directory source can hard-link any file of its filesystem "
                            "into it, and it would be indexed; set the sysctl to 1 or "
                            "retrieval.refuse_hard_links = true")


def log_default_models(config: Config) -> None:
    """Say which role runs the prepared default model because none was configured."""
    for role in Role:
        if config.sources.get(f"{role}.model") == "models_dir":
            _log.info(f"{role}.model not set: using the prepared default",
                      model=config.child(role).model, models_dir=str(config.models_dir))
