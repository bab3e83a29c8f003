"""``sparkpoint run``, ``submit`` and ``pack``: run a job here, on a cluster, or pack its
environment (:mod:`sparkpoint.runtime.driver`)."""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from sparkpoint.cli.app import SetOpt, app, err, errors_as
from sparkpoint.config import parse_overrides
from sparkpoint.errors import UserError


@app.command()
def run(
    job: Annotated[
        str,
        typer.Argument(
            help="The job file (YAML or .properties), or module:attribute of a DataFrame "
            "Pipeline (the current directory is on the import path)."
        ),
    ],
    until_caught_up: Annotated[
        bool,
        typer.Option(help="Read every input up to its newest offset at start, commit, exit 0."),
    ] = False,
    final_watermark: Annotated[
        bool,
        typer.Option(
            help="With --until-caught-up: the input ends there. Every event-time timer fires "
            "(the last windows and sessions go out) before the last commit; the watermark "
            "stays at the end of time, so records that come later are late."
        ),
    ] = False,
    max_batches: Annotated[
        int | None, typer.Option(help="Stop (with a commit) after N batches.")
    ] = None,
    master: Annotated[
        str | None,
        typer.Option(
            help="Spark master URL (default: spark.master, else local[*,4]: 4 tries per task)."
        ),
    ] = None,
    rebalance: Annotated[
        bool,
        typer.Option(
            help="On a cluster, move tasks from busy executors to idle (new) ones until task "
            "counts differ by at most one; moved tasks restore there "
            "(job.host-affinity.rebalance=true)."
        ),
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            help="Start although the job's heartbeat names a live driver (one on another host "
            "that is known to be gone); the other driver, if alive, stops at its next heartbeat."
        ),
    ] = False,
    supervise: Annotated[
        bool,
        typer.Option(
            help="Run the driver as a child and restart it when it dies (not after a user "
            "error, exit 2), with backoff; SIGTERM stops it cleanly."
        ),
    ] = False,
    max_restarts: Annotated[
        int, typer.Option(min=0, help="With --supervise: give up after this many restarts.")
    ] = 10,
    log_format: Annotated[
        str,
        typer.Option(
            help="text, or json: one JSON object per line (time, level, logger, job, message; "
            "task and batch where they apply) for log records, progress and the error line."
        ),
    ] = "text",
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log at INFO level.")] = False,
    set_: SetOpt = None,
) -> None:
    """Run a job: the driver plans micro-batches and Spark runs one partition per task.

    One driver runs a job at a time: while the job's heartbeat names a live driver, `run`
    refuses to start (exit 2, naming its host and pid).

    A job file runs the low-level task API (`task.class`); `module:attribute` runs a DataFrame
    pipeline (`sparkpoint.Pipeline`). Both share checkpoints, state backends and startpoints.
    Ctrl-C or SIGTERM finishes the current batch, commits every task and exits 0.

    Example: `sparkpoint run job.yaml --until-caught-up --set task.commit.ms=2000`

    Example: `sparkpoint run pageviews_pipeline:job --until-caught-up`

    Example: `sparkpoint run job.yaml --until-caught-up --final-watermark` (a backfill: its
    last windows go out too)

    Example: `sparkpoint run job.yaml --supervise --max-restarts 5` (restarts a driver that
    died; a restart resumes from the last checkpoint)
    """
    if supervise:
        from sparkpoint.runtime.driver.supervise import child_command
        from sparkpoint.runtime.driver.supervise import supervise as supervise_driver

        command = child_command(sys.argv[1:])
        raise typer.Exit(supervise_driver(command, max_restarts=max_restarts, say=err.print))
    from sparkpoint.runtime.driver.entry import resolve_job
    from sparkpoint.runtime.driver.launch import start_job
    from sparkpoint.runtime.driver.logs import FORMATS, setup_logging
    from sparkpoint.runtime.driver.progress import ProgressDisplay
    from sparkpoint.runtime.spark.session import choose_master

    if log_format not in FORMATS:
        raise UserError(f"--log-format {log_format!r}: use one of {', '.join(FORMATS)}")
    if final_watermark and not until_caught_up:
        raise UserError("--final-watermark ends the input: use it with --until-caught-up")
    setup_logging(verbose, log_format)
    with errors_as(log_format):
        resolved = resolve_job(job, parse_overrides(set_ or []))
        if rebalance:
            rebalanced = resolved.config.with_overrides({"job.host-affinity.rebalance": "true"})
            resolved = dataclasses.replace(resolved, config=rebalanced)
        config = resolved.config
        shown = choose_master(config, master)
        display: Any
        if log_format == "json":
            from sparkpoint.runtime.driver.progress import JsonProgress

            setup_logging(verbose, log_format, config.job_name)
            display = JsonProgress(config.job_name)
            display.say(f"starting Spark ({shown}) ...", event="starting")
        else:
            display = ProgressDisplay()
            err.print(f"starting Spark ({shown}) ...")
        pipeline = resolved.pipeline

        coordinator, spark = start_job(
            config,
            master,
            resolved.runner,
            exact_batches=pipeline is not None,
            listener=display,
            sql=pipeline is not None,  # a local task job: the SparkContext alone
            force=force,
        )

        if coordinator.reporters is not None and coordinator.reporters.url:
            if log_format == "json":
                display.say(f"metrics: {coordinator.reporters.url}", event="metrics")
            else:
                err.print(f"metrics: {coordinator.reporters.url}", highlight=False)

        def on_signal(signum: int, _frame: Any) -> None:
            coordinator.stop(f"signal {signal.Signals(signum).name}", bounded=True)

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        try:
            coordinator.run(
                until_caught_up=until_caught_up,
                max_batches=max_batches,
                final_watermark=final_watermark,
            )
        finally:
            coordinator.close()
            spark.stop(wait=False)  # the process exits next


