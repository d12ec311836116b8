"""Key/value shapes: assignments, headers, connection strings, flags, XML, PHP, Docker.

``password=...``, ``"api_key": "..."``, ``DB_PASSWORD: ...``, ``Authorization: Bearer
...``, ``postgres://user:pw@host``, ``--password pw``, ``<password>pw</password>``,
``<add key="DbPassword" value="pw"/>``, ``define('DB_PASSWORD', 'pw')``, ``"auth":
"<base64 user:pass>"``. The key says a secret follows; the value is whatever it is, unless
it is a reference (``$VAR``, ``<token>``, ...) or plainly not one (``null``, a type name,
a path to where the secret lives).
"""

from __future__ import annotations

import base64
import binascii
import re
import string

from ._base import (
    CI,
    TOKEN68,
    VARIABLE,
    Ranges,
    Rule,
    Span,
    is_path,
    is_reference,
    lead,
    rule,
    tokenish,
    unquote,
    windowed,
)

__all__ = ["ASSIGNMENTS", "FLAG", "HEADER_RULES", "KEYED_RULES"]

# --- headers and URLs ----------------------------------------------------------------------

# Authorization headers: "Authorization: Bearer <t>", "Authorization: Basic <b64>",
# "Authorization: token <t>" (GitHub). Without a known scheme the value must look like a
# token, so "Authorization: required for all endpoints" survives.
_AUTH_SCHEMES = {"bearer": "bearer_token", "basic": "secret", "token": "secret",
                 "bot": "secret", "apikey": "api_key", "sso-key": "api_key",
                 "ssws": "api_key", "dsn": "secret", "key": "api_key"}


def _auth_kind(m: re.Match[str]) -> str:
    return _AUTH_SCHEMES.get((m.group("scheme") or "").lower(), "secret")


def _auth_accept(m: re.Match[str]) -> bool:
    scheme = m.group("scheme")
    value = m.group("v")
    if scheme is not None:
        return scheme.lower() in _AUTH_SCHEMES or tokenish(value)
    return value.lower() not in _AUTH_SCHEMES and tokenish(value)


_AUTH_HEADER = rule(
    lead("proxy-authorization", "authorization") + r"[\"']?[ \t]*+[:=][ \t]*+[\"']?"
    r"(?:(?P<scheme>[A-Za-z][\w-]{0,19}+)[ \t]++)?(?P<v>[^\s\"',;\[]++)",
    _auth_kind, ("authorization",), flags=CI, accept=_auth_accept,
)

# "bearer <token>" anywhere (curl lines, logs). Prose ("the bearer of this card") has no
# 16+ character token with digits and letters after the word.
_BEARER = rule(
    lead("bearer") + rf"[ \t]++(?P<v>[{TOKEN68}]{{16,}}+=*+)",
    "bearer_token", ("bearer",), flags=CI, accept=lambda m: tokenish(m.group("v")),
)

# scheme://user:password@host: retrieval.redaction._clients.URL_USERINFO.
HEADER_RULES: tuple[Rule, ...] = (_AUTH_HEADER, _BEARER)

# --- generic assignments: password=..., "api_key": "...", DB_PASSWORD: ... ---------------
#
# Found by the last word of the key (password, token, secret, ...key, credentials, psk)
# followed by a separator, searched for in an ASCII-lowered copy of the text (same offsets,
# no IGNORECASE cost); the key is then read backwards and the value forwards, in Python.

_NOT_SECRET_WORDS = frozenset({"null", "none", "nil", "true", "false", "~", "undefined"})
_TYPE_NAMES = frozenset({"str", "bytes", "string", "secretstr", "optional[str]"})
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)
# English, and the word for password in a few other languages (German, Spanish,
# Portuguese, Dutch, French) as keys are written in them too.
_KEYWORDS = (r"pass(?:words?|wd|phrase|wort)?|pwd|pw|secret|token|key|credentials?|psk"
             r"|contrase(?:ñ|Ñ|n)a|senha|wachtwoord|mot_?de_?passe")
