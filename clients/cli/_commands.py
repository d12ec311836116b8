"""The client verbs of the ``llamad`` command (``daemon/cli.py`` adds them beside ``serve``).

Every verb talks to a running daemon through :class:`clients.Client`::

    llamad status                     children, models, breaker, slots, queue, retrieval
    llamad generate PROMPT            stream a completion to stdout
    llamad chat [--system S] [--user U ...]   one exchange, or a conversation from stdin
    llamad embed TEXT ...             embed texts (--json: the vectors)
    llamad ask QUESTION               stream a grounded answer, then its numbered sources
    llamad search QUERY               hits: citation, title and section, path, found by,
                                      score
    llamad ingest PATH [--source ID]  add a directory source and index it
    llamad sources [--disable|--enable ID]   list sources; disable or enable one
    llamad documents [--state STATE]  documents and their state (review_required: awaiting
                                      review)
    llamad approve ID [--note TEXT]   index a document held for review (admin)
    llamad reject ID --note TEXT      reject it: out of search until its content changes
    llamad reindex [--source ID] [--since TIME]   rescan directory sources
    llamad reprocess [--source ID|--document ID]   embed chunks indexed without vectors
    llamad swap ROLE MODEL|--rollback swap a child's model, streaming the stages
    llamad mode ROLE MODE             embedded child, OpenAI-compatible endpoint, or disabled
    llamad logs ROLE [-f] [-n N]      a child's output
    llamad health [--service NAME]    probe grpc.health.v1; exit status 0 when serving
                                      (its own table: clients/cli/_balancing.py)
    llamad drain [--wait S] / undrain take one daemon out of load balancing, and back
    llamad models prepare|list|verify the default models (``python -m models``)
    llamad models ps|load|unload      the daemon's models: state, memory, last use; make
                                      one resident or unload it (clients/cli/_models.py)

``generate``, ``chat``, ``embed`` and ``ask`` take ``--model NAME``: a catalog name or
alias that ``llamad models ps`` lists (default: the role's default model); the daemon
loads it on demand. ``llamad --version`` prints the installed version.

Scores: ``search`` and ``ask`` print one scale, ``score`` in [0, 1]: the fused RRF score
divided by the best score fusion can give (1: ranked first by every index that
answered); the cosine similarity in vector mode. ``--min-score`` compares it.

Common options: ``--address`` (default ``$LLAMAD_ADDRESS``, else ``127.0.0.1:50051``;
``host:port`` or ``unix:/path``; several IP ``host:port`` separated by commas balance the
calls over those daemons, docs/scale-out.md), ``--timeout`` (seconds; default 30 for single calls,
none for streams), ``--tls``, ``--ca``, ``--cert``/``--key``, ``--server-name``,
``--token-file``; each has an environment variable for scripts and services
(``LLAMAD_TLS=1``, ``LLAMAD_CA_FILE``, ``LLAMAD_CERT_FILE``, ``LLAMAD_KEY_FILE``,
``LLAMAD_SERVER_NAME``, ``LLAMAD_TOKEN_FILE``); a flag wins over its variable. The token
itself is never taken on the command line (it would show in ``ps``): only from a file,
which must not be readable by everyone. Read verbs
take ``--json``: one JSON document (status, search, sources, models list) or JSON lines
(generate, chat, ask, logs, swap, mode, ingest, reindex) for scripts.

Output: results on stdout; errors on stderr as one line, ``llamad: <verb>: <what>:
<message>``, never a traceback; progress lines on stderr only when it is a terminal.

Exit status (scripts can rely on it):

====  ==============================================================================
0     success
1     any other failure (deadline exceeded, swap aborted, refused, internal error)
2     usage or configuration error (bad flags, unreadable token or certificate file)
3     daemon unreachable or unavailable (UNAVAILABLE: connection refused, draining,
      the child needed is not running)
4     not found (NOT_FOUND)
5     invalid argument (the daemon said INVALID_ARGUMENT or OUT_OF_RANGE)
6     busy (RESOURCE_EXHAUSTED: every slot and the wait queue are full)
130   interrupted (Ctrl-C)
141   stdout closed early (a pipe reader exited), as for SIGPIPE
====  ==============================================================================

``llamad models ...`` keeps ``python -m models``'s own statuses (0 ok, 1 verification
failed, 2 usage error or failed prepare).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from .. import errors
from .._client import Client
from ._balancing import add_balancing_commands
from ._generation import add_controls
from ._history import add_push_command, add_source_flags
from ._review import add_review_commands
from ._search import add_search_commands

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
EXIT_NOT_FOUND = 4
EXIT_INVALID = 5
EXIT_BUSY = 6
EXIT_INTERRUPTED = 130
EXIT_PIPE = 141

VERBS = ("status", "generate", "chat", "embed", "ask", "search", "ingest", "sources",
         "documents",
         "approve", "reject", "reindex",
         "reprocess", "swap", "mode", "logs", "health", "drain", "undrain")

_EXIT_CODES: dict[type[errors.LlamadError], int] = {
    errors.Unavailable: EXIT_UNAVAILABLE,
    errors.NotFound: EXIT_NOT_FOUND,
    errors.InvalidArgument: EXIT_INVALID,
    errors.ResourceExhausted: EXIT_BUSY,
}
_WHAT: dict[type[errors.LlamadError], str] = {
    errors.Unavailable: "unavailable",
    errors.InvalidArgument: "invalid argument",
    errors.OutOfRange: "out of range",
    errors.NotFound: "not found",
    errors.ResourceExhausted: "busy",
    errors.DeadlineExceeded: "timed out",
    errors.FailedPrecondition: "refused",
    errors.Aborted: "aborted",
    errors.Cancelled: "cancelled",
    errors.Unauthenticated: "not authenticated",
    errors.PermissionDenied: "permission denied",
    errors.Unimplemented: "not supported by this daemon",
    errors.Internal: "internal error",
}
_CONNECT_FAILURES = ("failed to connect", "connection refused", "connect failed",
                     "no such file or directory", "dns resolution failed")


def exit_code(exc: errors.LlamadError) -> int:
    """The documented exit status for a failed call."""
    for cls in type(exc).__mro__:
        if cls in _EXIT_CODES:
            return _EXIT_CODES[cls]
    return EXIT_FAILURE


def describe(exc: errors.LlamadError, address: str) -> str:
    """``<what>: <message>`` for the error line, with the retry hint when there is one."""
    if isinstance(exc, errors.Unavailable) and any(
            s in exc.details.lower() for s in _CONNECT_FAILURES):
        what = f"cannot reach the daemon at {address}"
    else:
        what = next((_WHAT[c] for c in type(exc).__mro__ if c in _WHAT), "failed")
    hint = "" if exc.retry_after is None else f" (retry in {exc.retry_after:g}s)"
    return f"{what}: {exc.details}{hint}"


def _connection_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    g = common.add_argument_group("connection")
    g.add_argument("--address", metavar="ADDR",
                   help="daemon address, host:port or unix:/path, or several IP "
                        "host:port separated by commas to balance over them "
                        "(default: $LLAMAD_ADDRESS, else 127.0.0.1:50051)")
    g.add_argument("--timeout", type=float, metavar="SECONDS",
                   help="deadline of each call (default: 30 for single calls, none for "
                        "streams)")
    g.add_argument("--tls", action="store_true",
                   help="connect with TLS (default: $LLAMAD_TLS=1)")
    g.add_argument("--ca", metavar="FILE",
                   help="PEM roots to verify the daemon, implies TLS (default: $LLAMAD_CA_FILE)")
    g.add_argument("--cert", metavar="FILE",
                   help="client certificate for mutual TLS (default: $LLAMAD_CERT_FILE)")
    g.add_argument("--key", metavar="FILE", help="private key of --cert (default: "
                                                 "$LLAMAD_KEY_FILE)")
    g.add_argument("--server-name", metavar="NAME",
                   help="name the daemon's certificate is checked against, when it differs "
                        "from the address (default: $LLAMAD_SERVER_NAME)")
    g.add_argument("--token-file", metavar="FILE",
                   help="file holding a bearer token, not readable by everyone "
                        "(default: $LLAMAD_TOKEN_FILE)")
    return common


def _env(name: str) -> str | None:
    return os.environ.get(name) or None


def _json_flag(p: argparse.ArgumentParser, what: str = "JSON") -> None:
    p.add_argument("--json", action="store_true", help=f"print {what} for scripts")


def _model_flag(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--model", default="", metavar="NAME",
                   help=f"the catalog name or an alias of the {what} model to use, loaded "
                        "on demand (llamad models ps lists them; default: the role's "
                        "default model)")


def _streamed(p: argparse.ArgumentParser) -> None:
    """The options of a command that streams a generation: sampling and ``--json``."""
    _sampling(p)
    _json_flag(p, "JSON lines (one per chunk)")


def _sampling(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--max-tokens", type=int, metavar="N", help="tokens to generate at most")
    g.add_argument("--temperature", type=float, metavar="T", help="0 is greedy")
    g.add_argument("--top-p", type=float, metavar="P")
    g.add_argument("--top-k", type=int, metavar="K")
    g.add_argument("--seed", type=int)
    g.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="stop string (repeatable)")
    add_controls(g)


def _moment(text: str) -> datetime:
    """An ISO 8601 date or time (local time when it names no zone)."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not an ISO 8601 time: {text!r} (e.g. 2026-11-30 or 2026-11-30T08:00)") from None
    return moment if moment.tzinfo else moment.astimezone()


