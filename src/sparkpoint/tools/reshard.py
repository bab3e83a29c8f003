"""``sparkpoint state reshard``: move a stateful job's keyed state to the tasks its inputs' new
partition counts give each key, offline, all or nothing (docs/reshard.md).

1. **Claim the job** (its driver heartbeat: a job cannot start while a reshard runs, and a
   reshard is refused while the job runs), and finish a reshard an earlier run left past its
   commit point (:func:`sparkpoint.storage.reshard.finish_pending`).
2. **Plan**: the grown inputs (stored counts vs now), in groups that grow together: the
   job's own inputs, and each intermediate stream alone; the group each store's keys follow
   (``stores.<s>.reshard.stream``: by default the inputs, required in a job that re-keys);
   no unread input keyed by the old count (before the offsets ``stream
   add-partitions`` recorded when it grew the stream) and no re-keyed record waiting to be
   published; the tasks of the new count with their changelog partitions.
3. **Open every task of the new count** at its last checkpoint, restored through its backends
   (:class:`~sparkpoint.storage.task_storage.TaskStorage`), and **check every key**: each store
   entry's input key (:func:`~sparkpoint.storage.reshard.key_route`) must map to its task under
   the old count of the streams it follows, or the store does not follow their key and
   nothing is changed.
4. **Move** each entry whose key maps to another task under the new count: written to that
   task's store and deleted from its own, through the stores' backup wrappers (changelog
   writes and tombstones). New tasks get the task entries of the old tasks their keys come
   from (:func:`~sparkpoint.storage.reshard.new_task_entries`).
5. **Commit** every task as the job would (changelog flushed, blob snapshot uploaded, local
   checkpoint), without writing its checkpoint; the changelogs are grown first to a partition
   per task. Nothing references this state yet: a crash here leaves the old checkpoints.
6. **The commit point**: one record in the metadata store with every new checkpoint; then
   roll it forward (checkpoints, changelog partitions, the new partitions start at their
   oldest offset, the new counts) and remove it.

``dry_run`` does 1-3 reading only (the committed state as ``state dump`` reads it) and reports
what would move.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress, islice, repeat
from operator import eq, itemgetter

from sparkpoint.checkpoint.checkpoint import Checkpoint, CheckpointV2
from sparkpoint.checkpoint.manager import CheckpointManager
from sparkpoint.config import Config
from sparkpoint.errors import StreamNotFound, UserError
from sparkpoint.failpoints import maybe_crash
from sparkpoint.metadata.coordinator_stream import CoordinatorStreamStore, coordinator_stream_name
from sparkpoint.metadata.job_state import (
    INPUT_PARTITIONS,
    Heartbeat,
    refuse_if_running,
    stored_changelog_partitions,
    with_changelog_partitions,
)
from sparkpoint.model import JobModel, SystemStream, SystemStreamPartition, TaskName
from sparkpoint.storage.backend import store_backends
from sparkpoint.storage.changelog.backend import NAME as CHANGELOG
from sparkpoint.storage.changelog.backend import changelog_stream
from sparkpoint.storage.kv.base import KeyValueEngine
from sparkpoint.storage.kv.factory import engine_kind
from sparkpoint.storage.outputs import exactly_once
from sparkpoint.storage.reshard import (
    PENDING,
    RESHARD,
    TASK_ENTRY,
    ReshardRecord,
    finish_pending,
    growth_of,
    input_keys,
    new_task_entries,
    pending,
    source_tasks,
)
from sparkpoint.storage.state_id import CleanStart, CommittedState
from sparkpoint.storage.task_storage import TaskStorage
from sparkpoint.system.base import IntegerOffsets, SystemAdmin
from sparkpoint.system.registry import Systems
from sparkpoint.system.streams import job_model
from sparkpoint.tools.state import committed_raw_entries

log = logging.getLogger(__name__)

CHUNK = 10_000

#: ``(phase, done, total)``: progress of a long step (total None when not known)
Progress = Callable[[str, int, int | None], None]


@dataclass
class Moved:
    """One store's entries: how many the reshard looked at, and moved (with their bytes)."""

    entries: int = 0
    keys: int = 0
    bytes: int = 0


