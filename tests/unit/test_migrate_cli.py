"""``llamad retrieval migrate``'s options: the state directory and the PostgreSQL options
come from a flag, else the ``LLAMAD_*`` variable, else the ``--config`` file, as for
``llamad serve``; what ``serve`` refuses in them is refused here too, before any
connection. (The migration itself: tests/integration/test_pg_migrate.py.)"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from daemon.cli import _parser, main
from daemon.config._options import ConfigError
from daemon.ops.migrate_cli import resolve


def parse(*argv: str) -> argparse.Namespace:
    return _parser().parse_args(["retrieval", "migrate", "--to", "postgres", *argv])


def test_flag_beats_env_beats_file(tmp_path: Path) -> None:
    """The file gives every value; the variable overrides the DSN; the flag the state
    directory; the password file comes from the file alone."""
    config = tmp_path / "llamad.toml"
    config.write_text('state_dir = "/srv/from-file"\n'
                      '[retrieval]\n'
                      'store = "embedded"\n'
                      'postgres_dsn = "host=file.example.net dbname=kb"\n'
                      'postgres_password_file = "/etc/llamad/kb-password"\n'
                      'chunk_size = 900\n'
                      '[generation]\nthreads = 3\n')
    env = {"LLAMAD_RETRIEVAL_POSTGRES_DSN": "host=env.example.net dbname=kb"}
    state, options = resolve(parse("--config", str(config)), env)
    assert state == Path("/srv/from-file")
    assert options.dsn == "host=env.example.net dbname=kb"
    assert options.password_file == "/etc/llamad/kb-password"
    state, options = resolve(parse("--config", str(config), "--state-dir", "/srv/flag",
                                   "--retrieval-postgres-dsn", "host=flag dbname=kb"), env)
    assert (state, options.dsn) == (Path("/srv/flag"), "host=flag dbname=kb")


def test_the_config_file_can_come_from_llamad_config(tmp_path: Path) -> None:
    config = tmp_path / "llamad.toml"
    config.write_text('[retrieval]\npostgres_dsn = "host=db dbname=kb"\n')
    _, options = resolve(parse(), {"LLAMAD_CONFIG": str(config)})
    assert options.dsn == "host=db dbname=kb"


@pytest.mark.parametrize(("env", "problem"), [
    ({}, "needs retrieval.postgres_dsn"),
    ({"LLAMAD_RETRIEVAL_POSTGRES_DSN": "host=db password=hunter2"}, "password"),
    ({"LLAMAD_RETRIEVAL_POSTGRES_DSN": "host=db",
      "LLAMAD_RETRIEVAL_POSTGRES_PASSWORD_FILE": "/etc/pw",
      "LLAMAD_RETRIEVAL_POSTGRES_PASSWORD_ENV": "PW"}, "both set"),
    ({"LLAMAD_RETRIEVAL_POSTGRES_DSN": "host=db",
      "LLAMAD_RETRIEVAL_POSTGRES_PASSWORD_FILE": "pw.txt"}, "not an absolute path"),
])
def test_what_serve_refuses_is_refused(env: dict[str, str], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem) as caught:
        resolve(parse(), env)
    assert "hunter2" not in str(caught.value)


def test_a_state_dir_without_a_store_is_exit_status_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Refused before any connection (the DSN names no server that exists)."""
    assert main(["retrieval", "migrate", "--to", "postgres", "--state-dir", str(tmp_path),
                 "--retrieval-postgres-dsn", "host=db.invalid dbname=kb"]) == 2
    assert "no embedded retrieval store" in capsys.readouterr().err
