"""Configuration refusals: each bad value (flag, env or file), unknown choice, unknown TOML
key or section, malformed or missing file, enabled child without a model and inconsistent
combination is refused with one line naming the option, where the value came from, and how
to fix it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from daemon.config import ConfigError
from tests.support.config_load import load, parse, write_toml

# --- bad values ------------------------------------------------------------------------


Case = tuple[list[str], dict[str, str], str | None, str, str, str]
"""A bad value: the flags, the environment and the file text giving it, the option it is
for, where the refusal says it came from ("file": the file's path follows) and what it
says is wrong."""


def from_env(name: str, value: str, key: str, why: str) -> Case:
    return [], {name: value}, None, key, f"env {name}", why


def from_flag(argv: list[str], key: str, why: str) -> Case:
    return argv, {}, None, key, f"flag {argv[0].partition('=')[0]}", why


def from_file(toml: str, key: str, why: str) -> Case:
    return [], {}, toml, key, "file", why


@pytest.mark.parametrize(("argv", "env", "toml", "key", "source", "why"), [
    from_env("LLAMAD_GENERATION_THREADS", "four", "generation.threads", "four"),
    from_flag(["--generation-threads", "2.5"], "generation.threads", "2.5"),
    from_file("[generation]\nthreads = 2.5\n", "generation.threads", "not an integer"),
    from_file("[generation]\nthreads = true\n", "generation.threads", "not an integer"),
    from_env("LLAMAD_EMBEDDING_ENABLED", "maybe", "embedding.enabled", "not a boolean"),
    from_file('[embedding]\nenabled = "maybe"\n', "embedding.enabled", "not a boolean"),
    from_env("LLAMAD_RESTART_BACKOFF_BASE", "nan", "restart.backoff_base", "not a finite number"),
    from_env("LLAMAD_CHILD_STOP_GRACE", "inf", "child.stop_grace", "not a finite number"),
    from_flag(["--drain-grace=-inf"], "drain_grace", "not a finite number"),
    from_file("[restart]\nbackoff_cap = nan\n", "restart.backoff_cap", "not a finite number"),
    from_file("[generation]\nthreads = inf\n", "generation.threads", "not an integer"),
    from_env("LLAMAD_GENERATION_PARALLEL", "0", "generation.parallel", "below the minimum 1"),
    from_flag(["--limits-max-message-bytes", "1000"], "limits.max_message_bytes",
              "below the minimum 1024"),
    from_file("[child]\nprobe_interval = 0.01\n", "child.probe_interval", "below the minimum 0.05"),
    from_env("LLAMAD_LOG_FORMAT", "xml", "log.format", "not one of auto, json, console"),
    from_file('[generation]\nruntime = "vllm"\n', "generation.runtime",
              "not one of auto, llama-server, bundled"),
    from_file("listen = 50051\n", "listen", "not a string"),
])
def test_bad_value_names_option_and_source(tmp_path: Path, argv: list[str],
                                           env: dict[str, str], toml: str | None, key: str,
                                           source: str, why: str) -> None:
    """A bad value is a ConfigError naming the option, its source and what is wrong."""
    file = write_toml(tmp_path, toml) if toml is not None else None
    if source == "file":
        source = f"file {file}"
    with pytest.raises(ConfigError) as exc_info:
        load(*argv, env=env, file=file)
    message = str(exc_info.value)
    assert message.startswith(f"{key} (from {source}): "), message
    assert why in message


def test_bad_choice_flag_is_refused_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    """A flag with a value outside its choices stops argument parsing with status 2."""
    with pytest.raises(SystemExit) as exit_info:
        parse("--log-level", "loud")
    assert exit_info.value.code == 2
    assert "invalid choice: 'loud'" in capsys.readouterr().err


def test_unknown_toml_key_is_refused(tmp_path: Path) -> None:
    """A misspelt file key is an error naming the file and the key, not silently ignored."""
    file = write_toml(tmp_path, "[generation]\nthreds = 4\n")
    with pytest.raises(ConfigError, match=rf"config file {re.escape(str(file))}: "
                       r"unknown setting 'generation\.threds'"):
        load(file=file)


def test_unknown_toml_section_is_refused(tmp_path: Path) -> None:
    """A whole unknown section is refused too."""
    file = write_toml(tmp_path, "[generaton]\nmodel = '/m/x.gguf'\n")
    with pytest.raises(ConfigError, match=r"unknown setting 'generaton\.model'"):
        load(file=file)


def test_malformed_toml_is_refused(tmp_path: Path) -> None:
    """A file that is not valid TOML is a ConfigError naming the file."""
    file = write_toml(tmp_path, "[generation\nthreads = \n")
    with pytest.raises(ConfigError, match=rf"^config file {re.escape(str(file))}: "):
        load(file=file)


def test_missing_file_is_refused(tmp_path: Path) -> None:
    """A config file that does not exist is a ConfigError naming it and the OS reason."""
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match=rf"config file {re.escape(str(missing))}: "
                       "No such file or directory"):
        load(file=missing)


@pytest.mark.parametrize("role", ["generation", "embedding"])
def test_enabled_child_without_model_says_how_to_fix(role: str) -> None:
    """An enabled child with no model and no prepared models is refused with the flag, the
    env, the models directory and how to prepare it, and how to disable the child."""
    other = "embedding" if role == "generation" else "generation"
    env = {f"LLAMAD_{other.upper()}_MODEL": "/m/x.gguf"}
    with pytest.raises(ConfigError) as exc_info:
        load(env=env, models=False)
    message = str(exc_info.value)
    assert message.startswith(f"{role}.model: no model configured")
    assert f"--{role}-model" in message
    assert f"LLAMAD_{role.upper()}_MODEL" in message
    assert f"--no-{role}-enabled" in message
    assert "models_dir /nonexistent/llamad-models has no prepared models" in message
    assert "--models-dir" in message and "LLAMAD_MODELS_DIR" in message
    assert "`python -m models prepare --dest /nonexistent/llamad-models`" in message


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"LLAMAD_RESTART_BACKOFF_BASE": "5", "LLAMAD_RESTART_BACKOFF_CAP": "1"},
         "restart.backoff_cap must be >= restart.backoff_base"),
        ({"LLAMAD_CHILD_START_TIMEOUT": "100", "LLAMAD_CHILD_START_CAP": "50"},
         "child.start_cap must be >= child.start_timeout"),
        ({"LLAMAD_LIMITS_DEFAULT_MAX_TOKENS": "100", "LLAMAD_LIMITS_MAX_TOKENS": "50"},
         "limits.default_max_tokens must be <= limits.max_tokens"),
    ],
)
def test_inconsistent_combinations_are_refused(env: dict[str, str], match: str) -> None:
    """Values valid alone but inconsistent together are a ConfigError, not a crash later."""
    with pytest.raises(ConfigError, match=re.escape(match)):
        load(env=env)
