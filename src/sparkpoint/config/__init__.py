"""Job configuration: loading job files, overrides, validation and typed views.

A job file is YAML (nested mappings flatten to Samza-style dotted names; lists join with commas)
or Java-style ``.properties``. ``--set key=value`` overrides win over the file. Every key sparkpoint
reads is declared once in :data:`KEYS` with its default, what is allowed and a line of help; a bad
value, or an unknown key in a namespace sparkpoint owns (``job.``, ``task.``, ``stores.<s>.``,
``streams.<s>.``), is a :class:`ConfigError` naming the key and what is allowed. Keys under
``systems.<s>.`` beyond the ones declared are passed to the system; ``spark.*`` go to Spark.

Every path a job uses derives from ``job.data.dir`` (default ``.sparkpoint/<job.name>`` next to
the job file), made absolute when the config is loaded so that executors on other processes see
the same paths. A relative path in a job file is relative to the job file's directory; one given
with ``--set`` (or with no job file) to the current directory.

The package: :mod:`~sparkpoint.config.keys` (the declared keys), :mod:`~sparkpoint.config.plugins`
(keys plugins declare), :mod:`~sparkpoint.config.view` (:class:`Config`) and
:mod:`~sparkpoint.config.files` (loading). It may import ``model``, ``serde`` and ``errors``.
"""

from __future__ import annotations

from sparkpoint.config.files import (
    config_sources,
    flatten,
    load_config,
    parse_overrides,
    parse_properties,
    read_job_file,
)
from sparkpoint.config.keys import KEYS, SERDE_NAMES, ConfigKey, redact
from sparkpoint.config.plugins import PLUGIN_GROUPS, plugin_keys
from sparkpoint.config.view import Config

__all__ = [
    "KEYS",
    "PLUGIN_GROUPS",
    "SERDE_NAMES",
    "Config",
    "ConfigKey",
    "config_sources",
    "flatten",
    "load_config",
    "parse_overrides",
    "parse_properties",
    "plugin_keys",
    "read_job_file",
    "redact",
]
