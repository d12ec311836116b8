"""The ``llamad`` command.

    llamad serve [options]      run the daemon (``llamad serve --help`` lists every option)
    llamad --version            the installed llamad's version

``serve`` exit status: 0 after a clean shutdown; 2 for a configuration error (including a
state directory another daemon holds); 1 for any other fatal start error. Fatal errors
are one line on stderr, never a traceback.

The other verbs are clients of a running daemon (their code is in :mod:`clients.cli._commands`,
which documents them in full)::

    llamad status | generate PROMPT | chat | ask QUESTION | search QUERY
    llamad ingest PATH [--source ID] | sources | reindex [--source ID]
    llamad swap ROLE MODEL|--rollback | logs ROLE [-f] [-n N]
    llamad models prepare|list|verify | models ps|load|unload

``llamad retrieval migrate --to postgres`` is local (no daemon is called; stop the
daemon first): it copies the embedded store into PostgreSQL (:mod:`daemon.ops.migrate_cli`).

Client exit status: 0 ok; 1 other failure; 2 usage or configuration error; 3 daemon
unreachable or unavailable (UNAVAILABLE); 4 not found; 5 invalid argument
(INVALID_ARGUMENT, OUT_OF_RANGE); 6 busy (RESOURCE_EXHAUSTED); 130 interrupted; 141
stdout closed early. ``models`` keeps ``python -m models``'s statuses.
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


def version() -> str:
    """The installed llamad's version (``0+unknown`` from a checkout not installed)."""
    from importlib import metadata  # noqa: PLC0415

    try:
        return metadata.version("llamad")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def _parser() -> argparse.ArgumentParser:
    from clients.cli._commands import add_commands  # noqa: PLC0415

    from .config import add_arguments  # noqa: PLC0415
    from .ops.migrate_cli import add_retrieval_command  # noqa: PLC0415

    parser = argparse.ArgumentParser(prog="llamad", description="llama.cpp inference daemon")
    parser.add_argument("--version", action="version", version=f"llamad {version()}",
                        help="print the installed llamad's version and exit")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve",
        help="run the daemon",
        description="Run the daemon. Each option can also be set by its environment "
        "variable or in the TOML file given by --config; flag > env > file > default.",
    )
    add_arguments(serve)
    sub.add_parser(
        "config",
        help="print a configuration file of every option at its default",
        description="Print a TOML configuration listing every option `llamad serve` "
        "takes, commented out at its default, with its help and environment variable.")
    add_commands(sub)
    add_retrieval_command(sub)
    return parser


async def _serve(args: argparse.Namespace) -> int:
    import structlog  # noqa: PLC0415

    from retrieval import RetrievalError  # noqa: PLC0415

    from . import config as config_mod  # noqa: PLC0415
    from .ops.statelock import StateDirInUse  # noqa: PLC0415
    from .ops.systemd import Notifier  # noqa: PLC0415
    from .server import Daemon  # noqa: PLC0415
    from .telemetry import logs  # noqa: PLC0415

    try:
        config = config_mod.load(args)
    except config_mod.ConfigError as exc:
        print(f"llamad: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    logs.configure(config.settings.log.format, config.settings.log.level,
                   rate_limit=config.settings.log.rate_limit,
                   rate_interval=config.settings.log.rate_interval)
    log = structlog.get_logger("llamad")
    try:
        daemon = Daemon(config, reload=lambda: config_mod.load(args),
                        notifier=Notifier.from_env(unset=True))
        daemon.install_signal_handlers()
        await daemon.start()
    except StateDirInUse as exc:
        # Two daemons configured with one state_dir: a configuration error.
        log.error("fatal start error", error=str(exc))
        print(f"llamad: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except (OSError, ValueError, RetrievalError) as exc:
        # e.g. the port is taken, or the state directory cannot be created.
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
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["models"]:  # passed through whole: its own parser and --help
        from clients.cli._commands import run_models  # noqa: PLC0415

        return run_models(argv[1:])
    args = _parser().parse_args(argv)
    if args.command == "serve":
        return asyncio.run(_serve(args))
    if args.command == "config":
        from .config import example_config  # noqa: PLC0415

        sys.stdout.write(example_config())
        return 0
    if args.command == "retrieval":
        from .ops.migrate_cli import run_retrieval  # noqa: PLC0415

        return run_retrieval(args)
    from clients.cli._commands import run  # noqa: PLC0415

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
