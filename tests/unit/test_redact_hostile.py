"""Redaction of the shapes added for issue 18 (part 2) and issue 25 takes linear time on
hostile megabytes built for the new rules (prefixes, open tags, flags and keywords
repeated).

Every secret here is fake and assembled at run time (prefix + generated body), so no
literal in this file looks like a live credential to a secret scanner.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable

import pytest

from retrieval.redaction._redactor import redact
from tests.support.redaction import ALNUM, fake_body
from tests.support.scaling import assert_linear

body = functools.partial(fake_body, random.Random(20261201))


# --- linear time on hostile input ----------------------------------------------------------

MB = 1_000_000


def fill(size: int, unit: str) -> str:
    return (unit * (size // len(unit) + 1))[:size]


HOSTILE: dict[str, Callable[[int], str]] = {
    "stripe-prefixes": lambda n: fill(n, "sk" + "_live_"),
    "xml-open-tags": lambda n: fill(n, "<password>"),
    "xml-unclosed": lambda n: fill(n, "<password>a</passw"),
    "curl-users": lambda n: fill(n, "curl -u a:"),
    "mysql-flags": lambda n: fill(n, "mysql -p"),
    "base64-run": lambda n: fill(n, body(ALNUM + "/+", 40)),
    "base64-words": lambda n: fill(n, body(ALNUM + "/+", 40) + " "),
    "shadow-prefix": lambda n: fill(n, "root:$6$"),
    "crypt-prefix": lambda n: fill(n, "$6$aaaaaaaa"),
    "dollars": lambda n: fill(n, "$"),
    "putty-headers": lambda n: fill(n, "PuTTY-User-Key-File-2: x\n"),
    "begin-no-dashes": lambda n: fill(n, "BEGIN PRIVATE KEY"),
    "dashes": lambda n: fill(n, "-"),
    "em-dashes": lambda n: fill(n, "\u2014BEGIN RSA PRIVATE KEY\u2014\n"),
    "zero-width-keywords": lambda n: fill(n, "pass\u200bword="),
    "cyrillic-keywords": lambda n: fill(n, "\u0440\u0430ssword="),
    "full-width-keywords": lambda n: fill(
        n, "\uff50\uff41\uff53\uff53\uff57\uff4f\uff52\uff44\uff1d"),
    "snmp-users": lambda n: fill(n, "snmp-server user a b v3 auth sha "),
    "snmp-priv": lambda n: fill(n, "priv aes 128 "),
    "telegram-ids": lambda n: fill(n, "123456789:AA"),
    "azure-keys": lambda n: fill(n, "AccountKey="),
    "signatures": lambda n: fill(n, "sig="),
    "client-secret-marks": lambda n: fill(n, "Q~"),
    "mailchimp-suffixes": lambda n: fill(n, "-us"),
    "pgpass-fields": lambda n: fill(n, "a:1:b:c:"),
    "token-file-roles": lambda n: fill(n, "read "),
    "continued-lines": lambda n: fill(n, "curl \\\n"),
    "netrc": lambda n: fill(n, "machine a login b password "),
    "discord-dots": lambda n: fill(n, "M" + "a" * 23 + "."),
    "twilio-prefixes": lambda n: fill(n, "SK"),
    "sql": lambda n: fill(n, "IDENTIFIED BY "),
    "quoted-keyword": lambda n: fill(n, "password '"),
    "php-define": lambda n: fill(n, "define('"),
    "named-values": lambda n: fill(n, 'name="password" value="'),
    "docker-auth": lambda n: fill(n, '"auth": "'),
    "kubeconfig": lambda n: fill(n, "client-key-data: "),
    "saas-prefixes": lambda n: fill(n, "npm_hf_key-dapi"),
    "angle-brackets": lambda n: fill(n, "<"),
    "one-long-line": lambda n: fill(n, "x"),
    "many-short-lines": lambda n: fill(n, "x\n"),
    "placeholders": lambda n: fill(n, "-u [REDACTED:x]:"),
    "uppercase-token-body": lambda n: "sk" + "_live_" + "A" * n + "b",
    "uppercase-pypi-body": lambda n: "py" + "pi-AgEIcHlwaS5vcmc" + "A" * n + "b",
    # Issue 25's rules.
    "fish-setters": lambda n: fill(n, "set -gx API_TOKEN "),
    "csh-setters": lambda n: fill(n, "setenv A "),
    "ldap-binds": lambda n: fill(n, "ldapsearch -w "),
    "oracle-slashes": lambda n: fill(n, "sqlplus a/"),
    "oracle-one-line": lambda n: "sqlplus " + fill(n, "a/b"),
    "url-userinfo": lambda n: fill(n, "https://a:"),
    "url-one-authority": lambda n: "https://a:b" + fill(n, "/"),
    "url-key-userinfo": lambda n: fill(n, "s3://[REDACTED:aws_key]:"),
    "env-entries": lambda n: fill(n, "- name: DB_PASSWORD\n  value: "),
    "env-values": lambda n: fill(n, "value: "),
    "connection-values": lambda n: fill(n, "Server=a;Password="),
    "tag-keywords": lambda n: fill(n, "pass\U000e0041word="),
    "single-dash-flags": lambda n: fill(n, "-password "),
    "expansions": lambda n: fill(n, "${PASSWORD:-"),
    "code-values": lambda n: fill(n, "password = a.b.c("),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_new_rules_take_linear_time_on_hostile_megabytes(name: str) -> None:
    """Input built against the new rules is redacted in linear time: 8x the text (125 kB
    to 1 MB; some are 100 000 real matches, each replaced and then read again by the second
    pass), about 8x the CPU; and the result is idempotent."""
    make = HOSTILE[name]
    assert_linear(make, lambda text: redact(text, hostnames=True, ips=True), MB // 8)
    if name in ("zero-width-keywords", "dollars", "base64-run"):
        once = redact(make(MB), hostnames=True, ips=True)
        assert redact(once.text, hostnames=True, ips=True).text == once.text
