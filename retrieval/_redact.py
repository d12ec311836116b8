"""Credential redaction: secrets never reach an index or a model (ARCHITECTURE.md, 8).

:func:`redact` replaces credential-shaped text with ``[REDACTED:<type>]``. It runs at
ingest (before chunking) and again before prompt assembly, so it has to be:

* **Precise about shape, not about words.** Only assignments, key-value pairs, headers,
  config statements and well-known token formats are secrets; "Reset your password in the
  portal" is prose and survives. Look-alikes survive too: hex digests, git hashes, UUIDs,
  CVE ids, versions, dates, MAC addresses.
* **Idempotent.** ``redact(redact(t).text).text == redact(t).text``: no rule matches a
  placeholder, and no rule's output is shaped like another rule's input.
* **Linear-time.** Every pattern is anchored by a literal or a lookbehind that allows one
  match attempt per run of candidate characters, and every unbounded quantifier is
  possessive (Python 3.11), so a hostile 1 MB input cannot trigger catastrophic
  backtracking. Checks that a regex would express with unbounded lookaheads ("contains a
  digit") are done in Python on the match instead. Private key blocks are found with
  ``str.find`` for the same reason.

Values that are references or placeholders (``$PASSWORD``, ``${VAR}``, ``%VAR%``,
``<token>``, ``{{ secret }}``, ``****``) are left alone: they carry no secret, and runbooks
are full of them. When in doubt about a value in a key-value shape, it is redacted.
"""

from __future__ import annotations

import ipaddress
import re
import string
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["PLACEHOLDER_PREFIX", "Redacted", "redact"]

PLACEHOLDER_PREFIX = "[REDACTED:"


@dataclass(frozen=True)
class Redacted:
    """The result of :func:`redact`.

    Attributes:
        text: the input with every secret replaced by ``[REDACTED:<type>]``.
        counts: placeholder type -> occurrences replaced (types with none are absent).
    """

    text: str
    counts: dict[str, int]

    @property
    def total(self) -> int:
        """How many secrets were replaced in all."""
        return sum(self.counts.values())


def _placeholder(kind: str) -> str:
    return f"{PLACEHOLDER_PREFIX}{kind}]"


# --- value checks ------------------------------------------------------------------------

_NOT_SECRET_WORDS = frozenset({"null", "none", "nil", "true", "false", "~", "undefined"})
_TYPE_NAMES = frozenset({"str", "bytes", "string", "secretstr", "optional[str]"})


_VARIABLE = re.compile(r"\$(?:\{[^}\n]{1,100}\}|\([^)\n]{1,200}\)|[A-Za-z_][A-Za-z0-9_]{0,100})")


def _is_reference(value: str) -> bool:
    """True for values that are not secrets themselves: placeholders, variables, masks.

    ``$VAR``, ``${VAR}``, ``$(cmd)``, ``%VAR%``, ``<token>``, ``{{ secret }}``, ``****``,
    ``...`` and earlier placeholders are references; crypt hashes (``$1$...``, ``$6$...``,
    ``$9$...``) start with ``$`` too but are secrets.
    """
    v = value.strip().strip("\"'`")
    if not v:
        return True
    if v.startswith((PLACEHOLDER_PREFIX, "<", "{{", "{%", "...")):
        return True
    if v.startswith("$"):
        return _VARIABLE.fullmatch(v) is not None
    if v.startswith("%") and v.endswith("%") and len(v) > 2:
        return True
    return set(v) <= {"*", "\u2022"}  # a mask ("****", "••••")


def _has_digit(s: str) -> bool:
    return any(c.isdigit() for c in s)


def _has_letter(s: str) -> bool:
    return any(c.isalpha() for c in s)


# --- rules -------------------------------------------------------------------------------

Handler = Callable[[re.Match[str]], "tuple[str, str] | None"]
"""Gets a match; returns (replacement for the whole match, placeholder type) or None."""


@dataclass(frozen=True)
class _Rule:
    pattern: re.Pattern[str]
    handle: Handler | None    # None: the whole match becomes the placeholder of ``kind``
    needles: tuple[str, ...]  # the rule runs only if one of these is in text.lower()
    kind: str = ""