class _Message(argparse.Action):
    """``--system``/``--user``/``--assistant``: append (role, text) in command-line order."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        messages = list(getattr(namespace, self.dest) or [])
        messages.append((str(option_string).lstrip("-"), str(values)))
        setattr(namespace, self.dest, messages)


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the client verbs to the ``llamad`` command's subparsers."""
    common = [_connection_options()]

    p = sub.add_parser("status", parents=common, help="children, models, queue, retrieval",
                       description="Show every child (state, model, breaker, slots, queue, "
                                   "last exit) and the retrieval index.")
    _json_flag(p)

    p = sub.add_parser("generate", parents=common, help="stream a completion",
                       description="Stream the completion of a raw prompt to stdout.")
    p.add_argument("prompt", metavar="PROMPT", help="the prompt; - reads it from stdin")
    _model_flag(p, "generation")
    _streamed(p)

    p = sub.add_parser("chat", parents=common, help="chat with the generation model",
                       description="Send the messages given by --system/--user/--assistant "
                                   "(in order) and stream the reply; without --user, read "
                                   "user messages from stdin, one per line, and keep the "
                                   "conversation.")
    for role in ("system", "user", "assistant"):
        p.add_argument(f"--{role}", dest="messages", action=_Message, metavar="TEXT",
                       help=f"a {role} message (repeatable)")
    _model_flag(p, "generation")
    p.add_argument("--tools", metavar="FILE",
                   help="functions the model may call: a JSON array of tools (OpenAI's "
                        "{\"type\": \"function\", \"function\": {...}} or {\"name\", "
                        "\"description\", \"parameters\"}); its calls are printed as JSON "
                        "lines")
    p.add_argument("--tool-choice", metavar="CHOICE",
                   help="with --tools: auto (default), none, required, or a tool's name")
    _streamed(p)

    add_search_commands(sub, common, _json_flag, _moment, _model_flag)

    p = sub.add_parser("embed", parents=common, help="embed texts",
                       description="Embed each TEXT with the embedding model; print each "
                                   "vector's dimension and first values, or with --json "
                                   "the vectors.")
    p.add_argument("texts", nargs="+", metavar="TEXT", help="a text; - reads one from stdin")
    _model_flag(p, "embedding")
    _json_flag(p, "one JSON document (the vectors)")

    p = sub.add_parser("ingest", parents=common, help="add a directory source and index it",
                       description="Add (or update) a directory source, then index it, "
                                   "showing progress. The daemon must allow the directory "
                                   "(its retrieval.allowed_roots).")
    p.add_argument("path", metavar="PATH", help="directory on the daemon's machine")
    p.add_argument("--source", metavar="ID",
                   help="the source's id (default: the directory's name, lower-cased, e.g. "
                        "'my-docs' for 'My Docs'; refused if another directory's source "
                        "has it)")
    p.add_argument("--category", default="", help="category of its documents")
    p.add_argument("--tag", dest="tags", action="append", default=[],
                   help="tag of its documents (repeatable)")
    p.add_argument("--review", action="store_true",
                   help="every new or changed file waits for review (llamad approve) "
                        "before it is searchable; without it, adding the source again "
                        "turns review off")
    p.add_argument("--exclude", action="append", default=[], metavar="PATTERN",
                   help="a gitignore-style pattern of files or directories to leave out "
                        "(repeatable: 'private/', '*.bak', '/drafts', '!keep.pem'); key and "
                        "credential files are left out by default; ingesting again replaces "
                        "the patterns")
    _json_flag(p, "JSON lines (the final counts)")

    p = sub.add_parser("sources", parents=common, help="list the document sources",
                       description="List the sources; --disable keeps a source's documents "
                                   "but leaves them out of searches and rescans; --add adds "
                                   "a source of pushed documents, or with --history of "
                                   "time-ordered records kept within a retention.")
    toggle = p.add_mutually_exclusive_group()
    toggle.add_argument("--disable", metavar="ID", default="", help="disable this source")
    toggle.add_argument("--enable", metavar="ID", default="", help="enable it again")
    add_source_flags(p, toggle)
    _json_flag(p)

    add_push_command(sub, common, _json_flag, _moment)

    add_review_commands(sub, common, _json_flag)

    add_balancing_commands(sub, common)

    p = sub.add_parser("reindex", parents=common, help="rescan directory sources")
    p.add_argument("--source", default="", metavar="ID", help="only this source")
    p.add_argument("--since", type=_moment, default=None, metavar="TIME",
                   help="only files modified since TIME (ISO 8601, e.g. 2026-11-30 or "
                        "2026-11-30T08:00), read again even if they look unchanged")
    _json_flag(p, "JSON lines (the final counts)")

    p = sub.add_parser(
        "reprocess", parents=common, help="embed chunks indexed without vectors",
        description="Embed, in the background, the chunks without a vector of the current "
                    "embedding model (indexed while it was unavailable, or refused before): "
                    "all, one source's or one document's. `llamad status` shows progress.")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("--source", default="", metavar="ID", help="only this source")
    scope.add_argument("--document", default="", metavar="ID", help="only this document")
    _json_flag(p)

    p = sub.add_parser("swap", parents=common, help="swap a child's model (make-before-break)",
                       description="Start the new model beside the old one and switch once "
                                   "it is ready; streams the stages.")
    p.add_argument("role", choices=("generation", "embedding"))
    p.add_argument("model", nargs="?", default="", metavar="MODEL",
                   help="path of the new GGUF model")
    p.add_argument("--rollback", action="store_true", help="return to the previous model")
    p.add_argument("--stop-old-first", action="store_true",
                   help="stop the old child first when both do not fit in memory")
    p.add_argument("--ctx-size", type=int, metavar="N", help="new context size per slot")
    p.add_argument("--extra-args", metavar="ARGS",
                   help="new extra runtime arguments (performance and model-behaviour "
                   "options only, e.g. '-ngl 99 --flash-attn on')")
    p.add_argument("--reason", default="", help="why (shown by status)")
    p.add_argument("--name", default="", metavar="NAME",
                   help="a resident catalog model to swap instead of the role's default "
                        "(llamad models ps lists them)")
    _json_flag(p, "JSON lines (one per stage)")

    p = sub.add_parser("mode", parents=common,
                       help="switch a role: embedded child, endpoint, or disabled",
                       description="Switch make-before-break like swap: the new mode must "
                                   "pass readiness before it serves; a failed switch leaves "
                                   "the old mode serving. Streams the stages.")
    p.add_argument("role", choices=("generation", "embedding"))
    p.add_argument("mode", choices=("embedded", "endpoint", "disabled"))
    p.add_argument("--url", default="", metavar="URL",
                   help="endpoint base URL, with or without /v1 (default: the configured one)")
    p.add_argument("--model", default="", metavar="ID",
                   help="endpoint model id, or for embedded a GGUF path (default: current)")
    p.add_argument("--api-key-file", default="", metavar="PATH",
                   help="file on the daemon's machine holding the endpoint's API key "
                   "(inside its [endpoint_keys] dir, or one its configuration names)")
    p.add_argument("--api-key-env", default="", metavar="NAME",
                   help="or the daemon's environment variable holding it (starting with "
                   "its endpoint_keys.env_prefix, default LLAMAD_ENDPOINT_KEY_)")
    p.add_argument("--reason", default="", help="why (logged)")
    _json_flag(p, "JSON lines (one per stage)")

    p = sub.add_parser("logs", parents=common, help="a child's output lines")
    p.add_argument("role", choices=("generation", "embedding"))
    p.add_argument("-n", "--lines", type=int, default=20, metavar="N",
                   help="latest lines to show (0: all buffered; default 20)")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    _json_flag(p, "JSON lines")

    p = sub.add_parser("models", help="the default model files; the daemon's models",
                       description="Run `python -m models` in-process: "
                                   "llamad models {prepare,list,verify} --help; and the "
                                   "daemon's models: llamad models {ps,load,unload} --help.",
                       add_help=False)
    p.add_argument("args", nargs=argparse.REMAINDER)


