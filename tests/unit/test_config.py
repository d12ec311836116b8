"""Configuration: flag > env > file > default, every option documented in ``--help``, and
each bad value refused with one line naming the option and where the value came from."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest

import models
from daemon import cli, config
from daemon.config import OPTIONS, Config, ConfigError, check_listen
from models import Manifest, ManifestEntry
from supervisor import RestartPolicy, Timeouts

ROOT = Path(__file__).resolve().parents[2]
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
    assert load("--config", str(file)).drain_grace == 7.5
    assert load(env={"LLAMAD_CONFIG": str(file)}).drain_grace == 7.5
    assert load().drain_grace == 30.0


def test_defaults_when_nothing_is_set() -> None:
    """With only the models set, every value is its declared default."""
    cfg = load()
    assert cfg.listen == "127.0.0.1:50051"
    assert cfg.generation.parallel == 4
    assert cfg.embedding.ctx_size == 0
    assert cfg.generation.runtime == "auto"
    assert cfg.log_format == "auto"
    assert {k for k, v in cfg.sources.items() if v != "default"} == {
        "generation.model", "embedding.model",
    }


# --- help ------------------------------------------------------------------------------


def _option_blocks(text: str) -> dict[str, str]:
    """Map each flag of an option entry in argparse help to the entry's whole text."""
    blocks: dict[str, str] = {}
    current: list[str] = []
    for line in [*text.splitlines(), "  -end"]:
        if re.match(r"^  -", line) or not line.strip():
            if current:
                entry = " ".join(" ".join(current).split())
                for flag in re.findall(r"(?<![\w-])(--?[\w-]+)", current[0]):
                    blocks[flag] = entry
            current = [line] if line.strip() else []
        elif current:
            current.append(line)
    return blocks


def test_every_option_in_serve_help_with_its_env(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``llamad serve --help`` lists every option's flag, with its env variable in its entry."""
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit) as exit_info:
        cli._parser().parse_args(["serve", "--help"])
    assert exit_info.value.code == 0
    blocks = _option_blocks(capsys.readouterr().out)
    for opt in OPTIONS:
        assert opt.flag in blocks, opt.key
        assert f"Env: {opt.env}." in blocks[opt.flag], opt.key
        if opt.kind is bool:
            assert "--no-" + opt.flag[2:] in blocks, opt.key
    assert "--config" in blocks
    assert "LLAMAD_CONFIG" in blocks["--config"]


@pytest.mark.process
def test_serve_help_subprocess_lists_every_env_variable() -> None:
    """The real entry point ``python -m daemon serve --help`` exits 0 naming every variable."""
    proc = subprocess.run(
        [sys.executable, "-m", "daemon", "serve", "--help"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "COLUMNS": "100"},
    )
    assert proc.returncode == 0, proc.stderr
    missing = [opt.env for opt in OPTIONS if opt.env not in proc.stdout]
    assert missing == []


def test_flags_env_names_and_keys_are_unique() -> None:
    """No two options share a flag, an env variable or a destination."""
    for attr in ("key", "flag", "env", "dest"):
        names = [getattr(opt, attr) for opt in OPTIONS]
        assert len(names) == len(set(names)), attr


# --- bad values ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "env", "toml", "key", "source", "why"),
    [
        ([], {"LLAMAD_GENERATION_THREADS": "four"}, None,
         "generation.threads", "env LLAMAD_GENERATION_THREADS", "four"),
        (["--generation-threads", "2.5"], {}, None,
         "generation.threads", "flag --generation-threads", "2.5"),
        ([], {}, "[generation]\nthreads = 2.5\n",
         "generation.threads", "file", "not an integer"),
        ([], {}, "[generation]\nthreads = true\n",
         "generation.threads", "file", "not an integer"),
        ([], {"LLAMAD_EMBEDDING_ENABLED": "maybe"}, None,
         "embedding.enabled", "env LLAMAD_EMBEDDING_ENABLED", "not a boolean"),
        ([], {}, '[embedding]\nenabled = "maybe"\n',
         "embedding.enabled", "file", "not a boolean"),
        ([], {"LLAMAD_RESTART_BACKOFF_BASE": "nan"}, None,
         "restart.backoff_base", "env LLAMAD_RESTART_BACKOFF_BASE", "not a finite number"),
        ([], {"LLAMAD_CHILD_STOP_GRACE": "inf"}, None,
         "child.stop_grace", "env LLAMAD_CHILD_STOP_GRACE", "not a finite number"),
        (["--drain-grace=-inf"], {}, None,
         "drain_grace", "flag --drain-grace", "not a finite number"),
        ([], {}, "[restart]\nbackoff_cap = nan\n",
         "restart.backoff_cap", "file", "not a finite number"),
        ([], {}, "[generation]\nthreads = inf\n",
         "generation.threads", "file", "not an integer"),
        ([], {"LLAMAD_GENERATION_PARALLEL": "0"}, None,
         "generation.parallel", "env LLAMAD_GENERATION_PARALLEL", "below the minimum 1"),
        (["--limits-max-message-bytes", "1000"], {}, None,
         "limits.max_message_bytes", "flag --limits-max-message-bytes",
         "below the minimum 1024"),
        ([], {}, "[child]\nprobe_interval = 0.01\n",
         "child.probe_interval", "file", "below the minimum 0.05"),
        ([], {"LLAMAD_LOG_FORMAT": "xml"}, None,
         "log.format", "env LLAMAD_LOG_FORMAT", "not one of auto, json, console"),
        ([], {}, '[generation]\nruntime = "vllm"\n',
         "generation.runtime", "file", "not one of auto, llama-server, bundled"),
        ([], {}, "listen = 50051\n", "listen", "file", "not a string"),
    ],
)
def test_bad_value_names_option_and_source(
    tmp_path: Path,
    argv: list[str],
    env: dict[str, str],
    toml: str | None,
    key: str,
    source: str,
    why: str,
) -> None:
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