@app.command("submit", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def submit(
    ctx: typer.Context,
    job: Annotated[Path, typer.Argument(help="The job file (YAML or .properties).")],
    master: Annotated[
        str, typer.Option(help="Spark master URL (yarn, k8s://..., spark://..., local[N]).")
    ] = "local[*,4]",
    deploy_mode: Annotated[
        str, typer.Option(help="client (the driver runs here) or cluster (on the cluster).")
    ] = "client",
    env_archive: Annotated[
        Path | None,
        typer.Option(
            help="A packed Python environment with sparkpoint (sparkpoint pack -o env.zip), "
            "shipped to the cluster: its workers then need only Java."
        ),
    ] = None,
    conf: Annotated[
        list[str] | None, typer.Option(help="A Spark setting key=value (repeatable).")
    ] = None,
    until_caught_up: Annotated[
        bool, typer.Option(help="The run reads every input up to its newest offset and exits.")
    ] = False,
    max_batches: Annotated[int | None, typer.Option(help="The run stops after N batches.")] = None,
    dry_run: Annotated[
        bool, typer.Option(help="Print the spark-submit command; run nothing.")
    ] = False,
    set_: SetOpt = None,
) -> None:
    """Run a job through spark-submit: ships the job file, its modules and (--env-archive) its
    Python environment, and runs `sparkpoint run` as the application. Any other option goes
    to spark-submit as it is (--executor-memory 2g, --num-executors 4, --queue q, ...).

    Example: `sparkpoint submit job.yaml --master yarn --deploy-mode cluster
    --env-archive env.zip`

    Example: `sparkpoint submit job.yaml --master local[2] --until-caught-up --dry-run`
    """
    import shlex
    import subprocess
    import tempfile

    from sparkpoint.runtime.driver.submit import submit_command
    from sparkpoint.runtime.spark.gateway import forward

    run_args = ["--until-caught-up"] if until_caught_up else []
    for setting in set_ or []:
        run_args += ["--set", setting]
    if max_batches is not None:
        run_args += ["--max-batches", str(max_batches)]
    staging = Path(tempfile.mkdtemp(prefix="sparkpoint-submit-"))
    command = submit_command(
        job,
        master=master,
        deploy_mode=deploy_mode,
        env_archive=env_archive,
        conf=conf or [],
        run_args=run_args,
        staging=staging,
        spark_args=ctx.args,
    )
    if dry_run:
        print(shlex.join(command))
        return
    err.print(f"spark-submit: {shlex.join(command)}", highlight=False, markup=False, soft_wrap=True)
    child_env = dict(os.environ)
    if master.startswith("local"):  # as `run`: a local Spark binds to loopback
        child_env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # spark-submit's JVM writes to the pipe; its start-up noise is left out as in run
    child = subprocess.Popen(command, env=child_env, stderr=subprocess.PIPE)
    assert child.stderr is not None
    forward(iter(child.stderr.readline, b""))
    raise typer.Exit(child.wait())


@app.command("pack")
def pack(
    output: Annotated[
        Path,
        typer.Option(
            "--output", "-o", help="The archive to write (a .zip: Spark keeps its file modes)."
        ),
    ] = Path("sparkpoint-env.zip"),
    spark_jars: Annotated[
        bool,
        typer.Option(help="Keep pyspark's jars (460 MB) in the archive; workers use their own."),
    ] = False,
    force: Annotated[bool, typer.Option(help="Overwrite the archive if it exists.")] = False,
) -> None:
    """Pack the virtual env sparkpoint runs from (with venv-pack) for `submit --env-archive`.

    Run it with the env's own sparkpoint (ENV/bin/sparkpoint pack). The archive holds every
    package of the env but not Python itself: the workers need the same Python version at the
    same path. Spark's own jars are left out (the cluster has them) unless --spark-jars.

    Example: `sparkpoint pack -o env.zip && sparkpoint submit job.yaml --master yarn
    --deploy-mode cluster --env-archive env.zip`
    """
    from sparkpoint.runtime.driver.pack import pack_env

    written = pack_env(
        output,
        spark_jars=spark_jars,
        force=force,
        progress=sys.stderr.isatty(),
    )
    size = written.stat().st_size / 2**20
    print(f"packed {sys.prefix} into {written} ({size:.0f} MB)")