def run_models(argv: Sequence[str]) -> int:
    """``llamad models ...``: ``ps``, ``load`` and ``unload`` ask the daemon
    (:mod:`clients.cli._models`); the rest is ``python -m models ...`` in this process."""
    from models._cli import main as models_main  # noqa: PLC0415 - only this verb needs it

    from . import _models as _cli_models  # noqa: PLC0415

    if not argv or argv[0] in ("-h", "--help"):
        (sys.stdout if argv else sys.stderr).write(_cli_models.HELP)
        return EXIT_OK if argv else EXIT_USAGE
    if argv[0] in _cli_models.VERBS:
        try:
            args = _cli_models.parser([_connection_options()]).parse_args(list(argv))
        except SystemExit as exc:  # usage errors and --help
            return exc.code if isinstance(exc.code, int) else EXIT_USAGE
        args.command = "models"
        return _run_verb(args, _cli_models.run)

    try:
        return models_main(list(argv))
    except SystemExit as exc:  # argparse's usage errors and --help
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE


def _client(args: argparse.Namespace) -> Client:
    timeout = args.timeout
    tls = args.tls or (_env("LLAMAD_TLS") or "").lower() in ("1", "true", "yes", "on")
    return Client(args.address, timeout=30.0 if timeout is None else timeout,
                  stream_timeout=timeout, tls=tls,
                  ca_file=args.ca or _env("LLAMAD_CA_FILE"),
                  cert_file=args.cert or _env("LLAMAD_CERT_FILE"),
                  key_file=args.key or _env("LLAMAD_KEY_FILE"),
                  server_name=args.server_name or _env("LLAMAD_SERVER_NAME"),
                  token_file=args.token_file or _env("LLAMAD_TOKEN_FILE"))


def run(args: argparse.Namespace) -> int:
    """Run a client verb parsed by the ``llamad`` parser; return the exit status."""
    from . import _verbs as _cli_verbs  # noqa: PLC0415 - keeps `llamad serve` from importing it

    if args.command == "models":
        return run_models(args.args)
    return _run_verb(args, getattr(_cli_verbs, args.command))


def _run_verb(args: argparse.Namespace, verb: Callable[[Client, argparse.Namespace], int]) -> int:
    """Run ``verb`` with a client of ``args``' connection options; return the exit status."""
    from . import _verbs as _cli_verbs  # noqa: PLC0415 - keeps `llamad serve` from importing it

    try:
        client = _client(args)
    except ValueError as exc:
        print(f"llamad: {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        with client:
            return verb(client, args)
    except errors.LlamadError as exc:
        print(f"llamad: {args.command}: {describe(exc, client.address)}", file=sys.stderr)
        return exit_code(exc)
    except _cli_verbs.UsageError as exc:
        print(f"llamad: {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`llamad logs | head`): stay quiet, like SIGPIPE would.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_PIPE
