"""Clients of llamad: the generated gRPC stubs (``clients._pb``) and, later, a friendly
Python client and the CLI verbs."""
