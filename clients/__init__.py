"""Python clients of llamad: :class:`Client` (blocking) and :class:`AsyncClient` (asyncio).

Both cover every RPC of llamad's gRPC API and return frozen dataclasses (never protobuf
messages); failures raise :class:`~clients.errors.LlamadError` subclasses (never
``grpc.RpcError``). The generated stubs and the wire constants are the public
``llamad_protocol.v1`` package.

Example:
    >>> from clients import Client
    >>> with Client() as llamad:                        # $LLAMAD_ADDRESS or 127.0.0.1:50051
    ...     for chunk in llamad.generate("Hello", max_tokens=8):       # doctest: +SKIP
    ...         print(chunk.text, end="")
"""

from . import _types, errors
from ._aio import AsyncClient
from ._channel import DEFAULT, DEFAULT_ADDRESS
from ._client import Client
from ._models import ModelInfo
from ._stream import (
    AskStream,
    AsyncAskStream,
    AsyncStream,
    AsyncTextStream,
    Stream,
    TextStream,
)
from ._types import *  # noqa: F403 (what calls return; listed once, in _types.__all__)
from .errors import LlamadError

__all__ = [
    "DEFAULT",
    "DEFAULT_ADDRESS",
    "AskStream",
    "AsyncAskStream",
    "AsyncClient",
    "AsyncStream",
    "AsyncTextStream",
    "Client",
    "LlamadError",
    "ModelInfo",
    "Stream",
    "TextStream",
    "errors",
]
__all__ += _types.__all__
