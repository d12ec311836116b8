"""The ``llamad`` command.

    llamad serve [options]      run the daemon (``llamad serve --help`` lists every option)

Exit status: 0 after a clean shutdown; 2 for a configuration error; 1 for any other fatal
start error. Fatal errors are one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

EXIT_CONFIG = 2
EXIT_FATAL = 1


def _check_packages() -> str | None:
    """Our top-level names are generic (``supervisor`` is also supervisord's import name):
    make sure the ones imported are llamad's."""
    try:
        import supervisor  # noqa: PLC0415
    except ImportError as exc:
        return f"cannot import llamad's supervisor package: {exc}"
    if not getattr(supervisor, "LLAMAD_PACKAGE", False):
        return (
            f"the 'supervisor' package at {getattr(supervisor, '__file__', '?')} is not "
            "llamad's (supervisord uses the same name); install llamad in its own virtualenv"
        )
    return None


def _parser() -> argparse.ArgumentParser:
    from .config import add_arguments  # noqa: PLC0415

    parser = argparse.ArgumentParser(prog="llamad", description="llama.cpp inference daemon")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve",
        help="run the daemon",
        description="Run the daemon. Each option can also be set by its environment "
        "variable or in the TOML file given by --config; flag > env > file > default.",
    )
    add_arguments(serve)
    return parser


async def _serve(args: argparse.Namespace) -> int:
    import structlog  # noqa: PLC0415

    from . import config as config_mod  # noqa: PLC0415
    from . import logs  # noqa: PLC0415
    from .server import Daemon  # noqa: PLC0415
    from .systemd import Notifier  # noqa: PLC0415

    try:
        config = config_mod.load(args)
    except config_mod.ConfigError as exc:
        print(f"llamad: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    logs.configure(config.log_format, config.log_level)
    log = structlog.get_logger("llamad")
    try:
        daemon = Daemon(config, reload=lambda: config_mod.load(args),
                        notifier=Notifier.from_env(unset=True))
        daemon.install_signal_handlers()
        await daemon.start()
    except (OSError, ValueError) as exc:
        log.error("fatal start error", error=str(exc))
        print(f"llamad: {exc}", file=sys.stderr)
        return EXIT_FATAL
    await daemon.run_until_stopped()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    problem = _check_packages()
    if problem:
        print(f"llamad: {problem}", file=sys.stderr)
        return EXIT_FATAL
    args = _parser().parse_args(argv)
    if args.command == "serve":
        return asyncio.run(_serve(args))
    return EXIT_CONFIG


if __name__ == "__main__":
    sys.exit(main())