# The separator may follow a closing quote and bracket: os.environ["DB_PASSWORD"] = ...
_ASSIGN = re.compile(
    rf"(?P<kw>{_KEYWORDS})"
    r"(?P<sep>(?:[\"'`]\]?|\*\*|__)?[ \t]*+(?::=|=>|=|:)(?![=:/])(?:\*\*|__)?[ \t]*+)"
)
_KEYWORD_AT_END = re.compile(rf"(?:{_KEYWORDS})\Z")
# Keys ending in "key" are secrets only with one of these before it (sort_key is not).
_KEY_SUFFIX = re.compile(
    r"(?:(?P<api>api[_-]?)|access[_-]?|private[_-]?|auth[_-]?|secret[_-]?|app[_-]?"
    r"|application[_-]?|client[_-]?|master[_-]?|account[_-]?|encryption[_-]?|signing[_-]?"
    r"|license[_-]?|storage[_-]?|subscription[_-]?|consumer[_-]?|shared[_-]?|hmac[_-]?"
    r"|jwt[_-]?|sas[_-]?|ingest(?:ion)?[_-]?|service[_-]?|db[_-]?|database[_-]?|priv[_-]?"
    r"|iam[_-]?)"
    r"key\Z"
)
_QUOTED = r"\"(?:[^\"\\\n]|\\.)*+\"|'[^'\n]*+'"
_QUOTED_VALUE = re.compile(_QUOTED)
_TOKEN_VALUE = re.compile(r"[^\s,;&\"'<>]++")
_COMMENT = re.compile(r"[ \t]+[#;]")
# What may precede a key at the start of a line: indentation, a list bullet, "export ",
# an opening quote or emphasis. Then the value is the rest of the line (INI, env files
# and YAML allow spaces in values).
_LINE_PREFIX = re.compile(r"[ \t]*+(?:[-*+][ \t]++)?(?:(?:export|set|setx|env)[ \t]++)?"
                          r"(?:[\"'`]|\*\*|__)?")
_MAX_KEY = 128
_MAX_LINE_PREFIX = 64
_CLOSERS = {")": "(", "]": "[", "}": "{"}


def kind_for_keyword(kw: str) -> str:
    """The placeholder type for a key ending in ``kw``."""
    kw = kw.lower()
    if kw.startswith(("pass", "pw", "contrase", "senha", "wachtwoord", "mot")):
        return "password"
    if kw.startswith("api"):
        return "api_key"
    return "secret"


# Keywords no other word ends with: a key ending in one is a credential, glued or not.
_LONG_WORDS = ("password", "passwd", "passphrase", "passwort")
# Well-known variables that end in a short keyword without a separator.
_KNOWN_KEYS = frozenset({"sshpass", "pgpass", "mysqlpwd", "isqlpwd", "lftp_pass"})


def _key_start(text: str, kw_start: int) -> int:
    i = kw_start
    floor = max(0, kw_start - _MAX_KEY)
    while i > floor and (text[i - 1].isalnum() or text[i - 1] in "_.-"):
        i -= 1
    return i


def _keyword(key: str, base: str) -> str | None:
    """The keyword that ends ``key`` (None when the key is no credential): the key must
    end with it, and it must start the key or a segment of it (db_password, clientSecret,
    x-api-key), so "bypass" is no "pass" key and "sort_key" no key at all."""
    if base == "key":
        found = _KEY_SUFFIX.search(key.translate(_ASCII_LOWER))
        if found is None:
            return None
        kw = key[found.start():]
    else:
        kw = key[len(key) - len(base):]
    at = len(key) - len(kw)
    if at == 0:
        # A bare "pass" key is a test verdict ("PASS: test_login"), not a credential.
        return None if base == "pass" else kw
    if base.startswith(_LONG_WORDS) or key.lower().lstrip("-") in _KNOWN_KEYS:
        return kw  # PGPASSWORD, dbpassword, rootpasswd, SSHPASS: no word ends that way
    before, first = key[at - 1], key[at]
    if before in "_.-" or (before.islower() and first.isupper()):
        return kw
    return None


def credential_key(key: str) -> str | None:
    """The keyword ``key`` ends with, if it names a credential (``DbPassword``, ``apiKey``),
    else None."""
    found = _KEYWORD_AT_END.search(key.translate(_ASCII_LOWER))
    return None if found is None else _keyword(key, found.group())


