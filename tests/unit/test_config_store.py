"""``retrieval.store``: the embedded store by default; ``postgres`` needs a DSN without a
password (the password comes from a file or a variable, never echoed), and its options
reach the retriever as :class:`retrieval.PgOptions`."""

from __future__ import annotations

import re

import pytest

from daemon.config import ConfigError
from daemon.services.retrieval_bridge import postgres_from
from retrieval import PgOptions
from tests.support.config_load import load

DSN = "postgresql://llamad@db.example.net:5432/kb"


def test_the_embedded_store_is_the_default() -> None:
    cfg = load()
    assert cfg.settings.retrieval.store == "embedded"
    assert postgres_from(cfg) is None


def test_postgres_options_reach_the_retriever() -> None:
    cfg = load(env={"LLAMAD_RETRIEVAL_STORE": "postgres", "LLAMAD_RETRIEVAL_POSTGRES_DSN": DSN,
                    "LLAMAD_RETRIEVAL_POSTGRES_PASSWORD_ENV": "KB_PASSWORD",
                    "LLAMAD_RETRIEVAL_POSTGRES_STATEMENT_TIMEOUT": "2.5",
                    "LLAMAD_RETRIEVAL_POSTGRES_EF_SEARCH": "64"})
    assert postgres_from(cfg) == PgOptions(DSN, password_env="KB_PASSWORD",
                                           statement_timeout_ms=2500, ef_search=64)


@pytest.mark.parametrize(("env", "match"), [
    ({"LLAMAD_RETRIEVAL_STORE": "postgres"},
     "retrieval.store = postgres needs retrieval.postgres_dsn"),
    ({"LLAMAD_RETRIEVAL_STORE": "postgres", "LLAMAD_RETRIEVAL_POSTGRES_DSN": "host='unclosed"},
     "retrieval.postgres_dsn: the PostgreSQL DSN cannot be parsed"),
    ({"LLAMAD_RETRIEVAL_STORE": "postgres", "LLAMAD_RETRIEVAL_POSTGRES_DSN": DSN,
      "LLAMAD_RETRIEVAL_POSTGRES_PASSWORD_FILE": "/etc/llamad/kb.pw",
      "LLAMAD_RETRIEVAL_POSTGRES_PASSWORD_ENV": "KB_PASSWORD"},
     "are both set: keep one"),
    ({"LLAMAD_RETRIEVAL_STORE": "postgres", "LLAMAD_RETRIEVAL_POSTGRES_DSN": DSN,
      "LLAMAD_RETRIEVAL_POSTGRES_PASSWORD_FILE": "kb.pw"},
     "retrieval.postgres_password_file: 'kb.pw' is not an absolute path"),
    ({"LLAMAD_RETRIEVAL_STORE": "sqlite"}, "not one of embedded, postgres"),
])
def test_an_unusable_store_configuration_is_refused(env: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(match)):
        load(env=env)


def test_a_dsn_holding_a_password_is_refused_without_echoing_it() -> None:
    with pytest.raises(ConfigError) as refused:
        load(env={"LLAMAD_RETRIEVAL_STORE": "postgres",
                  "LLAMAD_RETRIEVAL_POSTGRES_DSN": "postgresql://llamad:s3cr3t-pw@db/kb"})
    message = str(refused.value)
    assert "holds a password" in message and "password_file" in message
    assert "s3cr3t-pw" not in message
