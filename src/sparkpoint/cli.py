"""The ``sparkpoint`` command line: run jobs and operate their streams, checkpoints and state.

Every command takes the job file first and ``--set key=value`` (repeatable) to override any key.
User errors (bad config, unknown stream, corrupt data) print one ``error:`` line and exit 2.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from sparkpoint.config import KEYS, Config, load_config, parse_overrides, redact
from sparkpoint.errors import SparkpointError, UserError
from sparkpoint.fsutil import USER_ERRNOS

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
app.add_typer(job_app, name="job")

JobArg = Annotated[Path, typer.Argument(help="The job file (YAML or .properties).")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set", "-s", help="Override a config key: --set task.commit.ms=5000 (repeatable)."
    ),
]
err = Console(stderr=True)


def _config(job: Path, overrides: list[str] | None) -> Config:
    """The job file's config with this command's ``--set`` values (one-off: a run does not
    store them as the job's config)."""
    values = parse_overrides(overrides or [])
    return load_config(job, values).with_one_off(values)


def _ran_config(job: Path, overrides: list[str] | None) -> Config:
    """The config of a job that has run: tools that read its data stop, saying where they
    looked, when there is none."""
    from sparkpoint.tools.jobs import require_job_data

    config = _config(job, overrides)
    require_job_data(config)
    return config


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
    setup_logging(verbose, log_format)
    with _errors_as(log_format):
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
            coordinator.stop(f"signal {signal.Signals(signum).name}")

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        try:
            coordinator.run(until_caught_up=until_caught_up, max_batches=max_batches)
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


@stream_app.command("trim")
def stream_trim(
    job: JobArg,
    stream: Annotated[str, typer.Argument(help="Stream name, or system.stream.")],
    force: Annotated[
        bool,
        typer.Option(help="Also delete records the job has not committed (logged as an ERROR)."),
    ] = False,
    set_: SetOpt = None,
) -> None:
    """Apply a stream's retention now: drop its records older than retention.ms and those past
    the newest retention.bytes (per partition), never past what the job has committed.

    A running job does this itself for its inputs after a commit (job.retention.check.ms);
    this command is for the other streams, or for now. Kafka's broker applies its own.

    Example: `sparkpoint stream trim job.yaml pageviews --set
    streams.pageviews.retention.bytes=100000000`
    """
    from sparkpoint.system.registry import Systems
    from sparkpoint.tools.streams import resolve_stream, trim_stream

    config = _config(job, set_)
    ss = resolve_stream(config, stream)
    trimmed = trim_stream(config, Systems(config), ss, force=force)
    for t in trimmed:
        held = (
            f"; kept {t.held_back} offsets past retention that job {config.job_label} has not "
            "committed"
            if t.held_back
            else ""
        )
        print(f"{t.ssp}: dropped {t.dropped} records, oldest offset now {t.oldest}{held}")
    if not trimmed:
        print(f"{ss}: nothing past its retention")


@stream_app.command("create")
def stream_create(
    job: JobArg,
    stream: Annotated[str, typer.Argument(help="Stream name, or system.stream.")],
    partitions: Annotated[int, typer.Option(min=1, help="Number of partitions.")] = 1,
    compacted: Annotated[bool, typer.Option(help="Keep only the newest record per key.")] = False,
    set_: SetOpt = None,
) -> None:
    """Create a stream.

    Example: `sparkpoint stream create job.yaml pageviews --partitions 4`
    """
    from sparkpoint.system.registry import Systems
    from sparkpoint.system.streams import stream_spec
    from sparkpoint.tools.streams import resolve_stream

    config = _config(job, set_)
    ss = resolve_stream(config, stream)
    systems = Systems(config)
    spec = stream_spec(config, ss, partitions, compacted=compacted)
    created = systems.admin(ss.system).create_stream(spec)
    n = systems.admin(ss.system).partition_count(ss.stream)
    print(f"{'created' if created else 'exists'}: {ss} ({n} partitions)")


@stream_app.command("add-partitions")
def stream_add_partitions(
    job: JobArg,
    stream: Annotated[str, typer.Argument(help="Stream name, or system.stream.")],
    partitions: Annotated[int, typer.Option(min=1, help="The new partition count (more).")],
    force: Annotated[
        bool,
        typer.Option(help="Grow an input of the job even though the job has not read all of it."),
    ] = False,
    set_: SetOpt = None,
) -> None:
    """Grow a stream to more partitions (Kafka: CreatePartitions); never shrinks one.

    Keys are placed by a hash modulo the partition count, so most keys move to another
    partition. For an input of a job with state: stop the producers and run the job to the end
    of its input first (refused while the job runs or has unread input); after the grow the job
    refuses to start until `sparkpoint state reshard JOB` has moved its state to the new
    tasks: it never runs with a key's state split between tasks.

    Example: `sparkpoint stream add-partitions job.yaml pageviews --partitions 8`
    """
    from sparkpoint.system.registry import Systems
    from sparkpoint.tools.streams import add_partitions, resolve_stream

    config = _config(job, set_)
    ss = resolve_stream(config, stream)
    systems = Systems(config)
    try:
        before = add_partitions(config, systems, ss, partitions, force=force)
    finally:
        systems.close()
    print(f"grown: {ss} ({before} -> {partitions} partitions)")
    if ss in config.inputs and config.stores:
        from sparkpoint.metadata.coordinator_stream import CoordinatorStreamStore
        from sparkpoint.storage.reshard import growth_of

        store = CoordinatorStreamStore(config, source="add-partitions")
        try:
            recorded = growth_of(store, str(ss)) is not None
        finally:
            store.close()
        if recorded:
            print(
                f"note: {ss} is an input of job {config.job_name}, which has state: it refuses "
                f"to start until its state is moved to the new tasks: sparkpoint state reshard "
                f"{job}"
            )
        else:  # a job that never ran, with nothing to read: no state to move
            print(f"note: job {config.job_name} has no state yet: it runs on {partitions} tasks")


@stream_app.command("list")
def stream_list(job: JobArg, set_: SetOpt = None) -> None:
    """List every stream of the job's systems with partitions and message counts.

    Example: `sparkpoint stream list job.yaml`
    """
    from sparkpoint.model import SystemStreamPartition
    from sparkpoint.system.registry import Systems

    config = _config(job, set_)
    systems = Systems(config)
    for system in config.systems:
        admin = systems.admin(system)
        for name in admin.list_streams():
            n = admin.partition_count(name)
            ssps = [SystemStreamPartition(system, name, p) for p in range(n)]
            meta = admin.get_metadata(ssps)
            total = 0
            for m in meta.values():
                with contextlib.suppress(ValueError):
                    total += int(m.upcoming) - int(m.oldest)
            print(f"{system}.{name}\tpartitions={n}\tmessages={total}")


@stream_app.command("repair")
def stream_repair(
    job: JobArg,
    stream: Annotated[str, typer.Argument(help="Stream name, or system.stream (a filelog one).")],
    partition: Annotated[int | None, typer.Option(help="Only this partition.")] = None,
    set_: SetOpt = None,
) -> None:
    """Remove damaged records from a filelog stream, after an error named them.

    A record the log had listed may have been read, so it is never cut silently: this command
    removes each damaged record, records its offset range in the partition's `LOST` file (every
    later read over it logs the loss), and the next append continues after the highest offset
    the log ever handed out, so no reader's checkpoint can skip a new record. Run it with the
    job stopped; readers whose checkpoint lies in a removed tail resume when new records arrive.

    Example: `sparkpoint stream repair job.yaml pageviews --partition 2`
    """
    from sparkpoint.system.filelog.system import FileLogAdmin
    from sparkpoint.system.registry import Systems
    from sparkpoint.tools.streams import resolve_stream

    config = _config(job, set_)
    ss = resolve_stream(config, stream)
    admin = Systems(config).admin(ss.system)
    if not isinstance(admin, FileLogAdmin):
        raise UserError(f"stream repair works on filelog streams; {ss.system} is not one")
    n = admin.partition_count(ss.stream)
    partitions = range(n) if partition is None else [partition]
    removed = 0
    for p in partitions:
        for first, last in admin.repair(ss.stream, p):
            print(f"{ss}.{p}: removed damaged records {first}..{last} (offsets not reused)")
            removed += last - first + 1
    err.print(f"{ss}: {removed} damaged records removed" if removed else f"{ss}: nothing damaged")


@stream_app.command("write")
def stream_write(
    job: JobArg,
    stream: Annotated[str, typer.Argument(help="Stream name, or system.stream.")],
    partition: Annotated[
        int | None, typer.Option(help="Write every record to this partition (default: by key).")
    ] = None,
    set_: SetOpt = None,
) -> None:
    """Append JSON lines `{"key", "value", "timestamp"}` from stdin to a stream.

    The stream is created with the job's configured partition count if it does not exist.

    Example: `echo '{"key": "u1", "value": {"n": 1}}' | sparkpoint stream write job.yaml pageviews`
    """
    from sparkpoint.system.registry import Systems
    from sparkpoint.tools.streams import resolve_stream, write_json_lines

    config = _config(job, set_)
    ss = resolve_stream(config, stream)
    n = write_json_lines(config, Systems(config), ss, sys.stdin, partition=partition)
    err.print(f"wrote {n} records to {ss}")


@stream_app.command("read")
def stream_read(
    job: JobArg,
    stream: Annotated[str, typer.Argument(help="Stream name, or system.stream.")],
    partition: Annotated[int | None, typer.Option(help="Only this partition.")] = None,
    from_: Annotated[str | None, typer.Option("--from", help="Start at this offset.")] = None,
    limit: Annotated[int | None, typer.Option(help="At most this many records.")] = None,
    staged: Annotated[
        bool,
        typer.Option(
            "--staged",
            help="Print the staged output instead: records of exactly-once jobs waiting for "
            "the checkpoint that covers their input (each with state, owner and part).",
        ),
    ] = False,
    uncommitted: Annotated[
        bool,
        typer.Option(
            "--uncommitted",
            help="Print every record, each with its state: committed, open (an exactly-once "
            "job's changelog record that no written checkpoint covers yet) or aborted (one a "
            "restore discarded: its input was read again).",
        ),
    ] = False,
    set_: SetOpt = None,
) -> None:
    """Print a stream's records as JSON lines (partition, offset, key, value, timestamp).

    These are the committed records: output a job with `job.processing.guarantee:
    exactly-once` staged is not in the stream until the checkpoint covering its input is
    written (`--staged` shows it), and such a job's changelog records are read once the
    checkpoint covering them is written (`--uncommitted` shows them all).

    Example: `sparkpoint stream read job.yaml user-counts --partition 0 --from 10`
    """
    from sparkpoint.system.registry import Systems
    from sparkpoint.tools.streams import (
        dump_json_lines,
        read_json_lines,
        read_staged_json_lines,
        resolve_stream,
    )

    config = _config(job, set_)
    ss = resolve_stream(config, stream)
    if staged:
        dump_json_lines(
            read_staged_json_lines(config, Systems(config), ss, partition=partition), sys.stdout
        )
        return
    rows = read_json_lines(
        config,
        Systems(config),
        ss,
        partition=partition,
        start=from_,
        limit=limit,
        uncommitted=uncommitted,
    )
    dump_json_lines(rows, sys.stdout)


@job_app.command("show")
def job_show(
    job: JobArg,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    set_: SetOpt = None,
) -> None:
    """Show each task: the executor and host it is assigned to (host affinity), its last
    checkpoint, where it committed it, its stores' size then, and whether that local state is
    current (a restart on that executor restores nothing).

    Example: `sparkpoint job show job.yaml --json`
    """
    from sparkpoint.tools.jobs import job_overview, overview_lines

    data = job_overview(_ran_config(job, set_))
    if as_json:
        print(json.dumps(data, indent=2))
        return
    print("\n".join(overview_lines(data)))


@job_app.command("reset")
def job_reset(
    job: JobArg,
    keep_input: Annotated[
        bool,
        typer.Option(
            "--keep-input", help="Keep the job's input streams (task.inputs): rerun on them."
        ),
    ] = False,
    force: Annotated[
        bool, typer.Option(help="Reset although the job's heartbeat names a live driver.")
    ] = False,
    set_: SetOpt = None,
) -> None:
    """Start a job over: delete its checkpoints, stored config, startpoints, changelogs, local
    state and, on the embedded filelog under job.data.dir, its streams (inputs too, unless
    --keep-input). The next run starts from the inputs' oldest (or upcoming) offsets with empty
    state. Refused while the job runs.

    Example: `sparkpoint job reset job.yaml --keep-input`
    """
    from sparkpoint.tools.reset import reset_job

    config = _config(job, set_)
    done = reset_job(config, keep_input=keep_input, force=force)
    for line in done:
        print(line)
    err.print(
        f"job {config.job_name} reset" if done else f"job {config.job_name}: nothing to reset"
    )


@checkpoint_app.command("show")
def checkpoint_show(
    job: JobArg,
    task: Annotated[str | None, typer.Option(help='Only this task, e.g. "Partition 0".')] = None,
    version: Annotated[
        int | None,
        typer.Option(help="Show this version (1 or 2) instead of the one the job reads."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    set_: SetOpt = None,
) -> None:
    """Show the last checkpoint of each task: id, input offsets and state markers.

    Without --version it shows what the job would read (task.checkpoint.read.versions).

    Example: `sparkpoint checkpoint show job.yaml --task "Partition 0" --version 2 --json`
    """
    from sparkpoint.checkpoint.manager import TYPES, CheckpointManager

    config = _ran_config(job, set_)
    manager = CheckpointManager(config)
    if version is not None and version not in TYPES:
        raise UserError(f"--version {version}: known versions are {', '.join(map(str, TYPES))}")
    checkpoints = manager.read_all() if version is None else manager.read_version(version)
    items = sorted(checkpoints.items(), key=lambda kv: (len(kv[0].name), kv[0].name))
    if task is not None:
        items = [(t, c) for t, c in items if t.name == task]
        if not items:
            known = ", ".join(t.name for t, _ in sorted(checkpoints.items())) or "none"
            raise UserError(f"task {task!r} has no checkpoint; tasks with checkpoints: {known}")
    if as_json:
        print(json.dumps({t.name: c.to_json() for t, c in items}, indent=2))
        return
    if not items:
        print("no checkpoints yet")
    for t, c in items:
        print(f"{t.name}: checkpoint {c.checkpoint_id} (V{c.VERSION})")
        for ssp, offset in sorted(c.input_offsets.items()):
            print(f"  {ssp}: {offset}")
        for factory, stores in sorted(c.state_checkpoint_markers.items()):
            for store, marker in sorted(stores.items()):
                print(f"  state {factory}/{store}: {marker}")


@checkpoint_app.command("set")
def checkpoint_set(
    job: JobArg,
    file: Annotated[Path, typer.Option("--file", "-f", help="YAML of task or SSP to offset.")],
    force: Annotated[
        bool, typer.Option(help="Write even though the job's driver looks alive.")
    ] = False,
    set_: SetOpt = None,
) -> None:
    """Set a stopped job's checkpointed offsets (the last processed offset per SSP).

    Every SSP and offset is checked against the streams before anything is written. State is
    kept as committed: only where the job reads from changes.

    File, per SSP or per task: `filelog.pageviews.0: 41` or
    `Partition 0: {filelog.pageviews.0: 41}`

    Example: `sparkpoint checkpoint set job.yaml --file offsets.yaml`
    """
    from sparkpoint.tools.checkpoints import set_checkpoints

    config = _ran_config(job, set_)
    written = set_checkpoints(config, file, force=force)
    for task, checkpoint in sorted(written.items()):
        offsets = ", ".join(f"{s}={o}" for s, o in sorted(checkpoint.input_offsets.items()))
        print(f"{task}: {offsets}")


@state_app.command("dump")
def state_dump(
    job: JobArg,
    store: Annotated[str, typer.Option(help="The store to dump.")],
    task: Annotated[str | None, typer.Option(help='Only this task, e.g. "Partition 0".')] = None,
    raw: Annotated[
        bool,
        typer.Option(
            "--raw",
            help="Print keys and values as escaped bytes, not through the store's serdes "
            "(window and timer stores keep their own layout).",
        ),
    ] = False,
    set_: SetOpt = None,
) -> None:
    """Print a store's committed contents as JSON lines `{"key", "value"}`.

    Example: `sparkpoint state dump job.yaml --store user-counts --task "Partition 1"`
    """
    from sparkpoint.tools.state import committed_entries, committed_raw_entries

    config = _ran_config(job, set_)
    out = sys.stdout
    if raw:
        for _task, key, value in committed_raw_entries(config, store, task):
            line = {"key": _escaped(key), "value": _escaped(value)}
            out.write(json.dumps(line, separators=(",", ":")) + "\n")
        return
    try:
        for _task, key, value in committed_entries(config, store, task):
            out.write(json.dumps({"key": key, "value": value}, separators=(",", ":")) + "\n")
    except (UnicodeDecodeError, ValueError) as exc:
        raise UserError(
            f"store {store}: an entry its serdes cannot decode ({exc}); a window or timer store "
            "keeps its own layout: add --raw to see its bytes"
        ) from exc


def _escaped(data: bytes) -> str:
    """Bytes as text with Python's escapes (``\\x00``) for what is not printable ASCII."""
    return repr(data)[2:-1]


@state_app.command("show")
def state_show(
    job: JobArg,
    task: Annotated[str | None, typer.Option(help='Only this task, e.g. "Partition 0".')] = None,
    store: Annotated[str | None, typer.Option(help="Only this store.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    set_: SetOpt = None,
) -> None:
    """Show where each store's committed state is: the local checkpoint on this machine, the
    changelog up to its checkpointed offset, the blob-store snapshot (files, bytes).

    Example: `sparkpoint state show job.yaml --store user-counts --json`
    """
    from sparkpoint.tools.state import state_locations

    rows = [
        r
        for r in state_locations(_ran_config(job, set_))
        if (task is None or r["task"] == task) and (store is None or r["store"] == store)
    ]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    if not rows:
        print("no committed state (no checkpoints yet, or no stores)")
    for r in rows:
        where = []
        if r["local"]:
            where.append(f"local checkpoint {r['local']}")
        if "changelog" in r:
            c = r["changelog"]
            where.append(f"changelog {c['ssp']} up to offset {c['offset']}")
        if "blobstore" in r:
            b = r["blobstore"]
            where.append(
                f"blob store snapshot {b['snapshot-index']} ({b['files']} files, "
                f"{b['bytes']:,} bytes) in {b['url']}"
            )
        found = "; ".join(where) or "NOWHERE readable from here (no backend, no local copy)"
        print(f"{r['task']} / {r['store']}: checkpoint {r['checkpoint-id']}: {found}")


@state_app.command("check")
def state_check(
    job: JobArg,
    quick: Annotated[
        bool, typer.Option("--quick", help="Only check that blobs exist (no download).")
    ] = False,
    set_: SetOpt = None,
) -> None:
    """Check every blob every checkpoint references: present, right size and checksum (it
    downloads them; --quick only checks they exist). Exit 1 naming each problem.

    Example: `sparkpoint state check job.yaml`
    """
    from sparkpoint.tools.state import blob_check

    result = blob_check(_ran_config(job, set_), checksums=not quick)
    for line in result.problems:
        print(line)
    if result.problems:
        raise typer.Exit(1)
    if result.snapshots == 0:
        print(
            f"nothing to check: none of the job's {result.checkpoints} checkpoints (V2) names a "
            f"blob-store snapshot (no store lists blobstore in stores.<s>.backup.factories, or "
            f"no commit has uploaded one yet)"
        )
        return
    what = "exists" if quick else "exists and matches its size and checksum"
    print(
        f"ok: {result.snapshots} snapshots of {result.checkpoints} checkpoints, "
        f"{result.files} files: every blob {what}"
    )


@state_app.command("reshard")
def state_reshard(
    job: JobArg,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Check every key and say what would move; change nothing."),
    ] = False,
    unread_after_growth: Annotated[
        bool,
        typer.Option(
            "--unread-after-growth",
            help="The job's unread input in the old partitions of a stream grown without "
            "`stream add-partitions` was written after the growth (keyed by the new count).",
        ),
    ] = False,
    set_: SetOpt = None,
) -> None:
    """Move the job's state to the tasks of its inputs' new partition counts (after `stream
    add-partitions`), offline; refused while the job runs.

    Every key's committed state goes to the task its input partition now maps it to (the
    producers' partitioner: crc32 on the filelog, murmur2 on Kafka), through the stores'
    changelogs and blob-store snapshots, with new checkpoints that adopt it. All or nothing: a
    crash leaves the old state and checkpoints, and running the command again finishes or
    redoes it. A store whose keys are not the input key needs `stores.<s>.reshard.key`
    (window, or a function); the reshard says which and changes nothing without it.

    Example: `sparkpoint stream add-partitions job.yaml pageviews --partitions 8 &&
    sparkpoint state reshard job.yaml`
    """
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from sparkpoint.tools.reshard import reshard

    config = _ran_config(job, set_)
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:,.0f}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=err, transient=True, disable=not err.is_terminal) as bar:
        tasks: dict[str, Any] = {}

        def progress(phase: str, done: int, total: int | None) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(phase, total=total)
            bar.update(tasks[phase], completed=done, total=total)

        result = reshard(
            config, dry_run=dry_run, unread_after_growth=unread_after_growth, progress=progress
        )
    if result.finished_earlier:
        print(f"finished reshard {result.finished_earlier}, which an earlier run had committed")
    if result.nothing:
        print(f"nothing to do: {result.nothing}")
        return
    for stream, (old, new) in sorted(result.streams.items()):
        print(f"{stream}: {old} -> {new} partitions")
    verb = "would move" if dry_run else "moved"
    for store, moved in sorted(result.moved.items()):
        print(
            f"store {store}: {verb} {moved.keys:,} of {moved.entries:,} entries "
            f"({moved.bytes:,} bytes)"
        )
    done = "checked in" if dry_run else "re-sharded and adopted in"
    print(f"{done} {result.seconds:.1f} s")


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


StreamOpt = Annotated[str, typer.Option("--stream", help="Input stream name, or system.stream.")]
PartitionsOpt = Annotated[
    list[int] | None,
    typer.Option("--partition", "-p", help="Partition (repeatable; default: all)."),
]
TaskOpt = Annotated[str | None, typer.Option(help='Only this task, e.g. "Partition 2".')]


@startpoint_app.command("set")
def startpoint_set(
    job: JobArg,
    stream: StreamOpt,
    partition: PartitionsOpt = None,
    task: TaskOpt = None,
    offset: Annotated[
        str | None, typer.Option(help="Start at this offset (the next to read).")
    ] = None,
    timestamp: Annotated[
        str | None,
        typer.Option(
            help="Start at the first message at or after this time (epoch ms or ISO-8601)."
        ),
    ] = None,
    oldest: Annotated[bool, typer.Option("--oldest", help="Start at the oldest message.")] = False,
    upcoming: Annotated[
        bool, typer.Option("--upcoming", help="Skip to new messages only.")
    ] = False,
    apply_now: Annotated[
        bool, typer.Option("--apply-now", help="Make a running job apply it at its next batch.")
    ] = False,
    set_: SetOpt = None,
) -> None:
    """Set where an input restarts: applied at the next start (or now, with --apply-now).

    The job's checkpoints are not edited, and **state is not rewound**: stores keep what they
    hold and re-read messages are processed again on top of it. Without --partition the
    startpoint applies to every partition; with --task only to that task (broadcast inputs).
    Everything is checked against the stream before anything is written.

    Example: `sparkpoint startpoint set job.yaml --stream pageviews --timestamp 2026-11-22T10:00Z`
    """
    from sparkpoint.tools.startpoints import make_startpoint, set_startpoints

    config = _config(job, set_)
    sp = make_startpoint(offset=offset, timestamp=timestamp, oldest=oldest, upcoming=upcoming)
    planned = set_startpoints(
        config, stream, sp, partitions=partition, task=task, apply_now=apply_now
    )
    for p in planned:
        who = f" task {p.task}" if p.task else ""
        print(f"{p.ssp}{who}: {sp.describe()} -> next offset {p.resolves_to} (as of now)")
    if apply_now:
        print("requested: a running job applies these at its next batch boundary")


@startpoint_app.command("list")
def startpoint_list(
    job: JobArg,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    set_: SetOpt = None,
) -> None:
    """List startpoints waiting for the next start, and those fanned out to tasks.

    Example: `sparkpoint startpoint list job.yaml --json`
    """
    from sparkpoint.tools.startpoints import list_startpoints

    found = list_startpoints(_ran_config(job, set_))
    if as_json:
        print(
            json.dumps(
                {k: {n: sp.to_json() for n, sp in v.items()} for k, v in found.items()}, indent=2
            )
        )
        return
    for kind, entries in found.items():
        for key, sp in sorted(entries.items()):
            print(f"{kind}\t{key}\t{sp.describe()}")
    if not any(found.values()):
        print("no startpoints")


@startpoint_app.command("delete")
def startpoint_delete(
    job: JobArg,
    stream: Annotated[
        str | None, typer.Option("--stream", help="Input stream name, or system.stream.")
    ] = None,
    partition: PartitionsOpt = None,
    task: TaskOpt = None,
    all_: Annotated[
        bool,
        typer.Option("--all", help="Every startpoint and fan-out of the job, on every stream."),
    ] = False,
    set_: SetOpt = None,
) -> None:
    """Delete startpoints of a stream, or all of the job's (waiting or fanned out).

    Example: `sparkpoint startpoint delete job.yaml --stream pageviews --partition 0`

    Example: `sparkpoint startpoint delete job.yaml --all`
    """
    from sparkpoint.tools.startpoints import delete_all_startpoints, delete_startpoints

    config = _config(job, set_)
    if all_ == (stream is not None):
        raise UserError("give either --stream (with --partition/--task) or --all")
    if all_:
        if partition or task:
            raise UserError("--all deletes every startpoint: it takes no --partition or --task")
        n = delete_all_startpoints(config)
    else:
        assert stream is not None
        n = delete_startpoints(config, stream, partitions=partition, task=task)
    print(f"deleted {n} startpoint(s)")


def _help_width() -> None:
    """Help as wide as the terminal, and 120 columns when piped (rich's 80 cut the tables);
    ``TERMINAL_WIDTH`` still wins."""
    import typer.rich_utils

    if typer.rich_utils.MAX_WIDTH is None:
        typer.rich_utils.MAX_WIDTH = max(shutil.get_terminal_size((120, 24)).columns, 100)


@contextlib.contextmanager
def _errors_as(log_format: str) -> Iterator[None]:
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


def _error_line(text: str) -> None:
    err.print(text, highlight=False, markup=False, soft_wrap=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point: runs the CLI and turns user errors into one line and exit code 2."""
    _help_width()
    try:
        app(args=argv, prog_name="sparkpoint")
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except UserError as exc:
        _error_line(f"error: {exc}")
        return 2
    except SparkpointError as exc:
        _error_line(f"error: {type(exc).__name__}: {exc}")
        return 1
    except BrokenPipeError:
        return 0
    except OSError as exc:
        if exc.errno not in USER_ERRNOS:
            raise
        where = f": {exc.filename}" if exc.filename else ""
        err.print(
            f"error: {exc.strerror}{where} (a full disk, a quota, or a read-only or not "
            f"writable directory: fix it and run the command again)",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
