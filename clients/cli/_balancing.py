"""The ``llamad`` verbs for load balancers and probes: ``health`` (a ``grpc.health.v1``
probe with exit codes, for systemd, Kubernetes exec probes and keepalived), ``drain`` and
``undrain`` (admin). Dispatched by name from :mod:`clients.cli._verbs`, like every verb:
``verb(client, args) -> exit status``. Each talks to one daemon: several addresses are a
usage error.

``llamad health`` exit status:

====  ==========================================================================
0     SERVING
1     NOT_SERVING (drained, shutting down, a model not ready), or another failure
2     usage or configuration error (several addresses, unreadable token file)
3     no answer: the daemon is unreachable, or did not answer within --timeout
4     the daemon has no such service (``--service`` unknown to it)
====  ==========================================================================
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from .. import errors
from .._client import Client

HEALTH_TIMEOUT = 5.0
"""``llamad health``'s deadline when ``--timeout`` is not given, seconds."""
DRAIN_POLL = 0.5
"""Seconds between two looks at the calls in flight (``llamad drain --wait``)."""

EXIT_SERVING, EXIT_NOT_SERVING, EXIT_USAGE, EXIT_NO_ANSWER, EXIT_UNKNOWN_SERVICE = 0, 1, 2, 3, 4


def add_balancing_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser],
                           common: list[argparse.ArgumentParser]) -> None:
    """Add ``health``, ``drain`` and ``undrain`` to the ``llamad`` parser."""
    p = sub.add_parser(
        "health", parents=common, help="probe grpc.health.v1 (exit status 0: serving)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Ask one daemon's grpc.health.v1 for a service's status and exit with "
                    "it, for systemd, Kubernetes exec probes and keepalived. Needs no "
                    f"token. Default --timeout: {HEALTH_TIMEOUT:g} s.\n\nexit status: 0 "
                    "SERVING, 1 NOT_SERVING, 2 usage error, 3 no answer (unreachable or "
                    "timed out), 4 unknown service")
    p.add_argument("--service", default="", metavar="NAME",
                   help="'' (default: the whole daemon), generation, embedding, or a gRPC "
                        "service name such as llamad.v1.InferenceService")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing")

    p = sub.add_parser(
        "drain", parents=common, help="take the daemon out of load balancing (admin)",
        description="Drain one daemon without stopping it: its grpc.health.v1 says "
                    "NOT_SERVING and its agent-check port 'drain', so load balancers send "
                    "it no new calls; calls that still arrive are served. Ends with "
                    "`llamad undrain` (or a restart).")
    p.add_argument("--reason", default="", help="why (logged)")
    p.add_argument("--wait", type=float, default=None, metavar="SECONDS",
                   help="then wait up to SECONDS for its calls in flight to finish (exit "
                        "status 1 if some are still running)")

    sub.add_parser("undrain", parents=common, help="put a drained daemon back (admin)",
                   description="End `llamad drain`: the daemon reports its health again "
                               "and load balancers send it calls.")


def _several(client: Client, verb: str) -> bool:
    """Say so and return True when ``client`` balances over several daemons."""
    if client.balanced:
        print(f"llamad: {verb}: talks to one daemon: give one --address", file=sys.stderr)
    return client.balanced


def health(client: Client, args: argparse.Namespace) -> int:
    if _several(client, "health"):
        return EXIT_USAGE
    say: Callable[[str], object] = (lambda _: None) if args.quiet else print
    timeout = HEALTH_TIMEOUT if args.timeout is None else args.timeout
    name = args.service or '""'
    try:
        status = client.health(args.service, timeout=timeout)
    except (errors.Unavailable, errors.DeadlineExceeded) as exc:
        say(f"no answer from {client.address}: {exc.details}")
        return EXIT_NO_ANSWER
    if status == "serving":
        say(f"{name}: serving")
        return EXIT_SERVING
    if status == "service_unknown":
        say(f"{name}: unknown service")
        return EXIT_UNKNOWN_SERVICE
    say(f"{name}: {status}")
    return EXIT_NOT_SERVING


def drain(client: Client, args: argparse.Namespace) -> int:
    if _several(client, "drain"):
        return EXIT_USAGE
    running = client.set_draining(True, reason=args.reason)
    print(f"drained: {running} calls in flight")
    if args.wait is None:
        return 0
    deadline = time.monotonic() + args.wait
    while running and time.monotonic() < deadline:
        time.sleep(DRAIN_POLL)
        running = client.set_draining(True)
    if running:
        print(f"llamad: drain: {running} calls still in flight after {args.wait:g} s",
              file=sys.stderr)
        return 1
    print("no calls in flight")
    return 0


def undrain(client: Client, args: argparse.Namespace) -> int:
    if _several(client, "undrain"):
        return EXIT_USAGE
    client.set_draining(False)
    print("undrained")
    return 0
