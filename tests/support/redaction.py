"""What the tests of issue 18's redaction shapes share (tests/unit/test_redact_*.py, part 2):
fake secrets assembled at run time (prefix + generated body, so no literal looks like a live
credential to a secret scanner), the placeholder format, and ``check``: exact output, and
redacting the output again changes nothing.
"""

from __future__ import annotations

import random
import string

from retrieval.redaction._redactor import Redacted, redact

ALNUM = string.ascii_letters + string.digits
HEX = "0123456789abcdef"
P = "[REDACTED:{}]".format


def check(text: str, expected: str, counts: dict[str, int]) -> None:
    got = redact(text)
    assert got == Redacted(text=expected, counts=counts)
    assert redact(got.text) == Redacted(text=got.text, counts={})


def fake_body(rng: random.Random, alphabet: str, n: int) -> str:
    """``n`` characters of ``alphabet`` drawn from ``rng``, with an upper, a lower case letter
    and a digit where the alphabet has them (real tokens do). Each module binds its own
    seeded ``rng`` (``functools.partial``), so its secrets do not depend on what else runs."""
    while True:
        s = "".join(rng.choice(alphabet) for _ in range(n))
        if all(not (set(c) & set(alphabet)) or set(c) & set(s)
               for c in (string.ascii_uppercase, string.ascii_lowercase, string.digits)):
            return s
