"""The PostgreSQL store's connection settings, without a server: how a DSN is shown, the
password's sources and refusals, and the scan-lock keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from retrieval.errors import StoreUnavailable
from retrieval.postgres._connect import PgOptions, check_dsn, describe, read_password, scrub
from retrieval.postgres._locks import scan_lock_key

SECRET = "hunter2-Pg"


@pytest.mark.parametrize(("dsn", "shown"), [
    ("postgresql://llamad@db.example.net:6432/kb", "llamad@db.example.net:6432/kb"),
    (f"postgresql://llamad:{SECRET}@db.example.net/kb", "llamad@db.example.net/kb"),
    (f"host=/run/postgresql dbname=kb password={SECRET}", "/run/postgresql/kb"),
    ("dbname=kb", "local socket/kb"),
    (f"host=x port {SECRET}", "(unparsable DSN)"),
])
def test_describe_names_the_server_never_the_password(dsn: str, shown: str) -> None:
    """A DSN is shown as user@host:port/db, whatever it holds."""
    assert describe(dsn) == shown


def test_a_dsn_with_a_password_or_unparsable_is_refused_without_echo() -> None:
    """The refusal says what is wrong and where the password goes, not what it is."""
    for dsn in (f"postgresql://u:{SECRET}@h/db", f"host=h password={SECRET}",
                f"host=h port {SECRET}"):
        with pytest.raises(StoreUnavailable) as refused:
            check_dsn(dsn)
        assert SECRET not in str(refused.value)
    check_dsn("postgresql://u@h/db")  # no password: accepted


def test_the_password_comes_from_a_file_or_a_variable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file's first line wins over the variable; neither set means none; a missing
    file or variable is a clear refusal."""
    path = tmp_path / "pw"
    path.write_text(f"{SECRET}\nignored\n")
    monkeypatch.setenv("LLAMAD_PG_PW", "from-env")
    assert read_password(PgOptions("dbname=kb", password_file=str(path),
                                   password_env="LLAMAD_PG_PW")) == SECRET
    assert read_password(PgOptions("dbname=kb", password_env="LLAMAD_PG_PW")) == "from-env"
    assert read_password(PgOptions("dbname=kb")) is None
    with pytest.raises(StoreUnavailable, match="cannot read the PostgreSQL password file"):
        read_password(PgOptions("dbname=kb", password_file=str(tmp_path / "none")))
    with pytest.raises(StoreUnavailable, match="LLAMAD_PG_UNSET is not set"):
        read_password(PgOptions("dbname=kb", password_env="LLAMAD_PG_UNSET"))
    assert scrub(f"failed for {SECRET}!", SECRET) == "failed for ***!"


def test_scan_lock_keys_are_stable_signed_bigints() -> None:
    """Every node computes the same key for a source, within Postgres's bigint."""
    keys = {source: scan_lock_key(source) for source in ("docs", "ops", "docs-2")}
    assert len(set(keys.values())) == 3
    assert all(-(2 ** 63) <= key < 2 ** 63 for key in keys.values())
    assert keys["docs"] == -6534733181783198581  # sha256("llamad.scan:docs")[:8], signed