# --- listen ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "listen",
    [
        "127.0.0.1:50051",
        "127.0.0.1:0",
        "127.1.2.3:65535",
        "localhost:50051",
        "[::1]:50051",
        "unix:/run/llamad/llamad.sock",
        "unix:///run/llamad/llamad.sock",
        "unix:relative.sock",
    ],
)
def test_check_listen_accepts_loopback_and_unix(listen: str) -> None:
    """Loopback host:port and unix socket paths are accepted."""
    check_listen(listen)


@pytest.mark.parametrize(
    ("listen", "match"),
    [
        ("0.0.0.0:50051", "not a loopback address"),
        ("[::]:50051", "not a loopback address"),
        ("192.168.1.10:50051", "not a loopback address"),
        ("10.0.0.7:50051", "not a loopback address"),
        ("example.com:50051", "not a loopback address"),
        # A DNS name that merely starts like a loopback address can resolve anywhere.
        ("127.example.com:50051", "not a loopback address"),
        ("127.0.0.1.attacker.example:50051", "not a loopback address"),
        (":50051", "not a loopback address"),
        ("garbage", "not host:port"),
        ("127.0.0.1", "not host:port"),
        ("127.0.0.1:http", "not host:port"),
        ("127.0.0.1:70000", "not host:port"),
        ("127.0.0.1:-1", "not host:port"),
        ("unix:", "unix socket path is empty"),
        ("unix:///", "unix socket path is empty"),
    ],
)
def test_check_listen_refuses_non_loopback_and_garbage(listen: str, match: str) -> None:
    """Anything but loopback or a unix socket is refused, naming the listen option."""
    with pytest.raises(ConfigError, match=rf"^listen: .*{match}"):
        check_listen(listen)


def test_load_refuses_lan_listen_from_env() -> None:
    """The listen check runs on load, whatever the source of the value."""
    with pytest.raises(ConfigError, match="not a loopback address"):
        load(env={"LLAMAD_LISTEN": "0.0.0.0:50051"})
    assert load(env={"LLAMAD_LISTEN": "unix:/tmp/l.sock"}).listen == "unix:/tmp/l.sock"


@pytest.mark.parametrize("listen", ["0.0.0.0:50051", "[::]:0", "192.168.1.10:50051",
                                    "example.com:443", ":50051"])
def test_check_listen_beyond_loopback_needs_tls_and_authentication(listen: str) -> None:
    """TLS alone is not enough: tokens or mutual TLS must say who the client is."""
    with pytest.raises(ConfigError, match=r"^listen: .*requires TLS \(set tls.cert_file"):
        check_listen(listen, authenticated=True)
    with pytest.raises(ConfigError, match=r"^listen: .*requires client authentication too"):
        check_listen(listen, tls=True)
    check_listen(listen, tls=True, authenticated=True)
    check_listen("127.0.0.1:0", tls=True)  # TLS on loopback needs nothing more


def test_unix_socket_paths() -> None:
    """unix:name is relative to the state directory; unix:/abs and unix:///abs are not."""
    state = Path("/var/lib/llamad")
    assert config.unix_socket_path("unix:llamad.sock", state) == state / "llamad.sock"
    assert config.unix_socket_path("unix:/run/l.sock", state) == Path("/run/l.sock")
    assert config.unix_socket_path("unix:///run/l.sock", state) == Path("/run/l.sock")
    assert config.unix_socket_path("127.0.0.1:1", state) is None
    assert load(env={"LLAMAD_LISTEN": "unix:l.sock", "LLAMAD_STATE_DIR": "/s"}).listen == \
        "unix:l.sock"
    with pytest.raises(ConfigError, match="longer than 107 bytes"):
        load(env={"LLAMAD_LISTEN": "unix:" + "x" * 120})