def _value_span(text: str, start: int, line_start: bool) -> tuple[int, int]:
    """The secret's span from ``start``: inside the quotes of a quoted value; the rest of
    the line (before a comment) at the start of a line; otherwise one token, without
    unbalanced closing brackets ("login(password=pw)")."""
    if text[start : start + 1] in ("\"", "'"):
        quoted = _QUOTED_VALUE.match(text, start)
        if quoted is not None:
            return start + 1, quoted.end() - 1
        if not line_start:
            start += 1  # an unclosed quote: the token after it
    if line_start:
        end = text.find("\n", start)
        raw = text[start : len(text) if end == -1 else end]
        cut = _COMMENT.search(raw)
        return start, start + len(raw[: cut.start()] if cut else raw.rstrip())
    token = _TOKEN_VALUE.match(text, start)
    raw = token.group(0) if token else ""
    while raw and (raw[-1] == ":" or (raw[-1] in _CLOSERS and _CLOSERS[raw[-1]] not in raw)):
        raw = raw[:-1]
    return start, start + len(raw)


# Code, not a literal, after a key: a call or subscript (getpass(), os.environ["X"],
# os.getenv("X"), ENV.fetch("X")), or a dotted name under a root that code and templates
# read settings from (var.db_password, settings.DB_PASSWORD, process.env.TOKEN).
_CODE_ROOTS = ("var|local|data|module|self|this|os|process|settings|config|cfg|conf|env|ENV"
               "|secrets|params|args|options|opts|request|req|ctx|context|props|inputs|steps"
               "|needs|values|Values|vars|app|creds|cls|System|Environment|Settings|Config")
_CODE_VALUE = re.compile(
    r"(?:[A-Za-z_][\w]*+\.)*+[A-Za-z_][\w]*+[ \t]*+[(\[]"
    rf"|(?:{_CODE_ROOTS})(?:\.[A-Za-z_]\w*+)++(?![\w.\-])"
)
# A regular expression where a value goes: password=(\S+), token: ([^&]+), (?P<pw>.*).
_REGEX_VALUE = re.compile(r"\(\?[:P<!=]|\((?:\\[SsWwDd]|\.[*+]|\[\^)|\\[SsWwDd][+*]")


def is_code(text: str, start: int, value: str) -> bool:
    """The unquoted value at ``text[start:]`` is code or a pattern, not a secret
    (:data:`_CODE_VALUE`, :data:`_REGEX_VALUE`)."""
    return _CODE_VALUE.match(text, start) is not None or _REGEX_VALUE.search(value) is not None


def is_secret_value(value: str, key: str) -> bool:
    """True unless ``value`` is a reference, a null/boolean word, a type name, the key's
    own name (``login(password=password)``) or a path."""
    lowered = value.lower()
    if is_reference(value) or lowered in _NOT_SECRET_WORDS or lowered.startswith("!vault"):
        return False  # (an Ansible vault value is encrypted, on the lines below)
    if value.startswith("$"):  # "${PW:-} psql", "$(DB_PW);Server=db": a variable, then more
        variable = VARIABLE.match(value)
        if variable is not None and value[variable.end() : variable.end() + 1] in " \t;,":
            return False
    own = key.lower().lstrip("-")
    if lowered in _TYPE_NAMES or lowered in (own, own.rsplit(".", 1)[-1]):
        return False  # code: "password: str", "login(password=password)", self.password = ...
    # PWD=/home/alice is the working directory; private_key = /etc/ssl/x.key and
    # credentials: ~/.aws/credentials are paths to where a secret lives, not the secret.
    return not is_path(value)


def find_assignments(text: str, lowered: str, needles: tuple[str, ...] = (),
                     ranges: Ranges | None = None) -> list[Span]:
    """The values of ``key = value`` / ``key: value`` pairs whose key names a credential
    (in ``ranges``, or everywhere). One left-to-right pass; every character is looked at a
    bounded number of times (keys are read back at most 128 characters, line prefixes 64)."""
    spans: list[Span] = []
    for start, end in [(0, len(text))] if ranges is None else ranges:
        spans += _assignments(text, lowered, start, end)
    return spans


