"""Configuration: one registry of options, read from flags, environment, a TOML file.

Precedence: flag > environment > file > default. Every option is declared once, as a
field of its section's frozen dataclass (:mod:`daemon.config._sections`: its type, default,
help, bounds, choices and what a reload does with a change); from there it gets its flag
(``--generation-model``), its environment variable (``LLAMAD_GENERATION_MODEL``), its TOML
key (``[generation] model``), its ``--help`` text, its validation and its reload decision
(:data:`OPTIONS` lists them). Invalid values stop the daemon at start with one clear line
naming the option and where the value came from.
"""

# The implementation is split by concept: the registry's machinery (_options), the
# options' declarations (_sections, _retrieval, _supervision, _connections), the validated
# configuration (_resolved), loading (_load), validation (_checks), the flags, --help and
# example configuration rendered from the declarations (_help), the model catalog (_catalog*),
# access (TLS and tokens), and the enums the options take (Role, InferenceMode).
from . import _load as _config_load
from . import _options as _config_options
from ._checks import check_listen, default_models_dir, is_loopback, unix_socket_path
from ._connections import ConnectionSettings
from ._console import ConsoleSettings
from ._help import add_arguments, example_config
from ._load import load
from ._options import (
    INSTALLED_MODELS_DIR,
    ConfigError,
    Option,
    Reload,
    value_of,
)
from ._resolved import ChildConfig, Config
from ._retrieval import RetrievalSettings
from ._sections import (
    OPTIONS,
    AnswerConfig,
    AuthSettings,
    HttpSettings,
    Limits,
    LogSettings,
    RoleSettings,
    Settings,
    TlsSettings,
    option,
)
from ._supervision import ChildSettings, RecycleSettings, RestartSettings, SwapSettings
from .inference_mode import InferenceMode
from .role import Role

# Private, for the unit tests: they build a Config from raw values and coerce the example
# configuration's values.
_build = _config_load._build
_coerce = _config_options._coerce

__all__ = [
    "INSTALLED_MODELS_DIR",
    "OPTIONS",
    "AnswerConfig",
    "AuthSettings",
    "ChildConfig",
    "ChildSettings",
    "Config",
    "ConfigError",
    "ConnectionSettings",
    "ConsoleSettings",
    "HttpSettings",
    "InferenceMode",
    "Limits",
    "LogSettings",
    "Option",
    "RecycleSettings",
    "Reload",
    "RestartSettings",
    "RetrievalSettings",
    "Role",
    "RoleSettings",
    "Settings",
    "SwapSettings",
    "TlsSettings",
    "add_arguments",
    "check_listen",
    "default_models_dir",
    "example_config",
    "is_loopback",
    "load",
    "option",
    "unix_socket_path",
    "value_of",
]
