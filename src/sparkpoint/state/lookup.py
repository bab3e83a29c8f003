"""Keys looked up in a job's committed state, with no Spark: ``sparkpoint.state.lookup(job,
store, keys)`` and ``sparkpoint state get JOB --store S KEY...``.

Each key is looked for in the task its input partitioner places it in (the store's keys are
the input's keys: ``stores.<s>.reshard.key`` unset or ``key``), then, not found there, in
every other task (a task may key its state by something else), as of the
task's last written checkpoint: its local checkpoint when this machine has it, else restored
from the store's backends into a scratch directory (:func:`sparkpoint.tools.state
.committed_engine`). A running job is not disturbed, and its writes since that checkpoint are
not seen: each answer names the checkpoint it came from.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkpoint.config import Config, load_config
from sparkpoint.errors import UserError
from sparkpoint.model import SystemStreamPartition, TaskModel
from sparkpoint.serde import IntegerSerde, JsonSerde
from sparkpoint.storage.kv.store import store_serdes
from sparkpoint.system.registry import Systems
from sparkpoint.system.streams import job_model
from sparkpoint.tools.state import committed_engine, require_store, task_checkpoints


@dataclass(frozen=True)
class Answer:
    """A key's committed value (``found`` false: none), the task that holds it and the
    checkpoint the answer is from."""

    key: Any
    value: Any
    found: bool
    task: str
    checkpoint: str


def _tasks_of(
    config: Config, systems: Systems, store: str, key: bytes, tasks: Sequence[TaskModel]
) -> list[TaskModel]:
    """The tasks whose input partitions the key goes to (every task when the store's keys are
    not the input's, or nothing places it)."""
    setting = config.get_str(f"stores.{store}.reshard.key") or "key"
    if setting != "key":
        return list(tasks)
    wanted: set[SystemStreamPartition] = set()
    broadcast = {s for s, _ in config.broadcast_inputs}
    for stream in config.inputs:
        if stream in broadcast:
            continue
        admin = systems.admin(stream.system)
        count = admin.partition_count(stream.stream)
        partition = admin.partition_for_key(key, count)
        wanted.add(SystemStreamPartition(stream.system, stream.stream, partition))
    chosen = [t for t in tasks if t.ssps & wanted]
    return chosen or list(tasks)


def key_from_text(config: Config, store: str, text: str) -> Any:
    """A key typed on the command line, as ``store``'s key serde takes it: an integer for
    ``integer``, JSON for ``json`` (a text that is not JSON: that string), else the text."""
    serde = store_serdes(config, store)[0]
    if isinstance(serde, IntegerSerde):
        try:
            return int(text)
        except ValueError:
            raise UserError(
                f"store {store}: key {text!r} is not an integer (its key serde)"
            ) from None
    if isinstance(serde, JsonSerde):
        try:
            return json.loads(text)
        except ValueError:
            return text
    return text


def lookup(
    job: str | Path | Config,
    store: str,
    keys: Sequence[Any],
    overrides: dict[str, str] | None = None,
) -> list[Answer]:
    """Each of ``keys`` (as the store's key serde takes them) in ``store``'s committed state,
    in the order given (see the module docstring)."""
    config = job if isinstance(job, Config) else load_config(Path(job), overrides or {})
    require_store(config, store)
    key_serde, msg_serde = store_serdes(config, store)
    systems = Systems(config)
    try:
        checkpoints = dict(task_checkpoints(config, systems))
        if not checkpoints:
            raise UserError(
                f"job {config.job_name} has no checkpoint yet: nothing is committed to look up"
            )
        known = {t.name.name: t for t in checkpoints}  # (with its changelog partition)
        tasks = [t for t in job_model(config, systems).sorted_tasks() if t.name.name in known]
        tasks = tasks or list(checkpoints)  # (the job's inputs changed since: every task)
        encoded = [key_serde.to_bytes(k) for k in keys]
        answers: dict[int, Answer] = {}
        routed: dict[str, list[int]] = {}
        for i, raw in enumerate(encoded):
            for task in _tasks_of(config, systems, store, raw, tasks):
                routed.setdefault(task.name.name, []).append(i)

        def look(by_task: dict[str, list[int]]) -> None:
            for name, indexes in by_task.items():
                model_task = known[name]
                checkpoint = checkpoints[model_task]
                with committed_engine(config, systems, model_task, store, checkpoint) as engine:
                    values = engine.get_many([encoded[i] for i in indexes])
                for i, value in zip(indexes, values, strict=True):
                    if i in answers and (value is None or answers[i].found):
                        continue  # the first answer found stands
                    answers[i] = Answer(
                        keys[i],
                        None if value is None else msg_serde.from_bytes(value),
                        value is not None,
                        name,
                        str(checkpoint.checkpoint_id),
                    )

        look(routed)
        # not where the input partitioner puts it (the task keys its state by something
        # else): every other task
        missing = [i for i, a in answers.items() if not a.found]
        rest = {
            t.name.name: [i for i in missing if i not in routed.get(t.name.name, [])] for t in tasks
        }
        look({name: indexes for name, indexes in rest.items() if indexes})
        return [answers[i] for i in range(len(keys))]
    finally:
        systems.close()
