"""What every ``sparkpoint`` command shares: the Typer apps of each command group, the job
argument and ``--set`` option, the job's config as a command reads it, and how errors print."""

from __future__ import annotations

import contextlib
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from sparkpoint.config import Config, load_config, parse_overrides
from sparkpoint.errors import SparkpointError, UserError

app = typer.Typer(
    help="sparkpoint: stateful stream processing on Spark, with Samza's state and checkpoints.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
)
stream_app = typer.Typer(help="Create, list, write and read streams.", no_args_is_help=True)
checkpoint_app = typer.Typer(help="Inspect checkpoints.", no_args_is_help=True)
state_app = typer.Typer(help="Inspect committed state.", no_args_is_help=True)
config_app = typer.Typer(help="Inspect configuration.", no_args_is_help=True)
job_app = typer.Typer(
    help="Inspect a job (where its tasks run), or start it over.", no_args_is_help=True
)
startpoint_app = typer.Typer(
    help="Rewind or fast-forward inputs without touching checkpoints (input only: state is kept).",
    no_args_is_help=True,
)
app.add_typer(stream_app, name="stream")
app.add_typer(checkpoint_app, name="checkpoint")
app.add_typer(state_app, name="state")
app.add_typer(config_app, name="config")
app.add_typer(startpoint_app, name="startpoint")
dlq_app = typer.Typer(
    help="The dead-letter stream: list what the tasks could not handle, and replay it.",
    no_args_is_help=True,
)
app.add_typer(job_app, name="job")
app.add_typer(dlq_app, name="dlq")

JobArg = Annotated[Path, typer.Argument(help="The job file (YAML or .properties).")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set", "-s", help="Override a config key: --set task.commit.ms=5000 (repeatable)."
    ),
]
err = Console(stderr=True)


def job_config(job: Path, overrides: list[str] | None) -> Config:
    """The job file's config with this command's ``--set`` values (one-off: a run does not
    store them as the job's config)."""
    values = parse_overrides(overrides or [])
    return load_config(job, values).with_one_off(values)


def ran_config(job: Path, overrides: list[str] | None) -> Config:
    """The config of a job that has run: tools that read its data stop, saying where they
    looked, when there is none."""
    from sparkpoint.tools.jobs import require_job_data

    config = job_config(job, overrides)
    require_job_data(config)
    return config


def help_width() -> None:
    """Help as wide as the terminal, and 120 columns when piped (rich's 80 cut the tables);
    ``TERMINAL_WIDTH`` still wins."""
    import typer.rich_utils

    if typer.rich_utils.MAX_WIDTH is None:
        typer.rich_utils.MAX_WIDTH = max(shutil.get_terminal_size((120, 24)).columns, 100)


@contextlib.contextmanager
def errors_as(log_format: str) -> Iterator[None]:
    """With ``--log-format json``, a failed run's error line is a JSON line (exit 2 for a user
    error, 1 for another sparkpoint error); in text, :func:`main` prints it."""
    if log_format != "json":
        yield
        return
    from sparkpoint.runtime.driver.logs import json_line

    try:
        yield
    except UserError as exc:
        print(json_line("ERROR", f"error: {exc}", logger="sparkpoint.cli"), file=sys.stderr)
        raise typer.Exit(2) from None
    except SparkpointError as exc:
        line = f"error: {type(exc).__name__}: {exc}"
        print(json_line("ERROR", line, logger="sparkpoint.cli"), file=sys.stderr)
        raise typer.Exit(1) from None


def error_line(text: str) -> None:
    err.print(text, highlight=False, markup=False, soft_wrap=True)
