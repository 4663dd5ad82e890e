"""The requests a run's decisions send to other runs, through the outbox: the wake that
tells a parent how its child ended (or that its spawn was refused), the cancels a parent's
end or cancel sends its children. Pure; used by projections.transitions and the reducer.
"""

from __future__ import annotations

import json
from typing import Any

from runstream.engine.journal import events as ev
from runstream.projections.state import InboxItem, OutboxItem, RunState, RunStatus


def parent_wake(run: RunState, status: RunStatus, changes: dict[str, Any]) -> OutboxItem | None:
    """The wake that tells a settled child's parent (None: the run has none) how it ended;
    `changes` are the run's settling field updates (its result or error)."""
    if run.parent_run_id is None:
        return None
    return OutboxItem(
        request_id=f"wake/{run.run_id}", type=ev.RunWakeRequested.TYPE,
        run_id=run.parent_run_id, lineage_id=run.parent_lineage_id or run.parent_run_id,
        body_json=json.dumps({
            "child_run_id": run.run_id, "child_status": status.value,
            "result_json": changes.get("result_json"),
            "error_type": changes.get("error_type"),
            "error_message": changes.get("error_message"),
            "position": run.parent_position,
        }))


def cancels(run: RunState, child_ids: list[str], reason: str) -> tuple[OutboxItem, ...]:
    """One cancel request per child in `child_ids`, from `run`, saying why."""
    lineages = {link.run_id: link.lineage_id for link in run.children}
    return tuple(
        OutboxItem(request_id=f"cancel/{run.run_id}/{child}", type=ev.RunCancelRequested.TYPE,
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
    return OutboxItem(
        request_id=f"wake/{child_run_id}/{item.request_id}", type=ev.RunWakeRequested.TYPE,
        run_id=item.parent_run_id, lineage_id=item.parent_lineage_id or item.parent_run_id,
        body_json=json.dumps({
            "child_run_id": child_run_id, "child_status": RunStatus.failed.value,
            "result_json": None, "error_type": "SpawnRefused", "error_message": why,
            "position": item.parent_position,
        }))
