"""Access rules without a daemon: every RPC has a role, token files and their checks,
constant-time lookups, TLS material checks, and where directory sources may live."""

from __future__ import annotations

import hmac
import importlib
import pkgutil
import shutil
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2

import llamad_protocol.v1
from daemon.config import access
from daemon.config.access import AccessError, load_tls, load_tokens
from daemon.grpcapi import auth
from retrieval import SourceNotAllowed, check_root
from tests.support.pki import Pki

TOKEN_A = "a" * 8 + "0123456789abcdef"
TOKEN_B = "b" * 8 + "fedcba9876543210"


def _services() -> dict[str, list[str]]:
    """Every service in the generated llamad protos (all of proto/llamad/v1/*.proto)."""
    found: dict[str, list[str]] = {}
    for module in pkgutil.iter_modules(llamad_protocol.v1.__path__):
        if not module.name.endswith("_pb2"):
            continue
        pb2 = importlib.import_module(f"llamad_protocol.v1.{module.name}")
        for service in pb2.DESCRIPTOR.services_by_name.values():
            found[service.full_name] = [m.name for m in service.methods]
    return found


def test_every_rpc_of_every_service_has_a_role() -> None:
    """A new RPC without a role fails here (and would be refused at run time)."""
    services = _services()
    assert {"llamad.v1.InferenceService", "llamad.v1.ControlService",
            "llamad.v1.RetrievalService", "llamad.v1.AnswerService"} <= set(services)
    reflection = reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"]
    services[reflection.full_name] = [m.name for m in reflection.methods]
    expected = {f"/{svc}/{name}" for svc, names in services.items() for name in names}
    missing = expected - set(auth.METHOD_ROLES)
    assert not missing, f"RPCs without an access role in daemon/grpcapi/auth.py: {sorted(missing)}"
    stale = set(auth.METHOD_ROLES) - expected
    assert not stale, f"roles for RPCs that do not exist: {sorted(stale)}"
    assert set(auth.METHOD_ROLES.values()) <= set(access.ROLES)


def test_roles_of_state_changing_rpcs() -> None:
    """Everything that changes state, or shows a child's raw output, needs admin; the rest
    read. Health is public."""
    admin = {m.rsplit("/", 1)[1] for m, r in auth.METHOD_ROLES.items() if r == access.ADMIN}
    assert admin == {"TailLogs", "Swap", "Reset", "SetMode", "SetDraining", "UpsertDocument",
                     "DeleteDocument", "AddSource", "RemoveSource", "Reindex", "Reprocess",
                     "SetSourceDisabled", "ApproveDocument", "RejectDocument", "LoadModel",
                     "UnloadModel"}
    health = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
    assert (health,) == auth.PUBLIC_SERVICES


