"""Database and directory clients: URLs with credentials, connection strings, CLI options.

* URLs: ``scheme://user:password@host`` keeps the user and loses the password; when the
  user part is itself a key id (``https://AKIA...:SECRET@host``, already a placeholder
  by then) the whole user part goes. A password holding an unencoded ``/``, ``?`` or
  ``#`` (``mongodb://app:pa/ss@db``) runs to the ``@``.
* Connection strings (ADO.NET, ODBC, JDBC properties): ``Password=`` and ``Pwd=`` run to
  the ``;``, spaces and ``{...}`` escapes included.
* Oracle: ``user/password@db`` on a line of ``sqlplus``, ``sqlldr``, ``expdp``, ``rman``,
  ..., after ``CONNECT``, ``userid=`` or ``jdbc:oracle:thin:``, or before ``@//host``
  (Easy Connect), ``@host:port/`` or ``@(DESCRIPTION=``.
* Options that mean a password only for some tools: ``sqlcmd -P``, ``mongosh -p``,
  ``ldapsearch -w``, ``ldappasswd -s``, ``mysqladmin password``; single-dash
  ``-password X`` / ``-pass X`` / ``-token X`` (Go-style flags) anywhere.
"""

from __future__ import annotations

import re
import string

from ._base import (
    _PLACEHOLDER,
    CI,
    Rule,
    Span,
    in_placeholder,
    is_path,
    is_reference,
    lead,
    line_has,
    rule,
    unquote,
    windowed,
)

__all__ = ["CLIENT_RULES", "URL_USERINFO"]

# --- URLs ---------------------------------------------------------------------------------

_SCHEME_CHARS = frozenset(string.ascii_letters + string.digits + "+.-")
_TOKEN_END = re.compile(r"[\s\"'<>`]")
_MAX_URL = 1024


def _scheme_before(text: str, end: int) -> bool:
    """A URL scheme ends at ``end``: 2 to 31 letters, digits, ``+``, ``.`` or ``-``,
    starting with a letter."""
    start = end
    while start > end - 32 and start > 0 and text[start - 1] in _SCHEME_CHARS:
        start -= 1
    if start > 0 and text[start - 1] in _SCHEME_CHARS:
        return False  # longer than 31
    return end - start >= 2 and text[start] in string.ascii_letters


def _userinfo(m: re.Match[str]) -> Span | None:
    """The password of the URL whose ``://`` ``m`` matched (or its whole user part, when
    the user is a placeholder)."""
    text, start = m.string, m.end()
    if not _scheme_before(text, m.start()):
        return None
    stop = _TOKEN_END.search(text, start, start + _MAX_URL)
    token = text[start : stop.start() if stop else min(len(text), start + _MAX_URL)]
    user_end = 0
    keyed = _PLACEHOLDER.match(token)
    if keyed is not None:
        user_end = keyed.end()
        if token[user_end : user_end + 1] != ":":
            return None
    colon = token.find(":", user_end)
    authority_end = min((i for i in (token.find(c, user_end) for c in "/?#") if i >= 0),
                        default=len(token))
    at = token.rfind("@", user_end, authority_end)
    if at < 0:  # no "@" before the path: perhaps a "/", "?" or "#" in the password
        if not 0 <= colon < authority_end:
            return None
        port = token[colon + 1 : authority_end]
        if not port or port.isdigit() or any(c in token[user_end:colon] for c in "[]@"):
            return None  # host:port/..., or an IPv6 address
        at = token.find("@", authority_end)
        if at < 0:
            return None
    if not 0 <= colon < at or any(c in token[user_end:colon] for c in "/?#[]"):
        return None
    if keyed is not None:
        return start, start + at, "connection_string"
    password = token[colon + 1 : at]
    if not password or is_reference(password) or in_placeholder(text, start + colon + 1):
        return None
    return start + colon + 1, start + at, "connection_string"


# Only a URL with an "@" in it (before the next space or quote) has a user part.
URL_USERINFO = Rule(windowed(re.compile(r"://(?=[^\s\"'<>`@]{0,1024}+@)"), _userinfo, ("://",)),
                    ("://",))

# --- connection strings ---------------------------------------------------------------------

# The line is a connection string: one of these keys is on it.
_CONNECTION_KEYS = ("server=", "data source=", "host=", "uid=", "user id=", "userid=",
                    "driver=", "database=", "initial catalog=", "dsn=", "jdbc:", "user=",
                    "username=", "address=", "addr=", "network address=", "provider=")
_CONNECTION_VALUE = rule(
    lead("password", "pwd", before=r"[^;\s\"'{]") + r"[ \t]*+=[ \t]*+"
    r"(?P<v>\{[^}\n]*+\}|\"[^\"\n]*+\"|'[^'\n]*+'|[^;\n\"']++)(?=;|[ \t]*+[\"']?[ \t]*+$)",
    "password", ("password", "pwd"), flags=CI | re.MULTILINE,
    accept=line_has(_CONNECTION_KEYS),  # (needles gate runs of lines, not each line)
)

# --- Oracle ---------------------------------------------------------------------------------

_ORACLE_TOOLS = ("sqlplus", "sqlldr", "expdp", "impdp", "rman", "dgmgrl", "sqlcl",
                 "exp userid", "imp userid")
_ON_ORACLE_LINE = line_has(_ORACLE_TOOLS)
_ORACLE_BEFORE = re.compile(r"(?:userid[ \t]*+=[ \t]*+|thin:|target[ \t]++"
                            r"|catalog[ \t]++|auxiliary[ \t]++)\Z", re.IGNORECASE)
