"""The GGUF header: what a valid file says about itself, and the checks that make it valid.

It applies the same structural checks as llama.cpp's ``gguf_init_from_file_impl``
(``ggml/src/gguf.cpp``): version, duplicate keys, tensor name length, dimension count,
row size a multiple of the block size, contiguous aligned data offsets; and, like
``llama_model_loader``, that every tensor's bytes lie inside the file. Every count and
length is bounded by a hard cap and by the bytes left in the file, so a hostile header
cannot make it allocate gigabytes or spin.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, LlamaFileType

from ._cursor import Cursor

__all__ = ["GGUFInfo", "parse_header"]

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
        pooling_type: ``{architecture}.pooling_type`` (llama.cpp's enum: 1 mean, 2 cls,
            3 last, 4 rank), or 0 when absent (a model that pools nothing: generation).
        vocab_size: the tokens of ``tokenizer.ggml.tokens`` (token ids run from 0 to
            one less), or 0 when absent.
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
    pooling_type: int = 0
    vocab_size: int = 0

    def kv_cache_bytes(self, tokens: int) -> int:
        """Bytes of an f16 KV cache holding ``tokens`` tokens (an estimate: 2 tensors,
        K and V, per layer, scaled by grouped-query attention)."""
        if not (self.block_count and self.embedding_length):
            return 0
        heads = self.head_count or 1
        kv_heads = self.head_count_kv or heads
        per_token = 2 * self.block_count * self.embedding_length * kv_heads // heads
        return per_token * 2 * tokens


_VOCAB = "tokenizer.ggml.tokens"


def parse_header(cur: Cursor, realpath: str) -> GGUFInfo:
    """Read and check the header from the start of ``cur``'s file; ``realpath`` is the
    result's ``path``.

    Raises:
        InvalidModelError: the header is not GGUF, of an unsupported version, corrupt, or
            claims more bytes than the file holds.
    """
    head = cur.take(min(cur.size, 4), "magic")
    if head != _MAGIC[: len(head)]:
        # Never the bytes found: a caller who may name any path (Swap's model_path, as
        # root) would read the first bytes of any file of the host (issue 25).
        raise cur.fail("not a GGUF file (it does not start with GGUF's magic)")
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
        pooling_type=ints.get(f"{architecture}.pooling_type", 0),
        vocab_size=ints.get(_VOCAB, 0),
    )


def _read_metadata(
    cur: Cursor, kv_count: int
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
                             ".attention.head_count", ".attention.head_count_kv",
                             ".pooling_type"))
        ):
            ints[key] = int(cur.unpack(_SCALARS[vtype][1], label)[0])
        else:
            items = _skip_value(cur, vtype, label)
            if key == _VOCAB:
                ints[key] = items
    return strings, ints, seen


def _expect(cur: Cursor, key: str, vtype: int, want: int) -> None:
    if vtype != want:
        raise cur.fail(f"{key} has type {_type_name(vtype)}, expected {_type_name(want)}")


def _type_name(vtype: int) -> str:
    if vtype in _SCALARS:
        return _SCALARS[vtype][0]
    return {_T_STRING: "string", _T_ARRAY: "array"}.get(vtype, f"unknown ({vtype})")


def _skip_value(cur: Cursor, vtype: int, label: str) -> int:
    """Skip one value; returns an array's item count (0 for a scalar or a string)."""
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
        return count
    else:
        raise cur.fail(f"{label} has unknown type {vtype}")
    return 0


def _read_tensor_infos(cur: Cursor, tensor_count: int, alignment: int) -> int:
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