def _assignments(text: str, lowered: str, begin: int, stop: int) -> list[Span]:
    spans: list[Span] = []
    done = begin    # text before done is inside a value already taken
    search = begin  # where the next key may start
    while (m := _ASSIGN.search(lowered, search, stop)) is not None:
        search = m.end()
        key_start = _key_start(text, m.start())
        key = text[key_start : m.start("kw") + len(m.group("kw"))]
        if key_start < done:
            continue  # inside a value already taken
        kw = _keyword(key, m.group("kw"))
        if kw is None:
            continue
        if text.startswith("${", key_start - 2):  # ${DB_PASSWORD:-default}: the default
            span = _expansion_default(text, m.end(), stop)
            if span is not None and is_secret_value(text[span[0]:span[1]], key):
                spans.append((*span, kind_for_keyword(kw)))
                done = search = span[1]
            continue
        line_begin = text.rfind("\n", max(0, key_start - _MAX_LINE_PREFIX - 1), key_start) + 1
        line_start = (key_start - line_begin <= _MAX_LINE_PREFIX
                      and (line_begin > 0 or key_start <= _MAX_LINE_PREFIX)
                      and _LINE_PREFIX.fullmatch(text, line_begin, key_start) is not None)
        start, end = _value_span(text, m.end(), line_start)
        if start >= end or not is_secret_value(text[start:end], key):
            continue
        if text[m.end() : m.end() + 1] not in ("\"", "'") and (
                is_code(text, start, text[start:end])
                # $pw = Read-Host ...: in PowerShell, PHP and Perl a literal is quoted
                or (text[key_start - 1 : key_start] == "$" and text[start].isalpha())):
            continue
        spans.append((start, end, kind_for_keyword(kw)))
        done = search = end
    return spans


def _expansion_default(text: str, start: int, stop: int) -> tuple[int, int] | None:
    """The default of a shell expansion (``${NAME:-default}``, ``${NAME:=default}``) whose
    operator starts at ``start``; None when it is empty or unclosed."""
    close = text.find("}", start, min(stop, start + 512))
    if close < 0:
        return None
    while start < close and text[start] in "-=?+ \t":
        start += 1
    return (start, close) if start < close else None


_NEEDLES = ("pass", "pwd", "pw", "secret", "token", "key", "credential", "psk", "contrase", "senha",
            "wachtwoord", "mot_de_passe", "motdepasse")
ASSIGNMENTS = Rule(find_assignments, _NEEDLES)
_XML_NEEDLES = tuple(needle for needle in _NEEDLES if needle != "pw")  # (no <pw> element)

# CLI flags with a space: --password hunter2, --api-key XYZ
# Prose about the flag ("pass --token with the request") keeps its words.
_PROSE_WORDS = frozenset({
    "a", "an", "the", "to", "with", "and", "or", "of", "for", "in", "on", "is", "are", "be",
    "as", "if", "when", "flag", "flags", "option", "options", "argument", "arguments",
    "parameter", "value", "values", "must", "can", "will", "should", "instead", "only",
    "also", "not", "from", "here"
})
FLAG = rule(
    r"--(?<![\w-]--)(?P<kw>password|passwd|pass|token|secret|api-key|apikey|client-secret"
    r"|auth-token|access-token|secret-key|access-key|private-key|passphrase)"
    r"[ \t]++(?P<v>(?!-)[^\s\"']++|" + _QUOTED + ")",
    lambda m: kind_for_keyword(m.group("kw")), ("--",), flags=CI,
    accept=lambda m: m.group("v").lower().rstrip(".,;:") not in _PROSE_WORDS
    and not is_path(unquote(m.group("v"))),
)

# --- keys written other ways: XML, PHP, Docker, kubeconfig ----------------------------------


def _xml_handle(m: re.Match[str]) -> Span | None:
    """``<password>pw</password>``, ``<apiKey>...</apiKey>``, CDATA included."""
    kw = credential_key(m.group("tag").rsplit(":", 1)[-1])
    if kw is None or (m.group("attrs") or "").endswith("/"):
        return None
    group = "cdata" if m.group("cdata") is not None else "v"
    value = m.group(group)
    if not value.strip() or not is_secret_value(value.strip(), m.group("tag")):
        return None
    return m.start(group), m.end(group), kind_for_keyword(kw)


