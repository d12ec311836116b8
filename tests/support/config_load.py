"""Loading configuration hermetically, as the configuration tests do
(tests/unit/test_config_*.py): a parser carrying every option, as ``llamad serve`` has; an
environment with both models set (or a models directory with none prepared); a TOML file.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from daemon import config
from daemon.config import Config

MODELS = {"LLAMAD_GENERATION_MODEL": "/m/gen.gguf", "LLAMAD_EMBEDDING_MODEL": "/m/emb.gguf"}
# No prepared models there: a role without a model is refused, whatever this machine has.
UNPREPARED = {"LLAMAD_MODELS_DIR": "/nonexistent/llamad-models"}


def parse(*argv: str) -> argparse.Namespace:
    """Parse ``argv`` with a parser carrying every option, as ``llamad serve`` does."""
    parser = argparse.ArgumentParser(prog="llamad-test")
    config.add_arguments(parser)
    return parser.parse_args(list(argv))


def load(
    *argv: str, env: dict[str, str] | None = None, file: Path | None = None, models: bool = True
) -> Config:
    """Load with a hermetic environment (both models set unless ``models`` is False; then
    models_dir, unless given, has no prepared models)."""
    base = dict(MODELS) if models else dict(UNPREPARED)
    return config.load(parse(*argv), env={**base, **(env or {})}, file=file)


def write_toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "llamad.toml"
    path.write_text(text)
    return path
