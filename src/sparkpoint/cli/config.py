"""``sparkpoint config ...``: a job's config, and every key sparkpoint reads."""

from __future__ import annotations

from sparkpoint.cli.app import JobArg, SetOpt, config_app
from sparkpoint.config import KEYS, load_config, parse_overrides, redact


@config_app.command("show")
def config_show(job: JobArg, set_: SetOpt = None) -> None:
    """Print the config the coordinator would use, and where each value comes from.

    Sources: file, --set, derived (paths from job.data.dir) or default. Values that differ from
    the job's last run (kept in its coordinator stream) are marked.

    Example: `sparkpoint config show job.yaml --set task.commit.ms=1000`
    """
    from sparkpoint.config import config_sources
    from sparkpoint.metadata.coordinator_stream import SET_CONFIG, CoordinatorStreamStore

    overrides = parse_overrides(set_ or [])
    config = load_config(job, overrides)
    last = CoordinatorStreamStore(config, source="config-show").all(SET_CONFIG)
    for key, value, source in config_sources(job, overrides):
        note = ""
        if last and source != "default" and last.get(key) != value:
            note = (
                f"  [last run: {redact(key, last[key])}]"
                if key in last
                else "  [new since last run]"
            )
        print(f"{key}={redact(key, value)}  ({source}){note}")


@config_app.command("keys")
def config_keys() -> None:
    """List every config key sparkpoint and its installed plugins read, with its default and what
    is allowed (a plugin declares its keys as ``config_keys`` on its factory class).

    Example: `sparkpoint config keys`
    """
    from sparkpoint.config import plugin_keys

    plugins = plugin_keys()
    for spec in (*KEYS, *plugins):
        default = spec.default if spec.default is not None else "-"
        origin = " (from a plugin)" if spec in plugins else ""
        print(
            f"{spec.pattern}{origin}\n    {spec.help}\n    allowed: {spec.allowed}; "
            f"default: {default}"
        )
