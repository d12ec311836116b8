"""Redaction of the shapes added for issue 18 (part 2), secrets under a password keyword in
files and markup: XML elements and attributes, code assignments, dotfiles and service
configs, llamad's token file, multilingual and PSK keys (a GitHub Actions expression is a
reference, not a secret), and keywords disguised with lookalike letters; one test per shape,
each with the exact output.

Every secret here is fake and assembled at run time (prefix + generated body), so no
literal in this file looks like a live credential to a secret scanner.
"""

from __future__ import annotations

import functools
import random

import pytest

from retrieval.redaction._redactor import redact
from tests.support.redaction import ALNUM, HEX, P, check, fake_body

body = functools.partial(fake_body, random.Random(20261201))


# --- files and markup ----------------------------------------------------------------------


def test_xml_elements_and_attributes() -> None:
    """<password>, <secret>, <apiKey> elements (CDATA too) and password="..." or
    name="password" value="..." attributes lose their value; references stay."""
    check("<db><password>Pw0rd1!</password><apiKey>k3y9</apiKey></db>",
          f"<db><password>{P('password')}</password><apiKey>{P('api_key')}</apiKey></db>",
          {"password": 1, "api_key": 1})
    check("<secret><![CDATA[Pw0rd1!]]></secret>", f"<secret><![CDATA[{P('secret')}]]></secret>",
          {"secret": 1})
    check('<user name="admin" password="Pw0rd1"/>',
          f'<user name="admin" password="{P("password")}"/>', {"password": 1})
    check('<add key="DbPassword" value="Pw0rd1" />', f'<add key="DbPassword" value="'
          f'{P("password")}" />', {"password": 1})
    for text in ("<password>${db.password}</password>", "<password/> is the element",
                 '<property name="password" value="${pw}"/>'):
        assert redact(text).text == text


def test_code_assignments() -> None:
    """os.environ["X_PASSWORD"] = ..., PHP define('DB_PASSWORD', ...) and setPassword("...")
    lose their literal."""
    check("os.environ['DB_PASSWORD'] = 'Pw0rd1'", f"os.environ['DB_PASSWORD'] = '{P('password')}'",
          {"password": 1})
    check("define('DB_PASSWORD', 'Pw0rd1');", f"define('DB_PASSWORD', '{P('password')}');",
          {"password": 1})
    check('ds.setPassword("Pw0rd1");', f'ds.setPassword("{P("password")}");', {"password": 1})


def test_dotfiles_and_service_configs() -> None:
    """.pgpass, .netrc, redis.conf, slapd/nslcd and LDIF passwords are redacted; an IPv6
    address or a time with colons is no .pgpass line."""
    check("db01:5432:app:app_user:Pw0rd1", f"db01:5432:app:app_user:{P('password')}",
          {"password": 1})
    check("machine api.example.com login deploy password Pw0rd1",
          f"machine api.example.com login deploy password {P('password')}", {"password": 1})
    check("requirepass Pw0rd1\nbindpw Pw0rd2\nolcRootPW: {SSHA}abcdefghijklmnop1234",
          f"requirepass {P('password')}\nbindpw {P('password')}\nolcRootPW: {P('password')}",
          {"password": 3})
    for text in ("fe80:0:0:0:1", "12:30:45:10:5"):
        assert redact(text).text == text


def test_llamad_token_file() -> None:
    """llamad's own token file lines (role, then a token of 16+ characters) lose the token;
    comments, prose and <token> placeholders stay."""
    hex_token, b64_token = body(HEX, 32), body(ALNUM + "-_", 43)
    check(f"# NOC\nread   {hex_token}\nadmin {b64_token}\n",
          f"# NOC\nread   {P('llamad_token')}\nadmin {P('llamad_token')}\n",
          {"llamad_token": 2})
    for text in ("read the documentation before the upgrade", "admin <token>",
                 "read /etc/llamad/tokens-production"):
        assert redact(text).text == text


def test_multilingual_and_psk_keys() -> None:
    """Keys named password in German, Spanish, Portuguese, Dutch and French, and psk keys,
    are credentials."""
    check("Passwort=Geheim9\ndb_contrase\u00f1a: Clave9\nDB_SENHA=Senha9\nwachtwoord: W9x\n"
          "mot_de_passe: Azerty9\nwpa_psk=Psk9xyz",
          f"Passwort={P('password')}\ndb_contrase\u00f1a: {P('password')}\n"
          f"DB_SENHA={P('password')}\nwachtwoord: {P('password')}\n"
          f"mot_de_passe: {P('password')}\nwpa_psk={P('secret')}", {"password": 5, "secret": 1})


def test_github_actions_expression_is_a_reference() -> None:
    """${{ secrets.X }} names a secret held elsewhere: it stays."""
    text = "AWS_SECRET_ACCESS_KEY: ${{ secrets.AWS_SECRET }}"
    assert redact(text).text == text


# --- disguised keywords --------------------------------------------------------------------


@pytest.mark.parametrize("key", [
    "\u0440\u0430ssword",                                            # Cyrillic er, a
    "pass\u200bword",                                                # zero-width space
    "\uff50\uff41\uff53\uff53\uff57\uff4f\uff52\uff44",              # full-width
    "p\u03b1ssw\u03bfrd",                                            # Greek alpha, omicron
    "pass\u00adword",                                                # soft hyphen
    "pass\u2060word",                                                # word joiner
    "PASS\u200dWORD",                                                # zero-width joiner
])
def test_disguised_password_keyword(key: str) -> None:
    """``password=`` spelt with look-alike letters or invisible characters is still a
    password assignment, and the key keeps its original characters."""
    check(f"{key}=Hunter2x", f"{key}={P('password')}", {"password": 1})
    check(f"{key}\uff1dHunter2x", f"{key}\uff1d{P('password')}", {"password": 1})


def test_disguised_value_is_removed_whole() -> None:
    """A value with zero-width characters inside is removed whole, not in part."""
    check("login password=hun\u200bter\u200b2 ok", f"login password={P('password')} ok",
          {"password": 1})
