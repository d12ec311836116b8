"""GGUF validation before launch: valid files read right, every broken one is refused
with a one-line reason, fast, without blocking and without trusting the header's sizes."""

from __future__ import annotations

import hashlib
import os
import struct
import threading
import time
from pathlib import Path

import gguf
import pytest

from supervisor import InvalidModelError
from supervisor.gguf._check import GGUFInfo, read_gguf_info, sha256_file
from tests.support.load import patience
from tests.support.models import write_model
from tests.support.scaling import FLOOR_SECONDS, assert_linear, cpu_seconds

# --- building files --------------------------------------------------------------------


def data_end(path: Path) -> int:
    """Where the last tensor's bytes end, per the gguf package's own reader."""
    reader = gguf.GGUFReader(path)
    return max(int(t.data_offset) + int(t.n_bytes) for t in reader.tensors)


def _str(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def kv_str(key: str, value: str) -> bytes:
    return _str(key) + struct.pack("<I", 8) + _str(value)


def kv_u32(key: str, value: int) -> bytes:
    return _str(key) + struct.pack("<II", 4, value)


def tensor_info(name: str, dims: list[int], ggml_type: int, offset: int) -> bytes:
    packed_dims = b"".join(struct.pack("<Q", d) for d in dims)
    return (
        _str(name)
        + struct.pack("<I", len(dims))
        + packed_dims
        + struct.pack("<IQ", ggml_type, offset)
    )


def raw_gguf(
    kvs: list[bytes],
    tensors: list[bytes],
    *,
    data: bytes = b"",
    version: int = 3,
    n_kv: int | None = None,
    n_tensors: int | None = None,
    alignment: int = 32,
) -> bytes:
    """Assemble a GGUF by hand, so a test can put anything at all in the header."""
    body = struct.pack(
        "<4sIQQ",
        b"GGUF",
        version,
        len(tensors) if n_tensors is None else n_tensors,
        len(kvs) if n_kv is None else n_kv,
    )
    body += b"".join(kvs) + b"".join(tensors)
    body += b"\0" * (-len(body) % alignment)
    return body + data


F32 = 0
ARCH = kv_str("general.architecture", "llama")
ONE_TENSOR = [tensor_info("w", [4], F32, 0)]
FOUR_FLOATS = b"\0" * 16


def reason_for(path: Path) -> str:
    with pytest.raises(InvalidModelError) as info:
        read_gguf_info(path)
    assert info.value.path == str(path)
    assert "\n" not in info.value.reason
    return info.value.reason


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


# --- valid files -----------------------------------------------------------------------


def test_valid_model_fields(tmp_path: Path) -> None:
    """A valid file yields every header fact, with the path absolute and resolved."""
    path = write_model(tmp_path / "m.gguf")
    link = tmp_path / "link.gguf"
    link.symlink_to(path.name)
    info = read_gguf_info(link)
    assert info == GGUFInfo(
        path=str(path.resolve()),
        size=path.stat().st_size,
        version=3,
        architecture="llama",
        name="tiny test model",
        context_length=256,
        embedding_length=8,
        tensor_count=3,
        file_type="Q8_0",
        vocab_size=300,  # the tokens of tokenizer.ggml.tokens
    )


def test_optional_fields_default_when_absent(tmp_path: Path) -> None:
    """Without name, lengths or file type the fields are "" and 0; path-like input works."""
    path = write(tmp_path / "m.gguf", raw_gguf([ARCH], ONE_TENSOR, data=FOUR_FLOATS))
    info = read_gguf_info(path)
    assert (info.name, info.context_length, info.embedding_length, info.file_type) == ("", 0, 0, "")
    assert info.architecture == "llama"
    assert info.tensor_count == 1


def test_lengths_come_from_the_file_architecture(tmp_path: Path) -> None:
    """Context and embedding lengths are read under the file's own architecture prefix."""
    kvs = [
        kv_u32("llama.context_length", 999),  # another architecture's key: ignored
        kv_str("general.architecture", "bert"),
        kv_u32("bert.context_length", 512),
        kv_u32("bert.embedding_length", 384),
    ]
    path = write(tmp_path / "m.gguf", raw_gguf(kvs, ONE_TENSOR, data=FOUR_FLOATS))
    info = read_gguf_info(path)
    assert (info.architecture, info.context_length, info.embedding_length) == ("bert", 512, 384)


def test_version_2_is_accepted(tmp_path: Path) -> None:
    """GGUF version 2 has the same layout as 3 and is accepted."""
    path = write(tmp_path / "m.gguf", raw_gguf([ARCH], ONE_TENSOR, data=FOUR_FLOATS, version=2))
    assert read_gguf_info(path).version == 2


def test_custom_alignment(tmp_path: Path) -> None:
    """general.alignment moves the data section, and the size check follows it."""
    kvs = [ARCH, kv_u32("general.alignment", 64)]
    data = raw_gguf(kvs, ONE_TENSOR, data=FOUR_FLOATS, alignment=64)
    assert read_gguf_info(write(tmp_path / "ok.gguf", data)).tensor_count == 1
    # The same file laid out with the default alignment ends before the 64-aligned data.
    short = raw_gguf(kvs, ONE_TENSOR, data=FOUR_FLOATS, alignment=32)
    assert len(short) < len(data)
    assert reason_for(write(tmp_path / "short.gguf", short)).startswith("truncated")


# --- not a model file at all -----------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    """A path that does not exist is refused as such."""
    assert reason_for(tmp_path / "nope.gguf") == "no such file"


def test_empty_file(tmp_path: Path) -> None:
    """An empty file is refused as empty, not as a bad magic."""
    assert reason_for(write(tmp_path / "m.gguf", b"")) == "empty file (0 bytes)"


def test_not_gguf_bytes(tmp_path: Path) -> None:
    """Foreign bytes are refused without quoting them (no first bytes of a file)."""
    path = write(tmp_path / "m.gguf", b"root:x:0:0" + b"\0" * 100)
    assert reason_for(path) == "not a GGUF file (it does not start with GGUF's magic)"


def test_directory(tmp_path: Path) -> None:
    """A directory is refused without trying to read it."""
    assert reason_for(tmp_path) == "not a regular file: it is a directory"


def test_character_device() -> None:
    """A device such as /dev/zero is refused before it is read (it would never end)."""
    with pytest.raises(InvalidModelError, match="it is a character device"):
        read_gguf_info("/dev/zero")


def test_fifo_does_not_block(tmp_path: Path) -> None:
    """A FIFO with no writer is refused at once instead of blocking in open()."""
    fifo = tmp_path / "m.gguf"
    os.mkfifo(fifo)
    outcome: list[BaseException | GGUFInfo] = []

    def attempt() -> None:
        try:
            outcome.append(read_gguf_info(fifo))
        except BaseException as exc:  # collected and checked below
            outcome.append(exc)

    started = time.monotonic()
    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(timeout=patience(5))
    assert not worker.is_alive(), "read_gguf_info blocked on a FIFO"
    assert time.monotonic() - started < patience(1)
    assert isinstance(outcome[0], InvalidModelError)
    assert outcome[0].reason == "not a regular file: it is a FIFO"


def test_symlink_loop(tmp_path: Path) -> None:
    """Two symlinks pointing at each other are reported as a loop."""
    (tmp_path / "a.gguf").symlink_to("b.gguf")
    (tmp_path / "b.gguf").symlink_to("a.gguf")
    assert reason_for(tmp_path / "a.gguf").startswith("symlink loop")


def test_dangling_symlink(tmp_path: Path) -> None:
    """A symlink to nothing is a missing file."""
    (tmp_path / "m.gguf").symlink_to("gone.gguf")
    assert reason_for(tmp_path / "m.gguf") == "no such file"


def test_unreadable_file(tmp_path: Path) -> None:
    """A file without read permission is refused; root bypasses permissions and reads it."""
    path = write_model(tmp_path / "m.gguf")
    path.chmod(0)
    try:
        if os.geteuid() == 0:
            # Honest about the environment: as root the permission check cannot fail.
            assert read_gguf_info(path).architecture == "llama"
        else:
            assert reason_for(path) == "permission denied"
    finally:
        path.chmod(0o644)


# --- broken GGUF headers ---------------------------------------------------------------


def test_unsupported_versions(tmp_path: Path) -> None:
    """Versions other than 2 and 3 are refused, with a hint for v1 and swapped byte order."""
    for version, hint in [(1, "GGUFv1"), (4, "supported: 2, 3"), (0x03000000, "byte order")]:
        data = raw_gguf([ARCH], ONE_TENSOR, data=FOUR_FLOATS, version=version)
        reason = reason_for(write(tmp_path / f"v{version}.gguf", data))
        assert reason.startswith(f"unsupported GGUF version {version}")
        assert hint in reason


def test_missing_architecture(tmp_path: Path) -> None:
    """A file without general.architecture is refused naming the key."""
    kvs = [kv_str("general.name", "x"), kv_u32("llama.context_length", 8)]
    path = write(tmp_path / "m.gguf", raw_gguf(kvs, ONE_TENSOR, data=FOUR_FLOATS))
    assert reason_for(path) == "missing general.architecture"


def test_architecture_of_wrong_type(tmp_path: Path) -> None:
    """general.architecture stored as a number is refused naming both types."""
    path = write(tmp_path / "m.gguf", raw_gguf([kv_u32("general.architecture", 1)], ONE_TENSOR))
    assert reason_for(path) == "general.architecture has type uint32, expected string"


def test_no_tensors(tmp_path: Path) -> None:
    """A vocabulary-only GGUF cannot serve and is refused."""
    path = write(tmp_path / "m.gguf", raw_gguf([ARCH], []))
    assert reason_for(path) == "no tensors (a vocabulary-only GGUF?)"


def test_duplicate_key(tmp_path: Path) -> None:
    """A key that appears twice is refused, as gguf.cpp does."""
    path = write(tmp_path / "m.gguf", raw_gguf([ARCH, ARCH], ONE_TENSOR, data=FOUR_FLOATS))
    assert reason_for(path) == "duplicate metadata key 'general.architecture'"


def test_bad_alignment(tmp_path: Path) -> None:
    """An alignment that is not a power of two is refused."""
    kvs = [ARCH, kv_u32("general.alignment", 48)]
    path = write(tmp_path / "m.gguf", raw_gguf(kvs, ONE_TENSOR, data=FOUR_FLOATS))
    assert reason_for(path) == "general.alignment 48 is not a power of 2"


def test_unknown_value_type(tmp_path: Path) -> None:
    """A metadata value of an undefined type is refused."""
    bad = _str("x.y") + struct.pack("<I", 99)
    path = write(tmp_path / "m.gguf", raw_gguf([ARCH, bad], ONE_TENSOR, data=FOUR_FLOATS))
    assert reason_for(path) == "metadata value 'x.y' has unknown type 99"


def test_nested_array(tmp_path: Path) -> None:
    """Arrays of arrays are refused: llama.cpp cannot load them either."""
    bad = _str("x.y") + struct.pack("<IIQ", 9, 9, 1)
    path = write(tmp_path / "m.gguf", raw_gguf([ARCH, bad], ONE_TENSOR, data=FOUR_FLOATS))
    assert "nested array" in reason_for(path)


def test_tensor_checks(tmp_path: Path) -> None:
    """Tensor infos get gguf.cpp's checks: type, dims, block size, offsets, names."""
    q8_0 = int(gguf.GGMLQuantizationType.Q8_0)
    cases = {
        "unknown ggml type": [tensor_info("w", [4], 4, 0)],  # Q4_2: removed from ggml
        "has 5 dimensions": [tensor_info("w", [1, 1, 1, 1, 1], F32, 0)],
        "not a multiple of its block size 32": [tensor_info("w", [16], q8_0, 0)],
        "has data offset 32, expected 0": [tensor_info("w", [4], F32, 32)],
        "duplicate tensor name 'w'": [
            tensor_info("w", [4], F32, 0),
            tensor_info("w", [4], F32, 32),
        ],
        "too long": [tensor_info("w" * 64, [4], F32, 0)],
        "impossible shape": [tensor_info("w", [1 << 40, 1 << 40], F32, 0)],
    }
    for i, (expected, tensors) in enumerate(cases.items()):
        path = write(tmp_path / f"t{i}.gguf", raw_gguf([ARCH], tensors, data=b"\0" * 64))
        assert expected in reason_for(path)


# --- truncation ------------------------------------------------------------------------


def test_truncated_header(tmp_path: Path) -> None:
    """A file cut inside the fixed header is reported as a truncated header."""
    full = write_model(tmp_path / "full.gguf").read_bytes()
    for cut in (2, 4, 10, 23):
        reason = reason_for(write(tmp_path / "m.gguf", full[:cut]))
        assert reason == f"truncated header: the file ends at {cut} bytes"


def test_truncated_metadata(tmp_path: Path) -> None:
    """A file cut inside the metadata names the key being read."""
    full = write_model(tmp_path / "full.gguf").read_bytes()
    cut = full.index(b"tok150")  # in the middle of the vocabulary array
    reason = reason_for(write(tmp_path / "m.gguf", full[:cut]))
    expected = f"truncated metadata value 'tokenizer.ggml.tokens': the file ends at {cut} bytes"
    assert reason == expected


def test_truncated_tensor_data(tmp_path: Path) -> None:
    """A file cut inside the tensor data says how many bytes the tensors need."""
    path = write_model(tmp_path / "full.gguf")
    need = data_end(path)
    full = path.read_bytes()
    for cut in (need - 1, need - 100, need - 200):
        reason = reason_for(write(tmp_path / "m.gguf", full[:cut]))
        assert reason == f"truncated: {cut} bytes, tensors need {need}"


def test_every_truncation_is_refused(tmp_path: Path) -> None:
    """Cut at every single byte before the data ends, the file is refused, never misread."""
    path = write_model(tmp_path / "full.gguf", vocab=20)
    need = data_end(path)
    full = path.read_bytes()
    assert read_gguf_info(path).size == len(full) >= need
    cut_path = tmp_path / "cut.gguf"
    for cut in range(1, need):
        cut_path.write_bytes(full[:cut])
        with pytest.raises(InvalidModelError, match="truncated"):
            read_gguf_info(cut_path)


# --- hostile headers -------------------------------------------------------------------


def _assert_refused_fast(path: Path, expected: str) -> None:
    # CPU time (user and system: reading or allocating what a header claims counts): the
    # refusal's own cost, not a busy machine's wait for a core.
    started = time.process_time()
    assert expected in reason_for(path)
    assert time.process_time() - started < 1


def test_absurd_counts_are_refused_without_allocating(tmp_path: Path) -> None:
    """Claimed counts and lengths far beyond the file are refused at once."""
    huge = 1 << 62
    cases = {
        "metadata entries": raw_gguf([ARCH], ONE_TENSOR, n_kv=huge),
        "tensors (limit": raw_gguf([ARCH], ONE_TENSOR, n_tensors=huge),
        "metadata key #0 is": raw_gguf([struct.pack("<Q", huge) + b"abc"], ONE_TENSOR),
        "is a string of": raw_gguf([_str("k") + struct.pack("<IQ", 8, huge)], ONE_TENSOR),
        "is an array of": raw_gguf([_str("k") + struct.pack("<IIQ", 9, 8, huge)], ONE_TENSOR),
    }
    for i, (expected, data) in enumerate(cases.items()):
        _assert_refused_fast(write(tmp_path / f"h{i}.gguf", data), expected)


def test_long_claims_inside_limits_are_truncation(tmp_path: Path) -> None:
    """Counts under the caps but beyond the file's bytes end as truncation, quickly."""
    strings = _str("k") + struct.pack("<IIQ", 9, 8, 10_000_000)  # 10M strings, no bytes
    floats = _str("k") + struct.pack("<IIQ", 9, 6, 10_000_000)  # 40 MB of float32
    one_huge_string = _str("k") + struct.pack("<IIQ", 9, 8, 1) + struct.pack("<Q", 1 << 40)
    for i, kv in enumerate([strings, floats, one_huge_string]):
        _assert_refused_fast(
            write(tmp_path / f"l{i}.gguf", raw_gguf([ARCH, kv], ONE_TENSOR)), "truncated"
        )


def vocabulary_model(directory: Path, entries: int, data_bytes: int = 4) -> Path:
    """A model with ``entries`` vocabulary pieces and ``data_bytes`` of sparse tensor data
    (os.truncate: nothing written)."""
    tokens = b"".join(_str(f"piece{i}") for i in range(entries))
    vocab = _str("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, entries) + tokens
    n = data_bytes // 4
    header = raw_gguf([ARCH, vocab], [tensor_info("w", [n], F32, 0)])
    path = write(directory / f"v{entries}-{data_bytes}.gguf", header)
    os.truncate(path, len(header) + 4 * n)
    return path


def test_large_vocabulary_reads_in_linear_time(tmp_path: Path) -> None:
    """Reading the metadata grows linearly with the vocabulary (32k to 262k pieces, the
    size of gemma-3's)."""
    assert read_gguf_info(vocabulary_model(tmp_path, 262_144)).tensor_count == 1
    assert_linear(lambda entries: vocabulary_model(tmp_path, entries), read_gguf_info,
                  262_144 // 8)


def test_tensor_data_is_never_read(tmp_path: Path) -> None:
    """64 GB of (sparse) tensor data costs no more than 4 bytes of it: only the header is
    read. Reading 64 GB would take tens of seconds at any disk speed."""
    small = vocabulary_model(tmp_path, 65_536)
    huge = vocabulary_model(tmp_path, 65_536, data_bytes=64 << 30)
    small_seconds = cpu_seconds(lambda: read_gguf_info(small), 3)
    huge_seconds = cpu_seconds(lambda: read_gguf_info(huge), 3)
    assert huge_seconds < 3 * max(small_seconds, FLOOR_SECONDS), (small_seconds, huge_seconds)


# --- sha256_file -----------------------------------------------------------------------


def test_sha256_file_matches_hashlib(tmp_path: Path) -> None:
    """The digest equals hashlib's for any chunk size, including the empty file."""
    data = os.urandom(100_003)
    path = write(tmp_path / "blob", data)
    for chunk in (1, 7, 4096, 1 << 20):
        assert sha256_file(path, chunk=chunk) == hashlib.sha256(data).hexdigest()
    assert sha256_file(write(tmp_path / "empty", b"")) == hashlib.sha256(b"").hexdigest()


def test_sha256_file_refuses_non_regular_files(tmp_path: Path) -> None:
    """Hashing a FIFO or directory raises OSError at once; a bad chunk is a ValueError."""
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(OSError, match="FIFO"):
        sha256_file(tmp_path / "fifo")
    with pytest.raises(OSError, match="directory"):
        sha256_file(tmp_path)
    with pytest.raises(FileNotFoundError):
        sha256_file(tmp_path / "missing")
    with pytest.raises(ValueError, match="chunk"):
        sha256_file(tmp_path / "missing", chunk=0)


# --- the prepared default models, when present -----------------------------------------


def _prepared_models() -> list[Path]:
    root = Path(__file__).resolve().parents[2]
    directory = Path(os.environ.get("LLAMAD_MODELS_DIR") or root / "models" / "gguf")
    return sorted(directory.glob("*.gguf"))


@pytest.mark.integration  # the prepared models: `make check` does not prepare them
@pytest.mark.skipif(not _prepared_models(), reason="no prepared models (python -m models prepare)")
@pytest.mark.parametrize("path", _prepared_models(), ids=lambda p: p.name)
def test_prepared_models_read_fast(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each prepared real model reads back valid from its header alone: the bytes read
    are a small part of the file (never the weights)."""
    real_pread = os.pread
    read: list[int] = []

    def counting(fd: int, n: int, offset: int) -> bytes:
        data = real_pread(fd, n, offset)
        read.append(len(data))
        return data

    monkeypatch.setattr("supervisor.gguf._cursor.os.pread", counting)
    monkeypatch.setattr("supervisor.gguf._check._READ", {})  # read it, not what was read before
    info = read_gguf_info(path)
    assert info.architecture
    assert info.tensor_count > 0
    size = path.stat().st_size
    assert 0 < sum(read) < size / 10, f"{path.name}: read {sum(read)} of {size} bytes"


def test_an_unchanged_file_is_not_read_again_a_changed_one_is(tmp_path: Path) -> None:
    """A second read of the same unchanged file returns the facts already read; after
    the file is truncated (or rewritten), it is read again and its problem found."""
    path = write_model(tmp_path / "m.gguf")
    first = read_gguf_info(path)
    assert read_gguf_info(path) is first
    size = path.stat().st_size
    with path.open("r+b") as fh:
        fh.truncate(size // 2)
    with pytest.raises(InvalidModelError, match="truncated"):
        read_gguf_info(path)
    write_model(path)
    again = read_gguf_info(path)
    assert again is not first and again == first