@dataclass
class ReshardResult:
    """What :func:`reshard` did (or, with ``dry_run``, would do)."""

    streams: dict[str, tuple[int, int]] = field(default_factory=dict)  # stream -> (old, new)
    moved: dict[str, Moved] = field(default_factory=dict)  # by store
    finished_earlier: str | None = None  # a reshard an interrupted run left, finished first
    seconds: float = 0.0
    dry_run: bool = False
    nothing: str = ""  # why there was nothing to do


#: the group of a job's own inputs (stage 1) in :func:`_groups`
INPUTS = "inputs"


@dataclass
class _Keys:
    """The streams a store's keys follow (the job's own inputs, or one intermediate stream):
    their partition count before and after, and the admin whose partitioner places them."""

    old: int
    new: int
    admin: SystemAdmin


@dataclass
class _Plan:
    old: int  # tasks before: the largest count the job's inputs had
    new: int  # tasks after
    streams: dict[str, tuple[int, int]]  # grown stream -> (old, new)
    follows: dict[str, _Keys]  # store -> the streams its keys follow
    model: JobModel  # the tasks of the new count, with their changelog partitions
    added_changelog: dict[str, int]
    checkpoints: dict[TaskName, Checkpoint]


def reshard(
    config: Config,
    *,
    dry_run: bool = False,
    unread_after_growth: bool = False,
    progress: Progress | None = None,
) -> ReshardResult:
    """Re-shard the job's state to its inputs' partition counts (see the module docstring)."""
    started = time.monotonic()
    result = ReshardResult(dry_run=dry_run)
    systems = Systems(config)
    coordinator = coordinator_stream_name(config.job_name, config.job_id)
    if coordinator not in systems.admin(config.coordinator_system).list_streams():
        # opening the metadata would create its stream: a job that never ran stays as it is
        systems.close()
        result.nothing = (
            f"job {config.job_name} never ran (it has no coordinator stream "
            f"{config.coordinator_system}.{coordinator}): there is no state to move"
        )
        result.seconds = time.monotonic() - started
        return result
    metadata = CoordinatorStreamStore(config, systems, source="state-reshard")
    heartbeat: Heartbeat | None = None
    try:
        if dry_run:
            refuse_if_running(metadata, config.job_name, "state-reshard", force=False)
            earlier = pending(metadata)
            if earlier is not None:
                result.nothing = (
                    f"reshard {earlier.reshard_id} passed its commit point and is not finished: "
                    "run sparkpoint state reshard JOB (without --dry-run) to finish it"
                )
                return result
        else:
            heartbeat = Heartbeat(config, f"state-reshard-{uuid.uuid4().hex[:8]}")
            heartbeat.start()
            done = finish_pending(config, systems, metadata)
            if done is not None:
                result.finished_earlier = done.reshard_id
        plan = _plan(config, systems, metadata, unread_after_growth, result)
        if plan is None:
            return result
        result.streams = plan.streams
        if dry_run:
            _dry_run(config, plan, result, progress)
        else:
            _run(config, systems, metadata, plan, result, progress)
        return result
    finally:
        result.seconds = time.monotonic() - started
        if heartbeat is not None:
            heartbeat.stop()
        metadata.close()
        systems.close()


# -- 2. plan