def _replace_group(
    kind: str | Callable[[re.Match[str]], str],
    group: str = "v",
    accept: Callable[[re.Match[str]], bool] | None = None,
) -> Handler:
    """A handler that replaces group ``group`` of the match (the whole match if absent)."""

    def handle(m: re.Match[str]) -> tuple[str, str] | None:
        if group in m.re.groupindex:
            value = m.group(group)
            start, end = m.span(group)
        else:
            value, (start, end) = m.group(0), m.span()
        if value is None or _is_reference(value):
            return None
        if accept is not None and not accept(m):
            return None
        k = kind if isinstance(kind, str) else kind(m)
        base = m.start()
        whole = m.group(0)
        return whole[: start - base] + _placeholder(k) + whole[end - base :], k

    return handle


def _rule(
    pattern: str,
    kind: str | Callable[[re.Match[str]], str],
    needles: tuple[str, ...],
    *,
    flags: int = 0,
    group: str = "v",
    accept: Callable[[re.Match[str]], bool] | None = None,
) -> _Rule:
    return _Rule(re.compile(pattern, flags), _replace_group(kind, group, accept), needles)


_I = re.IGNORECASE
_IM = re.IGNORECASE | re.MULTILINE

# Token alphabets.
_B64URL = r"A-Za-z0-9_\-"
_TOKEN68 = r"A-Za-z0-9\-._~+/"

# Authorization headers: "Authorization: Bearer <t>", "Authorization: Basic <b64>",
# "Authorization: token <t>" (GitHub). Without a known scheme the value must look like a
# token, so "Authorization: required for all endpoints" survives.
_AUTH_SCHEMES = {"bearer": "bearer_token", "basic": "secret", "token": "secret",
                 "bot": "secret", "apikey": "api_key", "sso-key": "api_key"}


def _auth_kind(m: re.Match[str]) -> str:
    scheme = (m.group("scheme") or "").lower()
    return _AUTH_SCHEMES.get(scheme, "secret")


def _auth_accept(m: re.Match[str]) -> bool:
    scheme = m.group("scheme")
    value = m.group("v")
    if scheme is not None:
        return scheme.lower() in _AUTH_SCHEMES or _tokenish(value)
    return value.lower() not in _AUTH_SCHEMES and _tokenish(value)


def _tokenish(value: str, min_len: int = 16) -> bool:
    return len(value) >= min_len and _has_digit(value) and _has_letter(value)


_AUTH_HEADER = _rule(
    r"(?<![\w-])(?:proxy-)?authorization[\"']?[ \t]*+[:=][ \t]*+[\"']?"
    r"(?:(?P<scheme>[A-Za-z][\w-]{0,19}+)[ \t]++)?(?P<v>[^\s\"',;\[]++)",
    _auth_kind, ("authorization",), flags=_I, accept=_auth_accept,
)

# "bearer <token>" anywhere (curl lines, logs). Prose ("the bearer of this card") has no
# 16+ character token with digits and letters after the word.
_BEARER = _rule(
    rf"(?<![\w-])bearer[ \t]++(?P<v>[{_TOKEN68}]{{16,}}+=*+)",
    "bearer_token", ("bearer",), flags=_I,
    accept=lambda m: _tokenish(m.group("v")),
)

# PEM private key blocks are handled by _redact_private_keys (str.find, not a regex).
_PEM_BEGIN = re.compile(r"-----BEGIN (?P<label>[A-Z0-9 ]{0,40}?PRIVATE KEY(?: BLOCK)?)-----")
# Body lines of an unterminated block: base64, armor headers ("Proc-Type: 4,ENCRYPTED"),
# blank lines. Matched with .match at one position, possessive: linear in what it eats.
_PEM_BODY = re.compile(
    r"(?:\r?\n(?:[ \t]*+[A-Za-z0-9+/=]{8,}+[ \t]*+"
    r"|(?:Proc-Type|DEK-Info|Comment|Version|Hash|Charset|MessageID):[^\n]*+|[ \t]*+)"
    r"(?=\r?\n|\Z))*+"
)

