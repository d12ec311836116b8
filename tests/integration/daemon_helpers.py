"""Moved to :mod:`tests.support.daemon`; kept for test_reload.py until its import changes."""

from tests.support.daemon import Clients, config_env, make_daemon

__all__ = ["Clients", "config_env", "make_daemon"]
