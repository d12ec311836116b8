"""Configuration: one registry of options, read from flags, environment, a TOML file.

Precedence: flag > environment > file > default. Every option is declared once in
:data:`OPTIONS`; from there it gets its flag (``--generation-model``), its environment
variable (``LLAMAD_GENERATION_MODEL``), its TOML key (``[generation] model``), its
``--help`` text, and its validation. Invalid values stop the daemon at start with one
clear line naming the option and where the value came from.
"""

# The implementation is split by concept: the option registry (_config_options), the typed
# sections (_config_sections), loading (_config_load) and validation (_config_checks).
from . import _config_load, _config_options
from ._config_checks import (
    check_listen,
    default_models_dir,
    is_loopback,
    unix_socket_path,
)
from ._config_load import (
    add_arguments,
    load,
)
from ._config_options import (
    INSTALLED_MODELS_DIR,
    MODES,
    OPTIONS,
    ConfigError,
    Option,
    Reload,
    option,
)
from ._config_sections import AnswerConfig, ChildConfig, Config, Limits, RetrievalSettings

# Private, for the unit tests: they build a Config from raw values and coerce the example
# configuration's values.
_build = _config_load._build
_coerce = _config_options._coerce

__all__ = [
    "INSTALLED_MODELS_DIR",
    "MODES",
    "OPTIONS",
    "AnswerConfig",
    "ChildConfig",
    "Config",
    "ConfigError",
    "Limits",
    "Option",
    "Reload",
    "RetrievalSettings",
    "add_arguments",
    "check_listen",
    "default_models_dir",
    "is_loopback",
    "load",
    "option",
    "unix_socket_path",
]