# JSON Web Tokens: three base64url segments, the first (the header) starting with eyJ.
_JWT = _rule(
    rf"(?<![{_B64URL}])eyJ[{_B64URL}]{{8,}}+\.[{_B64URL}]{{8,}}+\.[{_B64URL}]*+",
    "jwt", ("eyj",),
)

_AWS_KEY = _rule(r"(?<![A-Za-z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])",
                 "aws_key", ("akia", "asia"))

_AWS_SECRET = _rule(
    r"(?<![\w-])(?:aws_?secret_?(?:access_?)?key|secret_?access_?key)[\"']?[ \t]*+"
    r"(?::=|=>|=|:)[ \t]*+[\"']?(?P<v>[A-Za-z0-9/+=]{40})(?![A-Za-z0-9/+=])",
    "aws_secret", ("secret",), flags=_I,
)

_GCP_KEY = _rule(rf"(?<![{_B64URL}])AIza[{_B64URL}]{{35}}(?![{_B64URL}])",
                 "gcp_key", ("aiza",))

_GITHUB = _rule(
    r"(?<![A-Za-z0-9_])(?:gh[pousr]_[A-Za-z0-9]{36,255}+|github_pat_[A-Za-z0-9_]{22,255}+)"
    r"(?![A-Za-z0-9_])",
    "github_token", ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
)

_SLACK = _rule(
    r"(?<![A-Za-z0-9-])(?:xox[abposr]-|xapp-)[A-Za-z0-9-]{10,}+",
    "slack_token", ("xox", "xapp-"),
)
_SLACK_WEBHOOK = _rule(
    r"hooks\.slack\.com/services/(?P<v>[A-Za-z0-9_\-]++/[A-Za-z0-9/_\-]++)",
    "slack_token", ("hooks.slack.com",), flags=_I,
)


def _openai_accept(m: re.Match[str]) -> bool:
    body = m.group("v")[3:]
    return (_has_digit(body) and any(c.isupper() for c in body)
            and any(c.islower() for c in body))


# OpenAI-style keys: sk-..., sk-proj-..., sk-ant-... (20+ characters of mixed case and
# digits, so kebab-case slugs such as "sk-my-long-deployment-name" survive).
_OPENAI = _rule(
    r"(?<![A-Za-z0-9_\-])(?P<v>sk-[A-Za-z0-9_\-]{20,}+)",
    "openai_key", ("sk-",), accept=_openai_accept,
)

# scheme://user:password@host -> scheme://user:[REDACTED:connection_string]@host. The
# password runs to the last "@" of the authority (unencoded "@" in passwords happens).
_CONNECTION = _rule(
    r"(?<![A-Za-z0-9+.\-])[A-Za-z][A-Za-z0-9+.\-]{1,30}+://[^\s:/@?#\[\]]*+:"
    r"(?P<v>[^\s/?#]*)@",
    "connection_string", ("://",),
)

# --- network device configuration (Cisco IOS/NX-OS/ASA, Juniper) ---------------------------


def _cisco_type_accept(m: re.Match[str]) -> bool:
    """"password 7 <hex>", "secret 5 $1$...": the type digit says what the value looks like."""
    digit, value = m.group("t"), m.group("v")
    if digit == "7":
        return re.fullmatch(r"[0-9A-Fa-f]{4,}", value) is not None
    if digit in "589":
        return value.startswith("$")
    if digit == "6":  # AES-encrypted: long, not a word ("password 6 characters")
        return len(value) >= 16 and not value.isalpha()
    return digit == "0"


