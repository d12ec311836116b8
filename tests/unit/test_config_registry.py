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
    InferenceMode,
    Role,
    RoleSettings,
    Settings,
    example_config,
    option,
    value_of,
)
from daemon.config._options import options_of, setting

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


def test_a_help_paragraph_reads_as_one_line() -> None:
    """A help declared as a triple-quoted paragraph has its white space folded, as every
    declared option's help has (``--help`` and the example configuration reflow it)."""

    @dataclasses.dataclass(frozen=True)
    class Section:
        size: int = setting(1, minimum=0, help="""
            A size, declared over
            two lines.""")

    assert [o.help for o in options_of(Section())] == ["A size, declared over two lines."]
    for opt in OPTIONS:
        assert opt.help == " ".join(opt.help.split()), opt.key


@pytest.mark.parametrize("name", ["temperature", "top_p", "min_p", "repeat_penalty",
                                  "dry_multiplier", "frequency_penalty"])
def test_chat_and_ask_sampling_options_differ_only_in_their_call(name: str) -> None:
    """Chat's (limits.chat_*) and Ask's (answer.*) sampling options come from one table:
    the same type, minimum, reload and help but for the call's name."""
    chat, ask = option(f"limits.chat_{name}"), option(f"answer.{name}")
    assert (chat.kind, chat.minimum, chat.reload) == (ask.kind, ask.minimum, ask.reload) \
        == (float, 0, "apply")
    assert chat.help.startswith("Chat's ") and ask.help.startswith("Ask's ")
    assert chat.help.removeprefix("Chat's ") == ask.help.removeprefix("Ask's ")


def test_a_section_takes_its_reload_kind_unless_the_option_says_otherwise() -> None:
    """A role's options go through a new child but for its queue ahead, which applies, and
    whether it has a background instance, which waits for a restart (a reload does not
    add or remove one)."""
    kinds = {o.key: o.reload for o in OPTIONS if o.key.startswith("generation.")}
    assert kinds.pop("generation.queue_ahead") == "apply"
    assert kinds.pop("generation.background_instance") == "restart"
    assert set(kinds.values()) == {"new_child"}


def test_a_child_config_is_its_role_settings_resolved() -> None:
    """A role's ChildConfig is a RoleSettings (its options declared once, there) with the
    role's name and the one setting only a catalog model has (env: its child's
    environment); every option it does not resolve is the section's value."""
    assert issubclass(ChildConfig, RoleSettings)
    assert {f.name for f in dataclasses.fields(ChildConfig)} == {
        f.name for f in dataclasses.fields(RoleSettings)} | {"role", "env"}
    cfg = _load({"LLAMAD_GENERATION_CTX_SIZE": "1234", "LLAMAD_GENERATION_BATCH": "77",
                 "LLAMAD_GENERATION_CHAT_TEMPLATE": "gemma",
                 "LLAMAD_GENERATION_EXTRA_ARGS": "  -ngl\t0   --swa-full ",
                 "LLAMAD_EMBEDDING_MODE": "disabled"})
    resolved = {"mode", "enabled", "extra_args"}
    for role in Role:
        child, section = cfg.child(role), getattr(cfg.settings, role)
        assert child.role is role
        for f in dataclasses.fields(RoleSettings):
            if f.name not in resolved:
                assert getattr(child, f.name) == getattr(section, f.name), (role, f.name)
    gen, emb = cfg.generation, cfg.embedding
    assert (gen.ctx_size, gen.batch, gen.chat_template) == (1234, 77, "gemma")
    assert (gen.extra_args, gen.extra_argv) == ("-ngl 0 --swa-full", ("-ngl", "0", "--swa-full"))
    assert (gen.mode, gen.enabled) == (InferenceMode.EMBEDDED, True)
    assert emb.mode is InferenceMode.DISABLED and emb.enabled is False


def test_an_enum_option_is_a_string_of_its_values_read_as_its_member() -> None:
    """A role's mode is declared with its enum: the option is a string whose choices and
    default are the enum's values, and the settings hold the member."""
    opt = config.option("embedding.mode")
    assert (opt.kind, opt.choices) == (str, tuple(m.value for m in InferenceMode))
    assert type(opt.default) is str and opt.default == "embedded"
    cfg = _load({"LLAMAD_EMBEDDING_MODE": "disabled"})
    assert cfg.settings.embedding.mode is InferenceMode.DISABLED
    assert cfg.settings.generation.mode is InferenceMode.EMBEDDED


def test_the_config_keeps_no_option_twice() -> None:
    """The configuration holds its options once, in ``settings``: beside them only what
    load resolved (a role's child, the directories, the TLS material, the tokens, the
    catalog, the sources), and the supervisor's policy and timeouts built from them."""
    assert [f.name for f in dataclasses.fields(Config)] == [
        "settings", "generation", "embedding", "state_dir", "sources", "models_dir", "tls",
        "tokens", "catalog"]
    public = {n for n in vars(Config) if not n.startswith("_")} - {
        f.name for f in dataclasses.fields(Config)}
    assert public == {"policy", "timeouts", "child", "with_options"}
    cfg = _load({"LLAMAD_SWAP_READY_TIMEOUT": "12", "LLAMAD_LOG_LEVEL": "debug",
                 "LLAMAD_LIMITS_MAX_STOP": "3", "LLAMAD_RESTART_BREAKER_COOLDOWN": "0"})
    assert (cfg.settings.swap.ready_timeout, cfg.settings.log.level,
            cfg.settings.limits.max_stop) == (12.0, "debug", 3)
    assert cfg.policy.cooldown is None


def test_with_options_takes_exactly_the_named_options(tmp_path: Path) -> None:
    """A reload's merge takes the named options from the new configuration, and models_dir
    with its option; every other option keeps its running value."""
    current = _load()
    new = _load({"LLAMAD_RETRIEVAL_RRF_K": "61", "LLAMAD_RETRIEVAL_EMBED_BATCH": "64",
                 "LLAMAD_LLAMA_BIN": "/opt/llama-server", "LLAMAD_MODELS_DIR": str(tmp_path)})
    merged = current.with_options(new, ["retrieval.rrf_k", "llama_bin", "models_dir"])
    assert (merged.settings.retrieval.rrf_k, merged.settings.retrieval.embed_batch) == (61, 32)
    assert (merged.settings.llama_bin, merged.models_dir) == ("/opt/llama-server", tmp_path)
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
