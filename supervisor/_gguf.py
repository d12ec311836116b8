"""Validate a GGUF model file before a child is launched with it.

A child given a missing, truncated or foreign file fails minutes later with a log line
nobody reads, and the supervisor would retry it forever. ``read_gguf_info`` answers in
milliseconds instead, with one line saying what is wrong, so a bad file opens the circuit
breaker at once (ARCHITECTURE.md, invariant 3).

The parser streams the header through ``os.pread`` windows: it never maps or reads the
tensor data, skips values it does not need (a 262k-entry tokenizer vocabulary costs one
tight loop over length prefixes), and bounds every count and length by a hard cap and by
the bytes left in the file, so a hostile header cannot make it allocate gigabytes or spin.
It applies the same structural checks as llama.cpp's ``gguf_init_from_file_impl``
(``ggml/src/gguf.cpp``): version, duplicate keys, tensor name length, dimension count,
row size a multiple of the block size, contiguous aligned data offsets; and, like
``llama_model_loader``, that every tensor's bytes lie inside the file.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import struct
from dataclasses import dataclass
from typing import Final

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, LlamaFileType

from .errors import InvalidModelError

__all__ = ["GGUFInfo", "read_gguf_info", "sha256_file"]

_MAGIC: Final = b"GGUF"
_SUPPORTED_VERSIONS: Final = (2, 3)
_DEFAULT_ALIGNMENT: Final = 32

# Caps on what a header may claim. Real models stay far below them: a few dozen keys,
# a few thousand tensors, vocabularies and merge lists of a few hundred thousand entries.
_MAX_KV_COUNT: Final = 1 << 16
_MAX_TENSOR_COUNT: Final = 1 << 20
_MAX_ARRAY_LEN: Final = 1 << 24
_MAX_KEY_LEN: Final = 65535  # the GGUF spec limits keys to 2**16 - 1 bytes
_MAX_STRING_LEN: Final = 1 << 28  # a skipped string value (chat templates are the big ones)
_MAX_ARCH_LEN: Final = 64
_MAX_NAME_LEN: Final = 1024  # longer general.name values are cut, not refused
_GGML_MAX_NAME: Final = 64  # tensor names must be shorter (ggml.h GGML_MAX_NAME)
_GGML_MAX_DIMS: Final = 4
_INT64_MAX: Final = (1 << 63) - 1

_WINDOW: Final = 1 << 20  # bytes fetched per pread while walking the header

_U32: Final = struct.Struct("<I")
_U64: Final = struct.Struct("<Q")

# GGUF metadata value types (gguf.GGUFValueType), with the scalar ones' encodings.
_T_STRING: Final = 8
_T_ARRAY: Final = 9
_SCALARS: Final[dict[int, tuple[str, struct.Struct]]] = {
    0: ("uint8", struct.Struct("<B")),
    1: ("int8", struct.Struct("<b")),
    2: ("uint16", struct.Struct("<H")),
    3: ("int16", struct.Struct("<h")),
    4: ("uint32", struct.Struct("<I")),
    5: ("int32", struct.Struct("<i")),
    6: ("float32", struct.Struct("<f")),
    7: ("bool", struct.Struct("<B")),
    10: ("uint64", struct.Struct("<Q")),
    11: ("int64", struct.Struct("<q")),
    12: ("float64", struct.Struct("<d")),
}
_INTEGER_TYPES: Final = frozenset({0, 1, 2, 3, 4, 5, 10, 11})
_UINT32: Final = 4


@dataclass(frozen=True)
class GGUFInfo:
    """What a valid GGUF file says about itself.

    Attributes:
        path: the absolute path with symlinks resolved.
        size: the file size in bytes.
        version: the GGUF format version (2 or 3).
        architecture: ``general.architecture``, for example ``"llama"`` or ``"bert"``.
        name: ``general.name``, or ``""`` when absent.
        context_length: ``{architecture}.context_length``, or 0 when absent.
        embedding_length: ``{architecture}.embedding_length``, or 0 when absent.
        tensor_count: the number of tensors.
        file_type: ``general.file_type`` as a name such as ``"Q4_K_M"`` or ``"F16"``,
            ``""`` when absent, or the number as text when this gguf package does not
            know it.
        has_chat_template: the file carries ``tokenizer.chat_template``.
        block_count: ``{architecture}.block_count`` (layers), or 0 when absent.
        head_count: ``{architecture}.attention.head_count``, or 0.
        head_count_kv: ``{architecture}.attention.head_count_kv``, or 0 (then equal to
            ``head_count``).
    """

    path: str
    size: int
    version: int
    architecture: str
    name: str
    context_length: int
    embedding_length: int
    tensor_count: int
    file_type: str
    has_chat_template: bool = False
    block_count: int = 0
    head_count: int = 0
    head_count_kv: int = 0

    def kv_cache_bytes(self, tokens: int) -> int:
        """Bytes of an f16 KV cache holding ``tokens`` tokens (an estimate: 2 tensors,
        K and V, per layer, scaled by grouped-query attention)."""
        if not (self.block_count and self.embedding_length):
            return 0
        heads = self.head_count or 1
        kv_heads = self.head_count_kv or heads
        per_token = 2 * self.block_count * self.embedding_length * kv_heads // heads
        return per_token * 2 * tokens


def read_gguf_info(path: str | os.PathLike[str]) -> GGUFInfo:
    """Check that ``path`` is a complete GGUF model file and return its header facts.

    Reads the header and metadata only (a few megabytes at most, even for a model of
    many gigabytes) and checks that the file is long enough to hold every tensor. It
    never blocks on a FIFO or device: the path is checked with ``stat`` first and opened
    with ``O_NONBLOCK``.

    Args:
        path: the model file.

    Returns:
        The header facts.

    Raises:
        InvalidModelError: the file is missing, not a regular file, unreadable, empty,
            not a GGUF file, of an unsupported version, corrupt, or truncated. Its
            ``reason`` is one line naming what is wrong.
    """
    fspath = os.fspath(path)
    try:
        fd, size = _open_regular(fspath)
    except OSError as exc:
        raise InvalidModelError(fspath, _os_reason(exc)) from exc
    try:
        if size == 0:
            raise InvalidModelError(fspath, "empty file (0 bytes)")
        return _parse(_Cursor(fd, size, fspath), os.path.realpath(fspath))
    finally:
        os.close(fd)


def sha256_file(path: str | os.PathLike[str], *, chunk: int = 1 << 20) -> str:
    """Return the hex SHA-256 of a regular file's contents, read ``chunk`` bytes at a time.

    Like ``read_gguf_info`` it refuses, without blocking, anything but a regular file.

    Args:
        path: the file.
        chunk: the read size in bytes.

    Returns:
        The lowercase hex digest.

    Raises:
        OSError: the file cannot be opened or read, or is not a regular file (I/O
            errors stay ``OSError`` so callers that hash in the background can ignore
            them; ``read_gguf_info`` is the check that explains what is wrong).
        ValueError: ``chunk`` is not positive.
    """
    if chunk <= 0:
        raise ValueError(f"chunk must be positive, got {chunk}")
    fd, _ = _open_regular(os.fspath(path))
    digest = hashlib.sha256()
    view = memoryview(bytearray(chunk))
    with open(fd, "rb", buffering=0, closefd=True) as f:
        while n := f.readinto(view):
            digest.update(view[:n])
    return digest.hexdigest()


class _NotRegularFileError(OSError):
    """The path names a directory, FIFO, device or socket; ``strerror`` says which."""


def _open_regular(path: str) -> tuple[int, int]:
    """Open ``path`` read-only if it is a regular file; return (fd, size).

    Raises:
        OSError: from ``stat`` or ``open``, or ``_NotRegularFileError``.
    """
    _require_regular(path, os.stat(path).st_mode)
    # O_NONBLOCK: if the path is swapped for a FIFO after the stat, open still returns
    # at once instead of waiting for a writer; the fstat below then refuses it.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        _require_regular(path, st.st_mode)
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


def _require_regular(path: str, mode: int) -> None:
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        kind = "a directory"
    elif stat.S_ISFIFO(mode):
        kind = "a FIFO"
    elif stat.S_ISCHR(mode):
        kind = "a character device"
    elif stat.S_ISBLK(mode):
        kind = "a block device"
    elif stat.S_ISSOCK(mode):
        kind = "a socket"
    else:
        kind = "a special file"
    raise _NotRegularFileError(errno.EINVAL, f"not a regular file: it is {kind}", path)


def _os_reason(exc: OSError) -> str:
    if isinstance(exc, _NotRegularFileError):
        return str(exc.strerror)
    reasons = {
        errno.ENOENT: "no such file",
        errno.ELOOP: "symlink loop (too many levels of symbolic links)",
        errno.EACCES: "permission denied",
        errno.EPERM: "operation not permitted",
        errno.ENOTDIR: "a component of the path is not a directory",
        errno.ENAMETOOLONG: "file name too long",
    }
    if exc.errno is not None and exc.errno in reasons:
        return reasons[exc.errno]
    return f"cannot open: {exc.strerror or exc}"


class _Cursor:
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


def _parse(cur: _Cursor, realpath: str) -> GGUFInfo:
    head = cur.take(min(cur.size, 4), "magic")
    if head != _MAGIC[: len(head)]:
        raise cur.fail(f"not a GGUF file (magic {head!r})")
    version = cur.u32("header")
    tensor_count = cur.u64("header")
    kv_count = cur.u64("header")
    if version not in _SUPPORTED_VERSIONS:
        hint = ""
        if version & 0xFFFF == 0:
            hint = " (byte order mismatch: a big-endian GGUF?)"
        elif version == 1:
            hint = " (GGUFv1 is no longer supported by llama.cpp)"
        raise cur.fail(f"unsupported GGUF version {version}{hint}; supported: 2, 3")
    if kv_count > _MAX_KV_COUNT:
        raise cur.fail(f"corrupt header: {kv_count} metadata entries (limit {_MAX_KV_COUNT})")
    if tensor_count > _MAX_TENSOR_COUNT:
        raise cur.fail(f"corrupt header: {tensor_count} tensors (limit {_MAX_TENSOR_COUNT})")

    strings, ints, keys = _read_metadata(cur, kv_count)

    architecture = strings.get("general.architecture")
    if architecture is None:
        raise cur.fail("missing general.architecture")
    if not architecture:
        raise cur.fail("general.architecture is empty")
    alignment = ints.get("general.alignment", _DEFAULT_ALIGNMENT)
    if alignment <= 0 or alignment & (alignment - 1):
        raise cur.fail(f"general.alignment {alignment} is not a power of 2")
    if tensor_count == 0:
        raise cur.fail("no tensors (a vocabulary-only GGUF?)")

    data_end = _read_tensor_infos(cur, tensor_count, alignment)
    data_start = -(-cur.pos // alignment) * alignment
    need = data_start + data_end
    if cur.size < need:
        raise cur.fail(f"truncated: {cur.size} bytes, tensors need {need}")

    return GGUFInfo(
        path=realpath,
        size=cur.size,
        version=version,
        architecture=architecture,
        name=strings.get("general.name", ""),
        context_length=ints.get(f"{architecture}.context_length", 0),
        embedding_length=ints.get(f"{architecture}.embedding_length", 0),
        tensor_count=tensor_count,
        file_type=_file_type_name(ints.get("general.file_type")),
        has_chat_template="tokenizer.chat_template" in keys,
        block_count=ints.get(f"{architecture}.block_count", 0),
        head_count=ints.get(f"{architecture}.attention.head_count", 0),
        head_count_kv=ints.get(f"{architecture}.attention.head_count_kv", 0),
    )


def _read_metadata(
    cur: _Cursor, kv_count: int
) -> tuple[dict[str, str], dict[str, int], set[str]]:
    """Walk the key/value section; keep the few values ``GGUFInfo`` needs, skip the rest.

    Returns the string values, the integer values, and every key seen.
    """
    strings: dict[str, str] = {}
    ints: dict[str, int] = {}
    seen: set[str] = set()
    for i in range(kv_count):
        label = f"metadata key #{i}"
        key = cur.string(_MAX_KEY_LEN, label)
        if key in seen:
            raise cur.fail(f"duplicate metadata key {key!r}")
        seen.add(key)
        label = f"metadata value {key!r}"
        vtype = cur.u32(label)
        if key == "general.architecture":
            _expect(cur, key, vtype, _T_STRING)
            strings[key] = cur.string(_MAX_ARCH_LEN, label)
        elif key == "general.name" and vtype == _T_STRING:
            strings[key] = cur.string(_MAX_NAME_LEN, label, cut=True)
        elif key == "general.alignment":
            _expect(cur, key, vtype, _UINT32)
            ints[key] = cur.u32(label)
        elif vtype in _INTEGER_TYPES and (
            key == "general.file_type"
            or key.endswith((".context_length", ".embedding_length", ".block_count",
                             ".attention.head_count", ".attention.head_count_kv"))
        ):
            ints[key] = int(cur.unpack(_SCALARS[vtype][1], label)[0])
        else:
            _skip_value(cur, vtype, label)
    return strings, ints, seen


def _expect(cur: _Cursor, key: str, vtype: int, want: int) -> None:
    if vtype != want:
        raise cur.fail(f"{key} has type {_type_name(vtype)}, expected {_type_name(want)}")


def _type_name(vtype: int) -> str:
    if vtype in _SCALARS:
        return _SCALARS[vtype][0]
    return {_T_STRING: "string", _T_ARRAY: "array"}.get(vtype, f"unknown ({vtype})")


def _skip_value(cur: _Cursor, vtype: int, label: str) -> None:
    if vtype in _SCALARS:
        cur.skip(_SCALARS[vtype][1].size, label)
    elif vtype == _T_STRING:
        n = cur.u64(label)
        if n > _MAX_STRING_LEN:
            raise cur.fail(f"{label} is a string of {n} bytes (limit {_MAX_STRING_LEN})")
        cur.skip(n, label)
    elif vtype == _T_ARRAY:
        etype = cur.u32(label)
        count = cur.u64(label)
        if count > _MAX_ARRAY_LEN:
            raise cur.fail(f"{label} is an array of {count} items (limit {_MAX_ARRAY_LEN})")
        if etype in _SCALARS:
            cur.skip(count * _SCALARS[etype][1].size, label)
        elif etype == _T_STRING:
            if cur.pos + 8 * count > cur.size:  # every item has at least its length prefix
                raise cur.truncated(label)
            cur.skip_strings(count, label)
        elif etype == _T_ARRAY:
            # gguf.cpp refuses nested arrays too, so llama.cpp could not load this file.
            raise cur.fail(f"{label} is a nested array, which llama.cpp does not support")
        else:
            raise cur.fail(f"{label} is an array of unknown type {etype}")
    else:
        raise cur.fail(f"{label} has unknown type {vtype}")


def _read_tensor_infos(cur: _Cursor, tensor_count: int, alignment: int) -> int:
    """Walk the tensor infos; return where the last tensor's bytes end in the data section."""
    if cur.pos + 24 * tensor_count > cur.size:  # the smallest tensor info is 24 bytes
        raise cur.truncated("tensor infos")
    names: set[str] = set()
    expected_offset = 0
    end = 0
    for i in range(tensor_count):
        label = f"tensor info #{i}"
        name = cur.string(_MAX_KEY_LEN, label)
        if len(name.encode()) >= _GGML_MAX_NAME:
            raise cur.fail(f"tensor name {name[:80]!r} is too long (limit {_GGML_MAX_NAME - 1})")
        if name in names:
            raise cur.fail(f"duplicate tensor name {name!r}")
        names.add(name)
        label = f"tensor info {name!r}"
        n_dims = cur.u32(label)
        if n_dims > _GGML_MAX_DIMS:
            raise cur.fail(f"tensor {name!r} has {n_dims} dimensions (limit {_GGML_MAX_DIMS})")
        dims = [cur.u64(label) for _ in range(n_dims)]
        nelements = 1
        for d in dims:
            nelements *= d
        if any(d > _INT64_MAX for d in dims) or nelements > _INT64_MAX:
            raise cur.fail(f"tensor {name!r} has an impossible shape {dims}")
        raw_type = cur.u32(label)
        try:
            qtype = GGMLQuantizationType(raw_type)
            block_size, type_size = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise cur.fail(f"tensor {name!r} has unknown ggml type {raw_type}") from None
        row = dims[0] if dims else 1
        if row % block_size:
            raise cur.fail(
                f"tensor {name!r} of type {qtype.name} has rows of {row} elements, "
                f"not a multiple of its block size {block_size}"
            )
        nbytes = nelements // block_size * type_size
        offset = cur.u64(label)
        # gguf.cpp requires each tensor to start right after the previous one, padded.
        if offset != expected_offset:
            raise cur.fail(f"tensor {name!r} has data offset {offset}, expected {expected_offset}")
        expected_offset = offset + -(-nbytes // alignment) * alignment
        end = max(end, offset + nbytes)
    return end


def _file_type_name(value: int | None) -> str:
    if value is None:
        return ""
    try:
        name = LlamaFileType(value).name
    except ValueError:
        return str(value)
    for prefix in ("MOSTLY_", "ALL_"):
        name = name.removeprefix(prefix)
    return name