def _plan(
    config: Config,
    systems: Systems,
    metadata: CoordinatorStreamStore,
    unread_after_growth: bool,
    result: ReshardResult,
) -> _Plan | None:
    stored = metadata.all(INPUT_PARTITIONS)
    broadcast = {ss for ss, _parts in config.broadcast_inputs}
    counts = {
        ss: systems.admin(ss.system).partition_count(ss.stream)
        for ss in config.inputs
        if ss not in broadcast
    }
    pairs: dict[SystemStream, tuple[int, int]] = {}
    for ss, now in sorted(counts.items(), key=lambda item: str(item[0])):
        text = stored.get(str(ss), "")
        old = int(text) if text.strip().isdigit() else now
        if now < old:
            raise UserError(
                f"input stream {ss} has {now} partitions, fewer than the {old} job "
                f"{config.job_name} last ran with: a reshard only follows growth (streams "
                f"never shrink); recreate the stream with {old} or more partitions"
            )
        pairs[ss] = (old, now)
    grown = {ss: pair for ss, pair in pairs.items() if pair[0] != pair[1]}
    if not grown:
        result.nothing = (
            f"every input of job {config.job_name} has the partition count it last ran with: "
            "there is no state to move"
        )
        return None
    if not config.stores:
        result.nothing = f"job {config.job_name} has no stores: there is no state to move"
        return None
    groups = _groups(config, list(pairs))
    for streams in groups.values():
        _check_grew_together(config, systems, streams, pairs)
    if not config.get_bool("task.transactional.state.checkpoint.enabled"):
        raise UserError(
            f"job {config.job_name} runs with task.transactional.state.checkpoint.enabled="
            f"false: its stores restore to their newest changelog entry, not to their "
            f"checkpoints, so a reshard that stopped half-way could not be redone from the old "
            f"state. Run the reshard with --set task.transactional.state.checkpoint.enabled=true"
        )
    follows = {store: _follows(config, systems, store, groups, pairs) for store in config.stores}
    _check_unread(config, systems, metadata, grown, unread_after_growth)
    stored_map = stored_changelog_partitions(metadata)
    model, added = with_changelog_partitions(stored_map, job_model(config, systems))
    checkpoints = CheckpointManager(config, systems).read_all()
    return _Plan(
        max(old for old, _new in pairs.values()),
        max(new for _old, new in pairs.values()),
        {str(s): p for s, p in grown.items()},
        follows,
        model,
        added,
        checkpoints,
    )


def _groups(config: Config, inputs: Sequence[SystemStream]) -> dict[str, list[SystemStream]]:
    """The job's inputs by whose partition count keys follow: its own inputs together (stage
    1: a task is a partition number of each), each intermediate stream alone (its stage's
    keys follow its own count)."""
    intermediate = set(config.intermediate_streams)
    groups: dict[str, list[SystemStream]] = {}
    own = [ss for ss in inputs if ss not in intermediate]
    if own:
        groups[INPUTS] = own
    for ss in inputs:
        if ss in intermediate:
            groups[str(ss)] = [ss]
    return groups


def _check_grew_together(
    config: Config,
    systems: Systems,
    streams: Sequence[SystemStream],
    pairs: Mapping[SystemStream, tuple[int, int]],
) -> None:
    """Refuse a group of inputs (:func:`_groups`) that did not all grow to one count, or whose
    grown streams' systems place keys differently."""
    grown = {ss: pairs[ss] for ss in streams if pairs[ss][0] != pairs[ss][1]}
    if not grown:
        return
    if len({n for _o, n in grown.values()}) > 1:
        listed = ", ".join(f"{s} {o} -> {n}" for s, (o, n) in sorted(grown.items(), key=str))
        raise UserError(
            f"the inputs of job {config.job_name} grew differently ({listed}): a task is a "
            f"partition number of every input, so they must all grow to one count; grow them "
            f"to the same count (sparkpoint stream add-partitions) and run the reshard again"
        )
    new = next(iter(grown.values()))[1]
    olds = {o for o, _n in grown.values()}
    # an input that had the count a grown one had shared its keys' tasks: it must grow too
    behind = sorted((ss for ss in streams if ss not in grown and pairs[ss][0] in olds), key=str)
    if behind:
        listed = ", ".join(f"{ss} ({pairs[ss][0]})" for ss in behind)
        raise UserError(
            f"input stream(s) {listed} of job {config.job_name} did not grow to {new} "
            f"partitions with the others that had as many: a task is a partition number of "
            f"every input, and a key of those inputs was in one task; grow them too (sparkpoint "
            f"stream add-partitions JOB STREAM --partitions {new}) and run the reshard again"
        )
    admins = {ss.system for ss in grown}
    partitioners = {type(systems.admin(s)).partition_for_key for s in admins}
    if len(partitioners) > 1:
        raise UserError(
            f"the grown inputs of job {config.job_name} are on systems that place keys "
            f"differently ({', '.join(sorted(admins))}): one task cannot follow both"
        )