_CISCO_RULES = (
    # enable secret 5 $1$...; enable password [level 15] [7] cisco
    _rule(r"^(?P<p>[ \t]*+enable[ \t]++(?:secret|password)(?:[ \t]++level[ \t]++\d++)?"
          r"(?:[ \t]++[0-9](?=[ \t]))?[ \t]++)(?P<v>\S++)",
          "password", ("enable",), flags=re.MULTILINE),
    # username admin [privilege 15] secret 9 $9$... / password 7 0822455D0A16
    _rule(r"^(?P<p>[ \t]*+username[ \t]++\S++(?:[ \t]++(?!(?:password|secret)\b)\S++)*?"
          r"[ \t]++(?:password|secret)(?:[ \t]++[0-9](?=[ \t]))?[ \t]++)(?P<v>\S++)",
          "password", ("username",), flags=re.MULTILINE),
    # Juniper: encrypted-password "$6$..."; authentication-key "$9$..."; ascii-text "...".
    # A bare secret/password keyword needs a hash-shaped value: 'the secret "sauce"' stays.
    _rule(r"(?<![\w-])(?P<k>encrypted-password|simple-password|password|authentication-key|"
          r"ascii-text|hexadecimal|secret)[ \t]++\"(?P<v>[^\"\n]++)\"",
          lambda m: "password" if "password" in m.group("k").lower() else "secret",
          ("password", "authentication-key", "ascii-text", "hexadecimal", "secret"),
          accept=lambda m: m.group("k") not in {"secret", "password"}
          or m.group("v").startswith("$")),
    # "password 7 <hex>" / "secret 5 $1$..." anywhere on a line (neighbor, line, user).
    _rule(r"(?<![\w-])(?P<k>password|secret)[ \t]++(?P<t>[0-9])[ \t]++(?P<v>\S++)",
          lambda m: "password" if m.group("k").lower() == "password" else "secret",
          ("password", "secret"), accept=_cisco_type_accept),
    # neighbor 10.0.0.1 password <pw>
    _rule(r"(?<![\w-])neighbor[ \t]++\S++[ \t]++password[ \t]++(?:[0-9][ \t]++)?(?P<v>\S++)",
          "password", ("neighbor",)),
    # An indented "password <pw>" / "secret <pw>" / "key <k>" line in a config block
    # (line vty, tacacs server, ...). The value is the last token of the line.
    # (" key 1" under "key chain" is a key number, not a key.)
    _rule(r"^[ \t]++(?P<k>password|secret|key)[ \t]++(?:[0-9][ \t]++)?(?P<v>\S++)[ \t]*+$",
          lambda m: "password" if m.group("k") == "password" else "secret",
          ("password", "secret", "key"), flags=re.MULTILINE,
          accept=lambda m: m.group("k") != "key" or not m.group("v").isdigit()),
    _rule(r"(?<![\w-])key-string[ \t]++(?:[0-9][ \t]++)?(?P<v>\S++)",
          "secret", ("key-string",)),
    _rule(r"(?<![\w-])pre-shared-key(?:[ \t]++(?:local|remote))?"
          r"(?:[ \t]++address[ \t]++\S++(?:[ \t]++\d++\.\d++\.\d++\.\d++)?)?"
          r"(?:[ \t]++hostname[ \t]++\S++)?(?:[ \t]++key)?(?:[ \t]++[0-9](?=[ \t]))?"
          r"[ \t]++(?P<v>\S++)",
          "secret", ("pre-shared-key",),
          accept=lambda m: m.group("v").lower() not in {"ascii-text", "hexadecimal"}),
    _rule(r"(?<![\w-])crypto[ \t]++isakmp[ \t]++key[ \t]++(?:[0-9][ \t]++)?(?P<v>\S++)",
          "secret", ("isakmp",)),
    _rule(r"^[ \t]*+(?:tacacs-server|radius-server)(?:[ \t]++(?!key\b)\S++)*?[ \t]++key"
          r"[ \t]++(?:[0-9][ \t]++)?(?P<v>\S++)",
          "secret", ("tacacs-server", "radius-server"), flags=re.MULTILINE),
    # ntp authentication-key 1 md5 <k>; ip ospf message-digest-key 1 md5 [7] <k>
    _rule(r"(?<![\w-])(?:authentication-key|message-digest-key)[ \t]++(?:\d++[ \t]++)?"
          r"(?:md5[ \t]++)?(?:[0-9][ \t]++)?(?P<v>\S++)",
          "secret", ("authentication-key", "message-digest-key")),
    # snmp-server community <name> RO|RW; snmp-server host <h> [traps] [version 2c] <name>
    _rule(r"(?<![\w-])snmp-server[ \t]++community[ \t]++(?:[0-9][ \t]++)?(?P<v>\S++)",
          "snmp_community", ("snmp-server",)),
    _rule(r"(?<![\w-])snmp-server[ \t]++host[ \t]++\S++(?:[ \t]++(?:informs|traps))?"
          r"(?:[ \t]++version[ \t]++(?:1|2c|3[ \t]++\S++))?[ \t]++(?P<v>\S++)",
          "snmp_community", ("snmp-server",),
          accept=lambda m: m.group("v").lower() not in {"informs", "traps", "version"}),
    # Juniper: community public { authorization read-only; }  /  set snmp community public
    _rule(r"^[ \t]*+(?:set[ \t]++snmp[ \t]++)?community[ \t]++(?P<v>\"[^\"\n]*+\"|[^\s{;]++)",
          "snmp_community", ("community",), flags=re.MULTILINE),
)

