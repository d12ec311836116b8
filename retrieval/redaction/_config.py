"""Secrets in system files, command lines and SQL: shapes with no ``key=value`` to go by.

* Files: ``/etc/shadow`` and ``htpasswd`` lines (``user:$6$salt$hash:...``), ``.pgpass``
  (``host:port:db:user:password``), ``.netrc``, ``redis.conf`` (``requirepass``), LDAP
  (``rootpw``, ``bindpw``, ``userPassword::``), llamad's own token file (``admin <token>``).
* Command lines: ``curl -u user:pass``, ``mysql -pPASS``, ``sshpass -p PASS``,
  ``docker login -p PASS``, ``redis-cli -a PASS``, ``htpasswd -b``, ``openssl -passin
  pass:X``, ``keytool -storepass X``, ``net user NAME PASS``. A flag like ``-p`` means a
  password only for some commands, so these rules look for the command on the same line
  (or on the lines it continues with a trailing backslash).
* SQL: ``IDENTIFIED BY 'x'``, ``WITH PASSWORD 'x'``, ``= PASSWORD('x')``.
* Crypt hashes anywhere (``$6$salt$hash``, ``$2y$10$...``, ``$argon2id$...``): a hash of a
  password is offline-crackable, so it goes too.
"""

from __future__ import annotations

import re

from ._base import (
    CI,
    CIM,
    M,
    Rule,
    Span,
    has_digit,
    has_letter,
    is_path,
    is_reference,
    lead,
    line_has,
    rule,
    windowed,
)

# --- files ---------------------------------------------------------------------------------

# A modular-crypt hash ($id$[params$]salt$hash), an LDAP/htpasswd scheme ({SHA}, {SSHA}),
# or (in /etc/shadow, followed by the date fields) a 13-character DES crypt.
_HASH_IDS = r"(?:1|2[abxy]?|5|6|7|8|9|y|gy|apr1|md5|sha1|argon2(?:id|i|d)|scrypt|pbkdf2[\w-]*+)"
_SHADOW = rule(
    r"^(?P<user>[A-Za-z_][A-Za-z0-9_.@-]{0,63}+\$?):(?P<v>[!*]{0,2}+(?:\$" + _HASH_IDS
    + r"\$[^:\s]++|\{[A-Za-z0-9-]{2,16}+\}[A-Za-z0-9+/=.$]{8,}+"
    r"|[./A-Za-z0-9]{13}(?=:[0-9]*+:)))(?=:|[ \t\r]*+$)",
    "password_hash", (":",), flags=M,
)
# postgres host:port:database:user:password (port may be *). Not an IPv6 address or a time.
_PGPASS = rule(
    r"^(?P<h>[^:\s#]++):(?P<port>[0-9]++|\*):(?P<db>[^:\s]++):(?P<u>[^:\s]++)"
    r":(?P<v>(?:\\.|[^\s:\\])++)[ \t\r]*+$",
    "password", (":",), flags=M,
    accept=lambda m: not all(re.fullmatch(r"[0-9A-Fa-f]{1,4}|\*", m.group(g))
                             for g in ("h", "db", "u", "v")),
)
_NETRC = rule(
    r"(?:" + lead("machine") + r"[ \t]++\S++|" + lead("default") + r")[ \t]++login[ \t]++\S++"
    r"[ \t]++password[ \t]++(?P<v>\S++)", "password", ("machine", "default"),
)
_SERVICE_CONF = rule(
    r"^[ \t]*+(?:requirepass|masterauth|rootpw|bindpw|olcrootpw:|userpassword::?"
    r"|unicodepwd::?|sambantpassword:|ldap_default_authtok[ \t]*+=|ldap_bind_pw[ \t]*+="
    r"|auth_pass)[ \t]*+(?P<v>\"[^\"\n]*+\"|\S++)",
    "password", ("requirepass", "masterauth", "rootpw", "bindpw", "olcrootpw", "userpassword",
                 "unicodepwd", "sambantpassword", "authtok", "bind_pw", "auth_pass"), flags=CIM,
)


_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")


