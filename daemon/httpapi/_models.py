"""The model catalog as the HTTP API shows it, and ``model`` resolved against it.

With the daemon's model pool (:class:`daemon.models.pool.Pool`), the catalog is the pool's:
every model of ``[models.NAME]``, ``models_dir``, the preset and the roles' defaults, by
its catalog name; a request may name it by that name, an alias, its GGUF file name, or
(for a role's default) the role itself, and is routed to that model (loaded on demand,
as a gRPC call naming it is). Without a pool (tests of the API alone), each role's one
model is listed, named by what its backend reports (a GGUF file name, or an endpoint's
model id), or by its configured file while nothing serves it. An unknown or empty name
is a 404 with OpenAI's ``model_not_found``; a known model of the other role is a 400
naming it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from supervisor import LoadProgress, SupervisorError

from ..config._resolved import ChildConfig
from ..models.backend import InferenceBackend
from ..models.pool import ModelView
from ._errors import ApiError


class Served(Protocol):
    """What the catalog needs of a role's model (:class:`daemon.models.model.Model`)."""

    @property
    def role(self) -> str: ...

    @property
    def config(self) -> ChildConfig: ...

    def backend(self) -> InferenceBackend: ...


class Pooled(Protocol):
    """What the catalog needs of the model pool (:class:`daemon.models.pool.Pool`)."""

    def models(self) -> Sequence[ModelView]: ...


@dataclass(frozen=True)
class Listed:
    """A model of the catalog.

    Attributes:
        route: what a call for it passes as ``model`` to the router (``""``: the role's
            default model).
        names: further names it answers to (the pool's aliases, its GGUF file name).
    """

    name: str
    role: str
    loaded: bool
    route: str = ""
    names: tuple[str, ...] = ()
    loading: LoadProgress | None = None

    @property
    def aliases(self) -> tuple[str, ...]:
        own = (self.name, self.name.removesuffix(".gguf"), *self.names)
        return own if self.route else (*own, self.role)

    def to_json(self, created: int) -> dict[str, Any]:
        out = {"id": self.name, "object": "model", "created": created,
               "owned_by": "llamad", "role": self.role, "loaded": self.loaded}
        if self.loading is not None:  # llamad's: how far its load is
            p = self.loading
            out["loading"] = {"phase": p.phase, "seconds": round(p.seconds, 1),
                              "expected_seconds": round(p.expected_seconds, 1)}
        return out


def _listed(served: Served) -> Listed:
    name = ""
    loaded = False
    try:
        backend = served.backend()
    except SupervisorError:  # not ready: named by its configuration
        pass
    else:
        name = backend.model_name
        loaded = backend.refusal is None and bool(name)
    if not name:
        config = served.config
        name = Path(config.model).name if config.model else (
            config.endpoint_model or served.role)
    return Listed(name, served.role, loaded)


def _pooled(view: ModelView) -> Listed:
    file = Path(view.path)
    names = (*view.aliases, file.name, file.stem) if view.path else view.aliases
    return Listed(view.name, view.role, view.state == "ready",
                  route="" if view.is_default else view.name, names=tuple(names),
                  loading=view.loading)


class Catalog:
    """The models of ``pool`` if given, else of ``served`` (role -> model), read afresh on
    every call."""

    def __init__(self, served: Mapping[str, Served], created: int,
                 pool: Pooled | None = None) -> None:
        self._served = served
        self._pool = pool
        self.created = created

    def models(self) -> list[Listed]:
        if self._pool is not None:
            return [_pooled(v) for v in self._pool.models()]
        return [_listed(s) for s in self._served.values()]

    def find(self, name: str) -> Listed | None:
        for entry in self.models():
            if name in entry.aliases:
                return entry
        return None

    def served_name(self, listed: Listed, model_name: str) -> str:
        """The id, as ``GET /v1/models`` names it, of the model that answered a call for
        ``listed``: ``listed``'s own, unless a swap put another model (``model_name``, the
        backend's) behind a role's default since; then that model's entry, or its file
        name without ``.gguf``."""
        if not model_name or model_name in listed.aliases:
            return listed.name
        entry = self.find(model_name)
        return entry.name if entry is not None else model_name.removesuffix(".gguf")

    def resolve(self, name: str, role: str, route: str) -> Listed:
        """The model ``name`` names, which must be of ``role``.

        Raises:
            ApiError: 404 (model_not_found) for an empty or unknown name; 400 for a model
                of another role.
        """
        entry = self.find(name) if name else None
        if entry is None:
            known = ", ".join(e.name for e in self.models())
            what = f"the model {name[:200]!r} does not exist" if name else "model is missing"
            raise ApiError(404, f"{what}; GET /v1/models lists the models ({known})",
                           param="model", code="model_not_found")
        if entry.role != role:
            wanted = ", ".join(e.name for e in self.models() if e.role == role) or "none"
            raise ApiError(400, f"{entry.name} is the {entry.role} model; {route} needs the "
                           f"{role} model ({wanted})", param="model",
                           code="model_not_supported")
        return entry
