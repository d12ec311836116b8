"""Configuration values, where they come from and what they become: flag > env > file >
default, per option; the config file named by flag or env; booleans (--no- flags, env
spellings, TOML booleans) and extra args; every value landing in its typed section, whose
defaults match the supervisor's and which has a field per option.
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest

from daemon import config
from daemon.config import OPTIONS
from supervisor import RestartPolicy, Timeouts
from tests.support.config_load import load, write_toml

# --- precedence ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("use_flag", "use_env", "use_file", "expected", "source"),
    [
        (True, True, True, 7, "flag"),
        (False, True, True, 6, "env"),
        (False, False, True, 5, "file"),
        (False, False, False, 4, "default"),
    ],
)
def test_precedence_flag_env_file_default(
    tmp_path: Path, use_flag: bool, use_env: bool, use_file: bool, expected: int, source: str
) -> None:
    """A value comes from the highest layer that sets it: flag, then env, then file."""
    argv = ["--generation-parallel", "7"] if use_flag else []
    env = {"LLAMAD_GENERATION_PARALLEL": "6"} if use_env else {}
    file = write_toml(tmp_path, "[generation]\nparallel = 5\n") if use_file else None
    cfg = load(*argv, env=env, file=file)
    assert cfg.generation.parallel == expected
    assert cfg.sources["generation.parallel"] == source


def test_precedence_is_per_option(tmp_path: Path) -> None:
    """A higher layer overrides only the options it sets; the others keep their layer."""
    file = write_toml(tmp_path, "[generation]\nparallel = 5\nbatch = 64\n")
    cfg = load(env={"LLAMAD_GENERATION_PARALLEL": "6"}, file=file)
    assert (cfg.generation.parallel, cfg.sources["generation.parallel"]) == (6, "env")
    assert (cfg.generation.batch, cfg.sources["generation.batch"]) == (64, "file")
    assert (cfg.embedding.batch, cfg.sources["embedding.batch"]) == (512, "default")


def test_config_file_from_flag_and_from_env(tmp_path: Path) -> None:
    """The file is found through --config, or through LLAMAD_CONFIG when no flag is given."""
    file = write_toml(tmp_path, "drain_grace = 7.5\n")
    assert load("--config", str(file)).settings.drain_grace == 7.5
    assert load(env={"LLAMAD_CONFIG": str(file)}).settings.drain_grace == 7.5
    assert load().settings.drain_grace == 30.0


def test_defaults_when_nothing_is_set() -> None:
    """With only the models set, every value is its declared default."""
    cfg = load()
    assert cfg.settings.listen == "127.0.0.1:50051"
    assert cfg.generation.parallel == 4
    assert cfg.embedding.ctx_size == 0
    assert cfg.generation.runtime == "auto"
    assert cfg.settings.log.format == "auto"
    assert {k for k, v in cfg.sources.items() if v != "default"} == {
        "generation.model", "embedding.model",
    }


# --- booleans, extra args, typed values ------------------------------------------------


def test_no_flag_disables_and_beats_env() -> None:
    """``--no-embedding-enabled`` sets False even when the environment says true."""
    cfg = load("--no-embedding-enabled", env={"LLAMAD_EMBEDDING_ENABLED": "true"})
    assert cfg.embedding.enabled is False
    assert cfg.sources["embedding.enabled"] == "flag"


def test_positive_flag_beats_env_false() -> None:
    """``--embedding-enabled`` sets True over an environment that disables the child."""
    cfg = load("--embedding-enabled", env={"LLAMAD_EMBEDDING_ENABLED": "0"})
    assert cfg.embedding.enabled is True


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("1", True), ("true", True), ("YES", True), (" on ", True),
     ("0", False), ("false", False), ("No", False), ("off", False)],
)
def test_boolean_env_spellings(raw: str, expected: bool) -> None:
    """The usual boolean spellings are understood, case and spaces aside."""
    assert load(env={"LLAMAD_EMBEDDING_ENABLED": raw}).embedding.enabled is expected


def test_toml_booleans(tmp_path: Path) -> None:
    """TOML booleans set boolean options."""
    file = write_toml(tmp_path, "[embedding]\nenabled = false\n")
    assert load(file=file).embedding.enabled is False


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("", ()),
        ("--flash-attn on", ("--flash-attn", "on")),
        ("  --swa-full\t--no-kv-offload  \n -ngl 0 ", ("--swa-full", "--no-kv-offload",
                                                       "-ngl", "0")),
    ],
)
def test_extra_args_split_on_whitespace(raw: str, expected: tuple[str, ...]) -> None:
    """extra_args becomes a tuple of words split on any whitespace, empty words dropped."""
    cfg = load(f"--generation-extra-args={raw}")
    assert cfg.generation.extra_argv == expected
    assert cfg.embedding.extra_argv == ()


def test_values_land_in_the_typed_config(tmp_path: Path) -> None:
    """File values reach RestartPolicy, Timeouts, Limits and the other typed fields."""
    file = write_toml(tmp_path, """