def _llamad_token(m: re.Match[str]) -> bool:
    """Generated-looking: digits and letters, not a path, URL or timestamp."""
    value = m.group("v")
    return (has_digit(value) and has_letter(value) and not is_path(value)
            and "://" not in value and _DATE.match(value) is None)


# llamad's token file (daemon/config/access.py): "<role> <token>", a token of 16+ visible ASCII
# characters. Prose starting with "read" has words, not one generated token, after it.
_TOKEN_FILE = rule(r"^[ \t]*+(?:admin|read)[ \t]++(?P<v>[\x21-\x7e]{16,4096}+)[ \t\r]*+$",
                   "llamad_token", ("admin", "read"), flags=M, accept=_llamad_token)

# --- command lines ---------------------------------------------------------------------------

_HTTP_CLIENTS = ("curl", "wget", "http ", "https ", "xh ", "lftp", "httpie")
_ON_HTTP_CLIENT_LINE = line_has(_HTTP_CLIENTS)


def _uid_gid(m: re.Match[str]) -> bool:
    """``-u 1000:1000`` (a uid and gid, as docker takes them) is no user and password."""
    return not (m.group("user").isdigit() and m.group("v").isdigit())


_CURL_USER = rule(
    lead("-u", "-U", "--user", "--proxy-user", "-a", "--auth") + r"(?:[ \t]++|=)?(?:(?P<q>[\"'])|)"
    r"(?P<user>[^\s:\"'-][^\s:\"']*+|):(?P<v>(?(q)[^\"'\n]++|[^\s\"']++))",
    "password", ("-u", "-a", "--user", "--proxy-user", "--auth"),
    accept=lambda m: _uid_gid(m) and _ON_HTTP_CLIENT_LINE(m),
)
_MYSQL_P = rule(lead("-p") + r"(?P<v>\"[^\"\n]*+\"|'[^'\n]*+'|[^\s\"'-]\S*+)", "password",
                ("-p",), accept=line_has(("mysql", "mariadb")))
_DASH_P_SPACE = rule(
    lead("-p") + r"[ \t]++(?P<v>\"[^\"\n]*+\"|'[^'\n]*+'|[^\s\"'-]\S*+)", "password", ("-p",),
    accept=line_has(("sshpass", "docker login", "podman login", "buildah login",
                     "nerdctl login", "skopeo login", "helm registry login", "oras login",
                     "crane auth login")),
)
_REDIS_CLI = rule(lead("-a") + r"[ \t]++(?P<v>\S++)", "password", ("redis-cli",),
                  accept=line_has(("redis-cli",)))
_OPENSSL_PASS = rule(lead("-pass") + r"(?:in|out|word)?[ \t]++pass:(?P<v>\S++)", "password",
                     ("pass:",))
_KEYTOOL = rule(
    lead("-storepass", "-keypass", "-srcstorepass", "-deststorepass", "-srckeypass",
         "-destkeypass") + r"[ \t]++(?P<v>\"[^\"\n]*+\"|[^\s\"-]\S*+)",
    "password", ("pass",),
)
_NET_USER = rule(lead("net") + r"[ \t]++user[ \t]++(?:\"[^\"\n]++\"|[^\s/\"]++)[ \t]++"
                 r"(?P<v>[^\s/*\"]\S*+)", "password", ("net user",), flags=re.IGNORECASE,
                 accept=lambda m: not (m.group("v").isalpha() and m.group("v").islower()))
_SMBCLIENT = rule(lead("-U", "--user") + r"[ \t]*+=?[ \t]*+[^\s%]++%(?P<v>\S++)", "password",
                  ("%",), accept=line_has(("smbclient", "rpcclient", "smbmap", "mount.cifs",
                                           "net ", "winexe", "smbcacls")))
_RDP = rule(lead("/p:") + r"(?P<v>\"[^\"\n]*+\"|\S++)", "password", ("/p:",),
            accept=line_has(("xfreerdp", "wlfreerdp", "sdl-freerdp")))