def test_tls_and_token_options_are_checked_at_load(tmp_path: Path) -> None:
    """Half a TLS pair, a client CA without a certificate, a missing token file: one line
    naming the option."""
    with pytest.raises(ConfigError, match=r"^tls.key_file: TLS needs both"):
        load(env={"LLAMAD_TLS_CERT_FILE": "/c.pem"})
    with pytest.raises(ConfigError, match=r"^tls.cert_file: TLS needs both"):
        load("--tls-key-file", "/k.pem")
    with pytest.raises(ConfigError, match=r"^tls.client_ca_file: mutual TLS needs"):
        load(env={"LLAMAD_TLS_CLIENT_CA_FILE": "/ca.pem"})
    with pytest.raises(ConfigError, match=f"^tls: tls certificate {tmp_path}/c.pem: No such"):
        load(env={"LLAMAD_TLS_CERT_FILE": str(tmp_path / "c.pem"),
                  "LLAMAD_TLS_KEY_FILE": str(tmp_path / "k.pem")})
    with pytest.raises(ConfigError, match=f"^auth.token_file: token file {tmp_path}/t: No such"):
        load(env={"LLAMAD_AUTH_TOKEN_FILE": str(tmp_path / "t")})
    tokens = tmp_path / "tokens"
    tokens.write_text("admin 0123456789abcdef0123\n")
    tokens.chmod(0o640)
    cfg = load(env={"LLAMAD_AUTH_TOKEN_FILE": str(tokens)})
    assert cfg.tokens is not None and cfg.tokens.role_of("0123456789abcdef0123") == "admin"
    assert cfg.tls is None
    assert load().tokens is None


def test_allowed_roots(tmp_path: Path) -> None:
    """Empty by default; a TOML list, or ':'-separated in env and flags; absolute only."""
    assert load().retrieval.allowed_roots == ()
    assert load(env={"LLAMAD_RETRIEVAL_ALLOWED_ROOTS": "/srv/docs:/srv/kb:"}
                ).retrieval.allowed_roots == ("/srv/docs", "/srv/kb")
    assert load("--retrieval-allowed-roots", "/a").retrieval.allowed_roots == ("/a",)
    file = write_toml(tmp_path, '[retrieval]\nallowed_roots = ["/srv/docs", "/srv/kb"]\n')
    assert load(file=file).retrieval.allowed_roots == ("/srv/docs", "/srv/kb")
    with pytest.raises(ConfigError, match=r"retrieval.allowed_roots: 'docs' is not an absolute"):
        load(env={"LLAMAD_RETRIEVAL_ALLOWED_ROOTS": "docs"})
    file = write_toml(tmp_path, "[retrieval]\nallowed_roots = [1]\n")
    with pytest.raises(ConfigError, match=r"retrieval.allowed_roots .from file.*not a list"):
        load(file=file)


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
        ("  --mlock\t--no-mmap  \n -ngl 0 ", ("--mlock", "--no-mmap", "-ngl", "0")),
    ],
)
def test_extra_args_split_on_whitespace(raw: str, expected: tuple[str, ...]) -> None:
    """extra_args becomes a tuple of words split on any whitespace, empty words dropped."""
    cfg = load(f"--generation-extra-args={raw}")
    assert cfg.generation.extra_args == expected
    assert cfg.embedding.extra_args == ()


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
    assert cfg.listen == "unix:/run/l.sock"
    assert cfg.llama_bin == "/opt/llama-server"
    assert cfg.drain_grace == 12.5
    gen = cfg.child("generation")
    assert (gen.model, gen.runtime, gen.ctx_size, gen.threads, gen.parallel, gen.batch) == (
        "/m/g.gguf", "bundled", 2048, 3, 2, 128)
    assert cfg.child("embedding").runtime == "llama-server"
    assert cfg.policy == RestartPolicy(base=0.25, cap=8.0, max_failures=9, stable_after=42.0,
                                       cooldown=None)
    assert cfg.timeouts == Timeouts(start=11.0, start_cap=99.0, probe_interval=1.5,
                                    probe_timeout=0.5, probe_failures=4, stop_grace=2.0)
    assert cfg.request_timeout == 120.0
    assert cfg.log_lines == 50
    assert (cfg.log_format, cfg.log_level) == ("json", "debug")
    assert cfg.limits == config.Limits(
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
    loaded = getattr(load(), section)
    assert isinstance(loaded, cls)
    assert {name: getattr(loaded, name) for name in kinds} == {
        name: o.default for o in OPTIONS for name in [o.key.removeprefix(section + ".")]
        if o.key.startswith(section + ".")}