def _follows(
    config: Config,
    systems: Systems,
    store: str,
    groups: Mapping[str, Sequence[SystemStream]],
    pairs: Mapping[SystemStream, tuple[int, int]],
) -> _Keys:
    """The streams whose keys ``store``'s entries follow: ``stores.<s>.reshard.stream``, else
    the job's inputs; a job that re-keys through intermediate streams must name them."""
    key = f"stores.{store}.reshard.stream"
    setting = config.get_str(key)
    intermediate = config.intermediate_streams
    if setting:  # that stream's counts (its group's inputs grew with it: checked)
        named = [s for streams in groups.values() for s in streams if setting in (str(s), s.stream)]
        if not named:
            known = ", ".join(str(s) for streams in groups.values() for s in streams)
            raise UserError(
                f"{key}={setting!r} is not an input of job {config.job_name} (its inputs: "
                f"{known}): name the stream whose keys the store's entries follow; nothing "
                f"was changed"
            )
        old, new = pairs[named[0]]
        return _Keys(old, new, systems.admin(named[0].system))
    if not intermediate:
        group = INPUTS
    else:
        # the key check cannot tell the groups apart when their old counts are equal (the
        # usual case): a store of the first stage would pass as one of the second, and stay
        # split after its input grew. So the job says which.
        names = ", ".join(str(s) for streams in groups.values() for s in streams)
        raise UserError(
            f"job {config.job_name} re-keys through intermediate streams, so its stores' keys "
            f"follow either its inputs or an intermediate stream: set {key} to the stream "
            f"whose key store {store} holds (one of: {names}); nothing was changed"
        )
    streams = groups[group]
    olds = sorted({pairs[s][0] for s in streams})
    if len(olds) > 1:
        listed = ", ".join(f"{s} {pairs[s][0]}" for s in sorted(streams, key=str))
        raise UserError(
            f"the inputs of job {config.job_name} had different partition counts when it last "
            f"ran ({listed}): a key was in a different task for each, so the reshard cannot "
            f"tell which one store {store}'s keys follow. Set {key} to the input whose keys "
            f"it holds; nothing was changed"
        )
    old, new = pairs[streams[0]]
    return _Keys(old, new, systems.admin(streams[0].system))


def _check_unread(
    config: Config,
    systems: Systems,
    metadata: CoordinatorStreamStore,
    grown: dict[SystemStream, tuple[int, int]],
    unread_after_growth: bool,
) -> None:
    """Refuse when input keyed by the old count is unread: the task that would read it after
    the reshard no longer holds the state of its keys."""
    from sparkpoint.tools.streams import refuse_unpublished, unread_ranges

    problems = []
    recorded = True
    for ss, (old, _new) in sorted(grown.items(), key=lambda item: str(item[0])):
        refuse_unpublished(config, systems, ss, below=old)
        growth = growth_of(metadata, str(ss))
        recorded &= growth is not None
        if growth is None and unread_after_growth:
            continue
        problems += unread_ranges(config, systems, ss, below=old, ends=growth)
    if problems:
        unknown = (
            ""
            if recorded
            else (
                " (the stream did not grow by stream add-partitions, so every unread record of an "
                "old partition counts as written before it grew; if they were written after it, "
                "with the new count, pass --unread-after-growth)"
            )
        )
        raise UserError(
            f"job {config.job_name} has not read input written before the stream grew, keyed "
            f"by the old partition count: {'; '.join(problems[:3])}"
            f"{' ...' if len(problems) > 3 else ''}{unknown}. After a reshard the task reading "
            f"them would not hold their keys' state, so nothing was changed. The job cannot "
            f"read them now: skip them (they are not processed) by moving the job's offsets "
            f"past them with sparkpoint checkpoint set JOB --file offsets.yaml, then run the "
            f"reshard again. Next time, stop the producers and run the job to the end of its "
            f"input before growing a stream"
        )


# -- 3. check every key; dry run