listen = "unix:/run/l.sock"
llama_bin = "/opt/llama-server"
drain_grace = 12.5
[generation]
model = "/m/g.gguf"
runtime = "bundled"
ctx_size = 2048
threads = 3
parallel = 2
batch = 128
[embedding]
model = "/m/e.gguf"
runtime = "llama-server"
[restart]
backoff_base = 0.25
backoff_cap = 8
breaker_failures = 9
breaker_reset = 42
breaker_cooldown = 0
[child]
start_timeout = 11
start_cap = 99
probe_interval = 1.5
probe_timeout = 0.5
probe_failures = 4
stop_grace = 2
request_timeout = 120
log_lines = 50
[log]
format = "json"
level = "debug"
[limits]
max_prompt_chars = 1000
max_messages = 10
default_max_tokens = 20
max_tokens = 200
max_stop = 0
max_embed_batch = 16
max_embed_chars = 500
max_message_bytes = 4096
""")
    cfg = config.load(None, env={}, file=file)
    assert cfg.settings.listen == "unix:/run/l.sock"
    assert cfg.settings.llama_bin == "/opt/llama-server"
    assert cfg.settings.drain_grace == 12.5
    gen = cfg.child("generation")
    assert (gen.model, gen.runtime, gen.ctx_size, gen.threads, gen.parallel, gen.batch) == (
        "/m/g.gguf", "bundled", 2048, 3, 2, 128)
    assert cfg.child("embedding").runtime == "llama-server"
    assert cfg.policy == RestartPolicy(base=0.25, cap=8.0, max_failures=9, stable_after=42.0,
                                       cooldown=None)
    assert cfg.timeouts == Timeouts(start=11.0, start_cap=99.0, probe_interval=1.5,
                                    probe_timeout=0.5, probe_failures=4, stop_grace=2.0)
    assert cfg.settings.child.request_timeout == 120.0
    assert cfg.settings.child.log_lines == 50
    assert (cfg.settings.log.format, cfg.settings.log.level) == ("json", "debug")
    assert cfg.settings.limits == config.Limits(
        max_prompt_chars=1000, max_messages=10, default_max_tokens=20, max_tokens=200,
        max_stop=0, max_embed_batch=16, max_embed_chars=500, queue_size=32,
        max_message_bytes=4096,
    )
    assert isinstance(cfg.policy.cap, float)
    assert isinstance(cfg.timeouts.probe_failures, int)


def test_default_policy_and_timeouts_match_supervisor_defaults() -> None:
    """Unset, the restart policy and timeouts are the supervisor's documented defaults."""
    cfg = load()
    assert cfg.policy == RestartPolicy()
    assert cfg.timeouts == Timeouts()


@pytest.mark.parametrize(("section", "cls"), [("retrieval", config.RetrievalSettings),
                                              ("answer", config.AnswerConfig),
                                              ("limits", config.Limits)])
def test_typed_sections_have_a_field_per_option(section: str, cls: type) -> None:
    """Each field of a typed section is one option of the section, typed as the option
    (a list option is a tuple of strings), and every option of the section is a field."""
    hints = typing.get_type_hints(cls)
    kinds = {o.key.removeprefix(section + "."): o.kind for o in OPTIONS
             if o.key.startswith(section + ".")}
    assert [f.name for f in dataclasses.fields(cls)] == list(kinds)
    for name, kind in kinds.items():
        assert hints[name] == (tuple[str, ...] if kind is list else kind), name
    loaded = getattr(load().settings, section)
    assert isinstance(loaded, cls)
    assert {name: getattr(loaded, name) for name in kinds} == {
        name: o.default for o in OPTIONS for name in [o.key.removeprefix(section + ".")]
        if o.key.startswith(section + ".")}
