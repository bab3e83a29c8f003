"""The declared config keys: every key sparkpoint reads, once, with its default, what is
allowed and a line of help (:data:`KEYS`); which namespaces sparkpoint owns; which keys hold
credentials (:func:`redact`). Imports only the serde names and errors."""

from __future__ import annotations

import re

from sparkpoint.config.key_spec import ConfigKey, int_at_least, is_bool, one_of
from sparkpoint.config.registry_keys import REGISTRY_KEYS
from sparkpoint.config.table_keys import TABLE_KEYS
from sparkpoint.serde import BUILTIN_SERDES, REGISTRY_SERDES

__all__ = ["KEYS", "OWNED_PREFIXES", "SERDE_NAMES", "ConfigKey", "declared", "redact"]

#: what a serde key allows: the built-in serdes, or one registered in config
SERDE_NAMES = (
    " | ".join([*BUILTIN_SERDES, *REGISTRY_SERDES])
    + ", or a name registered as serializers.registry.<name>.class (or .type)"
)


KEYS: tuple[ConfigKey, ...] = (
    ConfigKey(
        "job.name",
        None,
        "a name of letters, digits, '-', '_'",
        "the job's name",
        lambda v: bool(re.fullmatch(r"[A-Za-z0-9_-]+", v)),
    ),
    ConfigKey(
        "job.id",
        "1",
        "a name of letters, digits, '-', '_'",
        "instance id of the job",
        lambda v: bool(re.fullmatch(r"[A-Za-z0-9_-]+", v)),
    ),
    ConfigKey(
        "job.data.dir",
        None,
        "a directory path",
        "root of every path the job uses (default .sparkpoint/<job.name> next to the job file; "
        "relative paths in a job file are relative to its directory)",
    ),
    ConfigKey(
        "job.modules",
        None,
        "module names, comma separated",
        "set by sparkpoint.run on a session you started (a notebook's), not by you: the job's "
        "own modules it shipped, which a Python worker forgets when job.modules.version changes",
    ),
    ConfigKey(
        "job.modules.version",
        None,
        "a hash",
        "set by sparkpoint.run on a session you started: the version (content hash) of "
        "job.modules; an edited module ships as a new version and runs as edited",
    ),
    ConfigKey(
        "job.processing.guarantee",
        "at-least-once",
        "at-least-once | exactly-once",
        "at-least-once: output is sent as it is made, and a crash replays what the last "
        "checkpoint does not cover (duplicates downstream); exactly-once: each batch's output "
        "is staged and becomes visible only when the checkpoint covering its input is written "
        "(a DataFrame pipeline's: when every task's checkpoint covers its batch) "
        "(none twice, none lost; it is seen a commit later and written twice on the filelog). "
        "Needs a system that can stage output (filelog)",
        one_of("at-least-once", "exactly-once"),
    ),
    ConfigKey(
        "job.logged.store.base.dir",
        None,
        "a directory path",
        "where executors keep store directories (default <job.data.dir>/state; {cwd} = the "
        "executor's working directory, private per executor)",
    ),
    ConfigKey(
        "job.host-affinity.enabled",
        "true",
        "true | false",
        "on a Spark cluster, run each task on the executor that holds its state (Samza's host "
        "affinity); the assignment is kept in the metadata store",
        is_bool,
    ),
    ConfigKey(
        "job.standbytasks.replication.factor",
        "1",
        "an integer >= 1",
        "copies of each task's changelogged stores: the active one and N-1 standbys kept on "
        "other executors (other hosts first), caught up to each checkpoint, promoted when the "
        "active's executor is lost (Samza's key; 1 = no standby; needs a cluster)",
        int_at_least(1),
    ),
    ConfigKey(
        "job.host-affinity.rebalance",
        "false",
        "true | false",
        "move tasks from the busiest executors to idle ones (a new executor) until task "
        "counts differ by at most one; moved tasks restore there (sparkpoint run --rebalance)",
        is_bool,
    ),
    ConfigKey(
        "job.coordinator.system",
        None,
        "a configured system name",
        "system of the coordinator and checkpoint streams (default: first system)",
    ),
    ConfigKey(
        "job.spark.class.archive",
        "true",
        "true | false",
        "start the Spark driver JVM with the class-data-sharing archive made at install "
        "(python -m sparkpoint.runtime.spark.jvm_archive), when there is one: seconds off "
        "every start",
        is_bool,
    ),
    ConfigKey(
        "job.spark.driver.quick.jit",
        "true",
        "true | false",
        "in local mode, run the Spark driver JVM with its quick (C1) JIT compiler only "
        "(-XX:TieredStopAtLevel=1): Spark starts about 0.8 s sooner; the JVM only schedules "
        "and moves small plans there. Never applied on a cluster",
        is_bool,
    ),
    ConfigKey(
        "job.restore.while.spark.starts",
        "true",
        "true | false",
        "in local mode, restore every task's state in the driver while the Spark session "
        "starts (the driver shares the executors' disk), so a restart is back in about the "
        "longer of the two instead of their sum; on a cluster the executors restore",
        is_bool,
    ),
    ConfigKey(
        "job.executor.log.level",
        "WARNING",
        "DEBUG | INFO | WARNING | ERROR",
        "log level of sparkpoint on the executors",
        one_of("DEBUG", "INFO", "WARNING", "ERROR"),
    ),
    ConfigKey("task.inputs", None, "comma-separated system.stream names", "input streams"),
    ConfigKey(
        "metrics.reporters",
        None,
        "comma-separated: prometheus, snapshot",
        "where the driver reports job and task metrics (docs/operations.md)",
    ),
    ConfigKey(
        "metrics.reporter.prometheus.host",
        "127.0.0.1",
        "a host or address",
        "address the Prometheus text endpoint listens on (0.0.0.0: every interface)",
    ),
    ConfigKey(
        "metrics.reporter.prometheus.port",
        "9464",
        "a port",
        "port of the Prometheus text endpoint, http://<host>:<port>/metrics",
        int_at_least(0),
    ),
    ConfigKey(
        "metrics.reporter.snapshot.stream",
        None,
        "system.stream",
        "stream of Samza-style metrics snapshots (default <coordinator system>.metrics)",
    ),
    ConfigKey(
        "metrics.reporter.snapshot.interval.ms",
        "60000",
        "milliseconds >= 0",
        "how often a metrics snapshot is written (and once when the job stops)",
        int_at_least(0),
    ),
    ConfigKey(
        "task.broadcast.inputs",
        None,
        "comma-separated system.stream, system.stream#N or system.stream#[A-B]",
        "streams (or partitions) every task consumes in full",
    ),
    ConfigKey(
        "task.startpoint.max.age.ms",
        "43200000",
        "an integer >= 0 (milliseconds)",
        "startpoints older than this are ignored with a warning",
        int_at_least(0),
    ),
    ConfigKey(
        "task.class",
        None,
        "module:Class or module.Class of a StreamTask",
        "the low-level task class",
    ),
    ConfigKey(
        "job.retention.check.ms",
        "60000",
        "an integer >= 0 (milliseconds)",
        "how often, after a commit, the job applies the retention.ms / retention.bytes of its "
        "input streams on systems that leave retention to sparkpoint (filelog); never past "
        "the job's committed offsets",
        int_at_least(0),
    ),
    ConfigKey(
        "task.commit.ms",
        "60000",
        "an integer >= 0 (milliseconds)",
        "commit at the end of a batch when this long has passed since the last",
        int_at_least(0),
    ),
    ConfigKey(
        "task.commit.intermediate.ms",
        "0",
        "an integer >= 0 (milliseconds)",
        "in a job that re-keys through intermediate streams: commit at the end of a batch when "
        "re-keyed records wait to be published and this long has passed since the last commit, "
        "whatever task.commit.ms says (they are staged until a checkpoint covers them, so the "
        "next stage reads them only after a commit); 0, the default, commits every such batch",
        int_at_least(0),
    ),
    ConfigKey(
        "task.ignored.exceptions",
        None,
        "comma-separated exception class names (ValueError, mymod.MyError) or *",
        "exceptions from process() that skip the message (logged) instead of failing the job",
    ),
    ConfigKey(
        "task.drop.deserialization.errors",
        "false",
        "true | false",
        "skip (and log) input messages that cannot be decoded instead of failing the job",
        is_bool,
    ),
    ConfigKey(
        "task.dlq.stream",
        None,
        "system.stream",
        "the dead-letter stream: an input record that cannot be decoded (or whose process() "
        "raises, per task.dlq.on) goes there, its key as it was and its value kept whole with "
        "what went wrong, and the task goes on (sparkpoint dlq show lists them)",
    ),
    ConfigKey(
        "task.dlq.on",
        "decode",
        "decode | process | both",
        "which failures go to task.dlq.stream: records that cannot be decoded (or lack their "
        "event time), records whose process() raises, or both",
        one_of("decode", "process", "both"),
    ),
    ConfigKey(
        "task.window.ms",
        "-1",
        "an integer (milliseconds; -1 disables)",
        "call window() on tasks this often",
        int_at_least(-1),
    ),
    ConfigKey(
        "task.checkpoint.system",
        None,
        "a configured system name",
        "system of the checkpoint stream (default: job.coordinator.system)",
    ),
    ConfigKey(
        "task.checkpoint.write.versions",
        "1,2",
        "a list of versions from 1, 2",
        "checkpoint versions written at every commit",
    ),
    ConfigKey(
        "task.checkpoint.read.versions",
        "2,1",
        "a list of versions from 1, 2 (by priority)",
        "checkpoint versions read at start, in priority order (Samza's default is 1; V1 "
        "checkpoints carry no blob-store markers)",
    ),
    ConfigKey(
        "task.live.checkpoint.max.age",
        "600000",
        "an integer >= 0 (milliseconds)",
        "a lower-priority checkpoint this much newer than the preferred one wins",
        int_at_least(0),
    ),
    ConfigKey(
        "task.batch.max.messages",
        "10000",
        "an integer >= 1",
        "most messages read from one partition in one micro-batch",
        int_at_least(1),
    ),
    ConfigKey(
        "task.poll.interval.ms",
        "500",
        "an integer >= 0 (milliseconds)",
        "pause between batches when no input is waiting",
        int_at_least(0),
    ),
    ConfigKey(
        "task.shutdown.ms",
        "30000",
        "an integer >= 0 (milliseconds)",
        "how long a stop from outside (SIGTERM, Ctrl-C) waits for the running batch and the "
        "last commit; then the batch is cancelled (nothing of it committed) and the run ends "
        "with an error naming this key",
        int_at_least(0),
    ),
    ConfigKey(
        "systems.<s>.factory",
        None,
        "filelog, or module:Class of a SystemFactory",
        "the system's implementation",
    ),
    ConfigKey(
        "systems.<s>.default.stream.samza.offset.default",
        "oldest",
        "oldest | upcoming",
        "where to start a partition with no checkpoint",
        one_of("oldest", "upcoming"),
    ),
    ConfigKey(
        "systems.<s>.default.stream.partitions",
        "1",
        "an integer >= 1",
        "partition count of streams the job creates in this system",
        int_at_least(1),
    ),
    ConfigKey(
        "streams.<s>.samza.offset.default",
        None,
        "oldest | upcoming",
        "overrides the system default for this stream",
        one_of("oldest", "upcoming"),
    ),
    ConfigKey(
        "streams.<s>.samza.reset.offset",
        "false",
        "true | false",
        "ignore this stream's checkpointed offsets at start",
        is_bool,
    ),
    ConfigKey(
        "streams.<s>.samza.intermediate",
        "false",
        "true | false",
        "a stream the job writes and reads itself, to re-key messages (Samza's name): created "
        "at start, and its messages are read only once the checkpoint of the input they came "
        "from is written, so a replayed input never counts twice downstream",
        is_bool,
    ),
    ConfigKey(
        "streams.<s>.samza.key.serde",
        "string",
        SERDE_NAMES,
        "serde of message keys in this stream",
    ),
    ConfigKey(
        "streams.<s>.samza.msg.serde",
        "json",
        SERDE_NAMES,
        "serde of message values in this stream",
    ),
    ConfigKey(
        "streams.<s>.partitions",
        None,
        "an integer >= 1",
        "partition count when the stream is created",
        int_at_least(1),
    ),
    *TABLE_KEYS,
    ConfigKey(
        "streams.<s>.<property>",
        None,
        "a value",
        "any other key (not samza.*) is a property the system creates the stream with, e.g. "
        "Kafka's retention.ms; systems.<s>.default.stream.<property> sets it for every stream. "
        "The embedded log reads retention.ms and retention.bytes (a stream's bounds) and "
        "delete.retention.ms (how long a changelog's compaction keeps a tombstone: a day by "
        "default, -1 forever)",
    ),
    ConfigKey("stores.<s>.factory", None, "rocksdb | in-memory", "the store's engine"),
    ConfigKey("stores.<s>.key.serde", "string", SERDE_NAMES, "serde of the store's keys"),
    ConfigKey("stores.<s>.msg.serde", "json", SERDE_NAMES, "serde of the store's values"),
    ConfigKey(
        "stores.<s>.changelog",
        None,
        "system.stream",
        "changelog stream of the store (used by the changelog backend)",
    ),
    ConfigKey(
        "stores.<s>.side.inputs",
        None,
        "comma-separated system.stream names of compacted streams, or unset",
        "makes the store a table (Samza's side inputs): each record of these streams is put "
        "into the store under its key (a null value deletes it), before the task's input "
        "records of the same batch; the streams must be compacted and partitioned as the "
        "job's inputs, and their offsets are checkpointed with the store",
    ),
    ConfigKey(
        "stores.<s>.side.inputs.bootstrap",
        "true",
        "true | false",
        "hold the task's input records back until the table is read up to where its streams "
        "stood when the batch was planned, so every input record sees a complete table; "
        "false: input records are processed while a long table is still being read",
        is_bool,
    ),
    ConfigKey(
        "stores.<s>.reshard.key",
        "key",
        "key | window | module:function",
        "how `sparkpoint state reshard` finds the input key an entry of the store belongs to: "
        "key (the store's key is the message key, as the input's key serde writes it), window "
        "(a window or join store: the message key inside the window layout), or a function of "
        "the raw store key returning the message key's bytes (None: an entry of the task, not "
        "of a key)",
        lambda v: v in ("key", "window") or bool(re.fullmatch(r"[\w.]+:\w+", v)),
    ),
    ConfigKey(
        "stores.<s>.reshard.stream",
        None,
        "an input stream (system.stream or stream), or unset",
        "the input whose key the store's entries follow, for `sparkpoint state reshard`: which "
        "partition count places them (default: the job's inputs; required in a job that "
        "re-keys through intermediate streams: the input or the intermediate stream)",
    ),
    ConfigKey(
        "task.timers.store",
        None,
        "the name of one of the job's stores, or unset",
        "the store that keeps the task's timers (context.timers) and its event-time watermark; "
        "give it a changelog or a blob store backup so timers survive a lost host, and keep it "
        "for this alone",
    ),
    ConfigKey(
        "task.watermark.lateness.ms",
        "0",
        "an integer >= 0 (milliseconds)",
        "how far a task's watermark stays behind the smallest largest-event-time of its busy "
        "input partitions: records up to this much out of order are not late",
        int_at_least(0),
    ),
    ConfigKey(
        "task.watermark.idle.ms",
        "60000",
        "an integer >= 1 (milliseconds)",
        "an input partition with no record for this long (processing time) is idle and no "
        "longer holds the task's watermark back (Flink's withIdleness)",
        int_at_least(1),
    ),
    ConfigKey(
        "streams.<s>.event.time.field",
        None,
        "the name of an integer field of the stream's messages, or unset",
        "the message field that holds a record's event time in milliseconds (JSON messages); "
        "unset: the record's timestamp. A message without it fails its batch, naming the offset",
    ),
    ConfigKey(
        "stores.<s>.rocksdb.ttl.ms",
        None,
        "an integer >= 1 (milliseconds), or unset for no TTL",
        "an entry older than this (by its write time) is never read again and is swept from "
        "the store and its changelog at a commit (Samza's key; rocksdb and in-memory stores); "
        "adding, changing or removing it on a store with data takes effect at the next start "
        "(docs/state-backends.md)",
        int_at_least(1),
    ),
    ConfigKey(
        "stores.<s>.write.batch.size",
        "10000",
        "an integer >= 1",
        "writes wait for a commit, a range or all scan, a flush, or this many distinct keys; "
        "then only the newest value of each key is written to the store and logged to its "
        "changelog, in one batch, as Samza's CachedStore does; reads see waiting writes",
        int_at_least(1),
    ),
    ConfigKey(
        "stores.<s>.changelog.restore.accept.loss",
        "false",
        "true | false",
        "restore what a changelog that is missing, recreated or shorter than the checkpointed "
        "offset still holds, losing committed writes, instead of stopping the job; set it "
        "once, deliberately, after the error names the store",
        is_bool,
    ),
    ConfigKey(
        "stores.<s>.changelog.min.compaction.lag.ms",
        "14400000",
        "milliseconds >= 0",
        "with transactional state, the changelog's records stay uncompacted this long "
        "(Kafka topic config min.compaction.lag.ms, 4 h) so that a restore can trim writes "
        "made after the last checkpoint; set it above the longest time between commits",
        int_at_least(0),
    ),
    ConfigKey(
        "stores.<s>.clean.on.container.start",
        "false",
        "true | false",
        "at every job start, delete the store's local state and restore it from its backend",
        is_bool,
    ),
    ConfigKey(
        "stores.<s>.backup.factories",
        None,
        "comma-separated backend names (changelog, blobstore, or registered ones)",
        "backends every commit backs the store up to (several = dual commit)",
    ),
    ConfigKey(
        "stores.<s>.restore.factories",
        None,
        "comma-separated backend names, preferred first",
        "backends the store may be restored from (default: the backup factories)",
    ),
    ConfigKey(
        "task.transactional.state.checkpoint.enabled",
        "true",
        "true | false",
        "restore state to exactly its checkpoint (true) or to the newest changelog entry",
        is_bool,
    ),
    ConfigKey(
        "task.transactional.state.retain.existing.state",
        "false",
        "true | false",
        "with no checkpointed changelog offset, restore the whole changelog (true) instead of "
        "trimming it (Samza's default is true)",
        is_bool,
    ),
    ConfigKey(
        "task.commit.max.delay.ms",
        "60000",
        "an integer >= 0 (milliseconds)",
        "skip a commit while the previous upload has run less than this; then wait for it",
        int_at_least(0),
    ),
    ConfigKey(
        "task.commit.timeout.ms",
        "1800000",
        "an integer >= 1 (milliseconds)",
        "fail the task when a commit waits longer than this for the previous upload",
        int_at_least(1),
    ),
    ConfigKey(
        "task.commit.skip.commit.during.failures.enabled",
        "false",
        "true | false",
        "log and skip failed or timed-out commits (up to the limits below) instead of failing",
        is_bool,
    ),
    ConfigKey(
        "task.commit.skip.commit.exception.max.limit",
        "5",
        "an integer >= 0",
        "with skipping on: fail after more than this many successive failed commits",
        int_at_least(0),
    ),
    ConfigKey(
        "task.commit.skip.commit.timeout.max.limit",
        "2",
        "an integer >= 0",
        "with skipping on: fail after more than this many successive commit timeouts",
        int_at_least(0),
    ),
    ConfigKey(
        "task.commit.async.enabled",
        "true",
        "true | false",
        "upload while processing continues (true), or wait for uploads inside the batch",
        is_bool,
    ),
    ConfigKey(
        "blob.store.url",
        None,
        "an fsspec URL: file://, s3://, abfs://, gs://, ...",
        "where the blob store backend keeps snapshots (default file://<job.data.dir>/blobs)",
    ),
    ConfigKey(
        "blob.store.manager.factory",
        "fsspec",
        "fsspec | module:function",
        "the blob store manager (fsspec serves every URL; a function (config, url) for others)",
        lambda v: v == "fsspec" or bool(re.fullmatch(r"[\w.]+:\w+", v)),
    ),
    ConfigKey(
        "blob.store.ttl.ms",
        "86400000",
        "an integer >= 1",
        "life of unadopted uploads",
        int_at_least(1),
    ),
    ConfigKey(
        "blob.store.max.retries",
        "5",
        "an integer >= 0",
        "retries of a blob operation",
        int_at_least(0),
    ),
    ConfigKey(
        "blob.store.retry.max.duration.ms",
        "60000",
        "an integer >= 0",
        "retry budget",
        int_at_least(0),
    ),
    ConfigKey(
        "blob.store.retry.backoff.ms",
        "100",
        "an integer >= 0",
        "first retry backoff",
        int_at_least(0),
    ),
    ConfigKey(
        "blob.store.sst.checksum.skip",
        "true",
        "true | false",
        "compare immutable .sst files by name, size and permissions only",
        is_bool,
    ),
    ConfigKey("serializers.registry.<s>.class", None, "module:Class of a Serde", "a user serde"),
    *REGISTRY_KEYS,
)

OWNED_PREFIXES = ("job.", "task.", "stores.", "streams.", "tables.", "metrics.", "blob.store.")


def is_stream_property(key: str) -> bool:
    """``streams.<s>.<p>`` other than sparkpoint's ``samza.*`` ones: a property the system
    creates the stream with (see :meth:`Config.stream_properties`)."""
    return key.startswith("streams.") and ".samza." not in key and key.count(".") >= 2


def declared(key: str, extra: tuple[ConfigKey, ...] = ()) -> ConfigKey | None:
    for spec in (*KEYS, *extra):
        if spec.regex.match(key):
            return spec
    return None


_SECRET = re.compile(
    r"secret|password|passwd|token|credential|connection[_.]?string|account[_.]?key|sas|(^|[._])key$",
    re.I,
)


def redact(key: str, value: str) -> str:
    """``value``, or a mask when ``key`` names a credential (for logs and printed config)."""
    if key.startswith(("blob.store.options.", "systems.", "spark.")) and _SECRET.search(key):
        return "****" if value else value
    return value
