"""Environment variables set by shells other than sh: fish, csh, PowerShell, cmd.

``set -x API_TOKEN value`` and ``set -gx ...`` (fish), ``setenv SECRET_KEY value`` (csh,
``launchctl``), ``setx API_TOKEN value`` (cmd.exe),
``[Environment]::SetEnvironmentVariable("DB_PASSWORD", "value")`` and ``Set-Item
env:API_TOKEN "value"`` (PowerShell), ``ConvertTo-SecureString "value" -AsPlainText`` (a
password in a PowerShell script), well-known variables whose names carry no keyword
(``REDISCLI_AUTH``), and ``- name: DB_PASSWORD`` then ``value: ...`` (a Kubernetes or ECS
environment entry). ``$env:API_TOKEN = "value"``, ``export X=...`` and csh's ``set X =
value`` are plain assignments (:mod:`retrieval.redaction._assign`).

The variable's name must name a credential (:func:`credential_key`) or be a well-known
one; fish's ``set`` without an export flag also wants an environment-style name
(``DB_PASSWORD``, not ``password``), so that "set password policy" stays prose.
"""

from __future__ import annotations

import re

from ._assign import credential_key, is_secret_value, kind_for_keyword
from ._base import CI, Rule, lead, rule, windowed

__all__ = ["SHELL_RULES"]

# Variables that hold a secret and whose names say so only to those who know them.
_KNOWN = {"rediscli_auth": "password", "sshpass": "password", "mysql_pwd": "password",
          "pgpassword": "password", "ldap_bindpw": "password", "borg_passphrase": "password",
          "restic_password": "password", "ansible_become_pass": "password",
          "vault_token": "secret", "consul_http_token": "secret", "nomad_token": "secret"}
_ENV_STYLE = re.compile(r"[A-Z][A-Z0-9]*+(?:_[A-Z0-9]++)++")


def _kind(name: str) -> str | None:
    """The placeholder type for a variable called ``name``, or None if it is no secret."""
    known = _KNOWN.get(name.lower())
    if known is not None:
        return known
    kw = credential_key(name)
    return None if kw is None else kind_for_keyword(kw)


# A variable's name (group "k").
_NAME = r"(?P<k>[A-Za-z_][A-Za-z0-9_]{0,100}+)"
# A quoted value (the quotes kept) or one shell word.
_VALUE = r"(?:(?P<q>[\"'])|)(?P<v>(?(q)[^\"'\n]++|[^\s\"';|&#]++))"


def _fish_accept(m: re.Match[str]) -> bool:
    name, flags = m.group("k"), m.group("flags") or ""
    if _kind(name) is None or not is_secret_value(m.group("v"), name):
        return False
    exported = any(f.startswith("--export") or (not f.startswith("--") and "x" in f)
                   for f in flags.split())
    return exported or _ENV_STYLE.fullmatch(name) is not None or name.lower() in _KNOWN


def _named_accept(m: re.Match[str]) -> bool:
    name = m.group("k")
    return _kind(name) is not None and is_secret_value(m.group("v"), name)


def _named_kind(m: re.Match[str]) -> str:
    return _kind(m.group("k")) or "secret"


def _named(pattern: str, needles: tuple[str, ...]) -> Rule:
    """A case-blind rule for a variable set by its name (:data:`_NAME`) to a value (group
    ``v``): a secret when the name names one and the value is not a reference."""
    return rule(pattern, _named_kind, needles, flags=CI, accept=_named_accept)


# fish: set [-g|-U|-l] [-x|--export] NAME VALUE...
_FISH_SET = rule(
    # (without a flag, only an environment-style NAME: "set the value" is prose)
    r"set(?<![\w$.-]set)(?:(?P<flags>(?:[ \t]++-{1,2}[A-Za-z-]++)++)|(?=[ \t]++[A-Z][A-Z0-9]*+_))"
    r"[ \t]++" + _NAME + r"[ \t]++" + _VALUE,
    _named_kind, ("set",), accept=_fish_accept,
)
# csh: setenv NAME VALUE; launchctl setenv NAME VALUE; cmd.exe: setx NAME VALUE [/M].
_SETENV = _named(r"set(?:env|x)(?<![\w.-]setenv)(?<![\w.-]setx)[ \t]++" + _NAME
                 + r"[ \t]++" + _VALUE, ("set",))