def _mismatch(config: Config, store: str, task: str, key: bytes, want: int, old: int) -> UserError:
    setting = config.get_str(f"stores.{store}.reshard.key") or "key"
    return UserError(
        f"store {store} task {task}: key {key[:60]!r} maps to partition {want} of {old}, not "
        f"to its task: the store's keys do not follow the input key as stores.{store}."
        f"reshard.key={setting} reads them, so the reshard cannot tell where its entries "
        f"belong; nothing was changed. Set stores.{store}.reshard.key to window (window and "
        f"join stores) or to a function module:function returning an entry's input key"
        + (
            f", and stores.{store}.reshard.stream to the stream whose key it holds"
            if config.intermediate_streams
            else ""
        )
    )


def _placed(
    keys_of: Callable[[Sequence[bytes]], Sequence[bytes | None]],
    admin: SystemAdmin,
    keys: Sequence[bytes],
    count: int,
) -> list[int | None]:
    """The partition among ``count`` of each raw key's input key (None: an entry of the task)."""
    message_keys = keys_of(keys)
    if TASK_ENTRY not in message_keys:  # the usual chunk: no Python step per key here
        every: list[int | None] = list(admin.partitions_for_keys(message_keys, count))
        return every
    found = [k for k in message_keys if k is not TASK_ENTRY]
    placed = iter(admin.partitions_for_keys(found, count))
    return [None if k is TASK_ENTRY else next(placed) for k in message_keys]


def _partition(task: TaskName) -> int:
    """The input partition number of a task of the job's grouping (``Partition n``)."""
    head, _, number = task.name.rpartition(" ")
    if head != "Partition" or not number.isdigit():
        raise UserError(
            f"task {task} is not a task of an input partition (Partition N): a reshard moves "
            f"state between the tasks of input partitions only"
        )
    return int(number)


def _dry_run(config: Config, plan: _Plan, result: ReshardResult, progress: Progress | None) -> None:
    """Read the committed state (as ``state dump`` does), check every key, count the moves."""
    for store in config.stores:
        keys_of, follows = input_keys(config, store), plan.follows[store]
        moved = result.moved.setdefault(store, Moved())
        rows = committed_raw_entries(config, store)
        while chunk := list(islice(rows, CHUNK)):
            keys = [key for _task, key, _value in chunk]
            olds = _placed(keys_of, follows.admin, keys, follows.old)
            news = _placed(keys_of, follows.admin, keys, follows.new)
            for (task, key, value), old, new in zip(chunk, olds, news, strict=True):
                owner = _partition(TaskName(task))
                if old is not None and old != owner:
                    raise _mismatch(config, store, task, key, old, follows.old)
                if new is not None and new != owner:
                    moved.keys += 1
                    moved.bytes += len(key) + len(value)
            moved.entries += len(chunk)
            if progress is not None:
                progress(f"checking {store}", moved.entries, None)


# -- 4-6. move, commit, adopt


def _run(
    config: Config,
    systems: Systems,
    metadata: CoordinatorStreamStore,
    plan: _Plan,
    result: ReshardResult,
    progress: Progress | None,
) -> None:
    reshard_id = uuid.uuid4().hex[:12]
    run_id = f"reshard-{reshard_id}"
    storages: dict[int, TaskStorage] = {}

    def open_tasks(new: bool) -> None:
        """The old tasks' storages, or the new ones', restored to their checkpoints."""
        for task in plan.model.sorted_tasks():
            if (_partition(task.name) >= plan.old) != new:
                continue
            last = plan.checkpoints.get(task.name)
            storage = TaskStorage(config, systems, task, run_id=run_id, last_checkpoint=last)
            storages[_partition(task.name)] = storage
            _require_copies(config, storage)
            storage.open(CleanStart(run_id))
            if progress is not None:
                progress("restoring", len(storages), len(plan.model.tasks))

    try:
        # the old tasks first, then every check: a refusal leaves the changelogs as they were
        # (growing one cannot be taken back); the new tasks' changelog partitions come after
        open_tasks(new=False)
        engines = {p: s.logged_engines() for p, s in storages.items()}
        for store in config.stores:
            result.moved[store] = Moved(_check_keys(config, plan, store, engines, progress))
        _grow_changelogs(config, systems, plan.model, plan.old)
        open_tasks(new=True)
        engines = {p: s.logged_engines() for p, s in storages.items()}
        for store in config.stores:
            _move(config, plan, store, engines, result.moved[store], progress)
        record = ReshardRecord(reshard_id, {s: n for s, (_o, n) in plan.streams.items()}, plan.old)
        for _number, storage in sorted(storages.items()):
            grown = [s for s in storage.task.sorted_ssps() if str(s.system_stream) in plan.streams]
            # the partitions the growth added: written since
            fresh = [s for s in grown if s.partition >= plan.streams[str(s.system_stream)][0]]
            before = _before_oldest(systems, fresh)
            checkpoint = commit_unwritten(storage, before)
            name = storage.task.name.name
            record.checkpoints[name] = checkpoint.to_json()
            if len(before) < len(fresh):  # offsets that are not integers: a startpoint
                record.oldest[name] = [str(s) for s in fresh if s not in before]
            if progress is not None:
                progress("committing", len(record.checkpoints), len(storages))
        record.changelog = dict(plan.added_changelog)
    except BaseException:
        for storage in storages.values():
            storage.close()
        raise
    maybe_crash(config, "reshard-after-state")
    metadata.put(RESHARD, PENDING, record.dumps())
    maybe_crash(config, "reshard-after-record")
    finish_pending(config, systems, metadata)


