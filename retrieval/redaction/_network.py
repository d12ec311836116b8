"""Optional redaction of host names and IP addresses (``redact(hostnames=True, ips=True)``).

These match often in ordinary text, so the checks live in the patterns, with no Python
callback per match except for IPv6 (validated by :mod:`ipaddress`).
"""

from __future__ import annotations

import ipaddress
import re

from ._base import Rule, rule, windowed

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
_HOSTNAME_RE = re.compile(
    r"(?<![\w.\-])(?:[a-z0-9][a-z0-9\-]{0,62}+\.(?=[a-z0-9]))++(?=[a-z]{2})"
    rf"(?:{'|'.join(_GENERIC_TLDS)}|(?!(?:{'|'.join(_FILE_EXTENSIONS)})\b)[a-z]{{2}})"
    r"(?![\w\-]|\.[\w\-])",
    re.IGNORECASE,
)


def _whole(kind: str, pattern: re.Pattern[str]) -> Rule:
    return Rule(windowed(pattern, lambda m: (m.start(), m.end(), kind), ()), (".",))


HOSTNAME = _whole("hostname", _HOSTNAME_RE)

_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
IPV4 = _whole("ip", re.compile(rf"(?<![\w.])(?:{_OCTET}\.){{3}}{_OCTET}(?![\w]|\.[0-9])"))


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
IPV6 = rule(
    rf"(?<![\w:.])(?:(?:{_H16}:){{7}}{_H16}|(?:{_H16}:){{6}}{_V4}"
    rf"|(?:{_H16}(?::{_H16}){{0,6}})?::(?:(?:{_H16}:){{0,5}}{_V4}|{_H16}(?::{_H16}){{0,6}})?)"
    r"(?:%[A-Za-z0-9_.]{1,16}+)?(?![\w:]|\.[0-9A-Za-z])",
    "ip", (":",), group="", accept=_ipv6_accept,
)
