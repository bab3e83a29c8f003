"""The ``sparkpoint`` command line: run jobs and operate their streams, checkpoints and state.

Every command takes the job file first and ``--set key=value`` (repeatable) to override any key.
User errors (bad config, unknown stream, corrupt data) print one ``error:`` line and exit 2.

A module per command group, mirroring :mod:`sparkpoint.tools` (which does the work): ``run``
(run, submit, pack), ``streams``, ``jobs``, ``checkpoints``, ``state``, ``config`` and
``startpoints``; what they share is :mod:`.app`.
"""

from __future__ import annotations

import sys

from sparkpoint.cli import checkpoints, config, dlq, jobs, run, startpoints, state, streams
from sparkpoint.cli.app import app, err, error_line, help_width
from sparkpoint.errors import SparkpointError, UserError
from sparkpoint.fsutil import USER_ERRNOS

#: the command groups, registered on :data:`app` as they are imported
COMMANDS = (run, streams, jobs, checkpoints, state, config, startpoints, dlq)


def main(argv: list[str] | None = None) -> int:
    """Entry point: runs the CLI and turns user errors into one line and exit code 2."""
    help_width()
    try:
        app(args=argv, prog_name="sparkpoint")
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except UserError as exc:
        error_line(f"error: {exc}")
        return 2
    except SparkpointError as exc:
        error_line(f"error: {type(exc).__name__}: {exc}")
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