# --- generic assignments: password=..., "api_key": "...", DB_PASSWORD: ... ---------------
#
# Found by the last word of the key (password, token, secret, ...key, credentials) followed
# by a separator, searched for in an ASCII-lowered copy of the text (same offsets, no
# IGNORECASE cost); the key is then read backwards and the value forwards, in Python.

_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)
_ASSIGN = re.compile(
    r"(?=[pstkc])(?P<kw>pass(?:words?|wd|phrase)?|pwd|secret|token|key|credentials?)"
    r"(?P<sep>(?:[\"'`]|\*\*|__)?[ \t]*+(?::=|=>|=|:)(?![=:/])(?:\*\*|__)?[ \t]*+)"
)
# Keys ending in "key" are secrets only with one of these before it (sort_key is not).
_KEY_SUFFIX = re.compile(r"(?:(?P<api>api[_-]?)|access[_-]?|private[_-]?|auth[_-]?|"
                         r"secret[_-]?)key\Z")
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


def _kind_for_keyword(kw: str) -> str:
    kw = kw.lower()
    if kw.startswith(("pass", "pwd")):
        return "password"
    if kw.startswith("api"):
        return "api_key"
    return "secret"


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
    before, first = key[at - 1], key[at]
    if before in "_.-" or (before.islower() and first.isupper()):
        return kw
    return None


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


def _is_secret_value(value: str, key: str) -> bool:
    lowered = value.lower()
    if _is_reference(value) or lowered in _NOT_SECRET_WORDS:
        return False
    if lowered in _TYPE_NAMES or lowered == key.lower().lstrip("-"):
        return False  # code: "password: str", "login(password=password)"
    # PWD=/home/alice is the working directory; private_key = /etc/ssl/x.key and
    # credentials: ~/.aws/credentials are paths to where a secret lives, not the secret.
    return not _is_path(value)


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] in "\"'" and value[-1] == value[0]:
        return value[1:-1]
    return value


def _is_path(value: str) -> bool:
    return value.startswith(("/", "~/", "./", "../")) and "/" in value[1:].lstrip("./")


def _redact_assignments(text: str, counts: Counter[str]) -> str:
    """Replace the values of ``key = value`` / ``key: value`` pairs whose key names a
    credential. One left-to-right pass; every character is looked at a bounded number of
    times (keys are read back at most 128 characters, line prefixes 64)."""
    lowered = text.translate(_ASCII_LOWER)
    out: list[str] = []
    pos = 0     # text before pos is already in out
    search = 0  # where the next key may start
    while (m := _ASSIGN.search(lowered, search)) is not None:
        search = m.end()
        key_start = _key_start(text, m.start())
        key = text[key_start : m.start("kw") + len(m.group("kw"))]
        if key_start < pos:
            continue  # inside a value already replaced
        kw = _keyword(key, m.group("kw"))
        if kw is None:
            continue
        line_begin = text.rfind("\n", max(0, key_start - _MAX_LINE_PREFIX - 1), key_start) + 1
        line_start = (key_start - line_begin <= _MAX_LINE_PREFIX
                      and (line_begin > 0 or key_start <= _MAX_LINE_PREFIX)
                      and _LINE_PREFIX.fullmatch(text, line_begin, key_start) is not None)
        start, end = _value_span(text, m.end(), line_start)
        if start >= end or not _is_secret_value(text[start:end], key):
            continue
        kind = _kind_for_keyword(kw)
        out += [text[pos:start], _placeholder(kind)]
        counts[kind] += 1
        pos = search = end
    out.append(text[pos:])
    return "".join(out)