def _grow_changelogs(config: Config, systems: Systems, model: JobModel, old: int) -> None:
    """Give each changelog a partition per task of the new count (before anything is written
    to them: more partitions change nothing for the old tasks). With exactly-once, the
    partitions of the new tasks hold their records back until the job starts from the
    checkpoints the reshard writes (also when an earlier attempt added them and died)."""
    need = max(t.changelog_partition for t in model.tasks.values()) + 1
    for store in config.stores:
        if CHANGELOG not in store_backends(config, store, "backup"):
            continue
        ss = changelog_stream(config, store)
        admin = systems.admin(ss.system)
        try:
            have = admin.partition_count(ss.stream)
        except StreamNotFound:
            continue  # created by the job at its next start, with a partition per task
        if have < need:
            log.info(
                "store %s: growing changelog %s from %d to %d partitions", store, ss, have, need
            )
            admin.add_partitions(ss.stream, need)
        if exactly_once(config) and admin.transactional_records:
            for p in range(old, need):
                ssp = SystemStreamPartition(ss.system, ss.stream, p)
                if admin.committed_end(ssp) is None:
                    admin.commit_records(ssp, admin.get_metadata([ssp])[ssp].oldest)


def _entries(engine: KeyValueEngine) -> Iterator[list[tuple[bytes, bytes]]]:
    """The engine's entries in key order, a chunk at a time, read ahead of any change the
    caller makes between chunks."""
    start = b""
    while chunk := engine.entries_from(start, CHUNK):
        yield chunk
        start = chunk[-1][0] + b"\x00"


def _check_keys(
    config: Config,
    plan: _Plan,
    store: str,
    engines: dict[int, dict[str, KeyValueEngine]],
    progress: Progress | None,
) -> int:
    """Check that every entry of the old tasks is in the task its key maps to under the old
    count (the store follows the input key); how many entries they have."""
    keys_of, follows = input_keys(config, store), plan.follows[store]
    seen = 0
    for partition in range(plan.old):
        engine, start = engines[partition][store], b""
        while keys := engine.keys_from(start, CHUNK):
            start = keys[-1] + b"\x00"
            placed = _placed(keys_of, follows.admin, keys, follows.old)
            for key, old in zip(keys, placed, strict=True):
                if old is not None and old != partition:
                    task = TaskName.for_partition(partition).name
                    raise _mismatch(config, store, task, key, old, follows.old)
            seen += len(keys)
            if progress is not None:
                progress(f"checking {store}", seen, None)
    return seen


