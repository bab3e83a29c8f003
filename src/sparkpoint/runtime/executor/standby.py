"""The executor side of standby tasks: one executor's catch-up of the standby copies it keeps
(:func:`run_standby`, called inside a Spark Python worker), around
:func:`sparkpoint.storage.standby.catch_up`."""

from __future__ import annotations

import logging
from pathlib import Path

from sparkpoint.checkpoint.checkpoint import Checkpoint
from sparkpoint.runtime.executor.task_batch import setup_worker_logging, worker_config
from sparkpoint.runtime.plan import StandbyPlan, StandbyResult, parse_checkpoint
from sparkpoint.storage.local import (
    remove_standby_copy,
    remove_standby_executor,
    standby_executors,
    standby_tasks,
    task_dir_name_of,
)
from sparkpoint.storage.standby import StandbyCopyInUse, catch_up

log = logging.getLogger(__name__)


def run_standby(plan: StandbyPlan) -> list[StandbyResult]:
    """Catch up every copy ``plan`` names, after deleting the copies kept in this state
    directory for executors that are gone and this executor's copies of other tasks (each
    under its lock: one another process holds stays). A copy
    whose catch-up fails is deleted (unless another process holds it) and its result says why
    (``error``); the others go on."""
    setup_worker_logging(plan.config)
    config, systems = worker_config(plan.config)
    base = config.store_base_dir
    executor = plan.executor.id
    try:  # only disk to free: what another worker removes meanwhile, or a failure, waits
        _remove_unkept(base, plan)
    except OSError as exc:
        log.warning("executor %s: standby copies no longer kept not all removed: %s", executor, exc)
    results = []
    for copy in plan.copies:
        checkpoint: Checkpoint = parse_checkpoint(copy.checkpoint)
        try:
            done = catch_up(config, systems, copy.task, executor, checkpoint, copy.at)
        except Exception as exc:  # this copy only (catch_up deleted it unless in use): go on
            log.warning("task %s: standby copy catch-up failed: %s", copy.task.name, exc)
            error = f"{type(exc).__name__}: {exc}"
            busy = isinstance(exc, StandbyCopyInUse)
            results.append(
                StandbyResult(
                    copy.task.name.name, "", False, "", executor=executor, error=error, busy=busy
                )
            )
            continue
        results.append(StandbyResult(**vars(done), executor=executor))
    return results


def _remove_unkept(base: Path, plan: StandbyPlan) -> None:
    """Delete the copies of executors that are gone and this executor's copies of tasks it no
    longer keeps, each under its lock (:func:`remove_standby_copy`)."""
    live = {task_dir_name_of(e) for e in plan.live}
    for name in standby_executors(base):
        if name not in live:
            remove_standby_executor(base, name)
    keep = {task_dir_name_of(t) for t in plan.keep}
    for stale in standby_tasks(base, plan.executor.id):
        if stale.name not in keep and not remove_standby_copy(stale):
            log.info("standby copy %s is in use by another process; left for now", stale)