_ASSIGN_NEEDLES = ("pass", "pwd", "secret", "token", "key", "credential")

# CLI flags with a space: --password hunter2, --api-key XYZ
# Prose about the flag ("pass --token with the request") keeps its words.
_PROSE_WORDS = frozenset({
    "a", "an", "the", "to", "with", "and", "or", "of", "for", "in", "on", "is", "are", "be",
    "as", "if", "when", "flag", "flags", "option", "options", "argument", "arguments",
    "parameter", "value", "values", "must", "can", "will", "should", "instead", "only",
    "also", "not", "from", "here"
})
_FLAG = _rule(
    r"(?<![\w-])--(?P<kw>password|passwd|pass|token|secret|api-key|apikey|client-secret)"
    r"[ \t]++(?P<v>(?!-)[^\s\"']++|" + _QUOTED + ")",
    lambda m: _kind_for_keyword(m.group("kw")), ("--",), flags=_I,
    accept=lambda m: m.group("v").lower().rstrip(".,;:") not in _PROSE_WORDS
    and not _is_path(_unquote(m.group("v"))),
)

# --- optional: hostnames and IP addresses ------------------------------------------------
#
# These match often in ordinary text, so the checks live in the patterns and the
# replacement is a constant (re.subn, no Python callback per match).

# Real TLDs that are also common file extensions are refused: config.sh, setup.py, a.md.
_FILE_EXTENSIONS = (
    "md", "py", "sh", "rs", "pl", "so", "ps", "js", "ts", "cs", "rb", "go", "cc", "mk", "pm",
    "in", "am", "ai", "as", "ml", "mo", "gz", "bz", "xz",
)
_GENERIC_TLDS = (
    "com", "net", "org", "edu", "gov", "mil", "int", "info", "biz", "dev", "app", "cloud",
    "localdomain", "local", "internal", "intranet", "lan", "corp", "home", "private", "arpa",
    "example", "test", "invalid", "localhost", "online", "site", "tech", "systems", "network",
    "services", "host", "server", "zone", "digital", "global",
)
_HOSTNAME = _Rule(
    re.compile(
        r"(?<![\w.\-])(?:[a-z0-9][a-z0-9\-]{0,62}+\.(?=[a-z0-9]))++(?=[a-z]{2})"
        rf"(?:{'|'.join(_GENERIC_TLDS)}|(?!(?:{'|'.join(_FILE_EXTENSIONS)})\b)[a-z]{{2}})"
        r"(?![\w\-]|\.[\w\-])",
        _I,
    ),
    None, (".",), "hostname",
)

_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_IPV4 = _Rule(
    re.compile(rf"(?<![\w.])(?:{_OCTET}\.){{3}}{_OCTET}(?![\w]|\.[0-9])"),
    None, (".",), "ip",
)


def _ipv6_accept(m: re.Match[str]) -> bool:
    candidate = m.group(0).split("%", 1)[0]
    if sum(1 for g in candidate.split(":") if g) < 2:
        return False
    try:
        ipaddress.IPv6Address(candidate)
    except ValueError:
        return False
    return True


_H16 = "[0-9A-Fa-f]{1,4}"
_V4 = r"[0-9]{1,3}(?:\.[0-9]{1,3}){3}"
# Full (8 groups), compressed (with "::"), and both with an IPv4 tail; then validated by
# ipaddress. Bounded quantifiers only.
_IPV6 = _rule(
    rf"(?<![\w:.])(?:(?:{_H16}:){{7}}{_H16}|(?:{_H16}:){{6}}{_V4}"
    rf"|(?:{_H16}(?::{_H16}){{0,6}})?::(?:(?:{_H16}:){{0,5}}{_V4}|{_H16}(?::{_H16}){{0,6}})?)"
    r"(?:%[A-Za-z0-9_.]{1,16}+)?(?![\w:]|\.[0-9A-Za-z])",
    "ip", (":",), group="", accept=_ipv6_accept,
)

# --- the pipeline ------------------------------------------------------------------------

