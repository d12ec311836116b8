"""``[console]``: the operator console in the browser (issue 32, :mod:`daemon.console`), a
section of :class:`~daemon.config._sections.Settings` declared apart to keep that module
short. The console is served under ``/console`` on the HTTP listener (``http_listen``);
without that listener there is no console.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._options import setting


@dataclass(frozen=True)
class ConsoleSettings:
    """``[console]``: fixed when the HTTP listener starts."""

    enabled: bool = setting(True, help="""
        Serve the operator console under /console on the HTTP listener (http_listen): static
        pages that call the HTTP API with the token typed into them.""")
    sample_interval: float = setting(5.0, minimum=1.0, help="""
        Seconds between two samples of the per-model metrics the console's Metrics page draws
        (tokens/s, time to first token, queue depth, errors).""")
    history: float = setting(900.0, minimum=60.0, help="""
        Seconds of metric samples kept in memory for the Metrics page (a ring of history /
        sample_interval samples; a restart starts it empty).""")
