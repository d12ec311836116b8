"""llamad's wire contract, shared by the daemon and its clients and owned by neither.

One subpackage per protocol version, named like the proto package (``proto/llamad/v1`` ->
:mod:`llamad_protocol.v1`), the way ``grpc_health.v1`` holds grpc.health.v1. This package
depends on grpcio and protobuf only; it never imports ``daemon`` or ``clients``.
"""
