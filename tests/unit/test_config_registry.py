"""The registry's machinery: options are read off the section dataclasses' fields, the
configuration reads its settings (nothing kept twice), a reload's merge takes exactly the
options it is given, and the example configuration is rendered from the declarations."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from daemon import config
from daemon.config import (
    OPTIONS,
    ChildConfig,
    Config,
    RoleSettings,
    Settings,
    example_config,
    value_of,
)
from daemon.config._options import options_of, setting
from daemon.config._resolved import _Read

MODELS = {"LLAMAD_GENERATION_MODEL": "/m/gen.gguf", "LLAMAD_EMBEDDING_MODEL": "/m/emb.gguf"}


def _load(env: dict[str, str] | None = None, file: Path | None = None) -> Config:
    return config.load(None, env={**MODELS, **(env or {})}, file=file)


def test_options_are_the_fields_of_the_settings_in_order() -> None:
    """Every option is one field of the settings tree, at the key of its path."""
    settings = Settings()
    assert [o.key for o in OPTIONS] == [o.key for o in options_of(settings)]
    for opt in OPTIONS:
        assert value_of(settings, opt.key) == opt.default, opt.key


def test_a_section_field_that_is_no_option_is_refused() -> None:
    """A field declared without its option's metadata fails when the options are read."""

    @dataclasses.dataclass(frozen=True)
    class Section:
        size: int = setting(1, "A size.")
        other: int = 2

    with pytest.raises(TypeError, match="other is neither an option nor a section"):
        list(options_of(Section()))


def test_a_section_takes_its_reload_kind_unless_the_option_says_otherwise() -> None:
    """A role's options go through a new child but for its queue ahead, which applies."""
    kinds = {o.key: o.reload for o in OPTIONS if o.key.startswith("generation.")}
    assert kinds.pop("generation.queue_ahead") == "apply"
    assert set(kinds.values()) == {"new_child"}


def test_a_child_config_has_a_field_per_role_option() -> None:
    """A role's resolved ChildConfig has the role's options and its name, and the one
    setting only a catalog model has (env: its child's environment), nothing else."""
    assert {f.name for f in dataclasses.fields(ChildConfig)} == {
        f.name for f in dataclasses.fields(RoleSettings)} | {"role", "env"}


def test_the_config_reads_its_settings() -> None:
    """Each attribute of the configuration that is one option's value reads the settings."""
    cfg = _load({"LLAMAD_SWAP_READY_TIMEOUT": "12", "LLAMAD_LOG_LEVEL": "debug",
                 "LLAMAD_LIMITS_MAX_STOP": "3", "LLAMAD_RESTART_BREAKER_COOLDOWN": "0"})
    reads = {name: attr.key for name, attr in vars(Config).items() if isinstance(attr, _Read)}
    assert len(reads) == 26
    for name, key in reads.items():
        assert getattr(cfg, name) == value_of(cfg.settings, key), name
    assert (cfg.swap_ready_timeout, cfg.log_level, cfg.limits.max_stop) == (12.0, "debug", 3)
    assert cfg.policy.cooldown is None


def test_with_options_takes_exactly_the_named_options(tmp_path: Path) -> None:
    """A reload's merge takes the named options from the new configuration, and models_dir
    with its option; every other option keeps its running value."""
    current = _load()
    new = _load({"LLAMAD_RETRIEVAL_RRF_K": "61", "LLAMAD_RETRIEVAL_EMBED_BATCH": "64",
                 "LLAMAD_LLAMA_BIN": "/opt/llama-server", "LLAMAD_MODELS_DIR": str(tmp_path)})
    merged = current.with_options(new, ["retrieval.rrf_k", "llama_bin", "models_dir"])
    assert (merged.retrieval.rrf_k, merged.retrieval.embed_batch) == (61, 32)
    assert (merged.llama_bin, merged.models_dir) == ("/opt/llama-server", tmp_path)
    assert merged.with_options(current, []) == merged
    assert current.with_options(new, []) == current


def _uncommented(text: str) -> str:
    """``text`` with the option line of each block, its last (``# key = value``),
    uncommented."""
    blocks = [b.rpartition("\n") for b in text.removesuffix("\n").split("\n\n")]
    return "\n\n".join(
        f"{head}\n{_SETTING.sub('', last)}" if head and _SETTING.match(last) else head + sep + last
        for head, sep, last in blocks)


_SETTING = re.compile(r"^# (?=[a-z][a-z0-9_]* = )")


def test_the_example_config_lists_every_option_at_its_default(tmp_path: Path) -> None:
    """Uncommented, the example sets every option once, to its default."""
    text = example_config()
    assert all(len(line) <= 88 for line in text.splitlines())
    file = tmp_path / "llamad.toml"
    file.write_text(_uncommented(text))
    cfg = _load(file=file)
    assert set(cfg.sources.values()) == {"file", "env"}
    assert {k for k, v in cfg.sources.items() if v == "env"} == {
        "generation.model", "embedding.model"}
    assert cfg.settings == _load().settings


def test_llamad_config_prints_the_example(capsys: pytest.CaptureFixture[str]) -> None:
    """`llamad config` prints the reference configuration, exit status 0."""
    from daemon import cli

    assert cli.main(["config"]) == 0
    assert capsys.readouterr().out == example_config()
