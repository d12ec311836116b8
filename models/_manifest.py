"""``manifest.json``: what was prepared in a models directory, and how to check it.

One entry per GGUF file: where it came from, its sha256 and size, what its header says,
and the size and mtime it had when it was hashed, so that a re-run of ``prepare`` can
trust an untouched file without reading it again. ``verify`` rehashes regardless.

The file is rewritten atomically after every model, so an interrupted ``prepare`` keeps
the entries of the models it finished.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from ._atomic import atomic_path
from .errors import ManifestError

__all__ = ["MANIFEST_NAME", "Manifest", "ManifestEntry"]

MANIFEST_NAME = "manifest.json"
_FORMAT = 1


@dataclass(frozen=True)
class ManifestEntry:
    """One prepared model file.

    Attributes:
        file: the file name inside the models directory.
        role: "generation" or "embedding".
        default: whether it is the default model for its role.
        source_package: the PyPI project it was prepared from.
        source_version: that project's version.
        recipe: how it was produced ("concat", "extract" or "convert-bert").
        sha256: the hex sha256 of the file.
        size: its size in bytes.
        mtime_ns: its modification time when it was last hashed.
        architecture: ``general.architecture``.
        context_length: ``{architecture}.context_length`` (0 if absent).
        embedding_length: ``{architecture}.embedding_length`` (0 if absent).
        file_type: ``general.file_type`` as a name, "" if absent.
        prepared_at: when the file was produced, ISO 8601 in UTC.
    """

    file: str
    role: str
    default: bool
    source_package: str
    source_version: str
    recipe: str
    sha256: str
    size: int
    mtime_ns: int
    architecture: str
    context_length: int
    embedding_length: int
    file_type: str
    prepared_at: str

    def to_json(self) -> dict[str, Any]:
        """Return the entry as a JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: object) -> ManifestEntry:
        """Build an entry from its JSON form.

        Raises:
            ManifestError: a field is missing or has the wrong type.
        """
        if not isinstance(data, dict):
            raise ManifestError(f"a manifest entry is a {type(data).__name__}, not an object")
        values: dict[str, Any] = {}
        for field in fields(cls):
            if field.name not in data:
                raise ManifestError(f"manifest entry {data.get('file')!r} lacks {field.name!r}")
            value = data[field.name]
            want = {"str": str, "int": int, "bool": bool}[str(field.type)]
            if type(value) is not want:
                raise ManifestError(
                    f"manifest entry {data.get('file')!r}: {field.name} should be a {want.__name__}"
                )
            values[field.name] = value
        return cls(**values)


@dataclass
class Manifest:
    """All entries of one models directory, keyed by file name."""

    entries: dict[str, ManifestEntry]

    @classmethod
    def load(cls, directory: Path) -> Manifest:
        """Read ``directory/manifest.json``; a missing file is an empty manifest.

        Raises:
            ManifestError: the file exists but is unreadable or malformed.
        """
        path = directory / MANIFEST_NAME
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return cls(entries={})
        except (OSError, UnicodeDecodeError) as exc:
            raise ManifestError(f"cannot read {path}: {exc}") from exc
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ManifestError(f"{path} is not valid JSON: {exc}") from exc
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            raise ManifestError(f"{path} is not a format-{_FORMAT} llamad models manifest")
        models = data.get("models")
        if not isinstance(models, list):
            raise ManifestError(f"{path}: 'models' should be a list")
        entries = [ManifestEntry.from_json(item) for item in models]
        return cls(entries={e.file: e for e in entries})

    def save(self, directory: Path) -> None:
        """Write ``directory/manifest.json`` atomically, entries sorted by file name."""
        data = {
            "format": _FORMAT,
            "models": [self.entries[name].to_json() for name in sorted(self.entries)],
        }
        text = json.dumps(data, indent=2, sort_keys=False) + "\n"
        with atomic_path(directory / MANIFEST_NAME) as tmp:
            tmp.write_text(text, encoding="utf-8")
