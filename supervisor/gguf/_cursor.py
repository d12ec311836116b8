"""A read position in an open GGUF file, served from windows fetched with ``os.pread``.

The header is streamed, never mapped: a window of ``_WINDOW`` bytes at a time, and the
tensor data is never read. Every read past the end of the file raises the
``InvalidModelError`` that says what was truncated.
"""

from __future__ import annotations

import os
import struct
from typing import Final

from ..errors import InvalidModelError

__all__ = ["Cursor"]

_WINDOW: Final = 1 << 20  # bytes fetched per pread while walking the header

_U32: Final = struct.Struct("<I")
_U64: Final = struct.Struct("<Q")


class Cursor:
    """A read position in an open file, served from a window fetched with ``pread``."""

    __slots__ = ("_base", "_buf", "_fd", "_path", "pos", "size")

    def __init__(self, fd: int, size: int, path: str) -> None:
        self._fd = fd
        self._path = path
        self._buf = b""
        self._base = 0  # file offset of _buf[0]
        self.size = size
        self.pos = 0

    def fail(self, reason: str) -> InvalidModelError:
        return InvalidModelError(self._path, reason)

    def truncated(self, what: str) -> InvalidModelError:
        return self.fail(f"truncated {what}: the file ends at {self.size} bytes")

    def _window(self, n: int, what: str) -> int:
        """Make bytes [pos, pos + n) available and return their offset in ``_buf``."""
        if self.pos + n > self.size:
            raise self.truncated(what)
        off = self.pos - self._base
        if off >= 0 and off + n <= len(self._buf):
            return off
        want = max(n, _WINDOW)
        data = os.pread(self._fd, want, self.pos)
        while len(data) < n:  # short read: only possible near EOF or if the file shrank
            more = os.pread(self._fd, want - len(data), self.pos + len(data))
            if not more:
                raise self.truncated(what)
            data += more
        self._buf = data
        self._base = self.pos
        return 0

    def unpack(self, fmt: struct.Struct, what: str) -> tuple[int | float, ...]:
        off = self._window(fmt.size, what)
        self.pos += fmt.size
        return fmt.unpack_from(self._buf, off)

    def u32(self, what: str) -> int:
        off = self._window(4, what)
        self.pos += 4
        return int(_U32.unpack_from(self._buf, off)[0])

    def u64(self, what: str) -> int:
        off = self._window(8, what)
        self.pos += 8
        return int(_U64.unpack_from(self._buf, off)[0])

    def take(self, n: int, what: str) -> bytes:
        off = self._window(n, what)
        self.pos += n
        return self._buf[off : off + n]

    def skip(self, n: int, what: str) -> None:
        if self.pos + n > self.size:
            raise self.truncated(what)
        self.pos += n

    def string(self, limit: int, what: str, *, cut: bool = False) -> str:
        """Read a length-prefixed UTF-8 string of at most ``limit`` bytes.

        With ``cut`` a longer string is cut to ``limit`` bytes; otherwise it is refused.
        """
        n = self.u64(what)
        if n > limit:
            if not cut:
                raise self.fail(f"{what} is {n} bytes long (limit {limit})")
            if self.pos + n > self.size:
                raise self.truncated(what)
            text = self.take(limit, what).decode("utf-8", errors="replace")
            self.pos += n - limit
            return text
        try:
            return self.take(n, what).decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not valid UTF-8") from None

    def skip_strings(self, count: int, what: str) -> None:
        """Skip ``count`` length-prefixed strings without materialising any of them.

        This is the hot loop of the whole parser (a vocabulary has up to a few hundred
        thousand entries), so it does the least per item: no per-string cap, since a
        huge length only jumps past the end of the file, which is then reported.
        """
        unpack = _U64.unpack_from
        remaining = count
        while remaining:
            off = self._window(8, what)
            buf = self._buf
            last = len(buf) - 8
            done = 0
            # Walk every length prefix that lies inside the window; a string body may run
            # past its end, the next window starts wherever the walk stopped.
            for done in range(remaining):  # noqa: B007 - read after the loop
                if off > last:
                    break
                (n,) = unpack(buf, off)
                off += 8 + n
            else:
                done = remaining
            remaining -= done
            self.pos = self._base + off
            if self.pos > self.size:
                raise self.truncated(what)