def _htpasswd_handle(m: re.Match[str]) -> Span | None:
    """``htpasswd -b[c] FILE USER PASS`` and ``htpasswd -nb USER PASS``."""
    flags = m.group("flags")
    if "b" not in flags:
        return None
    group = "b" if "n" in flags else "c"
    if m.group(group) is None or is_reference(m.group(group)):
        return None
    return m.start(group), m.end(group), "password"


_HTPASSWD = re.compile(
    r"htpasswd(?<![\w-]htpasswd)(?P<flags>(?:[ \t]++-[A-Za-z]++){1,4}+)[ \t]++"
    r"(?P<a>[^\s-]\S*+)[ \t]++(?P<b>\S++)(?:[ \t]++(?P<c>\S++))?"
)
_HTPASSWD_CMD = Rule(windowed(_HTPASSWD, _htpasswd_handle, ("htpasswd",)), ("htpasswd",))

# --- SQL -----------------------------------------------------------------------------------

_SQL_QUOTED = rule(
    r"(?:" + lead("with") + r"[ \t]++(?:(?:un)?encrypted[ \t]++)?password(?:[ \t]*+=)?"
    r"|" + lead("identified") + r"[ \t]++(?:with[ \t]++\S++[ \t]++)?by(?:[ \t]++password)?"
    r"|=[ \t]*+password[ \t]*+\()[ \t]*+'(?P<v>[^'\n]++)'",
    "password", ("password", "identified"), flags=re.IGNORECASE,
)
# Oracle: IDENTIFIED BY tiger, unquoted. In lower case ("identified by its hash") it takes
# a value that is no plain lower-case word.
_SQL_UNQUOTED = rule(
    r"(?P<k>" + lead("identified") + r"[ \t]++by)[ \t]++(?P<v>[^\s;'\",()]++)",
    "password", ("identified",), flags=re.IGNORECASE,
    accept=lambda m: m.group("v").lower() != "password" and (
        m.group("k").isupper() or not (m.group("v").isalpha() and m.group("v").islower())),
)
# "password 'hunter2'" in any text: a quoted word after the keyword is a password.
_QUOTED_AFTER_KEYWORD = rule(lead("password") + r"[ \t]++'(?P<v>[^'\n]{1,200}+)'", "password",
                             ("password",), flags=re.IGNORECASE,
                             accept=lambda m: " " not in m.group("v").strip())

# --- crypt hashes anywhere -----------------------------------------------------------------


def _crypt_accept(m: re.Match[str]) -> bool:
    ident, rest = m.group("id"), m.group("v")[len(m.group("id")) + 2 :]
    if ident in ("8", "9"):  # Cisco type 8/9, Juniper $9$ (no salt separator)
        return len(rest) >= 10
    return "$" in rest and len(rest) >= 16


CRYPT_HASH = rule(
    r"(?P<v>" + lead("$", before=r"[\w$]") + r"(?P<id>" + _HASH_IDS
    + r")\$[./A-Za-z0-9+=,$-]{8,}+)",
    "password_hash", ("$",), accept=_crypt_accept,
)

# LDAP / htpasswd scheme hashes anywhere: {SSHA}..., {SHA}..., {PBKDF2-SHA256}...
SCHEME_HASH = rule(
    lead("{", before=r"[\w{]") + r"(?:s?sha(?:256|384|512)?|s?md5|crypt|pbkdf2[\w-]{0,16}+"
    r"|argon2\w{0,4}+|ssha3?[\w-]{0,8}+)\}(?P<v>[a-z0-9+/=]{16,}+)",
    "password_hash", ("{",), flags=CI,
    accept=lambda m: has_digit(m.group("v")) or "+" in m.group("v") or "/" in m.group("v"),
    group="",
)

FILE_RULES: tuple[Rule, ...] = (_SHADOW, _PGPASS, _NETRC, _SERVICE_CONF, _TOKEN_FILE)
COMMAND_RULES: tuple[Rule, ...] = (
    _CURL_USER, _MYSQL_P, _DASH_P_SPACE, _REDIS_CLI, _OPENSSL_PASS, _KEYTOOL, _NET_USER,
    _SMBCLIENT, _RDP, _HTPASSWD_CMD, _SQL_QUOTED, _SQL_UNQUOTED, _QUOTED_AFTER_KEYWORD,
)
