"""The requests a run's decisions send to other runs, through the outbox: the wake that
tells a parent how its child ended (or that its spawn was refused), the cancels a parent's
end or cancel sends its children. Pure; used by projections.transitions and the reducer.
"""

from __future__ import annotations

import json
from typing import Any

from runstream.engine.journal import events as ev
from runstream.projections.state import InboxItem, OutboxItem, RunState, RunStatus, incarnation_id

SPAWN_REFUSED = "SpawnRefused"  # a wake that answers one spawn: no child was made for it


def parent_wake(run: RunState, status: RunStatus, changes: dict[str, Any]) -> OutboxItem | None:
    """The wake that tells a settled child's parent (None: the run has none) how it ended;
    `changes` are the run's settling field updates (its result or error)."""
    if run.parent_run_id is None:
        return None
    return wake_request(
        f"wake/{incarnation_id(run)}", run.parent_run_id,
        run.parent_lineage_id or run.parent_run_id,
        child_run_id=run.run_id, child_status=status, position=run.parent_position,
        result_json=changes.get("result_json"), error_type=changes.get("error_type"),
        error_message=changes.get("error_message"), flow=run.flow)


def wake_request(request_id: str, run_id: str, lineage_id: str, *, child_run_id: str,
                 child_status: RunStatus, position: int | None, result_json: str | None = None,
                 error_type: str | None = None, error_message: str | None = None,
                 flow: str | None = None) -> OutboxItem:
    """A `run.wake-requested` to the parent `run_id`: its child `child_run_id` ended so.
    The one place a wake's body is written (a settled child, a refused spawn, a wake that
    could not be delivered and is sent again without the child's outcome)."""
    return OutboxItem(
        request_id=request_id, type=ev.RunWakeRequested.TYPE, run_id=run_id,
        lineage_id=lineage_id,
        body_json=json.dumps({
            "child_run_id": child_run_id, "child_status": child_status.value,
            "result_json": result_json, "error_type": error_type,
            "error_message": error_message, "position": position, "flow": flow,
        }))


def cancels(run: RunState, child_ids: list[str], reason: str) -> tuple[OutboxItem, ...]:
    """One cancel request per child in `child_ids`, from `run`, saying why."""
    lineages = {link.run_id: link.lineage_id for link in run.children}
    return tuple(
        OutboxItem(request_id=f"cancel/{incarnation_id(run)}/{child}",
                   type=ev.RunCancelRequested.TYPE,
                   run_id=child, lineage_id=lineages.get(child, child),
                   body_json=json.dumps({"reason": reason, "requested_by": run.run_id}))
        for child in child_ids
    )


def refused_spawn(child_run_id: str, item: InboxItem, why: str) -> OutboxItem | None:
    """The wake that fails a parent's spawn the owner answered without making the run its
    child (the id exists already, or the request was rejected): the parent would otherwise
    wait for a child that never settles for it."""
    if item.parent_run_id is None:
        return None
    return wake_request(
        f"wake/{child_run_id}/{item.request_id}", item.parent_run_id,
        item.parent_lineage_id or item.parent_run_id, child_run_id=child_run_id,
        child_status=RunStatus.failed, position=item.parent_position,
        error_type=SPAWN_REFUSED, error_message=why)


def spawn_answer(before: RunState | None,
                 record: ev.RunCreated | ev.RunCreateRejected) -> tuple[OutboxItem, ...]:
    """A parent's create request answered without making the run its child (a duplicate of
    an existing run, or rejected) fails that parent's spawn through the outbox, instead of
    leaving the parent waiting for a child that never settles for it."""
    if before is None:
        return ()
    item = next((i for i in before.inbox if i.request_id == record.envelope.request_id), None)
    if item is None or item.parent_run_id is None:
        return ()
    if isinstance(record, ev.RunCreateRejected) and record.reason == "identity-conflict":
        why = (f"run {before.run_id} already exists with {record.field} "
               f"{record.existing_value!r}, not {record.requested_value!r}; a child's run id "
               f"must be new")
    elif isinstance(record, ev.RunCreateRejected):
        why = f"{record.reason}: {record.field} {record.requested_value!r}"
    elif record.duplicate and before.request_id != item.request_id:
        owner = (f"a child of {before.parent_run_id}" if before.parent_run_id
                 else "created by a client")
        why = f"run {before.run_id} already exists ({owner}); a child's run id must be new"
    else:
        return ()
    wake = refused_spawn(before.run_id, item, why)
    return () if wake is None else (wake,)
