"""Where SetMode may take an endpoint's API key from: only places an operator configured.

SetMode switches a role to an endpoint its caller names, and llamad sends the endpoint's
key to that URL as a bearer token. An admin token is an API role, not a shell: it must
not make llamad read an arbitrary file of the host, or an arbitrary variable of the
daemon, and send it away. So the key named over the API must be

* a file inside ``endpoint_keys.dir`` (symbolic links resolved: a link inside that points
  outside is refused), or a file the configuration itself names as a role's
  ``api_key_file``;
* a variable whose name begins with ``endpoint_keys.env_prefix``, or one the configuration
  names as a role's ``api_key_env``.

Anything else is refused (INVALID_ARGUMENT) before it is opened or read; the file's own
checks (owner, mode, one key line) are :func:`supervisor.read_api_key`'s, whose errors
quote nothing read from the file.
"""

from __future__ import annotations

import os

from supervisor import EndpointSpec

from ..config import Config, Role
from ..errors import InvalidArgument


def check_key_source(endpoint: EndpointSpec, config: Config) -> None:
    """Refuse ``endpoint``'s key file or variable unless the operator configured it.

    Raises:
        InvalidArgument: naming the field and the rule.
    """
    keys = config.settings.endpoint_keys
    configured = [config.child(role) for role in Role]
    if endpoint.api_key_file:
        real = os.path.realpath(os.path.expanduser(endpoint.api_key_file))
        named = {os.path.realpath(os.path.expanduser(c.api_key_file))
                 for c in configured if c.api_key_file}
        root = os.path.realpath(keys.dir) if keys.dir else None
        inside = root is not None and real != root and os.path.commonpath([real, root]) == root
        if not inside and real not in named:
            where = (f"inside endpoint_keys.dir {keys.dir}" if keys.dir
                     else "inside endpoint_keys.dir (not set)")
            raise InvalidArgument(
                f"endpoint.api_key_file: {endpoint.api_key_file} is neither {where} nor a "
                "key file the configuration names")
    if endpoint.api_key_env:
        name = endpoint.api_key_env
        named_env = {c.api_key_env for c in configured if c.api_key_env}
        prefix = keys.env_prefix
        if not (prefix and name.startswith(prefix) and name != prefix) and name not in named_env:
            begins = (f"does not begin with endpoint_keys.env_prefix {prefix}" if prefix
                      else "is not allowed (endpoint_keys.env_prefix is empty)")
            raise InvalidArgument(
                f"endpoint.api_key_env: {name} {begins} and is not a variable the "
                "configuration names")
