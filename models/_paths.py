"""Where prepared models and the wheel cache live by default."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

__all__ = ["default_cache_dir", "default_models_dir"]

MODELS_DIR_ENV = "LLAMAD_MODELS_DIR"
CACHE_DIR_ENV = "LLAMAD_CACHE"


def default_models_dir() -> Path:
    """Return the directory that holds the prepared GGUF files.

    In order: ``$LLAMAD_MODELS_DIR``; ``models/gguf`` beside this package when it runs
    from a source checkout of llamad (that directory is gitignored); otherwise
    ``$XDG_DATA_HOME/llamad/models`` (``~/.local/share/llamad/models``), so an installed
    package never writes into site-packages.
    """
    env = os.environ.get(MODELS_DIR_ENV)
    if env:
        return Path(env).expanduser()
    package_dir = Path(__file__).resolve().parent
    if _is_source_checkout(package_dir.parent):
        return package_dir / "gguf"
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "llamad" / "models"


def default_cache_dir() -> Path:
    """Return llamad's cache directory: ``$LLAMAD_CACHE``, else ``~/.cache/llamad``."""
    env = os.environ.get(CACHE_DIR_ENV)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "llamad"


def _is_source_checkout(root: Path) -> bool:
    """Tell whether ``root`` is a llamad source tree (its pyproject names the project)."""
    try:
        with (root / "pyproject.toml").open("rb") as f:
            project = tomllib.load(f).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        return False
    return isinstance(project, dict) and project.get("name") == "llamad"
