"""Secrets in file names: redacted wherever a name is shown or kept (ARCHITECTURE.md, 8).

A file called ``AKIA....txt`` or ``token=ghp_....md`` would carry its secret into the
document id, the path shown in hits, citations and Status, the chunk ids and the scan's
reports. :func:`redact_name` redacts each ``/``-separated part of a name on its own, like
any text, and gives each placeholder a marker derived from the original part
(``[REDACTED:aws_key.3f9a0c1b2d4e]``), so that the name stays:

* **stable**: the same file gets the same redacted name on every scan, so a reindex
  updates its document and a deleted file's document is found and deleted;
* **distinct**: two files that differ only in their secret (``password=a.md``,
  ``password=b.md``) keep different ids (48 bits of marker: a collision needs ~16
  million secret-named files in one folder);
* **safe to redact again**: the placeholder keeps the ``[REDACTED:<type>]`` grammar, so
  that redacting text that quotes the name (a citation in a prompt) changes nothing.

The marker is scrypt (n=2**14, r=8) of the original part with a fixed salt: unkeyed, so a
guessed secret can be checked against it, at about 30 ms and 16 MiB per guess. The
extension the original part ended with is kept, so that the name still says its type.
"""

from __future__ import annotations

import functools
import hashlib
import re

from ._redactor import redact

__all__ = ["redact_name"]

_SALT = b"llamad/redacted-file-name/1"
_PLACEHOLDER = re.compile(r"\[REDACTED:([A-Za-z0-9_-]{1,27})\]")
_EXTENSION = re.compile(r"\.[A-Za-z0-9]{1,8}\Z")


def _marker(part: str) -> str:
    """12 hex characters derived from ``part`` (see the module docstring)."""
    data = part.encode("utf-8", "surrogatepass")
    return hashlib.scrypt(data, salt=_SALT, n=1 << 14, r=8, p=1, dklen=6).hex()


# A part of only these characters, with no run of 16 letters, digits, "_" or "-", holds
# no secret: every rule needs a separator ("=", ":", "@", "$", a space, ...) or a token of
# 16 characters or more. Most file names are like that: they skip the redactor.
_PLAIN = re.compile(r"[A-Za-z0-9._-]*+")
_LONG_RUN = re.compile(r"[A-Za-z0-9_-]{16}")


def _redact_part(part: str) -> str:
    if _PLAIN.fullmatch(part) is not None and _LONG_RUN.search(part) is None:
        return part
    cleaned = redact(part).text
    if cleaned == part:
        return part
    marker = _marker(part)
    out = _PLACEHOLDER.sub(lambda m: f"[REDACTED:{m.group(1)}.{marker}]", cleaned)
    extension = _EXTENSION.search(part)
    if extension is not None and not out.endswith(extension.group()):
        out += extension.group()
    return out


@functools.lru_cache(maxsize=16384)
def redact_name(name: str) -> str:
    """``name`` (a file name, a path relative to a source, or an absolute path) with the
    secrets in each ``/``-separated part replaced by a marked placeholder; the name itself
    when it holds none. Pure and deterministic (see the module docstring)."""
    if not name:
        return name
    return "/".join(_redact_part(part) if part else part for part in name.split("/"))