# Order matters: specific formats first (their placeholders then stop the generic rules),
# generic assignments after, optional hostnames and addresses last.
_RULES: tuple[_Rule, ...] = (
    _JWT,
    _AWS_KEY,
    _AWS_SECRET,
    _GCP_KEY,
    _GITHUB,
    _SLACK,
    _SLACK_WEBHOOK,
    _OPENAI,
    _AUTH_HEADER,
    _BEARER,
    _CONNECTION,
    *_CISCO_RULES,
    _FLAG,
)


def redact(text: str, *, hostnames: bool = False, ips: bool = False) -> Redacted:
    """Replace credential-shaped text with ``[REDACTED:<type>]`` placeholders.

    Secrets (private keys, tokens, passwords in assignments and device configs, passwords
    in connection strings) are always redacted; host names and IP addresses only when
    asked. Pure and thread-safe; linear in ``len(text)``.

    Args:
        text: any text (an extracted document, a chunk, a prompt).
        hostnames: also redact FQDN-like host names (``web01.example.net``).
        ips: also redact IPv4 and IPv6 addresses (MAC addresses are kept).

    Returns:
        The redacted text and how many placeholders of each type were inserted.
        Idempotent: ``redact(redact(t).text).text == redact(t).text``.
    """
    counts: Counter[str] = Counter()
    lowered = text.lower()
    if "private key" in lowered:
        text = _redact_private_keys(text, counts)
    optional: list[_Rule] = []
    if ips:
        optional += [_IPV6, _IPV4]
    if hostnames:
        optional.append(_HOSTNAME)
    for rule in _RULES:
        if any(needle in lowered for needle in rule.needles):
            text = _apply(rule, text, counts)
    if any(needle in lowered for needle in _ASSIGN_NEEDLES):
        text = _redact_assignments(text, counts)
    for rule in optional:
        if any(needle in lowered for needle in rule.needles):
            text = _apply(rule, text, counts)
    return Redacted(text=text, counts=dict(counts))


def _apply(rule: _Rule, text: str, counts: Counter[str]) -> str:
    handle = rule.handle
    if handle is None:
        text, n = rule.pattern.subn(_placeholder(rule.kind), text)
        if n:
            counts[rule.kind] += n
        return text
    has_value = "v" in rule.pattern.groupindex
    out: list[str] = []
    pos = 0     # text[:pos] is in out
    search = 0  # where the next match may start
    while (m := rule.pattern.search(text, search)) is not None:
        result = handle(m)
        if result is None:
            # Rejected: look again inside the value, so that a rejected match never hides
            # a real one (a placeholder followed by a secret, say). Values hold no spaces
            # or are bounded, so this re-reads each character a bounded number of times.
            value_start = m.start("v") if has_value and m.start("v") > m.start() else m.end()
            search = max(value_start, m.start() + 1)
            continue
        replacement, kind = result
        counts[kind] += 1
        out += [text[pos : m.start()], replacement]
        pos = search = m.end()
    if not out:
        return text
    out.append(text[pos:])
    return "".join(out)


def _redact_private_keys(text: str, counts: Counter[str]) -> str:
    """Replace every ``-----BEGIN ... PRIVATE KEY-----`` block, END line included.

    An unterminated block (a truncated paste) loses its BEGIN line and the key-shaped lines
    after it. Linear: each END marker is searched for at most once per label, and a label
    whose END is missing is not searched for again.
    """
    out: list[str] = []
    pos = 0
    missing_end: set[str] = set()
    while (m := _PEM_BEGIN.search(text, pos)) is not None:
        out.append(text[pos : m.start()])
        end_marker = f"-----END {m.group('label')}-----"
        end = -1 if end_marker in missing_end else text.find(end_marker, m.end())
        if end == -1:
            missing_end.add(end_marker)
            body = _PEM_BODY.match(text, m.end())
            eaten = text[m.end() : body.end()] if body else ""
            pos = m.end() + len(eaten.rstrip())  # trailing blank lines stay
        else:
            pos = end + len(end_marker)
        out.append(_placeholder("private_key"))
        counts["private_key"] += 1
    out.append(text[pos:])
    return "".join(out)
