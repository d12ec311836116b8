"""The HTTP/1.1 llamad speaks to its own children over their private sockets: a lean loopback
client with kept connections, the reading of its answers and of their server-sent events,
and the one check of JSON text that must hold an object (:func:`json_object`).
"""

from ._json import NotAJsonObject, json_object
from ._loopback import LoopbackHTTP, Response, Streamed
from ._read import HTTPTransportError

__all__ = ["HTTPTransportError", "LoopbackHTTP", "NotAJsonObject", "Response", "Streamed",
           "json_object"]
