"""Configuration of models: unset models are the prepared defaults of the models directory
(the prepared checkout's, else the installed one), a configured model wins over them,
missing or unnamed prepared defaults are refused, and a disabled child needs no model.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import models
from daemon import config
from daemon.config import ConfigError
from models import Manifest, ManifestEntry
from tests.support.config_load import load, parse, write_toml


def prepare_fake(directory: Path, *entries: tuple[str, str, bool]) -> Path:
    """A models directory as ``python -m models prepare`` leaves it: the files and a
    manifest with each one's role and whether it is that role's default."""
    directory.mkdir(parents=True, exist_ok=True)
    manifest = Manifest(entries={})
    for file, role, default in entries:
        (directory / file).write_bytes(b"GGUF")
        manifest.entries[file] = ManifestEntry(
            file=file, role=role, default=default, source_package="fake", source_version="1",
            recipe="extract", sha256="0" * 64, size=4, mtime_ns=0, architecture="llama",
            context_length=0, embedding_length=0, file_type="", prepared_at="2026-01-01")
    manifest.save(directory)
    return directory


PREPARED = (("small.gguf", "generation", False), ("big.gguf", "generation", True),
            ("embed.gguf", "embedding", True))


@pytest.mark.parametrize("how", ["flag", "env", "file"])
def test_unset_models_are_the_prepared_defaults(tmp_path: Path, how: str) -> None:
    """With no model configured, each embedded role runs the file the manifest of
    models_dir marks as its default (from a flag, the env or the file), said by the
    model's source."""
    prepared = prepare_fake(tmp_path / "prepared", *PREPARED)
    argv = ["--models-dir", str(prepared)] if how == "flag" else []
    env = {"LLAMAD_MODELS_DIR": str(prepared)} if how == "env" else {}
    file = write_toml(tmp_path, f'models_dir = "{prepared}"\n') if how == "file" else None
    cfg = config.load(parse(*argv), env=env, file=file)  # no other model setting
    assert cfg.models_dir == prepared
    assert cfg.generation.model == str(prepared / "big.gguf")
    assert cfg.embedding.model == str(prepared / "embed.gguf")
    assert cfg.sources["generation.model"] == cfg.sources["embedding.model"] == "models_dir"
    assert cfg.sources["models_dir"] == how


def test_configured_model_wins_over_the_prepared_default(tmp_path: Path) -> None:
    """A configured model is used as is; only the role without one takes the default; a
    role in endpoint mode or disabled takes none."""
    prepared = prepare_fake(tmp_path / "prepared", *PREPARED)
    cfg = load(env={"LLAMAD_MODELS_DIR": str(prepared),
                    "LLAMAD_GENERATION_MODEL": "/m/mine.gguf"}, models=False)
    assert (cfg.generation.model, cfg.sources["generation.model"]) == ("/m/mine.gguf", "env")
    assert cfg.embedding.model == str(prepared / "embed.gguf")
    cfg = load("--no-embedding-enabled", "--generation-mode", "endpoint",
               "--generation-endpoint-url", "http://127.0.0.1:9/v1",
               env={"LLAMAD_MODELS_DIR": str(prepared)}, models=False)
    assert (cfg.generation.model, cfg.embedding.model) == ("", "")


def test_prepared_defaults_missing_or_unnamed_are_refused(tmp_path: Path) -> None:
    """A manifest that names no default for the role, or whose default file is gone, is
    refused naming what is wrong and how to prepare the models again."""
    prepared = prepare_fake(tmp_path / "prepared", ("small.gguf", "generation", False),
                            ("embed.gguf", "embedding", True))
    env = {"LLAMAD_MODELS_DIR": str(prepared)}
    with pytest.raises(ConfigError, match=r"^generation.model: no model configured .*names "
                       r"no default generation model: run `python -m models prepare"):
        load(env=env, models=False)
    (prepared / "embed.gguf").unlink()
    with pytest.raises(ConfigError, match=r"^embedding.model: .*embed.gguf, the prepared "
                       r"default embedding model, is missing"):
        load(env={**env, "LLAMAD_GENERATION_MODEL": "/m/g.gguf"}, models=False)
    (prepared / "manifest.json").write_text("{")
    with pytest.raises(ConfigError, match=r"manifest is unusable: .*not valid JSON"):
        load(env=env, models=False)


def test_default_models_dir_is_the_prepared_checkout_else_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default models_dir is models/gguf beside the models package once prepared
    there, else the installed location, /var/lib/llamad/models."""
    monkeypatch.setattr(models, "__file__", str(tmp_path / "models" / "__init__.py"))
    assert config.default_models_dir() == Path("/var/lib/llamad/models")
    prepare_fake(tmp_path / "models" / "gguf", *PREPARED)
    assert config.default_models_dir() == tmp_path / "models" / "gguf"
    cfg = config.load(parse(), env={})
    assert cfg.models_dir == tmp_path / "models" / "gguf"
    assert cfg.generation.model == str(tmp_path / "models" / "gguf" / "big.gguf")


def test_disabled_child_needs_no_model() -> None:
    """A disabled child may have no model; the enabled one still loads."""
    cfg = load("--no-generation-enabled", env={"LLAMAD_EMBEDDING_MODEL": "/m/e.gguf"},
               models=False)
    assert cfg.generation.enabled is False
    assert cfg.generation.model == ""
    assert cfg.embedding.enabled is True