def _move(
    config: Config,
    plan: _Plan,
    store: str,
    engines: dict[int, dict[str, KeyValueEngine]],
    moved: Moved,
    progress: Progress | None,
) -> None:
    """Move each entry of the old tasks whose key maps to another task under the new count
    (an entry that arrived from a task scanned earlier maps to its new task: it stays)."""
    keys_of, follows = input_keys(config, store), plan.follows[store]
    scanned = 0
    task_entries: list[dict[bytes, bytes]] = []
    for partition in range(plan.old):
        own = engines[partition][store]
        kept: dict[bytes, bytes] = {}
        for chunk in _entries(own):
            news = _placed(keys_of, follows.admin, list(map(itemgetter(0), chunk)), follows.new)
            if TASK_ENTRY in news:
                kept.update(compress(chunk, [new is TASK_ENTRY for new in news]))
            gone: list[bytes] = []
            # a pass in C per target rather than a Python step per entry: this is the hot loop
            targets = sorted(n for n in set(news) if n is not None and n != partition)
            for target in targets:
                # operator.eq, not target.__eq__: that is NotImplemented (true) for a task
                # entry's None, which would move the task's own entries
                writes = list(compress(chunk, map(eq, news, repeat(target))))
                engines[target][store].write_bulk(writes)
                sent = list(map(itemgetter(0), writes))
                gone += sent
                moved.keys += len(writes)
                moved.bytes += sum(map(len, sent)) + sum(map(len, map(itemgetter(1), writes)))
            if gone:
                own.write_bulk(zip(gone, repeat(None)))
            scanned += len(chunk)
            if progress is not None:
                progress(f"moving {store}", scanned, moved.entries)
        task_entries.append(kept)
    for partition in range(plan.old, plan.new):
        sources = source_tasks(partition, plan.old, plan.new)
        fresh = new_task_entries(store, config, [task_entries[q] for q in sources])
        if fresh:
            engines[partition][store].write_batch(list(fresh.items()))


def _require_copies(config: Config, storage: TaskStorage) -> None:
    """Refuse a task whose committed state of a store without a backup backend is not on this
    machine: it would restore empty, and the empty state would be committed. An in-memory
    store without one has no committed state anywhere (each run starts it empty)."""
    cid = storage.last_checkpoint_id
    if cid is None:
        return
    for store in config.stores:
        if store_backends(config, store, "backup"):
            continue
        if engine_kind(store, config.require(f"stores.{store}.factory")) == "in-memory":
            continue  # nothing of it outlives a run: the job starts it empty as well
        if not storage.local.has_checkpoint(store, cid):
            raise UserError(
                f"task {storage.task.name} store {store}: the store has no backup backend and "
                f"its checkpoint {cid} is not on this machine "
                f"({storage.local.checkpoint_dir(store, cid)}): its state is only on the "
                f"executor that ran the task. Run the reshard there (with its "
                f"job.logged.store.base.dir), or give the store a changelog or a blob store"
            )


def _before_oldest(
    systems: Systems, ssps: list[SystemStreamPartition]
) -> dict[SystemStreamPartition, str]:
    """For partitions whose offsets are integers: the offset before the oldest, as a
    checkpoint's last processed offset (the task reads the partition from its oldest)."""
    out = {}
    for ssp in ssps:
        admin = systems.admin(ssp.system)
        if isinstance(admin, IntegerOffsets):
            oldest = admin.get_metadata([ssp])[ssp].oldest
            out[ssp] = str(int(oldest) - 1)
    return out


def commit_unwritten(
    storage: TaskStorage, offsets: Mapping[SystemStreamPartition, str] | None = None
) -> CheckpointV2:
    """Commit the task's state through its backends (its last checkpoint's input offsets, and
    ``offsets``) and close it; the checkpoint, which is not written."""
    task = storage.task
    last = storage.last_checkpoint
    kept = {s: o for s, o in (last.input_offsets if last else {}).items() if s in task.ssps}
    offsets = {**kept, **(offsets or {})}
    report = storage.commit(offsets, due=True, wait=True)
    started = report.outcome.started
    done = [r for r in report.completed if r.checkpoint_id == started]
    if started is None or not done:
        storage.close()
        raise UserError(
            f"task {task.name}: committing its re-sharded state failed ({report.outcome}); "
            f"nothing was adopted: the job keeps its old state. Fix the cause (the log says "
            f"which backend) and run sparkpoint state reshard JOB again"
        )
    checkpoint = CheckpointV2.from_json(done[0].checkpoint)
    storage.close(CommittedState(started))
    return checkpoint


__all__ = ["Moved", "ReshardResult", "commit_unwritten", "reshard"]
