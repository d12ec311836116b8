"""Exclude patterns of a directory source: gitignore-style globs, applied before a file
is opened or a directory entered.

The rules are git's (``gitignore(5)``), on paths relative to the source's root:

* a blank line or one starting with ``#`` is nothing; ``\\#`` and ``\\!`` start a
  pattern with that character; trailing spaces are dropped;
* ``!pattern`` includes again what an earlier pattern excluded (the last pattern that
  matches decides); a file inside an excluded directory cannot be included again, since
  the directory is never entered;
* a trailing ``/`` matches directories only;
* a pattern with a ``/`` at its start or middle is anchored at the root (``/build``,
  ``docs/private``); one without matches a name at any depth (``*.pem``, ``private``);
* ``*`` matches within one path component, ``?`` one character, ``[a-z]`` a class;
  ``**`` as a whole component matches any number of directories (``**/keys``,
  ``vault/**``, ``a/**/b``).

Each component is matched by :mod:`fnmatch`'s translation (whose regular expressions do
not backtrack catastrophically), and the components by a bounded dynamic programme, so
a hostile pattern costs at most its length times the path's; rules that name a file or
directory at any depth (all the defaults) are folded into one expression.

:data:`DEFAULT_EXCLUDES` keeps key and credential files out of every directory source
unless the operator turns them off (``retrieval.exclude_defaults``) or includes one
again with ``!``.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

DEFAULT_EXCLUDES: tuple[str, ...] = (
    # private keys and certificates with keys
    "*.pem", "*.key", "*.p12", "*.pfx", "*.jks", "*.keystore", "*.ppk",
    "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*",
    # password and secret stores
    "*.kdbx", "*.kdb", "*.agilekeychain", "*.opvault", "*.gpg", "*.asc",
    # environment and credential files of common tools
    ".env", ".env.*", "*.env", ".netrc", "_netrc", ".pgpass", ".git-credentials",
    ".npmrc", ".pypirc", "credentials", "credentials.json", "*.tfstate",
    "*.tfstate.backup", ".vault-token", ".htpasswd",
    # directories of such things
    ".ssh/", ".gnupg/", ".aws/", ".docker/", ".kube/",
)
"""Excluded from every directory source while ``retrieval.exclude_defaults`` is on."""


class ExcludeError(ValueError):
    """A pattern list that cannot be used (too many, too long); the message says which."""


@dataclass(frozen=True, slots=True)
class _Rule:
    parts: tuple[str, ...]     # components; "**" for any number of directories
    negated: bool
    directory_only: bool


@lru_cache(maxsize=4096)
def _component(glob: str) -> re.Pattern[str]:
    return re.compile(fnmatch.translate(glob))


def _parse(pattern: str) -> _Rule | None:
    line = pattern.rstrip(" ")
    if not line or line.startswith("#"):
        return None
    negated = line.startswith("!")
    if negated or line.startswith(("\\#", "\\!")):  # "!x" or an escaped "\!x", "\#x"
        line = line[1:]
    directory_only = line.endswith("/")
    line = line.rstrip("/")
    anchored = "/" in line  # at its start or in its middle
    line = line.lstrip("/")
    if not line:
        return None
    parts = tuple(p for p in line.split("/") if p)
    if not anchored:
        parts = ("**", *parts)
    return _Rule(parts, negated, directory_only)


def _matches(parts: tuple[str, ...], path: tuple[str, ...]) -> bool:
    """Whether the components ``path`` match ``parts`` (with ``**``), in O(len * len)."""
    n, m = len(parts), len(path)
    # ok[i][j]: parts[i:] match path[j:]
    ok = [[False] * (m + 1) for _ in range(n + 1)]
    ok[n][m] = True
    for i in range(n - 1, -1, -1):
        part = parts[i]
        for j in range(m, -1, -1):
            if part == "**":
                ok[i][j] = ok[i + 1][j] or (j < m and ok[i][j + 1])
            else:
                ok[i][j] = j < m and ok[i + 1][j + 1] and \
                    _component(part).match(path[j]) is not None
    return ok[0][0]


@dataclass(frozen=True, slots=True)
class _Names:
    """Adjacent rules that match a name at any depth (``*.pem``, ``private/``) and agree
    in negation and directory-only: one regular expression for the last component (such
    a rule matches a path exactly when it matches its last component)."""

    regex: re.Pattern[str]
    negated: bool
    directory_only: bool


class ExcludeRules:
    """Compiled patterns (checked against the limits before, by :func:`check_patterns`);
    :meth:`excluded` says whether a relative path is left out.

    A scan asks for every file and directory of a source on its event loop, so the
    common rules (a name at any depth: all the defaults) are folded into one regular
    expression per run of alike rules; the others are matched component by component.
    """

    def __init__(self, patterns: Sequence[str]) -> None:
        self.patterns = tuple(patterns)
        self._rules: list[_Rule | _Names] = []
        names: list[str] = []
        for rule in (r for r in map(_parse, patterns) if r is not None):
            last = self._rules[-1] if self._rules else None
            if len(rule.parts) == 2 and rule.parts[0] == "**" and "**" not in rule.parts[1]:
                piece = fnmatch.translate(rule.parts[1])
                if isinstance(last, _Names) and (last.negated, last.directory_only) == (
                        rule.negated, rule.directory_only):
                    names.append(piece)
                    self._rules[-1] = _Names(re.compile("|".join(names)), rule.negated,
                                             rule.directory_only)
                    continue
                names = [piece]
                self._rules.append(_Names(re.compile(piece), rule.negated,
                                          rule.directory_only))
            else:
                self._rules.append(rule)

    def __bool__(self) -> bool:
        return bool(self._rules)

    def excluded(self, rel: str, *, is_dir: bool = False) -> bool:
        """Whether ``rel`` (relative to the root, ``/``-separated) is excluded by the last
        pattern that matches it. Its directories are not looked at: a walk never enters
        an excluded directory."""
        path = tuple(p for p in rel.split("/") if p)
        if not path:
            return False
        for rule in reversed(self._rules):
            if rule.directory_only and not is_dir:
                continue
            if isinstance(rule, _Names):
                if rule.regex.match(path[-1]) is not None:
                    return not rule.negated
            elif _matches(rule.parts, path):
                return not rule.negated
        return False


def check_patterns(patterns: Sequence[str], *, max_patterns: int, max_chars: int) -> None:
    """Refuse a pattern list over the limits, or with a control character in a pattern.

    Raises:
        ExcludeError: naming the limit or the pattern.
    """
    if len(patterns) > max_patterns:
        raise ExcludeError(f"{len(patterns)} exclude patterns; at most {max_patterns} "
                           "(retrieval.max_exclude_patterns)")
    total = sum(len(p) for p in patterns)
    if total > max_chars:
        raise ExcludeError(f"exclude patterns of {total} characters; at most {max_chars} "
                           "in all (retrieval.max_exclude_chars)")
    for i, pattern in enumerate(patterns):
        if any(ord(c) < 32 or ord(c) == 127 for c in pattern):
            raise ExcludeError(f"exclude pattern {i + 1} holds a control character "
                               "(a line break?): one pattern per entry")
