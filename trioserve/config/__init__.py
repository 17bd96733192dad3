"""Server configuration: ``config.properties``, command line and environment.

The package reads TorchServe's ``config.properties`` and resolves it the way TorchServe
does, with trioserve's safer defaults, into one frozen :class:`ServerConfig`:

* :mod:`~trioserve.config.properties` -- the Java ``.properties`` file format;
* :mod:`~trioserve.config.addresses` -- :class:`Address` and the listener address syntax;
* :mod:`~trioserve.config.settings` -- :class:`ServerConfig` (every key, its default and
  trioserve's own keys) and :class:`CliOptions`;
* :mod:`~trioserve.config.values` -- strict typed readers over the raw strings;
* :mod:`~trioserve.config.loading` -- which file, and how the file, the command line and
  the ``TS_*`` environment variables combine (:func:`load_config`);
* :mod:`~trioserve.config.errors` -- :class:`ConfigError`.
"""

from trioserve.config.addresses import Address, parse_address
from trioserve.config.errors import ConfigError
from trioserve.config.loading import (
    CONFIG_FILE_NAME,
    TORCHSERVE_UNUSED_KEYS,
    find_config_file,
    load_config,
)
from trioserve.config.properties import parse_properties
from trioserve.config.settings import METRICS_MODES, CliOptions, ServerConfig

__all__ = [
    "CONFIG_FILE_NAME",
    "METRICS_MODES",
    "TORCHSERVE_UNUSED_KEYS",
    "Address",
    "CliOptions",
    "ConfigError",
    "ServerConfig",
    "find_config_file",
    "load_config",
    "parse_address",
    "parse_properties",
]