_ORACLE_AFTER = re.compile(r"@(?://|\(description|[\w.-]++:[0-9]++/)", re.IGNORECASE)


_USER_CHARS = frozenset(string.ascii_letters + string.digits + "_$#")
_NOT_BEFORE_USER = frozenset(string.ascii_letters + string.digits + "_/.@$#:\\-")


def _oracle_handle(m: re.Match[str]) -> Span | None:
    """``user/password`` (the match is ``/password``; the user is read back from it)."""
    text, slash = m.string, m.start()
    start = slash
    while start > slash - 128 and start > 0 and text[start - 1] in _USER_CHARS:
        start -= 1
    if start == slash or not text[start].isalpha():
        return None
    if start > 0 and text[start - 1] in _NOT_BEFORE_USER and not text.endswith(
            "thin:", 0, start):
        return None
    value = unquote(m.group("v"))
    if value.lower() in _ORACLE_TOOLS or value.lower() in ("nolog", "as") or is_reference(
            value) or in_placeholder(text, m.start("v")):
        return None
    if (_ORACLE_AFTER.match(text, m.end()) is None
            and _ORACLE_BEFORE.search(text, max(0, start - 16), start) is None
            and not _ON_ORACLE_LINE(m)):
        return None
    return m.start("v"), m.end("v"), "password"


_ORACLE_NEEDLES = ("sqlplus", "sqlldr", "expdp", "impdp", "rman", "userid", "@//")
_ORACLE = Rule(windowed(
    re.compile(r"/(?P<v>\"[^\"\n]{1,128}+\"|[^\s/@\"';]{1,128}+)(?=@|[ \t\r\n;\"']|$)",
               re.MULTILINE),
    _oracle_handle, _ORACLE_NEEDLES), _ORACLE_NEEDLES)

# SQL*Plus scripts: CONNECT user/password[@db], CONN user/password.
_ORACLE_CONNECT = rule(
    lead("connect", "conn") + r"[ \t]++[A-Za-z][\w$#]{0,127}+/"
    r"(?:(?P<q>\")|)(?P<v>(?(q)[^\"\n]{1,128}+|[^\s/@\"';]{1,128}+))(?(q)\")(?=@|[ \t\r;]|$)",
    "password", ("connect ", "conn "), flags=CI | re.MULTILINE,
    accept=lambda m: m.group("v").lower() not in ("as",),
)

# --- options that mean a password only for some tools -------------------------------------

# A quoted value (the quotes kept) or one word, not starting with "-" (the next option).
_VALUE = r"(?:(?P<q>[\"'])|)(?P<v>(?(q)[^\"'\n]++|[^\s\"'-]\S*+))"
_LDAP_TOOLS = ("ldapsearch", "ldapmodify", "ldapadd", "ldapdelete", "ldappasswd", "ldapwhoami",
               "ldapcompare", "ldapmodrdn", "ldapexop", "ldapvc")
_MONGO_TOOLS = ("mongosh", "mongo ", "mongodump", "mongorestore", "mongoexport",
                "mongoimport", "mongostat", "mongotop", "mongofiles")
_MSSQL_TOOLS = ("sqlcmd", "bcp ")
# Needles shared with other rules cost nothing more (each is looked for once per text),
# and each needle no text holds costs a search of the whole text: rules look for common
# ones ("-p", "pass", "set") and check the tool on the line.
_SQLCMD_P = rule(lead("-P") + r"[ \t]*+" + _VALUE, "password", ("-p",),
                 accept=line_has(_MSSQL_TOOLS))
_ON_MONGO_LINE = line_has(_MONGO_TOOLS)
_MONGO_P = rule(lead("-p") + r"[ \t]++" + _VALUE, "password", ("-p",),
                accept=lambda m: _ON_MONGO_LINE(m) and not (  # -p 27017: a port, mistyped
                    m.group("v").isdigit() and len(m.group("v")) <= 5))
_ON_LDAP_LINE = line_has(_LDAP_TOOLS)
_ON_LDAPPASSWD = line_has(("ldappasswd",))
# ldapsearch -w PW (bind password); ldappasswd -a OLD -s NEW.
_LDAP_W = rule(lead("-w", "-s", "-a") + r"[ \t]++" + _VALUE, "password", ("ldap",),
               accept=lambda m: _ON_LDAP_LINE(m) and (m.group(0)[1] == "w" or _ON_LDAPPASSWD(m)))
_MYSQLADMIN = rule(lead("password") + r"[ \t]++" + _VALUE, "password", ("admin",),
                   accept=line_has(("mysqladmin",)))

# Go-style single-dash flags: -password X, -token X (the "=" form is an assignment).
_NOT_A_VALUE = frozenset({"a", "an", "the", "to", "with", "and", "or", "of", "for", "in", "is",
                          "flag", "option", "argument", "parameter", "value", "stdin", "file",
                          "instead", "only", "not", "prompt", "env"})
_SINGLE_DASH = rule(
    r"-(?<![\w-]-)(?:pass(?:word|wd)?|token)[ \t]++" + _VALUE,
    "password", ("pass", "token"),
    flags=CI,
    accept=lambda m: (m.group("v").lower().rstrip(".,;:") not in _NOT_A_VALUE
                      and not is_path(unquote(m.group("v")))
                      and not m.group("v").lower().startswith(("env:", "file:", "fd:",
                                                               "pass:"))),
)

CLIENT_RULES: tuple[Rule, ...] = (
    _CONNECTION_VALUE, _ORACLE, _ORACLE_CONNECT, _SQLCMD_P, _MONGO_P, _LDAP_W, _MYSQLADMIN,
    _SINGLE_DASH,
)
