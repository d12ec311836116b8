"""Inference modes in configuration (validated at load, one line naming the option) and
endpoint failures as gRPC status codes."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from daemon import config
from daemon.config import ConfigError
from daemon.errors import DEFAULT_RETRY_AFTER, Mapped, map_error
from supervisor import EndpointError, EndpointSpec, TokenizeUnavailableError

GEN = {"LLAMAD_GENERATION_MODEL": "/m/gen.gguf"}
EMB = {"LLAMAD_EMBEDDING_MODEL": "/m/emb.gguf"}


def load(env: dict[str, str], file: Path | None = None) -> config.Config:
    return config.load(None, env=env, file=file)


def test_default_mode_is_embedded() -> None:
    """Without mode settings both roles are supervised children, as before."""
    cfg = load({**GEN, **EMB})
    assert (cfg.generation.mode, cfg.embedding.mode) == ("embedded", "embedded")
    assert cfg.generation.endpoint() is None


def test_endpoint_mode_needs_no_model(tmp_path: Path) -> None:
    """An endpoint role needs a URL, not a GGUF file; the key comes from a 0600 file."""
    key = tmp_path / "key"
    key.write_text("sk-1\n")
    key.chmod(0o600)
    file = tmp_path / "llamad.toml"
    file.write_text(
        '[generation]\nmode = "endpoint"\nendpoint_url = "http://10.0.0.5:8080/v1"\n'
        f'endpoint_model = "qwen"\napi_key_file = "{key}"\n')
    cfg = load(EMB, file)
    assert cfg.generation.mode == "endpoint"
    assert cfg.generation.enabled
    assert cfg.generation.endpoint() == EndpointSpec("http://10.0.0.5:8080/v1", "qwen",
                                                     str(key), "")
    assert cfg.embedding.mode == "embedded"


def test_enabled_false_is_disabled_mode() -> None:
    """The older ``enabled = false`` means mode "disabled"; no model is needed."""
    cfg = load({**GEN, "LLAMAD_EMBEDDING_ENABLED": "false"})
    assert cfg.embedding.mode == "disabled"
    assert not cfg.embedding.enabled
    cfg = load({**GEN, "LLAMAD_EMBEDDING_MODE": "disabled"})
    assert not cfg.embedding.enabled


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"LLAMAD_GENERATION_MODE": "endpoint"},
         r"^generation\.endpoint_url: endpoint mode needs a URL \(set "
         r"--generation-endpoint-url or LLAMAD_GENERATION_ENDPOINT_URL\)"),
        ({"LLAMAD_GENERATION_MODE": "remote"},
         r"^generation\.mode \(from env LLAMAD_GENERATION_MODE\): 'remote' is not one of "
         r"embedded, endpoint, disabled"),
        ({"LLAMAD_GENERATION_MODE": "endpoint",
          "LLAMAD_GENERATION_ENDPOINT_URL": "ftp://host/v1"},
         r"^generation\.endpoint_url: 'ftp://host/v1': the scheme must be http or https"),
        ({"LLAMAD_GENERATION_MODE": "endpoint",
          "LLAMAD_GENERATION_ENDPOINT_URL": "http://h:1/v1",
          "LLAMAD_GENERATION_API_KEY_ENV": "sk-abc def"},
         r"^generation\.api_key_env: 'sk-abc def' is not an environment variable name"),
        ({"LLAMAD_GENERATION_MODE": "endpoint",
          "LLAMAD_GENERATION_ENDPOINT_URL": "http://h:1/v1",
          "LLAMAD_GENERATION_API_KEY_ENV": "LLM_KEY"},
         r"^generation\.api_key_env: environment variable LLM_KEY \(api_key_env\) is not "
         r"set or empty"),
        ({"LLAMAD_GENERATION_MODE": "endpoint",
          "LLAMAD_GENERATION_ENDPOINT_URL": "http://h:1/v1",
          "LLAMAD_GENERATION_API_KEY_ENV": "K", "LLAMAD_GENERATION_API_KEY_FILE": "/k"},
         r"^generation\.api_key_file and generation\.api_key_env: set one, not both"),
        ({"LLAMAD_GENERATION_ENABLED": "false", "LLAMAD_GENERATION_MODE": "endpoint",
          "LLAMAD_GENERATION_ENDPOINT_URL": "http://h:1/v1"},
         r"^generation\.enabled = false conflicts with generation\.mode = endpoint"),
    ],
)
def test_bad_mode_settings_are_refused(env: dict[str, str], match: str) -> None:
    """Each inconsistent mode setting is refused at load, naming the option."""
    with pytest.raises(ConfigError, match=match):
        load({**EMB, **env})


def test_world_readable_key_file_stops_the_daemon(tmp_path: Path) -> None:
    """A key file everyone may read is a configuration error (the key is not shown)."""
    key = tmp_path / "key"
    key.write_text("sk-visible\n")
    key.chmod(0o644)
    with pytest.raises(ConfigError, match=r"^generation\.api_key_file: API key file .* is "
                       r"readable or writable by group or others") as err:
        load({**EMB, "LLAMAD_GENERATION_MODE": "endpoint",
              "LLAMAD_GENERATION_ENDPOINT_URL": "http://h:1/v1",
              "LLAMAD_GENERATION_API_KEY_FILE": str(key)})
    assert "sk-visible" not in str(err.value)


def test_key_env_is_checked_in_the_given_environment() -> None:
    """api_key_env names a variable that must be set; its value is never kept in Config."""
    cfg = load({**EMB, "LLAMAD_GENERATION_MODE": "endpoint",
                "LLAMAD_GENERATION_ENDPOINT_URL": "http://h:1/v1",
                "LLAMAD_GENERATION_API_KEY_ENV": "LLM_KEY", "LLM_KEY": "sk-secret"})
    assert cfg.generation.api_key_env == "LLM_KEY"
    assert "sk-secret" not in repr(cfg)


@pytest.mark.parametrize(
    ("exc", "code", "message", "retry_after"),
    [
        (EndpointError("refused", "GET http://h:1/v1/models: connection refused",
                       permanent=False),
         grpc.StatusCode.UNAVAILABLE,
         "inference endpoint failed (refused): GET http://h:1/v1/models: connection refused",
         DEFAULT_RETRY_AFTER),
        (EndpointError("auth", "the endpoint refused the API key (HTTP 401)", permanent=True,
                       status=401),
         grpc.StatusCode.FAILED_PRECONDITION,
         "inference endpoint failed (auth): the endpoint refused the API key (HTTP 401)",
         None),
        (TokenizeUnavailableError("tokenization not available from this endpoint"),
         grpc.StatusCode.FAILED_PRECONDITION,
         "tokenization not available from this endpoint", None),
    ],
)
def test_endpoint_errors_map_to_status(exc: BaseException, code: grpc.StatusCode,
                                       message: str, retry_after: float | None) -> None:
    """A transient endpoint failure is UNAVAILABLE with a retry hint; one that needs an
    operator (a wrong key) is FAILED_PRECONDITION; a missing tokenizer too."""
    assert map_error(exc) == Mapped(code, message, retry_after)