# PowerShell: [Environment]::SetEnvironmentVariable("NAME", "VALUE"[, "User"]);
# Set-Item [-Path] env:NAME [-Value] "VALUE".
_PS_SET_ENV = _named(r"setenvironmentvariable[ \t]*+\([ \t]*+[\"']" + _NAME
                     + r"[\"'][ \t]*+,[ \t]*+[\"'](?P<v>[^\"'\n]++)[\"']", ("set",))
_PS_SET_ITEM = _named(r"(?:set|new)-item(?<![\w-]set-item)(?<![\w-]new-item)"
                      r"(?:[ \t]++-path)?[ \t]++env:" + _NAME
                      + r"(?:[ \t]++-value)?[ \t]++" + _VALUE, ("-item",))
# PowerShell: ConvertTo-SecureString [-String] "VALUE" -AsPlainText [-Force]
_PS_SECURE_STRING = rule(
    r"convertto-securestring(?:[ \t]++-string)?[ \t]++[\"'](?P<v>[^\"'\n]++)[\"']"
    r"(?=[^\n]*?-asplaintext)",
    "password", ("convertto-securestring",), flags=CI,
    accept=lambda m: is_secret_value(m.group("v"), ""),
)
# Well-known names as assignments or environment prefixes: REDISCLI_AUTH=pw redis-cli.
_UNKEYED = tuple(k for k in _KNOWN if credential_key(k) is None)
_KNOWN_ASSIGNMENT = rule(
    r"(?P<k>" + lead(*sorted(_UNKEYED, key=len, reverse=True), before=r"[\w$-]")
    + r")[\"']?[ \t]*+[:=][ \t]*+" + _VALUE,
    _named_kind, ("auth", "bindpw"), flags=CI,
    accept=lambda m: is_secret_value(m.group("v"), m.group("k")),
)

# Kubernetes, Compose and task definitions: "- name: DB_PASSWORD" then "value: pw" on the
# next line, or {"name": "DB_PASSWORD", "value": "pw"} on one. Found from "value", the
# name read back (at most 256 characters, this line or the one before).
_NAME_BEFORE = re.compile(
    r"(?:^|[\s{,])[\"']?name[\"']?[ \t]*+[:=][ \t]*+[\"']?(?P<k>[A-Za-z_][\w.-]{0,100}+)"
    r"[\"']?[ \t]*+(?:,[ \t]*+|\r?\n[ \t]*+(?:-[ \t]++)?)\Z",
    re.IGNORECASE,
)
_ENTRY_VALUE = re.compile(
    r"value[\"']?[ \t]*+:[ \t]*+(?:(?P<q>[\"'])|)(?P<v>(?(q)[^\"'\n]++|[^\s#,}]++))",
    re.IGNORECASE,
)


def _entry_handle(m: re.Match[str]) -> tuple[int, int, str] | None:
    text, at = m.string, m.start()
    if at > 0 and text[at - 1] in "\"'":  # "value" quoted: the name ends before the quote
        at -= 1
    name = _NAME_BEFORE.search(text, max(0, at - 256), at)
    if name is None:
        return None
    kind = _kind(name.group("k"))
    if kind is None or not is_secret_value(m.group("v"), name.group("k")):
        return None
    return m.start("v"), m.end("v"), kind


_ENTRY_NEEDLES = ("value",)  # (as another rule's: looked for once)
_NAMED_ENTRY = Rule(windowed(_ENTRY_VALUE, _entry_handle, _ENTRY_NEEDLES), _ENTRY_NEEDLES)

SHELL_RULES: tuple[Rule, ...] = (
    _NAMED_ENTRY,
    _FISH_SET, _SETENV, _PS_SET_ENV, _PS_SET_ITEM, _PS_SECURE_STRING, _KNOWN_ASSIGNMENT,
)

