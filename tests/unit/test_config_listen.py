"""Configuration of access: where the daemon may listen (loopback and unix sockets; beyond
loopback only with TLS and authentication; LAN addresses and garbage refused), unix socket
paths, TLS and token options checked at load, and the allowed roots of directory sources.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon import config
from daemon.config import ConfigError, check_listen
from tests.support.config_load import load, write_toml

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
    assert load(env={"LLAMAD_LISTEN": "unix:/tmp/l.sock"}).settings.listen == "unix:/tmp/l.sock"


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
    assert load(env={"LLAMAD_LISTEN": "unix:l.sock", "LLAMAD_STATE_DIR": "/s"}).settings.listen == \
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
    assert load().settings.retrieval.allowed_roots == ()
    assert load(env={"LLAMAD_RETRIEVAL_ALLOWED_ROOTS": "/srv/docs:/srv/kb:"}
                ).settings.retrieval.allowed_roots == ("/srv/docs", "/srv/kb")
    assert load("--retrieval-allowed-roots", "/a").settings.retrieval.allowed_roots == ("/a",)
    file = write_toml(tmp_path, '[retrieval]\nallowed_roots = ["/srv/docs", "/srv/kb"]\n')
    assert load(file=file).settings.retrieval.allowed_roots == ("/srv/docs", "/srv/kb")
    with pytest.raises(ConfigError, match=r"retrieval.allowed_roots: 'docs' is not an absolute"):
        load(env={"LLAMAD_RETRIEVAL_ALLOWED_ROOTS": "docs"})
    file = write_toml(tmp_path, "[retrieval]\nallowed_roots = [1]\n")
    with pytest.raises(ConfigError, match=r"retrieval.allowed_roots .from file.*not a list"):
        load(file=file)