_XML_ELEMENT = re.compile(
    r"<(?P<tag>[A-Za-z_][\w.:-]{0,100}+)"
    r"(?:(?<=pass)|(?<=password)|(?<=passwd)|(?<=passphrase)|(?<=pwd)|(?<=secret)"
    r"|(?<=token)|(?<=key)|(?<=credential)|(?<=credentials)|(?<=psk))"
    r"(?P<attrs>[ \t][^<>\n]{0,300}+)?>"
    r"(?:<!\[CDATA\[(?P<cdata>[^\]\n]{1,4096}+)\]\]>|(?P<v>[^<\n]{1,4096}+))</(?P=tag)>",
    re.IGNORECASE,
)


def _named_value_accept(m: re.Match[str]) -> bool:
    return credential_key(m.group("k")) is not None and is_secret_value(m.group("v"), "")


# <property name="password" value="pw"/>, <add key="DbPassword" value="pw"/>, and PHP's
# define('DB_PASSWORD', 'pw').
_NAMED_VALUE = rule(
    lead("name", "key") + r"[ \t]*+=[ \t]*+(?P<q>[\"'])(?P<k>[\w.:-]{1,100}+)(?P=q)"
    r"[ \t]++value[ \t]*+=[ \t]*+(?P<q2>[\"'])(?P<v>[^\"'\n]++)(?P=q2)",
    lambda m: kind_for_keyword(credential_key(m.group("k")) or ""), ("value",), flags=CI,
    accept=_named_value_accept,
)
_PHP_DEFINE = rule(
    lead("define") + r"[ \t]*+\([ \t]*+(?P<q>[\"'])(?P<k>[\w.-]{1,100}+)(?P=q)[ \t]*+,"
    r"[ \t]*+(?P<q2>[\"'])(?P<v>[^\"'\n]++)(?P=q2)",
    lambda m: kind_for_keyword(credential_key(m.group("k")) or ""), ("define",), flags=CI,
    accept=_named_value_accept,
)
# C and C++: #define DB_PASSWORD "pw"
_C_DEFINE = rule(
    r"#[ \t]*+define[ \t]++(?P<k>[\w]{1,100}+)[ \t]++(?:l|u8|u)?\"(?P<v>[^\"\n]++)\"",
    lambda m: kind_for_keyword(credential_key(m.group("k")) or ""), ("define",), flags=CI,
    accept=lambda m: credential_key(m.group("k")) is not None,
)
# Java/C# setters called with a literal: ds.setPassword("pw").
_SETTER = rule(
    lead("set") + r"(?P<k>Password|Passwd|Secret|ApiKey|Token|AccessKey|SecretKey"
    r"|ClientSecret|AuthToken|Passphrase)[ \t]*+\([ \t]*+\"(?P<v>[^\"\n]++)\"",
    lambda m: kind_for_keyword(m.group("k")), ("set",),
)


def _docker_auth_accept(m: re.Match[str]) -> bool:
    """Docker's and npm's ``auth`` is base64 of ``user:password``."""
    value = m.group("v")
    try:
        decoded = base64.b64decode(value + "=" * (-len(value) % 4), validate=True)
    except (binascii.Error, ValueError):
        return False
    return b":" in decoded or tokenish(value, 20)


_DOCKER_AUTH = rule(
    r"auth(?<![a-z0-9-]auth)(?<![\w-]_auth)[\"']?[ \t]*+[:=][ \t]*+[\"']?"
    r"(?P<v>[a-z0-9+/]{8,}+={0,2})(?![a-z0-9+/=])",
    "secret", ("auth",), flags=CI, accept=_docker_auth_accept,
)
# kubeconfig client keys; Kubernetes pull secrets.
_KUBE = rule(
    r"(?P<k>" + lead("client-key-data", ".dockerconfigjson", ".dockercfg") + r")"
    r"[\"']?[ \t]*+:[ \t]*+[\"']?(?P<v>[A-Za-z0-9+/]{16,}+={0,2})",
    lambda m: "private_key" if m.group("k") == "client-key-data" else "secret",
    ("client-key-data", ".dockercfg", ".dockerconfigjson"),
)

KEYED_RULES: tuple[Rule, ...] = (
    Rule(windowed(_XML_ELEMENT, _xml_handle, _XML_NEEDLES), _XML_NEEDLES),
    _NAMED_VALUE, _PHP_DEFINE, _C_DEFINE, _SETTER, _DOCKER_AUTH, _KUBE,
)
