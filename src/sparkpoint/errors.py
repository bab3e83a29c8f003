"""The root of sparkpoint's error hierarchy.

Every error sparkpoint raises on purpose derives from :class:`SparkpointError`. Module-specific
errors also inherit a builtin where one fits, so callers can catch either. Messages name the task,
store, SSP, stream or config key involved. :class:`UserError` marks problems the user can fix
(bad config, unknown stream, corrupt input); the CLI prints those as one line without a traceback.
"""

from __future__ import annotations


class SparkpointError(Exception):
    """Base class of every error sparkpoint raises on purpose."""


class UserError(SparkpointError):
    """A problem the user can fix; the CLI shows its message alone, without a traceback."""


class ConfigError(UserError, ValueError):
    """A missing or invalid configuration value; the message names the key and what is allowed."""


class StreamNotFound(UserError, LookupError):
    """A stream that does not exist in its system."""


class CorruptRecordError(UserError):
    """A record in a log failed its checksum or framing; names stream, partition and offset."""


class StoreError(SparkpointError):
    """A key-value store operation failed; names the store."""


class CheckpointError(UserError):
    """A checkpoint could not be read, parsed or written; names the task (and the stream and
    offset of a message that cannot be parsed, for the user to repair)."""


class CheckpointNotFound(CheckpointError, LookupError):
    """No checkpoint exists for the task."""


class OutputError(SparkpointError):
    """Sending a task's output to its system failed (the producer, not the message being
    processed); names the task, stream and partition."""


class TableError(OutputError):
    """A table refused a write or could not be reached (:mod:`sparkpoint.system.tables`); the
    message names the table and the fix. No batch counts as written when it is raised."""


class TableSchemaError(TableError, UserError):
    """A batch's columns do not fit its table: a new column without
    ``streams.<t>.table.schema.evolution: add-columns``, or a changed type."""


class ShutdownOverdue(SparkpointError):
    """A shutdown waited ``task.shutdown.ms`` for the running batch, then cancelled it."""


class TaskError(SparkpointError):
    """User task code failed; names the task and the message being processed."""


class PhaseError(TaskError):
    """A phase of a task's DataFrame batch ran out of order (names task, batch and phase)."""


class MessageEncodeError(TaskError):
    """A message the serde of the stream it is sent to cannot encode; names the task and the
    stream."""


class MessageDecodeError(TaskError, UserError):
    """A message its stream's serde cannot decode; names the task, SSP and offset. A problem
    of the data (or of the serde configured for it), so a user error."""


class RestoreError(UserError):
    """A store cannot be brought to the state its checkpoint commits to; names the task, the
    store, the checkpoint and the fix. The job stops rather than run on wrong state."""


class CommitError(SparkpointError):
    """A commit failed (its upload, a timeout, or writing local state); names the task, store
    and checkpoint. The task stays at its last written checkpoint."""


class BatchInterrupted(SparkpointError):
    """A batch stopped before its end because an executor it ran tasks on was lost (its Spark
    jobs were cancelled rather than wait for it): the driver starts every task again from its
    last written checkpoint, as after a restart."""


def first_line(exc: BaseException) -> str:
    """An exception's message cut to its first line (for one-line errors that quote it)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else "(no message)"