def write_private(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def test_token_file_is_read_with_roles(tmp_path: Path) -> None:
    """Comments and blank lines are skipped; tokens are kept as digests only."""
    table = load_tokens(write_private(tmp_path / "t", f"# ops\n\nread {TOKEN_A}\n"
                                                     f"  admin   {TOKEN_B}  \n"))
    assert table.role_of(TOKEN_A) == "read"
    assert table.role_of(TOKEN_B) == "admin"
    assert table.role_of("c" * 24) is None
    assert table.role_of(TOKEN_A[:-1]) is None
    assert table.role_of("") is None
    assert TOKEN_A not in repr(table) and TOKEN_A.encode() not in repr(table).encode()
    assert all(TOKEN_A not in str(e.digest) for e in table.entries)
    assert {r: len(f) for r, f in table.roles().items()} == {"read": 1, "admin": 1}


def test_every_token_is_compared_without_early_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lookup compares the presented token with every configured one, in constant time,
    whether the first one matches or none does."""
    lines = "".join(f"read {chr(ord('c') + i) * 24}\n" for i in range(5))
    table = load_tokens(write_private(tmp_path / "t", f"admin {TOKEN_B}\n{lines}"))
    calls: list[int] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append(1)
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", counting)
    assert table.role_of(TOKEN_B) == "admin"
    assert len(calls) == 6
    calls.clear()
    assert table.role_of("nope" * 6) is None
    assert len(calls) == 6


@pytest.mark.parametrize(
    ("text", "mode", "match"),
    [
        (f"read {TOKEN_A}\n", 0o644, r"readable by everyone \(mode 0644\)"),
        (f"read {TOKEN_A}\n", 0o602, r"writable by everyone \(mode 0602\)"),
        ("# nothing\n\n", 0o600, "holds no token"),
        (f"reader {TOKEN_A}\n", 0o600, "line 1: unknown role 'reader'"),
        (f"# c\nread {TOKEN_A} extra\n", 0o600, "line 2: term 1 after the token is not one"),
        (f"{TOKEN_A}\n", 0o600, "line 1: expected '<role> <token>'"),
        ("read short\n", 0o600, "line 1: a token must be 16 to 4096 characters long"),
        (f"read {TOKEN_A}\nadmin {TOKEN_A}\n", 0o600, "line 2: the same token as line 1"),
        ("read " + "é" * 20 + "\n", 0o600, "visible ASCII"),
    ],
)
def test_bad_token_files_are_refused_without_showing_tokens(
    tmp_path: Path, text: str, mode: int, match: str
) -> None:
    path = write_private(tmp_path / "tokens", text, mode)
    with pytest.raises(AccessError, match=match) as info:
        load_tokens(path)
    assert str(path) in str(info.value)
    assert TOKEN_A not in str(info.value)


def test_token_file_must_be_a_readable_regular_file(tmp_path: Path) -> None:
    with pytest.raises(AccessError, match="No such file"):
        load_tokens(tmp_path / "missing")
    (tmp_path / "dir").mkdir(mode=0o700)
    with pytest.raises(AccessError, match="not a regular file"):
        load_tokens(tmp_path / "dir")
    big = write_private(tmp_path / "big", "#" * (access.MAX_TOKEN_FILE_BYTES + 1))
    with pytest.raises(AccessError, match="larger than"):
        load_tokens(big)


def test_fingerprints_are_short_stable_and_not_the_token() -> None:
    fp = access.fingerprint(TOKEN_A)
    assert fp == access.fingerprint(TOKEN_A) != access.fingerprint(TOKEN_B)
    assert len(fp) == 12 and fp not in TOKEN_A


@pytest.mark.parametrize(
    ("metadata", "token", "why"),
    [
        ((), None, "no token"),
        ((("x-other", "1"),), None, "no token"),
        ((("authorization", "Bearer abc"),), "abc", ""),
        ((("authorization", "bearer   abc "),), "abc", ""),
        ((("authorization", "Basic abc"),), None, "malformed authorization"),
        ((("authorization", "Bearer"),), None, "malformed authorization"),
        ((("authorization", b"Bearer abc"),), "abc", ""),
    ],
)
def test_bearer_metadata(metadata: tuple[tuple[str, str | bytes], ...], token: str | None,
                         why: str) -> None:
    assert auth.bearer(metadata) == (token, why)


# --- TLS material ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.mark.process
def test_tls_material_is_checked(pki: Pki, tmp_path: Path) -> None:
    """A good pair loads (with a client CA: mutual TLS); a mismatched key, garbage, an
    encrypted key, a world-readable key and a CA file without a certificate are refused,
    naming the file."""
    material = load_tls(str(pki.server1.cert), str(pki.server1.key))
    assert not material.require_client_cert
    assert b"PRIVATE KEY" not in repr(material).encode()
    assert load_tls(str(pki.server1.cert), str(pki.server1.key),
                    str(pki.ca.cert)).require_client_cert
    with pytest.raises(AccessError, match="does not match the certificate"):
        load_tls(str(pki.server1.cert), str(pki.server2.key))
    garbage = write_private(tmp_path / "garbage.pem",
                            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
                            0o644)
    with pytest.raises(AccessError, match=f"{garbage}.*not valid PEM"):
        load_tls(str(garbage), str(pki.server1.key))
    with pytest.raises(AccessError, match="holds no PEM private key"):
        load_tls(str(pki.server1.cert), str(write_private(tmp_path / "k", "nothing\n")))
    open_key = tmp_path / "open.key"
    shutil.copy(pki.server1.key, open_key)
    open_key.chmod(0o640)
    load_tls(str(pki.server1.cert), str(open_key))  # group-readable is fine
    open_key.chmod(0o644)
    with pytest.raises(AccessError, match=rf"{open_key} is readable by everyone"):
        load_tls(str(pki.server1.cert), str(open_key))
    encrypted = pki.encrypted_key(pki.server1, tmp_path / "enc.key")
    with pytest.raises(AccessError, match="is encrypted"):
        load_tls(str(pki.server1.cert), str(encrypted))
    with pytest.raises(AccessError, match=r"client CA file .* holds no PEM certificate"):
        load_tls(str(pki.server1.cert), str(pki.server1.key), str(pki.server1.key))


@pytest.mark.process
def test_tls_credentials_switch_only_within_the_same_client_auth(pki: Pki) -> None:
    """The fetcher hands a reloaded certificate over once; turning mutual TLS on needs a
    restart."""
    first = load_tls(str(pki.server1.cert), str(pki.server1.key))
    creds = auth.TlsCredentials(first)
    assert isinstance(creds.server_credentials(), grpc.ServerCredentials)
    assert creds._fetch() is None
    creds.update(load_tls(str(pki.server2.cert), str(pki.server2.key)))
    assert creds._fetch() is not None
    assert creds._fetch() is None
    with pytest.raises(ValueError, match="restart"):
        creds.update(load_tls(str(pki.server1.cert), str(pki.server1.key), str(pki.ca.cert)))


# --- directory sources -------------------------------------------------------------------


def test_check_root_resolves_symlinks_and_dotdot(tmp_path: Path) -> None:
    docs, outside = tmp_path / "docs", tmp_path / "outside"
    (docs / "a").mkdir(parents=True)
    outside.mkdir()
    (docs / "link").symlink_to(outside)
    (tmp_path / "docs-link").symlink_to(docs)
    roots = (str(docs),)
    assert check_root(docs, roots) == docs.resolve()
    assert check_root(docs / "a", roots) == (docs / "a").resolve()
    assert check_root(tmp_path / "docs-link" / "a", roots) == (docs / "a").resolve()
    assert check_root(docs / "a", (str(tmp_path / "docs-link"),)) == (docs / "a").resolve()
    for path in (outside, docs / ".." / "outside", docs / "link", docs / "a" / ".." / "..",
                 tmp_path / "docsx"):
        with pytest.raises(SourceNotAllowed, match=r"outside retrieval.allowed_roots") as info:
            check_root(path, roots)
        assert info.value.configured
    # A root given with '..' is the directory it names, nothing more.
    sneaky = (str(docs / "a" / ".." / ".." / "docs"),)
    assert check_root(docs / "a", sneaky) == (docs / "a").resolve()
    with pytest.raises(SourceNotAllowed):
        check_root(outside, sneaky)
    with pytest.raises(SourceNotAllowed, match=r"disabled until retrieval.allowed_roots") as info:
        check_root(docs, ())
    assert not info.value.configured
