"""The model catalog as the HTTP API shows it, and ``model`` resolved against it.

Today each role serves one model (the model pool of issue 14 will list more): the
catalog names it by what its backend reports (a GGUF file name, or an endpoint's model
id), or by its configured file while nothing serves it. A request's ``model`` may be
that name, the name without ``.gguf``, or the role itself (``generation``,
``embedding``). An unknown or empty name is a 404 with OpenAI's ``model_not_found``; a
known model of the other role is a 400 naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from supervisor import SupervisorError

from .._config_resolved import ChildConfig
from ..backend import InferenceBackend
from ._errors import ApiError


class Served(Protocol):
    """What the catalog needs of a role's model (:class:`daemon.model.Model`)."""

    @property
    def role(self) -> str: ...

    @property
    def config(self) -> ChildConfig: ...

    def backend(self) -> InferenceBackend: ...


@dataclass(frozen=True)
class Listed:
    """A model of the catalog."""

    name: str
    role: str
    loaded: bool

    @property
    def aliases(self) -> tuple[str, ...]:
        return (self.name, self.name.removesuffix(".gguf"), self.role)

    def to_json(self, created: int) -> dict[str, Any]:
        return {"id": self.name, "object": "model", "created": created,
                "owned_by": "llamad", "role": self.role, "loaded": self.loaded}


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


class Catalog:
    """The models of ``served`` (role -> model), read afresh on every call."""

    def __init__(self, served: Mapping[str, Served], created: int) -> None:
        self._served = served
        self.created = created

    def models(self) -> list[Listed]:
        return [_listed(s) for s in self._served.values()]

    def find(self, name: str) -> Listed | None:
        for entry in self.models():
            if name in entry.aliases:
                return entry
        return None

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
