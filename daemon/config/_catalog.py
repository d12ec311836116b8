"""The model catalog: every model the daemon may serve, by name.

A :class:`CatalogEntry` is one model: its name, its role, the settings its child runs
with (a :class:`~daemon.config.ChildConfig`, the same a role section resolves to), its
aliases and its residency settings (``pin``, ``ttl``, ``preload``). The
:class:`Catalog` holds them all, each role's default model, and the files of
``models_dir`` that were passed over (with why). Where entries come from — the
``[models.NAME]`` tables, the GGUF files of ``models_dir``, llama-server's router preset
INI, and the ``[generation]``/``[embedding]`` sections — is :mod:`daemon.config._catalog_load`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from supervisor import GGUFInfo

from .role import Role

if TYPE_CHECKING:
    from ._resolved import ChildConfig

RESERVED_ROLES: tuple[str, ...] = ("rerank",)
"""Roles a model may declare in the future; refused with a clear error today."""

# llama.cpp architectures that embed and never generate (beyond any pooling type).
_ENCODERS = frozenset({"bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2",
                       "jina-bert-v3", "neo-bert", "modern-bert", "t5encoder"})
_POOLING_RANK = 4


def role_of(info: GGUFInfo) -> Role | str:
    """The role a GGUF file's metadata says it serves: ``rerank`` (a reserved role) for
    rank pooling, embedding for another pooling type or a BERT-like encoder, else
    generation."""
    if info.pooling_type == _POOLING_RANK:
        return "rerank"
    if info.pooling_type > 0 or info.architecture in _ENCODERS:
        return Role.EMBEDDING
    return Role.GENERATION


@dataclass(frozen=True)
class CatalogEntry:
    """One model of the catalog.

    Attributes:
        name: its catalog name (what a request's ``model`` names).
        role: what it serves.
        child: the settings its child runs with (``child.model`` is the GGUF path).
        aliases: other names a request may use for it.
        pin: never evicted to make room for another model, nor unloaded by its ttl
            (a role's default is pinned unless its table says ``pin = false``).
        ttl: seconds of idleness after which it is unloaded (0: never).
        preload: started with the daemon.
        origin: where it was declared: ``models.NAME``, ``models_dir``, ``preset``, or a
            role section (``generation``, ``embedding``).
        device: the device its memory is on when offloaded (``-ngl`` in extra_args, and
            ``CUDA_VISIBLE_DEVICES`` or the like in env), for that device's budget; ""
            is RAM.
    """

    name: str
    role: Role
    child: ChildConfig
    aliases: tuple[str, ...] = ()
    pin: bool = False
    ttl: float = 0.0
    preload: bool = False
    origin: str = ""
    device: str = ""

    @property
    def path(self) -> str:
        """The GGUF path (empty for a role's endpoint)."""
        return self.child.model


@dataclass(frozen=True)
class Catalog:
    """Every model by name, each role's default, and what ``models_dir`` passed over.

    Attributes:
        entries: the models, in declaration order.
        defaults: role -> the name of the model a request naming none gets.
        skipped: (file, why) for each file of ``models_dir`` that is not a model.
    """

    entries: tuple[CatalogEntry, ...] = ()
    defaults: Mapping[str, str] = field(default_factory=dict)
    skipped: tuple[tuple[str, str], ...] = ()

    def names(self) -> list[str]:
        """The catalog names, in declaration order."""
        return [e.name for e in self.entries]

    def find(self, name: str) -> CatalogEntry | None:
        """The entry called ``name`` or aliased so (None: no such model)."""
        for entry in self.entries:
            if entry.name == name or name in entry.aliases:
                return entry
        return None

    def default(self, role: str) -> CatalogEntry | None:
        """The role's default model (None: the role has none, e.g. disabled)."""
        name = self.defaults.get(role)
        return None if name is None else self.find(name)
