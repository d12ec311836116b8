"""The blocking and the asyncio client stay in parity: every public method of
:class:`clients.Client` has an :class:`clients.AsyncClient` counterpart with the same
parameters (names, kinds, defaults, in order), and vice versa."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from clients import AsyncClient, Client
from clients import _requests as rq
from clients._channel import ConnectionOptions, settings
from clients._generation import GenerationControls, sampling

# Members of one client with no counterpart of the same name in the other, with why.
ONLY_SYNC = {
    "__enter__": "context manager; AsyncClient's is __aenter__",
    "__exit__": "context manager; AsyncClient's is __aexit__",
}
ONLY_ASYNC = {
    "__aenter__": "async context manager; Client's is __enter__",
    "__aexit__": "async context manager; Client's is __exit__",
}
# Dunders compared like public methods (the rest are object's or the context managers).
COMPARED_DUNDERS = ("__init__",)
CONTEXT_DUNDERS = ("__enter__", "__exit__", "__aenter__", "__aexit__")


def members(cls: type) -> set[str]:
    """The public names of ``cls`` (methods and properties), with its compared dunders and
    context-manager dunders."""
    return {name for name in dir(cls)
            if not name.startswith("_") or name in COMPARED_DUNDERS + CONTEXT_DUNDERS}


def parameters(cls: type, name: str) -> list[tuple[str, Any, Any]]:
    """Name, kind and default of each parameter of ``cls.name`` (a property's getter)."""
    member = inspect.getattr_static(cls, name)
    function = member.fget if isinstance(member, property) else getattr(cls, name)
    assert function is not None, f"{cls.__name__}.{name} has no getter"
    return [(p.name, p.kind, p.default)
            for p in inspect.signature(function).parameters.values()]


SHARED = sorted(members(Client) & members(AsyncClient))


def test_same_public_names() -> None:
    """Each client's public members are the other's, but for the allow-listed ones."""
    assert members(Client) - members(AsyncClient) == set(ONLY_SYNC)
    assert members(AsyncClient) - members(Client) == set(ONLY_ASYNC)


@pytest.mark.parametrize("name", SHARED)
def test_same_parameters(name: str) -> None:
    """A method shared by both clients takes the same parameters: names, kinds, defaults."""
    assert parameters(Client, name) == parameters(AsyncClient, name)


@pytest.mark.parametrize("name", SHARED)
def test_same_member_kind(name: str) -> None:
    """A member that is a property on one client is a property on the other."""
    static = (inspect.getattr_static(Client, name), inspect.getattr_static(AsyncClient, name))
    assert isinstance(static[0], property) == isinstance(static[1], property)


@pytest.mark.parametrize(("options", "builder", "positional"), [
    (ConnectionOptions, settings, {"address"}),
    (GenerationControls, sampling, {"schema_name"}),
    (rq.SearchOptions, rq.search, {"query"}),
    (rq.UpsertOptions, rq.upsert_document, {"source_id", "text"}),
    (rq.AskOptions, rq.ask, {"question"}),
], ids=["connection", "generate/chat", "search", "upsert_document", "ask"])
def test_forwarded_options_are_the_builders(options: type, builder: Any,
                                             positional: set[str]) -> None:
    """The options both clients forward as ``**options`` (a TypedDict) are exactly the
    keyword parameters of the request builder that takes them, which holds the defaults."""
    keywords = set(inspect.signature(builder).parameters) - positional
    assert set(options.__annotations__) == keywords
