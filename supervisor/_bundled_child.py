"""The bundled runtime's child: llama-cpp-python's server on a private UNIX socket.

``python -m llama_cpp.server`` listens on TCP only (``--host``/``--port``), takes its API key
on the command line or from a generic ``API_KEY`` variable, and lets every browser origin
read its answers (CORS ``*`` with credentials). This launcher builds the same app from the
same arguments (llama_cpp.server's own argument parser), then:

* the API key comes from ``LLAMA_API_KEY`` in the environment (see
  :data:`supervisor._runtime.KEY_ENV`), never from argv, and is always required;
* uvicorn serves the app on ``--uds PATH`` (created mode 0600), never on a TCP port;
* the CORS middleware and the interactive docs (``/docs``, ``/redoc``, ``/openapi.json``,
  which skip the key) are taken out;
* ``CONFIG_FILE`` is ignored (it would replace these server settings, key included).

It is run by path (``python .../_bundled_child.py``), not as ``-m supervisor...``: it imports
no llamad module, so the child starts without importing the daemon's packages.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

KEY_ENV = "LLAMA_API_KEY"
_UNAUTHENTICATED = {"/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"}


def _parse(argv: list[str]) -> tuple[argparse.Namespace, str]:
    from llama_cpp.server.cli import add_args_from_model  # noqa: PLC0415
    from llama_cpp.server.settings import Settings  # noqa: PLC0415

    parser = argparse.ArgumentParser(prog="llamad bundled child", allow_abbrev=False)
    add_args_from_model(parser, Settings)
    parser.add_argument("--uds", required=True, help="UNIX socket path to listen on")
    args = parser.parse_args(argv)
    return args, str(args.uds)


def _private_app(args: argparse.Namespace, key: str) -> Any:
    from fastapi.middleware.cors import CORSMiddleware  # noqa: PLC0415
    from llama_cpp.server.app import create_app  # noqa: PLC0415
    from llama_cpp.server.settings import ModelSettings, ServerSettings  # noqa: PLC0415

    given = {name: value for name, value in vars(args).items() if value is not None}
    # As llama_cpp.server's parse_model_from_args, but the key is ours whatever argv says.
    server = ServerSettings(**{**{k: v for k, v in given.items()
                                  if k in ServerSettings.model_fields}, "api_key": key})
    model = ModelSettings(**{k: v for k, v in given.items() if k in ModelSettings.model_fields})
    app = create_app(server_settings=server, model_settings=[model])
    # Starlette builds its middleware stack at the first request: removing it here is enough.
    app.user_middleware = [m for m in app.user_middleware if m.cls is not CORSMiddleware]
    app.router.routes = [r for r in app.router.routes
                         if getattr(r, "path", None) not in _UNAUTHENTICATED]
    return app


def main(argv: list[str] | None = None) -> int:
    """Serve llama_cpp.server's app on ``--uds`` with the key from the environment."""
    key = os.environ.get(KEY_ENV, "")
    if not key:
        print(f"error: {KEY_ENV} is not set: the child would answer anyone", file=sys.stderr)
        return 1
    os.environ.pop("CONFIG_FILE", None)
    args, uds = _parse(sys.argv[1:] if argv is None else argv)
    app = _private_app(args, key)
    import uvicorn  # noqa: PLC0415

    # The socket is created inside the daemon's private directory; 0600 besides.
    os.umask(0o077)
    uvicorn.run(app, uds=uds)
    return 0


if __name__ == "__main__":
    # Run by path, Python put this file's directory (supervisor/) first on sys.path: drop
    # it, so its modules never shadow the ones llama_cpp imports.
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]
    sys.exit(main())
