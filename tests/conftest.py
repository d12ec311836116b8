"""Shared fixtures: where the real models and the llama-server binary are. The tiers
(tests/tiers.py), the skip gate of CI (tests/skips.py) and the PostgreSQL server of the
store tests (tests/support/postgres.py) are plugins loaded here."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from supervisor import find_llama_server

pytest_plugins = ["pytester", "tests.tiers", "tests.skips", "tests.support.postgres"]

# No property test is about speed: Hypothesis's wall-clock checks (a 200 ms deadline an
# example, "too slow" when generating takes over a second) fail on a busy machine and say
# nothing about the property. Loaded here, before any test module builds its @settings,
# so every test's settings inherit it. Size (data_too_large) is no verdict either: the
# properties draw large inputs on purpose.
settings.register_profile("llamad", deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile("llamad")

ROOT = Path(__file__).resolve().parent.parent
SMALL_MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The other generation model (the swap target of the tests). It was the prepared default
# until the answer-quality bench chose SmolLM2 (PREPARED_DEFAULT); the name stays.
DEFAULT_MODEL = "gemma-3-270m-q4_k_m.gguf"
PREPARED_DEFAULT = SMALL_MODEL
"""The generation model `python -m models prepare` marks as the default."""
EMBED_MODEL = "all-MiniLM-L6-v2-f16.gguf"
RUNTIMES = ("llama-server", "bundled")


def models_dir() -> Path:
    return Path(os.environ.get("LLAMAD_MODELS_DIR") or ROOT / "models" / "gguf")


def model_path(name: str) -> Path:
    path = models_dir() / name
    if not path.is_file():
        pytest.fail(f"{path} is missing: run `make models` (or set LLAMAD_MODELS_DIR)")
    return path


@pytest.fixture(scope="session")
def llama_server() -> str:
    binary = find_llama_server()
    if binary is None:
        pytest.fail("no llama-server binary beside the venv's python or on PATH: "
                    "run `make llama-server`")
    return binary
